"""Aggregator settings (POWERTRIP_* environment variables).

The training run itself is an experiment configuration (``powertrip.config.experiment``): a preset
plus overrides (``config_run.RunSettings``), so the service and ``powertrip experiment`` share
one definition.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig
from powertrip.services.aggregator.config_run import RunSettings
from powertrip.services.common.config import DeviceSettings, ServiceConfig, config_error
from powertrip.services.common.settings import CurtailSettings, library_settings, library_values

#: ``CurtailmentConfig`` fields no aggregator variable sets, and why (the run's own fields are
#: ``RunSettings``' variables, the sites' availability ``CurtailSettings``').
CURTAIL_RUN_LESS = {
    "name": "the preset's name (POWERTRIP_CURTAIL_PRESET)",
    "description": "the preset's description",
    "policies": "POWERTRIP_CURTAIL_POLICY: a service run trains one policy",
    "tokenizer_sha256": "filled in by the aggregator for its workers",
    "site_seed": "the profiler's: the sites' modelled distances",
    "site_power": "the emulated study's; a service's sites train at the power they have",
    "round_min_s": "the emulated study's round clock; a service's rounds are real "
    "(POWERTRIP_ROUND_DEADLINE_S)",
    "overhead_s": "the emulated study's round clock",
    "single_site_hours": "the emulated study's step time; a service's sites really train",
    "eval_every_s": "the emulated study's solo-training evaluations",
    "always_on_sites": "the emulated study's always-on baseline",
}
#: the curtailment run's own fields (neither the PowerTrip run's nor the availability's)
CURTAIL_DERIVED = [
    n
    for n in CurtailmentConfig.model_fields
    if n not in ExperimentConfig.model_fields
    and n not in CurtailSettings.model_fields
    and n not in CURTAIL_RUN_LESS
]

if TYPE_CHECKING:  # derived at run time; read only through ``curtailment``
    _CurtailRunFields = BaseModel
else:
    _CurtailRunFields = library_settings(CurtailmentConfig, CURTAIL_DERIVED, __name__)


def default_checkpoint_dir() -> str:
    """The per-user state directory (XDG base directory spec): a start from any working
    directory, a checkout's included, never resumes checkpoints it happens to find there."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(state, "powertrip", "checkpoints")


class AggregatorConfig(
    ServiceConfig, RunSettings, CurtailSettings, DeviceSettings, _CurtailRunFields
):
    profiler_addr: str = Field(description="host:port of the profiler")
    mode: Literal["powertrip", "curtailment"] = Field(
        "powertrip",
        description="powertrip: PowerTrip's rounds over the experiment preset; curtailment: the "
        "elastic, curtailment-aware run of docs/curtailment.md over POWERTRIP_CURTAIL_PRESET, "
        "availability from the profiler",
    )
    curtail_policy: Literal["curtailment", "combined"] = Field(
        "curtailment", description="curtailment mode: every connected site, or PowerTrip's pick"
    )
    clock: Literal["emulated", "wall"] = Field(
        "emulated", description="emulated: the emulator's time model; wall: real time"
    )
    pace: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="Emulated clock only: run-clock seconds per wall second. After each round "
        "the run waits until wall time since training began reaches clock / pace, so a "
        "Prometheus scraping at a normal interval sees the run unfold; 0 = as fast as possible. "
        "Results are the same.",
    )
    stream_window_mib: int = Field(
        32,
        ge=1,
        description="Uploads' flow control (services/aggregator/upload_flow.py): each upload "
        "gets credit for its site's measured bandwidth x RTT, capped by the receive budget "
        "shared among the uploads in flight (buffered uploads hold about one budget however many "
        "send at once) and by the transport window, the most one stream may have in flight (32 "
        "MiB: ~670 MB/s at 50 ms), which also bounds a worker that ignores its credit. Raise "
        "both for fatter long links.",
    )
    receive_budget_mib: int = Field(32, ge=1, description="see POWERTRIP_STREAM_WINDOW_MIB")
    wall_tau_s: float = Field(
        1.0,
        gt=0,
        description="Wall clock: expected local training time at full power, for ranking "
        "before measurement.",
    )
    round_deadline_s: float = Field(
        120.0, gt=0, description="wall seconds a round waits for updates"
    )
    registration_timeout_s: float = Field(
        300.0, gt=0, description="wall seconds the sites have to register before the run fails"
    )
    min_sites: int | None = Field(None, ge=1, description="sites to wait for; default: every site")
    max_failed_rounds: int = Field(3, ge=1, description="this many failed rounds in a row: FAILED")
    heartbeat_s: float = Field(
        2.0,
        gt=0,
        description="Liveness (docs/liveness.md). A worker is alive while its last heartbeat is "
        "at most heartbeat_patience x heartbeat_s + 1 s old; POWERTRIP_HEARTBEAT_S is the "
        "variable the workers beat at, so one environment file sets both sides.",
    )
    heartbeat_patience: float = Field(2.0, ge=1, description="see POWERTRIP_HEARTBEAT_S")
    min_contributions: int = Field(
        1,
        ge=1,
        description="Quorum: a round closing with fewer accepted updates fails (model "
        "unchanged). Keep it at or below the sites a round selects, or every round fails.",
    )
    profiler_retry_s: float = Field(
        15.0,
        gt=0,
        description="The profiler's circuit breaker: after a failed call, rounds use the cached "
        "profile at once and the profiler is asked again only after profiler_retry_s; a cached "
        "profile older than profiler_stale_s holds new rounds until the profiler answers.",
    )
    profiler_stale_s: float = Field(600.0, gt=0, description="see POWERTRIP_PROFILER_RETRY_S")
    checkpoint_dir: str = Field(
        default_factory=default_checkpoint_dir,
        description="where the run's checkpoints and round journal live (default: the user's "
        "state directory, $XDG_STATE_HOME/powertrip/checkpoints or "
        '~/.local/state/powertrip/checkpoints, never the working directory\'s); "" disables '
        "checkpoints",
    )
    start_fresh: bool = Field(
        False,
        description="When checkpoints exist but none verifies (checksum, format), start over "
        "from round 0 (the bad ones are renamed *.rejected) instead of refusing to start (exit "
        "code 3). No effect when one verifies or there are none.",
    )
    exit_when_done: bool = Field(
        False, description="end the process once the run ends (default: keep serving its status)"
    )
    stop_workers: str | None = Field(
        None,
        description="Kubernetes, with exit_when_done: a label selector of the worker "
        "StatefulSets this aggregator scales to 0 once the run is DONE, before it exits "
        "(its service account may; services/aggregator/stop_workers.py)",
    )
    shutdown_grace_s: float = Field(
        10.0,
        gt=0,
        description="SIGTERM to exit 0: no new round, the open one finished or abandoned, the "
        "port closed; keep it below the orchestrator's kill timeout (Kubernetes: 30 s by "
        "default)",
    )
    allowed_workers: str | None = Field(
        None,
        description="Comma-separated worker ids admitted to the run; unset admits any worker "
        "(with TLS: any holder of a certificate from the CA, under its own name).",
    )
    allowed_workers_file: str | None = Field(None, description="one id per line; re-read on change")
    site_owners: str | None = Field(
        None,
        description='Which sites each worker id may host, "w0=0-3;w1=4-7" (site lists as in '
        'POWERTRIP_SITES), or a file of "w0: 0-3" lines re-read on change; one or the other. A '
        "claim of a site not assigned to the claimant is refused, and only the workers named "
        "may join. Unset: sites are first-come (docs/site-ownership.md).",
    )
    site_owners_file: str | None = Field(None, description="see POWERTRIP_SITE_OWNERS")

    @property
    def lease_s(self) -> float:
        """How old a worker's last heartbeat may be while it still counts as alive."""
        return self.heartbeat_patience * self.heartbeat_s + 1.0

    @property
    def allowed_worker_ids(self) -> frozenset[str] | None:
        if not self.allowed_workers:
            return None
        return frozenset(w.strip() for w in self.allowed_workers.split(",") if w.strip())

    @field_validator("site_owners", "site_owners_file", mode="before")
    @classmethod
    def _empty_owners_is_unset(cls, v: object) -> object:
        return v or None

    @model_validator(mode="after")
    def _site_owners_are_valid(self) -> AggregatorConfig:
        # At start, sites checked against the run's size: a typo is exit 2 naming the entry,
        # not a worker refused later. (A bad later edit of the file keeps the last good map.)
        if self.site_owners or self.site_owners_file:
            from powertrip.services.aggregator.site_owners import (
                SiteOwners,  # lazily: it imports grpc
            )

            SiteOwners(self.site_owners, self.site_owners_file, self._run_sites())
        return self

    def _run_sites(self) -> int | None:
        """The run's site count, where the settings alone tell it."""
        if self.num_sites:
            return self.num_sites
        try:
            if self.mode == "curtailment":
                c = self.curtailment()
                return len(c.regions) * c.sites_per_region if c.regions else None
            return self.build_experiment().num_sites
        except ValueError:  # the run's own checks report it
            return None

    @model_validator(mode="after")
    def _curtailment_runs_on_the_emulated_clock(self) -> AggregatorConfig:
        if self.mode == "curtailment" and self.clock != "emulated":
            raise ValueError("POWERTRIP_MODE=curtailment needs POWERTRIP_CLOCK=emulated")
        return self

    @model_validator(mode="after")
    def _pace_is_for_the_emulated_clock(self) -> AggregatorConfig:
        # Refused, not ignored: a wall-clock run already unfolds in real time, and a setting
        # that silently does nothing would leave the operator wondering why nothing changed.
        if self.pace > 0 and self.clock != "emulated":
            raise ValueError(
                "POWERTRIP_PACE paces the emulated clock; with POWERTRIP_CLOCK=wall the run "
                "already unfolds in real time: unset POWERTRIP_PACE or set it to 0"
            )
        return self

    def curtailment(self) -> CurtailmentConfig:
        """The curtailment run: its preset, with every variable set that is one of its fields
        (the workload, its optimizer, the availability, ...); ConfigError naming the variable
        when the combination is invalid."""
        try:
            return self.build_curtailment()
        except ValidationError as exc:
            raise config_error(exc, {}) from None

    def build_curtailment(self) -> CurtailmentConfig:
        """The curtailment run, or the library's ValidationError."""
        run = library_values(self, ExperimentConfig)
        shared = {n: v for n, v in run.items() if n in CurtailmentConfig.model_fields}
        return self.curtail_config(**shared)
