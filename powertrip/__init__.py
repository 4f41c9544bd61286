"""PowerTrip: train one model across datacenters whose spare power is limited, different per site
and changing.

Each round PowerTrip ranks sites by a power-to-cost score (the paper's Eq. 8), chooses how many
to use with a greedy bottom-up controller (Algorithm 1), and combines their updates with
streaming FedAvg (Eq. 2). This package is the library: the site and time model (Eqs. 3-7),
the selection policies, FedAvg, the one round loop with its executors, the trainer, traces,
curtailment-aware elastic training and the studies. It never imports gRPC: the services in
``services/`` are thin adapters over it, and ``powertrip.v1`` holds their generated stubs.

A small study, from Python::

    import powertrip as pt

    config = pt.build_config("quick", num_sites=20, static_sweep=(5, 10, 20), max_rounds=40)
    result = pt.run_study(config)
    for row in pt.policy_table(result):
        print(f"{row.policy:16s} {row.tta_mean_s / 3600:.2f} h  {row.mean_sites:.1f} sites")

Names are imported on first use, so ``import powertrip`` stays cheap (no torch until a name
that needs it is used).
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from powertrip.lazy import lazy_exports

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # the run definition
    "ExperimentConfig": "powertrip.config.experiment",
    "build_config": "powertrip.config.experiment",
    "PRESETS": "powertrip.config.presets",
    # bring your own model, data and partitioner
    "CustomWorkload": "powertrip.learning.custom",
    "Dataset": "powertrip.learning.datasets.record",
    "dataset_from_arrays": "powertrip.learning.custom",
    "dataset_from_torch": "powertrip.learning.custom",
    "register_workload": "powertrip.config.workloads",
    # the trained model as a file (safetensors + its card), and back
    "ModelCard": "powertrip.learning.model_file",
    "load_model": "powertrip.learning.model_file",
    "save_model": "powertrip.learning.model_file",
    # the system model: sites, power, links, round time (Eqs. 3-7)
    "SiteSet": "powertrip.sites.profiles",
    "SiteProfile": "powertrip.sites.profiles",
    "generate_sites": "powertrip.sites.profiles",
    "profile_at": "powertrip.sites.profiles",
    "round_time_s": "powertrip.sites.timing",
    "comm_time_s": "powertrip.sites.timing",
    "EmulatedClock": "powertrip.rounds.clock",
    "WallClock": "powertrip.rounds.clock",
    # selection: the policy interface, Eq. 8, Algorithm 1, every policy by name
    "SelectionPolicy": "powertrip.selection.base",
    "RoundContext": "powertrip.selection.base",
    "RoundFeedback": "powertrip.selection.base",
    "power_to_cost_scores": "powertrip.selection.scoring",
    "rank_sites": "powertrip.selection.scoring",
    "PowerTripGreedy": "powertrip.selection.greedy",
    "GreedyConfig": "powertrip.selection.greedy",
    "build_policy": "powertrip.selection.registry",
    "known_policy_names": "powertrip.selection.registry",
    "register_policy": "powertrip.selection.registration",
    "PolicyContext": "powertrip.selection.registration",
    # local training: bring your own optimizer rule
    "register_optimizer": "powertrip.config.optimizers",
    # aggregation (Eq. 2)
    "StreamingFedAvg": "powertrip.aggregation.fedavg",
    "UpdateRejected": "powertrip.aggregation.fedavg",
    # the one round loop and its executor protocol
    "run_rounds": "powertrip.rounds.loop",
    "RoundExecutor": "powertrip.rounds.loop",
    "RoundOutcome": "powertrip.rounds.loop",
    "RoundRecord": "powertrip.rounds.loop",
    "RunResult": "powertrip.rounds.loop",
    "TimeModel": "powertrip.rounds.loop",
    "Emulator": "powertrip.rounds.emulate",
    "EmulatedRun": "powertrip.rounds.emulate",
    # studies
    "run_study": "powertrip.study.powertrip",
    "policy_table": "powertrip.study.results",
    "write_outputs": "powertrip.study.results",
    "write_plots": "powertrip.study.plots",
    "CurtailmentConfig": "powertrip.config.curtailment",
    "build_curtail_config": "powertrip.config.curtailment",
    "run_curtailment_study": "powertrip.study.curtailment",
}

__all__ = [
    "CurtailmentConfig",
    "CustomWorkload",
    "Dataset",
    "EmulatedClock",
    "EmulatedRun",
    "Emulator",
    "ExperimentConfig",
    "GreedyConfig",
    "ModelCard",
    "PRESETS",
    "PolicyContext",
    "PowerTripGreedy",
    "RoundContext",
    "RoundExecutor",
    "RoundFeedback",
    "RoundOutcome",
    "RoundRecord",
    "RunResult",
    "SelectionPolicy",
    "SiteProfile",
    "SiteSet",
    "StreamingFedAvg",
    "TimeModel",
    "UpdateRejected",
    "WallClock",
    "build_config",
    "build_curtail_config",
    "build_policy",
    "comm_time_s",
    "dataset_from_arrays",
    "dataset_from_torch",
    "generate_sites",
    "known_policy_names",
    "load_model",
    "policy_table",
    "power_to_cost_scores",
    "profile_at",
    "rank_sites",
    "register_optimizer",
    "register_policy",
    "register_workload",
    "round_time_s",
    "run_curtailment_study",
    "run_rounds",
    "run_study",
    "save_model",
    "write_outputs",
    "write_plots",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from powertrip.aggregation.fedavg import StreamingFedAvg, UpdateRejected
    from powertrip.config.curtailment import CurtailmentConfig, build_curtail_config
    from powertrip.config.experiment import ExperimentConfig, build_config
    from powertrip.config.optimizers import register_optimizer
    from powertrip.config.presets import PRESETS
    from powertrip.config.workloads import register_workload
    from powertrip.learning.custom import CustomWorkload, dataset_from_arrays, dataset_from_torch
    from powertrip.learning.datasets.record import Dataset
    from powertrip.learning.model_file import ModelCard, load_model, save_model
    from powertrip.rounds.clock import EmulatedClock, WallClock
    from powertrip.rounds.emulate import EmulatedRun, Emulator
    from powertrip.rounds.loop import (
        RoundExecutor,
        RoundOutcome,
        RoundRecord,
        RunResult,
        TimeModel,
        run_rounds,
    )
    from powertrip.selection.base import RoundContext, RoundFeedback, SelectionPolicy
    from powertrip.selection.greedy import GreedyConfig, PowerTripGreedy
    from powertrip.selection.registration import PolicyContext, register_policy
    from powertrip.selection.registry import build_policy, known_policy_names
    from powertrip.selection.scoring import power_to_cost_scores, rank_sites
    from powertrip.sites.profiles import SiteProfile, SiteSet, generate_sites, profile_at
    from powertrip.sites.timing import comm_time_s, round_time_s
    from powertrip.study.curtailment import run_curtailment_study
    from powertrip.study.plots import write_plots
    from powertrip.study.powertrip import run_study
    from powertrip.study.results import policy_table, write_outputs
