"""Who is calling: the verified client certificate's common name, bound to the id a request claims.

mTLS proves a peer holds *a* certificate from our CA; it does not stop worker w0 from claiming to
be w1 in a request body. Servicers therefore call ``check_worker`` before touching any state, so a
spoofed id is refused (PERMISSION_DENIED) with nothing registered or accepted in its name.
"""

from __future__ import annotations

from collections.abc import Collection

import grpc

from services.common.errors import Forbidden


def caller_identity(context: grpc.ServicerContext) -> str | None:
    """The common name of the caller's verified certificate; None on a plaintext connection."""
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    names = auth.get("x509_common_name") or [b""]
    return names[0].decode()


def check_worker(
    context: grpc.ServicerContext, claimed_id: str, allowed: Collection[str] | None = None
) -> None:
    """Raise Forbidden unless the caller may act as ``claimed_id``.

    Over TLS the certificate CN must equal the claim. ``allowed`` (when given) is the allow-list of
    worker ids admitted to the run. Plaintext servers skip the certificate check (nothing to read),
    as before TLS existed.
    """
    cn = caller_identity(context)
    if cn is not None and cn != claimed_id:
        raise Forbidden(f"certificate {cn!r} may not act as worker {claimed_id!r}")
    if allowed is not None and claimed_id not in allowed:
        raise Forbidden(f"worker {claimed_id!r} is not on the allow-list")
