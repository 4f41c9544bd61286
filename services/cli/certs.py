"""``powertrip certs``: the cluster's CA and one certificate per identity, for mutual TLS.

Each certificate serves both ways (server and client auth), because every service both listens
and calls. Its common name is the identity: ``aggregator``, ``profiler``, ``operator`` (the CLI
polling status) and each worker id, which the aggregator binds to the worker_id a worker claims.
Its only subject alternative name is that identity too: clients check a server by the identity
they expect (``make_channel(..., server_identity)``), never by the address they dial, so one
certificate cannot pass for another peer and no address needs to be on any certificate.

The CA key is kept (``ca.key``, owner-only) so that leaves can be renewed (``--renew``) and
workers added without changing ``ca.pem``: running services keep trusting each other.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from powertrip.services.common.cert_check import CLOCK_SKEW_MARGIN, common_name
from powertrip.services.common.ids import SERVICES, validate_id

__all__ = [
    "SERVICES",
    "Authority",
    "add_identities",
    "issue",
    "load_authority",
    "mint_cluster",
    "new_ca",
    "renew",
    "tls_env",
    "write_pair",
]
CA_DAYS = 3650  # the CA outlives many renewals: replacing ca.pem means restarting everyone
LEAF_DAYS = 90  # a stolen leaf key is useful for this long at most; renew with --renew


@dataclass(frozen=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(name: str) -> x509.SubjectAlternativeName:
    try:
        entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        entry = x509.DNSName(name)
    return x509.SubjectAlternativeName([entry])


def new_ca(cn: str = "powertrip cluster CA", days: int = CA_DAYS) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    start = dt.datetime.now(dt.UTC) - CLOCK_SKEW_MARGIN
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Authority(key, cert)


def issue(
    ca: Authority, cn: str, days: int = LEAF_DAYS, not_before: dt.datetime | None = None
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for identity ``cn``, valid for server and client auth.

    Valid from ``CLOCK_SKEW_MARGIN`` ago, for ``days`` but never past the CA. ``not_before``
    lets tests mint an expired or a not-yet-valid certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - CLOCK_SKEW_MARGIN
    end = min(start + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(cn), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Whole or not at all (a service reloading the file never reads half of it), created with
    ``mode`` (a key is never readable by others, not even for a moment)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_pair(out: Path, name: str, cert: bytes, key: bytes) -> None:
    """``<name>.key`` (owner-only) then ``<name>.pem``, each replaced atomically."""
    _write(out / f"{name}.key", key, 0o600)
    _write(out / f"{name}.pem", cert, 0o644)


def _write_authority(out: Path, ca: Authority) -> None:
    _write(out / "ca.key", _key_pem(ca.key), 0o600)
    _write(out / "ca.pem", ca.pem, 0o644)


def load_authority(out: Path) -> Authority:
    """The CA kept in ``out`` (``ca.pem`` and ``ca.key``); ValueError naming what is missing."""
    if not (out / "ca.key").is_file():
        raise ValueError(
            f"{out} has no ca.key (minted before the CA key was kept, or it was moved away): "
            "restore it, or mint a new cluster into an empty folder"
        )
    key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{out / 'ca.key'} is not an EC private key")
    return Authority(key, x509.load_pem_x509_certificate((out / "ca.pem").read_bytes()))


def _check_workers(workers: Sequence[str]) -> None:
    for w in workers:
        validate_id(w)  # the CN is the worker id the aggregator binds: the same rules
    clash = set(workers) & set(SERVICES)
    if clash:
        raise ValueError(f"worker ids {sorted(clash)} collide with service names")


def mint_cluster(
    out: Path, workers: Sequence[str], days: int = LEAF_DAYS, ca_days: int = CA_DAYS
) -> None:
    """A new CA (``ca.pem``, ``ca.key``) and a pair for every service and worker, into ``out``."""
    _check_workers(workers)
    out.mkdir(parents=True, exist_ok=True)
    ca = new_ca(days=ca_days)
    _write_authority(out, ca)
    for name in dict.fromkeys((*SERVICES, *workers)):
        write_pair(out, name, *issue(ca, name, days=days))


def add_identities(out: Path, workers: Sequence[str], days: int = LEAF_DAYS) -> list[str]:
    """Pairs, from the CA kept in ``out``, for the identities there that have none yet (the
    services, then ``workers``): existing certificates and ``ca.pem`` are left alone."""
    _check_workers(workers)
    ca = load_authority(out)
    added = [n for n in dict.fromkeys((*SERVICES, *workers)) if not (out / f"{n}.pem").exists()]
    for name in added:
        write_pair(out, name, *issue(ca, name, days=days))
    return added


def identities(out: Path) -> list[str]:
    """The identities with a certificate in ``out``, read from the certificates themselves."""
    names = []
    for pem in sorted(out.glob("*.pem")):
        if pem.name != "ca.pem":  # the name becomes a file name: the id rules apply
            cn = common_name(x509.load_pem_x509_certificate(pem.read_bytes()))
            names.append(validate_id(cn, f"identity in {pem.name}"))
    return names


def renew(out: Path, days: int = LEAF_DAYS) -> list[str]:
    """Every pair in ``out`` re-issued (new key, new validity) from the kept CA, same names;
    ``ca.pem`` is unchanged, so services reload the new files and keep trusting each other."""
    ca = load_authority(out)
    names = identities(out)
    for name in names:
        write_pair(out, name, *issue(ca, name, days=days))
    return names


def tls_env(out: Path, name: str) -> dict[str, str]:
    """The POWERTRIP_TLS_* variables for service ``name`` with certificates in ``out``."""
    return {
        "POWERTRIP_TLS_CERT_PATH": str(out / f"{name}.pem"),
        "POWERTRIP_TLS_KEY_PATH": str(out / f"{name}.key"),
        "POWERTRIP_TLS_CA_PATH": str(out / "ca.pem"),
    }


HOST_GONE = (
    "--host is gone: servers are verified by identity name (aggregator, profiler, the worker "
    "id), not by the address dialled, so certificates carry no host names. Drop --host."
)


@click.command()
@click.option(
    "--out", type=click.Path(path_type=Path), required=True, help="Directory for the PEM files."
)
@click.option("--workers", help="Comma-separated worker ids, e.g. w0,w1 (added if OUT has a CA).")
@click.option("--renew", is_flag=True, help="Re-issue every certificate in OUT from its CA.")
@click.option(
    "--days",
    type=click.IntRange(min=1),
    default=LEAF_DAYS,
    show_default=True,
    help="Validity of the certificates (never past the CA's).",
)
@click.option(
    "--ca-days",
    type=click.IntRange(min=1),
    default=CA_DAYS,
    show_default=True,
    help="Validity of a new CA.",
)
@click.option("--host", "hosts", multiple=True, hidden=True)
def certs(
    out: Path, workers: str | None, renew: bool, days: int, ca_days: int, hosts: tuple[str, ...]
) -> None:
    """Mint the cluster's CA and mTLS certificates for the aggregator, the profiler, the
    operator CLI and each worker (common name = worker id); with a CA already in OUT, add the
    missing ones; with --renew, renew them all. OUT/ca.key signs them: keep it offline."""
    if hosts:
        raise click.BadParameter(HOST_GONE, param_hint="--host")
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{out} is a file, not a folder", param_hint="--out")
    if renew and workers is not None:
        raise click.UsageError("--renew re-issues what OUT holds; add workers without --renew")
    try:
        if renew:
            _renew(out, days)
        else:
            _mint(out, workers, days, ca_days)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write {out}: {exc.strerror or exc}", param_hint="--out"
        ) from None
    click.echo("per service: " + " ".join(f"{k}=..." for k in tls_env(out, "NAME")))


def _renew(out: Path, days: int) -> None:
    if not (out / "ca.pem").is_file():
        raise click.BadParameter(f"{out} holds no ca.pem to renew from", param_hint="--out")
    try:
        names = renew(out, days)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from None
    click.echo(f"renewed {len(names)} certificates in {out} for {days} days; ca.pem unchanged")


def _mint(out: Path, workers: str | None, days: int, ca_days: int) -> None:
    ids = [w.strip() for w in (workers or "").split(",") if w.strip()]
    if not ids:
        raise click.BadParameter("name at least one worker", param_hint="--workers")
    try:
        if (out / "ca.pem").exists():
            added = add_identities(out, ids, days)
            click.echo(f"added {len(added)} certificates to {out} ({', '.join(added) or 'none'})")
            return
        mint_cluster(out, ids, days, ca_days)
    except ValueError as exc:
        hint = "--out" if "ca.key" in str(exc) else "--workers"
        raise click.BadParameter(str(exc), param_hint=hint) from None
    n = len(set(SERVICES) | set(ids))
    click.echo(f"wrote ca.pem, ca.key and {n} certificate/key pairs to {out}")
    click.echo(f"{out / 'ca.key'} signs every certificate: keep it offline or where you mint")
