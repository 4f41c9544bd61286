"""``powertrip certs``: a throw-away CA and one certificate per service for mutual TLS.

Each certificate serves both ways (server and client auth), because every service both listens
and calls. Its common name is the service's identity: ``aggregator``, ``profiler``, ``operator``
(the CLI polling status) and each worker id, which the aggregator binds to the worker_id a worker
claims. The CA key is not written: to add a worker, mint a fresh set.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.identity import SERVICES, validate_id

__all__ = ["SERVICES", "Authority", "issue", "mint_cluster", "new_ca", "tls_env", "write_pair"]
LOCAL_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):  # keep order, drop repeats
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            entries.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(entries)


def new_ca(cn: str = "powertrip throw-away CA", days: int = 30) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Authority(key, cert)


def issue(
    ca: Authority,
    cn: str,
    hosts: Sequence[str] = (),
    days: int = 30,
    not_before: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for ``cn``, valid for server and client auth.

    SANs are ``cn``, ``hosts`` and loopback, so a peer dialled by name or by 127.0.0.1 verifies.
    ``not_before`` lets tests mint an already expired certificate.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san([cn, *hosts, *LOCAL_HOSTS]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write_pair(out: Path, name: str, cert: bytes, key: bytes) -> None:
    """``<name>.pem`` and ``<name>.key`` (owner-only, as a private key should be)."""
    (out / f"{name}.pem").write_bytes(cert)
    key_path = out / f"{name}.key"
    key_path.write_bytes(key)
    os.chmod(key_path, 0o600)


def mint_cluster(
    out: Path,
    workers: Sequence[str],
    hosts: Sequence[str] = (),
    days: int = 30,
    hosts_of: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """``ca.pem`` plus a certificate and key for every service and worker, into ``out``.
    ``hosts`` go on every certificate, ``hosts_of[name]`` on ``name``'s only (the address a
    peer dials it at, such as a worker's own link in a netns topology)."""
    for w in workers:
        validate_id(w)  # the CN is the worker id the aggregator binds: the same rules
    clash = set(workers) & set(SERVICES)
    if clash:
        raise ValueError(f"worker ids {sorted(clash)} collide with service names")
    out.mkdir(parents=True, exist_ok=True)
    ca = new_ca(days=days)
    (out / "ca.pem").write_bytes(ca.pem)
    for name in (*SERVICES, *workers):
        own = (hosts_of or {}).get(name, ())
        write_pair(out, name, *issue(ca, name, [*hosts, *own], days=days))


def tls_env(out: Path, name: str) -> dict[str, str]:
    """The POWERTRIP_TLS_* variables for service ``name`` with certificates in ``out``."""
    return {
        "POWERTRIP_TLS_CERT_PATH": str(out / f"{name}.pem"),
        "POWERTRIP_TLS_KEY_PATH": str(out / f"{name}.key"),
        "POWERTRIP_TLS_CA_PATH": str(out / "ca.pem"),
    }


@click.command()
@click.option(
    "--out", type=click.Path(path_type=Path), required=True, help="Directory for the PEM files."
)
@click.option("--workers", required=True, help="Comma-separated worker ids, e.g. w0,w1.")
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="Extra DNS name or IP on every certificate (repeatable); loopback is always on.",
)
@click.option("--days", default=30, show_default=True, help="Validity of CA and certificates.")
def certs(out: Path, workers: str, hosts: tuple[str, ...], days: int) -> None:
    """Mint a throw-away CA and mTLS certificates for the aggregator, the profiler, the operator
    CLI and each worker (common name = worker id)."""
    ids = [w.strip() for w in workers.split(",") if w.strip()]
    if not ids:
        raise click.BadParameter("name at least one worker", param_hint="--workers")
    try:
        mint_cluster(out, ids, hosts, days)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--workers") from None
    click.echo(f"wrote ca.pem and {len(SERVICES) + len(ids)} certificate/key pairs to {out}")
    click.echo("per service: " + " ".join(f"{k}=..." for k in tls_env(out, "NAME")))
