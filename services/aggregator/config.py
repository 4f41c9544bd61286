"""Aggregator settings (POWERTRIP_* environment variables).

The training run itself is an experiment configuration (``powertrip.experiment``): a preset
plus the overrides below, so the service and ``powertrip experiment`` share one definition.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from powertrip.curtailment.config import CurtailmentConfig
from powertrip.experiment import (
    ExperimentConfig,
    ModelSize,
    Partition,
    build_config,
    needs_dataset_path,
)
from powertrip.learning.local_optim import LocalOptimizer
from powertrip.selection.registry import validate_policy_name
from powertrip.services.common.config import (
    ConfigError,
    CurtailSettings,
    DeviceSettings,
    ServiceConfig,
    config_error,
    env_name,
)
from powertrip.workloads import validate_workload


class AggregatorConfig(ServiceConfig, CurtailSettings, DeviceSettings):
    profiler_addr: str  # host:port of the profiler
    # powertrip: PowerTrip's rounds over the experiment preset; curtailment: the elastic,
    # curtailment-aware run of docs/curtailment.md over POWERTRIP_CURTAIL_PRESET, availability
    # from the profiler
    mode: Literal["powertrip", "curtailment"] = "powertrip"
    curtail_policy: Literal["curtailment", "combined"] = "curtailment"
    policy: str = "powertrip"
    clock: Literal["emulated", "wall"] = "emulated"
    # Emulated clock only: run-clock seconds per wall second. After each round the run waits
    # until wall time since training began reaches clock / pace, so a Prometheus scraping at a
    # normal interval sees the run unfold; 0 = as fast as possible. Results are the same.
    pace: float = Field(0.0, ge=0, allow_inf_nan=False)
    preset: str = "quick"
    num_sites: int | None = Field(None, ge=1)
    num_samples: int | None = Field(None, ge=100)
    # The workload and its data (default: the preset's, synthetic MNIST-1D). Workers rebuild the
    # same partition from this run's config, so they must see the dataset at the same path.
    workload: Annotated[str, AfterValidator(validate_workload)] | None = None  # or MODULE:ATTR
    dataset_path: Path | None = None
    partition: Partition | None = None
    model_size: ModelSize | None = None  # the lm workload's size
    seed: int | None = None
    target_accuracy: float | None = Field(None, gt=0, le=1)
    max_rounds: int | None = Field(None, ge=1)
    update_gb: float | None = Field(None, ge=0)
    ideal_compute_s: float | None = Field(None, gt=0)
    k_star: int | None = Field(None, ge=1)  # for static-optimal / random
    # Aggregation rule (powertrip/robust.py, docs/robust-aggregation.md): fedavg (default,
    # streamed) or trimmed-mean / median (hold every update); checked by experiment()
    aggregation: Literal["fedavg", "trimmed-mean", "median"] | None = None
    clip_norm: float | None = None
    trim_beta: float | None = None
    # The outer step after the aggregate (powertrip/outer_step.py): fedavg (default) or
    # nesterov, with its lr and momentum; PowerTrip mode, checked by experiment()
    outer: Literal["fedavg", "nesterov"] | None = None
    outer_lr: float | None = None
    outer_momentum: float | None = None
    # Each site's local optimizer (powertrip/learning/local_optim.py) as JSON, e.g.
    # {"name": "adamw", "lr": 0.001}; handed to the workers in the run's configuration
    local_optimizer: LocalOptimizer | None = None
    # Uploads' flow control (services/aggregator/upload_flow.py): each upload gets credit for
    # its site's measured bandwidth x RTT, capped by the receive budget shared among the uploads
    # in flight (buffered uploads hold about one budget however many send at once) and by the
    # transport window, the most one stream may have in flight (32 MiB: ~670 MB/s at 50 ms),
    # which also bounds a worker that ignores its credit. Raise both for fatter long links.
    stream_window_mib: int = Field(32, ge=1)
    receive_budget_mib: int = Field(32, ge=1)
    # Wall clock: expected local training time at full power, for ranking before measurement.
    wall_tau_s: float = Field(1.0, gt=0)
    round_deadline_s: float = Field(120.0, gt=0)  # wall seconds a round waits for updates
    registration_timeout_s: float = Field(300.0, gt=0)
    min_sites: int | None = Field(None, ge=1)  # sites to wait for; default: every site
    max_failed_rounds: int = Field(3, ge=1)  # this many failed rounds in a row: FAILED
    # Liveness (docs/liveness.md). A worker is alive while its last heartbeat is at most
    # heartbeat_patience x heartbeat_s + 1 s old; POWERTRIP_HEARTBEAT_S is the variable the
    # workers beat at, so one environment file sets both sides.
    heartbeat_s: float = Field(2.0, gt=0)
    heartbeat_patience: float = Field(2.0, ge=1)
    # Quorum: a round closing with fewer accepted updates fails (model unchanged). Keep it at
    # or below the sites a round selects, or every round fails.
    min_contributions: int = Field(1, ge=1)
    # The profiler's circuit breaker: after a failed call, rounds use the cached profile at once
    # and the profiler is asked again only after profiler_retry_s; a cached profile older than
    # profiler_stale_s holds new rounds until the profiler answers.
    profiler_retry_s: float = Field(15.0, gt=0)
    profiler_stale_s: float = Field(600.0, gt=0)
    checkpoint_dir: str = "checkpoints"  # "" disables checkpoints
    # When checkpoints exist but none verifies (checksum, format), start over from round 0
    # (the bad ones are renamed *.rejected) instead of refusing to start (exit code 3). No
    # effect when one verifies or there are none.
    start_fresh: bool = False
    exit_when_done: bool = False
    # SIGTERM to exit 0: no new round, the open one finished or abandoned, the port closed;
    # keep it below the orchestrator's kill timeout (Kubernetes: 30 s by default)
    shutdown_grace_s: float = Field(10.0, gt=0)
    # Comma-separated worker ids admitted to the run; unset admits any worker (with TLS: any
    # holder of a certificate from the CA, under its own name).
    allowed_workers: str | None = None
    allowed_workers_file: str | None = None  # one id per line; re-read on change
    # Which sites each worker id may host, "w0=0-3;w1=4-7" (site lists as in POWERTRIP_SITES),
    # or a file of "w0: 0-3" lines re-read on change; one or the other. A claim of a site not
    # assigned to the claimant is refused, and only the workers named may join. Unset: sites
    # are first-come (docs/site-ownership.md).
    site_owners: str | None = None
    site_owners_file: str | None = None

    @property
    def lease_s(self) -> float:
        """How old a worker's last heartbeat may be while it still counts as alive."""
        return self.heartbeat_patience * self.heartbeat_s + 1.0

    @property
    def allowed_worker_ids(self) -> frozenset[str] | None:
        if not self.allowed_workers:
            return None
        return frozenset(w.strip() for w in self.allowed_workers.split(",") if w.strip())

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        validate_policy_name(v)
        return v

    @field_validator(
        "workload",
        "dataset_path",
        "partition",
        "model_size",
        "aggregation",
        "clip_norm",
        "trim_beta",
        "outer",
        "outer_lr",
        "outer_momentum",
        mode="before",
    )
    @classmethod
    def _empty_run_setting_is_unset(cls, v: object) -> object:
        # Not named _empty_is_unset: that would replace ServiceConfig's validator of the same
        # name, and POWERTRIP_TLS_*="" would no longer mean unset in the aggregator.
        return v or None

    @model_validator(mode="after")
    def _workload_has_its_data(self) -> AggregatorConfig:
        # Checked on names only; that the path exists, by experiment() at the service's start
        # (so a deployment's config still validates on a machine without the volume).
        if needs_dataset_path(self.workload) and self.dataset_path is None:
            raise ValueError(
                f"POWERTRIP_WORKLOAD={self.workload} needs POWERTRIP_DATASET_PATH "
                "(datasets are mounted, never downloaded)"
            )
        if self.workload == "lm" and self.partition not in (None, "iid"):
            raise ValueError(
                "POWERTRIP_WORKLOAD=lm has no labels to split by: POWERTRIP_PARTITION=iid"
            )
        return self

    @field_validator("local_optimizer", mode="before")
    @classmethod
    def _recipe_is_json(cls, v: object) -> object:
        return (json.loads(v) if v.strip() else None) if isinstance(v, str) else v

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
            lm_iid = "iid" if self.workload == "lm" else None
            return self._build(self.partition or lm_iid).num_sites
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
        """The curtailment run: its preset, with this service's sample count and seed."""
        return self.curtail_config(num_samples=self.num_samples, seed=self.seed)

    def experiment(self) -> ExperimentConfig:
        """The run: the preset plus these overrides; ConfigError naming the variable when the
        dataset is missing here or the combination is invalid."""
        if self.dataset_path is not None and not self.dataset_path.exists():
            var = env_name("dataset_path")
            raise ConfigError(f"{var}={str(self.dataset_path)!r}: no such file or directory")
        partition = self.partition
        if self.workload == "lm" and partition is None:
            partition = "iid"  # the presets' label skew does not apply to a text corpus
        try:
            return self._build(partition)
        except ValidationError as exc:
            raise config_error(exc, {}) from None

    def _build(self, partition: str | None) -> ExperimentConfig:
        return build_config(
            self.preset,
            workload=self.workload,
            dataset_path=self.dataset_path,
            model_size=self.model_size,
            num_sites=self.num_sites,
            num_samples=self.num_samples,
            partition=partition,
            seed=self.seed,
            target_accuracy=self.target_accuracy,
            max_rounds=self.max_rounds,
            update_gb=self.update_gb,
            ideal_compute_s=self.ideal_compute_s,
            policies=(self.policy,),
            static_sweep=(self.k_star,) if self.k_star else None,
            aggregation=self.aggregation,
            clip_norm=self.clip_norm,
            trim_beta=self.trim_beta,
            outer=self.outer,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
            local_optimizer=self.local_optimizer,
        )
