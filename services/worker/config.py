"""Worker settings (POWERTRIP_* environment variables)."""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, field_validator

from powertrip.sites import parse_site_list
from services.common.config import DeviceSettings, ServiceConfig
from services.common.identity import validate_id


class WorkerConfig(ServiceConfig, DeviceSettings):
    aggregator_addr: str  # host:port of the aggregator
    sites: str  # the sites this worker hosts: "site-000,site-001" or "0-3"
    worker_id: str = Field(default_factory=socket.gethostname)
    # How the aggregator and profiler reach this worker; default <advertise_host>:<bound port>.
    advertise_host: str = Field(default_factory=socket.gethostname)
    train_threads: int = Field(1, ge=1)
    register_timeout_s: float = Field(120.0, gt=0)  # keep retrying registration this long
    # Re-register this often: a heartbeat that lets a restarted aggregator find us again, and
    # renews this worker's lease there (the aggregator reads the same POWERTRIP_HEARTBEAT_S).
    heartbeat_s: float = Field(2.0, gt=0)
    # Where this worker keeps what a restart needs (the run's registration, the hosted sites'
    # local optimizer states, saved after each round); unset: in memory, a restart starts fresh.
    worker_state_dir: Path | None = None

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
        parse_site_list(v)
        return v

    @property
    def site_indices(self) -> list[int]:
        return parse_site_list(self.sites)
