"""Service configuration from environment variables, parsed once into a frozen object.

Each service declares a pydantic model whose field ``foo_bar`` is read from ``POWERTRIP_FOO_BAR``;
this module turns a missing or invalid variable into one ``ConfigError`` that names it, so a
misconfigured container fails at start with a message an operator can act on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from powertrip.services.common.settings import PREFIX, CurtailSettings, env_name

__all__ = ["PREFIX", "ConfigError", "CurtailSettings", "ServiceConfig", "env_name", "load_config"]


class ConfigError(ValueError):
    """A missing or invalid environment variable."""


NO_TLS = (
    "TLS is not configured: set POWERTRIP_TLS_CERT_PATH, POWERTRIP_TLS_KEY_PATH and "
    "POWERTRIP_TLS_CA_PATH (`powertrip certs` mints them), or POWERTRIP_INSECURE=1 for plaintext"
)


class ServiceConfig(BaseModel):
    """Fields shared by every service; subclasses add their own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bind_host: str = Field("0.0.0.0", description="address the gRPC port binds")
    grpc_port: int = Field(50051, description="the service's gRPC port")
    metrics_port: int = Field(8000, description="Prometheus /metrics port")
    metrics_addr: str = Field(
        "127.0.0.1",
        description="Address /metrics binds. It answers anyone who reaches it, without TLS or "
        "a login, so by default only this machine; a deployment whose Prometheus scrapes over "
        "the pod or container network sets 0.0.0.0 (the shipped k8s and compose deploys do).",
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR")
    keepalive_s: float = Field(
        10.0, description="HTTP/2 ping period; a frozen peer is noticed after this ..."
    )
    keepalive_timeout_s: float = Field(5.0, description="... plus this")
    rpc_timeout_s: float = Field(10.0, description="deadline for every short call")
    max_message_mib: int = Field(
        4, description="gRPC per-message limit; big tensors are chunked below it"
    )
    stream_window_mib: int = Field(
        4,
        ge=1,
        description="Per-stream HTTP/2 receive window. Fixed instead of BDP-probed so that many "
        "concurrent uploads cannot each buffer a growing window in memory. One stream moves at "
        "most window / RTT (4 MiB: ~490 Mbit/s at 50 ms); raise it for long links, memory "
        "permitting (docs/services.md, benchmarks/bench_stream_window.py).",
    )
    max_concurrent_rpcs: int = Field(
        0,
        ge=0,
        description="Calls served at once; beyond it gRPC answers RESOURCE_EXHAUSTED at once "
        "(clients retry with jitter) instead of queueing without bound behind the handler "
        "threads. 0 = no limit. Keep it above the uploads a round can have in flight (one per "
        "selected site).",
    )
    tls_cert_path: str | None = Field(
        None,
        description="Mutual TLS: PEM files of this service's certificate, its key and the CA "
        "that signed every peer. All three or none: a partial set is an error, so a typo cannot "
        "silently downgrade a deployment to plaintext; none is an error too unless "
        "POWERTRIP_INSECURE=1.",
    )
    tls_key_path: str | None = Field(None, description="this service's TLS key (PEM)")
    tls_ca_path: str | None = Field(None, description="the CA that signed every peer (PEM)")
    insecure: bool = Field(
        False,
        description="Plaintext gRPC only when asked for: with no TLS paths and this unset a "
        "service refuses to start, so a forgotten setting cannot silently expose the run "
        "(docs/security.md).",
    )
    health_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="A second, plaintext port serving only grpc.health.v1.Health, for probes "
        "that cannot present a client certificate (Kubernetes' gRPC probe, compose "
        "healthchecks); 0 = none.",
    )

    @field_validator("tls_cert_path", "tls_key_path", "tls_ca_path")
    @classmethod
    def _empty_is_unset(cls, v: str | None) -> str | None:
        return v or None

    @field_validator("allowed_workers_file", check_fields=False)
    @classmethod
    def _allow_list_file_reads(cls, v: str | None) -> str | None:
        """The aggregator's POWERTRIP_ALLOWED_WORKERS_FILE (declared there), checked here so a
        bad file is a ConfigError at start; later edits are re-read by ``AllowList``."""
        if not v:
            return None
        from powertrip.services.common.allow_list import read_ids  # lazily: it imports grpc

        read_ids(v)
        return v

    @model_validator(mode="after")
    def _tls_all_or_nothing(self) -> ServiceConfig:
        names = ("tls_cert_path", "tls_key_path", "tls_ca_path")
        missing = [env_name(n) for n in names if getattr(self, n) is None]
        if 0 < len(missing) < len(names):
            raise ValueError(f"TLS is half configured: {', '.join(missing)} not set")
        if not missing:
            if self.insecure:
                raise ValueError(
                    "POWERTRIP_INSECURE=1 contradicts the POWERTRIP_TLS_* paths that are set: "
                    "unset one of them"
                )
            for n in names:
                if not Path(getattr(self, n)).is_file():
                    raise ValueError(f"{env_name(n)}={getattr(self, n)!r}: no such file")
            _usable_certificate(self.tls_cert_path, self.tls_key_path, self.tls_ca_path)
        elif not self.insecure:
            raise ValueError(NO_TLS)
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert_path is not None


def _usable_certificate(cert: str | None, key: str | None, ca: str | None) -> None:
    """An expired, not yet valid (clock skew), foreign-CA or mismatched certificate fails at
    start with one line, rather than as "Socket closed" at the peer's first handshake."""
    from powertrip.services.common.cert_check import local_problem  # lazily: cryptography

    assert cert and key and ca
    problem = local_problem(cert, key, ca)
    if problem:
        raise ValueError(f"{env_name('tls_cert_path')}={cert!r}: {problem}")


C = TypeVar("C", bound=ServiceConfig)


def load_config(cls: type[C], env: Mapping[str, str] | None = None) -> C:
    """Build ``cls`` from ``POWERTRIP_*`` variables; unknown ``POWERTRIP_*`` names are ignored
    (they may belong to another service sharing the same env file)."""
    env = os.environ if env is None else env
    values = {name: env[env_name(name)] for name in cls.model_fields if env_name(name) in env}
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        raise config_error(exc, values) from None


def config_error(exc: ValidationError, values: Mapping[str, object]) -> ConfigError:
    """The first validation error, naming the variable (and its value where ``values`` has it);
    a rule across fields keeps its own message, which names the variables itself."""
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:
        return ConfigError(msg)
    field = str(err["loc"][0])
    var = env_name(field)
    if err["type"] == "missing":
        return ConfigError(f"{var} is required but not set")
    if field not in values:
        return ConfigError(f"{var}: {msg}")
    return ConfigError(f"{var}={values[field]!r}: {msg}")


class DeviceSettings(BaseModel):
    """POWERTRIP_DEVICE for the services that run models (workers train, the aggregator
    evaluates): auto (CUDA when present), cpu, cuda or cuda:N. The name is checked here; that
    the machine has it, by ``usable_device`` at the service's start (so a GPU deployment's
    config still validates on a CPU-only machine, and a pod without its GPU fails at once)."""

    device: str = Field("auto", description="auto|cpu|cuda[:N]: where models train or evaluate")

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        from powertrip.learning.device import device_name  # torch: not for the profiler

        return device_name(v)

    def usable_device(self) -> str:
        """The device, checked against this machine: ConfigError naming POWERTRIP_DEVICE."""
        from powertrip.learning.device import resolve_device

        try:
            resolve_device(self.device)
        except ValueError as exc:
            raise ConfigError(f"{env_name('device')}={self.device!r}: {exc}") from None
        return self.device
