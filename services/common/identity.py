"""Who is calling, and who may call what: the verified certificate's common name (CN).

mTLS proves a peer holds *a* certificate from our CA; it does not stop worker w0 from claiming
to be w1 in a request body, nor a worker's certificate from starting rounds on other workers.
Servicers therefore call ``require_role`` / ``check_worker`` before touching any state, so a
caller acting outside its role is refused (PERMISSION_DENIED) with nothing done in its name.

Plaintext servers (POWERTRIP_INSECURE=1) have no certificate to read: every check here passes
there, as before TLS existed. That is why plaintext needs an explicit flag.

The identity names and the id rule are ``ids``' (plain Python: a configuration check needs no
gRPC), re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import grpc

from powertrip.services.common.auth_metrics import count_denied
from powertrip.services.common.errors import BadRequest, Forbidden
from powertrip.services.common.ids import AGGREGATOR as AGGREGATOR
from powertrip.services.common.ids import OPERATOR as OPERATOR
from powertrip.services.common.ids import PROFILER as PROFILER
from powertrip.services.common.ids import SERVICES as SERVICES
from powertrip.services.common.ids import id_problem as id_problem
from powertrip.services.common.ids import validate_id as validate_id
from powertrip.sites.profiles import site_index


def caller_identity(context: grpc.ServicerContext) -> str | None:
    """The common name of the caller's verified certificate; None on a plaintext connection."""
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    names = auth.get("x509_common_name") or [b""]
    return names[0].decode()


class Denied(Forbidden):
    """A refusal with its metric reason (identity_mismatch, not_allowed, revoked, wrong_role)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def deny(service: str, method: str, reason: str, message: str) -> Denied:
    """Count the refusal in ``powertrip_auth_denied_total`` and return it to raise."""
    count_denied(service, method, reason)
    return Denied(message, reason)


def require_id(service: str, method: str, value: str, what: str = "worker id") -> None:
    """BadRequest (INVALID_ARGUMENT) for an invalid id, counted as ``bad_id``."""
    problem = id_problem(value, what)
    if problem:
        count_denied(service, method, "bad_id")
        raise BadRequest(problem)


def require_site_ids(service: str, method: str, site_ids: Sequence[str]) -> list[int]:
    """The site indices a request names (``site-007`` -> 7); BadRequest for an id that is not
    valid (counted as ``bad_id``, as ``require_id`` does) or names no site."""
    for s in site_ids:
        require_id(service, method, s, "site id")
    try:
        return [site_index(s) for s in site_ids]
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def require_role(
    context: grpc.ServicerContext,
    service: str,
    method: str,
    roles: Collection[str],
    also: Callable[[str], bool] | None = None,
) -> str | None:
    """The caller's CN if it is one of ``roles`` (or ``also(cn)`` holds), else Denied.

    None on plaintext (nothing to check)."""
    cn = caller_identity(context)
    if cn is None or cn in roles or (also is not None and also(cn)):
        return cn
    raise deny(service, method, "wrong_role", f"certificate {cn!r} may not call {service}.{method}")


def check_worker(
    context: grpc.ServicerContext,
    claimed_id: str,
    admitted: Callable[[str], str | None] | Collection[str] | None = None,
    service: str = "AggregatorService",
    method: str = "RegisterWorker",
) -> None:
    """Raise unless the caller may act as ``claimed_id``.

    A service identity (``SERVICES``) never hosts sites, as the certificate's CN or as the
    claim: ``wrong_role``, so a leaked operator certificate cannot join a run as a worker. Over
    TLS the certificate CN must equal the claim. ``admitted`` is the allow-list: a
    collection of ids, or a function returning None (admitted) or the refusal reason
    (``not_allowed`` / ``revoked``, see ``AllowList.verdict``). Plaintext servers skip the
    certificate check (nothing to read) but still apply the allow-list and the id rules.
    """
    if not claimed_id:
        count_denied(service, method, "bad_id")
        raise BadRequest(f"{method} needs a worker_id")
    require_id(service, method, claimed_id)
    cn = caller_identity(context)
    role = cn if cn in SERVICES else claimed_id if claimed_id in SERVICES else None
    if role is not None:
        raise deny(service, method, "wrong_role", f"the {role} identity cannot host sites")
    if cn is not None and cn != claimed_id:
        raise deny(
            service,
            method,
            "identity_mismatch",
            f"certificate {cn!r} may not act as worker {claimed_id!r}",
        )
    if admitted is None:
        return
    if callable(admitted):
        reason = admitted(claimed_id)
    else:
        reason = None if claimed_id in admitted else "not_allowed"
    if reason == "revoked":
        raise deny(service, method, reason, f"worker {claimed_id!r} was revoked")
    if reason is not None:
        raise deny(service, method, reason, f"worker {claimed_id!r} is not on the allow-list")
