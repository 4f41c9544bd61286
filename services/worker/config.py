"""Worker settings (POWERTRIP_* environment variables)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from powertrip.config.site_engine import SiteEngineConfig
from powertrip.services.common.config import ConfigError, DeviceSettings, ServiceConfig, env_name
from powertrip.services.common.ids import validate_id
from powertrip.services.common.settings import library_settings, library_values

#: ``SiteEngineConfig`` fields with no ``POWERTRIP_SITE_*`` variable of their own, and why
SITE_ENGINE_LESS = {
    "ranks": "POWERTRIP_SITE_RANKS, the worker's switch: 0 is its in-process engine",
}
SITE_PREFIX = "site_"

if TYPE_CHECKING:  # derived at run time; read only through ``site_engine``
    _SiteEngineFields = BaseModel
else:
    _SiteEngineFields = library_settings(
        SiteEngineConfig,
        [n for n in SiteEngineConfig.model_fields if n not in SITE_ENGINE_LESS],
        __name__,
        prefix=SITE_PREFIX,
    )


class WorkerConfig(ServiceConfig, DeviceSettings, _SiteEngineFields):
    aggregator_addr: str = Field(description="host:port of the aggregator")
    sites: str = Field(description='the sites this worker hosts: "site-000,site-001" or "0-3"')
    worker_id: str = Field(
        default_factory=socket.gethostname, description="this worker's id in the run"
    )
    advertise_host: str = Field(
        default_factory=socket.gethostname,
        description="How the aggregator and profiler reach this worker: "
        "<advertise_host>:<bound port>.",
    )
    train_threads: int = Field(1, ge=1, description="CPU threads torch trains with")
    register_timeout_s: float = Field(
        120.0, gt=0, description="keep retrying registration this long"
    )
    heartbeat_s: float = Field(
        2.0,
        gt=0,
        description="Re-register this often: a heartbeat that lets a restarted aggregator find "
        "us again, and renews this worker's lease there (the aggregator reads the same "
        "POWERTRIP_HEARTBEAT_S).",
    )
    exit_when_done: bool = Field(
        False,
        description="end the process (exit 0) once the aggregator reports the run DONE; "
        "default: keep heartbeating in case it comes back (services/worker/run_end.py)",
    )
    worker_state_dir: Path | None = Field(
        None,
        description="Where this worker keeps what a restart needs (the run's registration, the "
        "hosted sites' local optimizer states, saved after each round); unset: in memory, a "
        "restart starts fresh.",
    )
    upload_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="bfloat16: updates travel in half the bytes (rounded to nearest even; the "
        "aggregator widens them back to float32 as it folds). float32: exact.",
    )
    site_ranks: int = Field(
        0,
        ge=0,
        le=64,
        description="0: the in-process engine (all hosted sites batched on one device). N >= 1: "
        "each site trains as a torch.distributed job over N rank processes, one per GPU on CUDA "
        "(a site that is a GPU cluster); the other site_* settings shape that job "
        "(SiteEngineConfig).",
    )

    @field_validator("worker_state_dir", mode="before")
    @classmethod
    def _empty_dir_is_unset(cls, v: object) -> object:
        return v or None

    @field_validator("worker_id")
    @classmethod
    def _worker_id_is_an_id(cls, v: str) -> str:
        return validate_id(v)  # the aggregator would refuse it at registration anyway

    @field_validator("sites")
    @classmethod
    def _sites_parse(cls, v: str) -> str:
        from powertrip.sites.profiles import parse_site_list  # numpy: not for --help

        parse_site_list(v)
        return v

    @model_validator(mode="after")
    def _a_distributed_site_per_worker(self) -> WorkerConfig:
        # the ranks hold one site's model, optimizer state and devices: a second site would
        # need a second set of GPUs, i.e. another worker
        if self.site_ranks and len(self.site_indices) != 1:
            raise ValueError(
                f"site_ranks={self.site_ranks} trains one site over this worker's devices, so "
                f"sites must name exactly one site, not {len(self.site_indices)}"
            )
        return self

    def usable_device(self) -> str:
        """The device, checked against this machine, and on CUDA one GPU per site rank."""
        device = super().usable_device()
        if self.site_ranks:
            import torch

            from powertrip.learning.device import resolve_device

            seen = torch.cuda.device_count()
            if resolve_device(device).type == "cuda" and seen < self.site_ranks:
                raise ConfigError(
                    f"{env_name('site_ranks')}={self.site_ranks} needs one GPU per rank; "
                    f"this machine shows {seen} (CUDA_VISIBLE_DEVICES, the pod's nvidia.com/gpu)"
                )
        return device

    @property
    def site_engine(self) -> SiteEngineConfig | None:
        """The distributed site job's settings; None: the in-process engine."""
        if self.site_ranks == 0:
            return None
        given = {k: v for k, v in library_values(self, SiteEngineConfig).items() if v is not None}
        return SiteEngineConfig.model_validate({**given, "ranks": self.site_ranks})

    @property
    def site_indices(self) -> list[int]:
        from powertrip.sites.profiles import parse_site_list

        return parse_site_list(self.sites)
