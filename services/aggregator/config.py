"""Aggregator settings (POWERTRIP_* environment variables).

The training run itself is an experiment configuration (``powertrip.experiment``): a preset
plus the overrides below, so the service and ``powertrip experiment`` share one definition.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from powertrip.curtailment.config import CurtailmentConfig
from powertrip.experiment import ExperimentConfig, build_config
from powertrip.selection.registry import validate_policy_name
from services.common.config import CurtailSettings, DeviceSettings, ServiceConfig


class AggregatorConfig(ServiceConfig, CurtailSettings, DeviceSettings):
    profiler_addr: str  # host:port of the profiler
    # powertrip: PowerTrip's rounds over the experiment preset; curtailment: the elastic,
    # curtailment-aware run of docs/curtailment.md over POWERTRIP_CURTAIL_PRESET, availability
    # from the profiler
    mode: Literal["powertrip", "curtailment"] = "powertrip"
    curtail_policy: Literal["curtailment", "combined"] = "curtailment"
    policy: str = "powertrip"
    clock: Literal["emulated", "wall"] = "emulated"
    preset: str = "quick"
    num_sites: int | None = Field(None, ge=1)
    num_samples: int | None = Field(None, ge=100)
    partition: Literal["iid", "dirichlet", "natural"] | None = None
    seed: int | None = None
    target_accuracy: float | None = Field(None, gt=0, le=1)
    max_rounds: int | None = Field(None, ge=1)
    update_gb: float | None = Field(None, ge=0)
    ideal_compute_s: float | None = Field(None, gt=0)
    k_star: int | None = Field(None, ge=1)  # for static-optimal / random
    # Wall clock: expected local training time at full power, for ranking before measurement.
    wall_tau_s: float = Field(1.0, gt=0)
    round_deadline_s: float = Field(120.0, gt=0)  # wall seconds a round waits for updates
    registration_timeout_s: float = Field(300.0, gt=0)
    min_sites: int | None = Field(None, ge=1)  # sites to wait for; default: every site
    max_failed_rounds: int = Field(3, ge=1)  # this many rounds in a row with no update: FAILED
    checkpoint_dir: str = "checkpoints"  # "" disables checkpoints
    exit_when_done: bool = False
    # Comma-separated worker ids admitted to the run; unset admits any worker (with TLS: any
    # holder of a certificate from the CA, under its own name).
    allowed_workers: str | None = None

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

    @model_validator(mode="after")
    def _curtailment_runs_on_the_emulated_clock(self) -> AggregatorConfig:
        if self.mode == "curtailment" and self.clock != "emulated":
            raise ValueError("POWERTRIP_MODE=curtailment needs POWERTRIP_CLOCK=emulated")
        return self

    def curtailment(self) -> CurtailmentConfig:
        """The curtailment run: its preset, with this service's sample count and seed."""
        return self.curtail_config(num_samples=self.num_samples, seed=self.seed)

    def experiment(self) -> ExperimentConfig:
        return build_config(
            self.preset,
            num_sites=self.num_sites,
            num_samples=self.num_samples,
            partition=self.partition,
            seed=self.seed,
            target_accuracy=self.target_accuracy,
            max_rounds=self.max_rounds,
            update_gb=self.update_gb,
            ideal_compute_s=self.ideal_compute_s,
            policies=(self.policy,),
            static_sweep=(self.k_star,) if self.k_star else None,
        )
