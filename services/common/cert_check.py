"""Why a TLS peer refuses us, in one line: our own certificate first, then the server's view.

gRPC reports a failed handshake as UNAVAILABLE with "Socket closed" (the server rejected our
certificate) or a verification error, after retries that can last minutes. These checks name the
reason instead: ``local_problem`` reads our certificate, key and CA (expired, not yet valid, i.e.
clock skew, not signed by our CA, key mismatch); ``probe`` repeats the handshake with Python's
``ssl`` against the server, expecting its identity name, and reads the verification error or the
alert the server sent (certificate expired, unknown ca, ...).
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

#: certificates are valid from this long before they were minted, so a peer whose clock is a
#: little behind the minting machine's still accepts them (docs/security.md "Clock skew")
CLOCK_SKEW_MARGIN = dt.timedelta(minutes=5)
PROBE_TIMEOUT_S = 2.0
#: HTTP/2's client preface and an empty SETTINGS frame: a server that accepted us answers it
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
REJECTED = (
    "the server closed the connection after the handshake: it rejected our certificate "
    "(expired by its clock, or not signed by a CA it trusts)"
)


def when(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else "?"


def validity_problem(cert: x509.Certificate, whose: str, now: dt.datetime) -> str | None:
    """Expired, or not yet valid (this machine's clock behind the minting one's), or None."""
    if now > cert.not_valid_after_utc:
        return f"{whose} certificate expired at {when(cert.not_valid_after_utc)} (now {when(now)})"
    if now < cert.not_valid_before_utc:
        return (
            f"{whose} certificate is not valid until {when(cert.not_valid_before_utc)} but this "
            f"machine's clock reads {when(now)}: a clock behind by more than the "
            f"{CLOCK_SKEW_MARGIN.seconds // 60} min margin, or a certificate minted in the future"
        )
    return None


def local_problem(
    cert_path: str, key_path: str, ca_path: str, now: dt.datetime | None = None
) -> str | None:
    """What is wrong with our own certificate files, or None if a peer should accept them."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        cas = x509.load_pem_x509_certificates(Path(ca_path).read_bytes())
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), None)
    except (OSError, ValueError) as exc:
        return f"cannot read our certificate, key or CA: {exc}"
    problem = validity_problem(cert, "our", now)
    if problem:
        return problem
    if not _same_key(cert, key):
        return f"our key {key_path} does not belong to our certificate {cert_path}"
    issuers = [ca for ca in cas if _issued_by(cert, ca)]
    if not issuers:
        return (
            f"our certificate ({common_name(cert)!r}, issued by {cert.issuer.rfc4514_string()}) "
            f"is not signed by the CA in {ca_path}"
        )
    return validity_problem(issuers[0], "the CA", now)


_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _same_key(cert: x509.Certificate, key: Any) -> bool:
    return bool(key.public_key().public_bytes(*_SPKI) == cert.public_key().public_bytes(*_SPKI))


def pair_mismatch(cert_pem: bytes, key_pem: bytes) -> bool:
    """True when the key does not belong to the certificate: files caught mid-rotation (one
    replaced, the other not yet), to be read again rather than loaded."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, None)
    except ValueError:
        return True
    return not _same_key(cert, key)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def probe(
    address: str,
    identity: str,
    cert_path: str,
    key_path: str,
    ca_path: str,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> str | None:
    """Shake hands with the server at ``address`` as gRPC would (ALPN h2, our certificate,
    expecting ``identity``); the reason it fails, or None if it succeeds or nobody answers."""
    host, port = _split(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca_path)
    ctx.load_cert_chain(cert_path, key_path)
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, port), timeout_s) as raw,
            ctx.wrap_socket(raw, server_hostname=identity) as tls,
        ):
            # TLS 1.3: the server judges our certificate after our side has finished, so its
            # verdict comes later: its HTTP/2 settings if accepted, else a close or an alert
            try:
                tls.sendall(H2_PREFACE)
                accepted = bool(tls.recv(1))
            except (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
                accepted = False
            if not accepted:
                return REJECTED
    except ssl.SSLCertVerificationError as exc:
        return _server_cert_problem(exc, host, port, identity, timeout_s)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "ALERT" in reason:
            alert = reason.split("ALERT_", 1)[-1].replace("_", " ").lower()
            return f"the server rejected our certificate ({alert})"
        return f"TLS failed: {reason.replace('_', ' ').lower()}"
    except OSError:  # refused, reset, timed out: not a certificate matter
        return None
    return None


def _server_cert_problem(
    exc: ssl.SSLCertVerificationError, host: str, port: int, identity: str, timeout_s: float
) -> str:
    """The server's certificate failed our checks: read it unverified to say how."""
    theirs = _peer_certificate(host, port, timeout_s)
    if theirs is None:
        return f"the server's certificate failed verification: {exc.verify_message}"
    problem = validity_problem(theirs, "the server's", dt.datetime.now(dt.UTC))
    if problem:
        return problem
    if exc.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
        return (
            f"the server presents the certificate of {common_name(theirs)!r}, not {identity!r}: "
            "an impostor, or a wrong address"
        )
    return (
        f"the server's certificate ({common_name(theirs)!r}, issued by "
        f"{theirs.issuer.rfc4514_string()}) is not signed by our CA ({exc.verify_message})"
    )


def _peer_certificate(host: str, port: int, timeout_s: float) -> x509.Certificate | None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout_s) as raw, ctx.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    except OSError:
        return None
    return x509.load_der_x509_certificate(der) if der else None


def _split(address: str) -> tuple[str, int]:
    """host and port of a gRPC target (``host:port``, ``[v6]:port``, ``ipv4:``/``dns:`` forms)."""
    for prefix in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        address = address.removeprefix(prefix)
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
