"""The ServerApp: both strategies, one after the other, on the same nodes of one simulation.

Running them in one ServerApp means one Ray start-up, and the same nodes, data, initial model
and site profiles for both: Flower's FedAvg sampling (``TimedFedAvg``, ``fraction_train`` of the
nodes at random each round) first, then PowerTrip (``PowerTripStrategy``). Both evaluate the
global model centrally on the MNIST-1D test set after each round and stop once it reaches the
target, so each run's emulated clock at that round is its time-to-accuracy. Both send the
same local optimizer recipe (``RunConfig.optimizer``) in their train config, if one is set.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from task import TaskConfig, evaluate, load_task

from powertrip.integrations.flower import (
    DEFAULT_POLICY,
    PowerTripStrategy,
    ReportedProperties,
    TimedFedAvg,
)
from powertrip.learning.local_optim import LocalOptimizer


@dataclass(frozen=True)
class RunConfig:
    """The emulation and the protocol (the task's own settings are in ``TaskConfig``)."""

    rounds: int = 40  # upper bound per strategy; each stops at the target
    target: float = 0.8
    fraction_train: float = 1.0  # Flower FedAvg's default: every node trains every round
    policy: str = DEFAULT_POLICY  # powertrip-noise; "powertrip-paper": Eq. 8 + Algorithm 1
    ideal_compute_s: float = 50.0  # tau, powertrip's default: local training at full power
    update_gb: float = 1.5  # the paper's update size; the emulated link carries this much
    #: the nodes' local optimizer, sent in every train config; None: plain SGD at the task's lr
    optimizer: LocalOptimizer | None = None


def make_server_app(task: TaskConfig, run: RunConfig, results: dict[str, Any]) -> ServerApp:
    """A ServerApp that fills ``results`` (same process: Flower runs the ServerApp in a thread)."""
    app = ServerApp()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        accuracy, loss = evaluate(task, arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def emulation() -> dict[str, Any]:
        return {
            "profiles": ReportedProperties(),  # each node reports its site once
            "ideal_compute_s": run.ideal_compute_s,
            "update_bytes": run.update_gb * 1e9,
            "stop_at_accuracy": run.target,
            "fraction_evaluate": 0.0,  # centralized evaluation scores the rounds
            "min_available_nodes": task.nodes,
            "seed": task.seed,
            "local_optimizer": run.optimizer,
        }

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        initial = load_task(task).initial_params
        random.seed(task.seed)  # Flower's FedAvg samples nodes with the random module
        strategies = {
            "fedavg": TimedFedAvg(fraction_train=run.fraction_train, **emulation()),
            "powertrip": PowerTripStrategy(run.policy, **emulation()),
        }
        for name, strategy in strategies.items():
            started = time.perf_counter()
            strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord(initial),
                num_rounds=run.rounds,
                train_config=ConfigRecord({}),
                evaluate_fn=evaluate_fn,
            )
            results[name] = {
                "strategy": strategy,
                "wall_s": time.perf_counter() - started,
            }

    return app
