"""The ServerApp: Flower's FedAvg sampling and PowerTrip, one after the other, on the same nodes.

Running both in one ServerApp gives them the same nodes, data, initial model and site profiles:
Flower's FedAvg sampling (``TimedFedAvg``, ``fraction-train`` of the nodes at random each
round) first, then PowerTrip (``PowerTripStrategy``). Both evaluate the global model centrally
on the MNIST-1D test set after each round and end their run at the round that reaches
``target-accuracy``, so each one's emulated clock at that round is its time-to-accuracy. Every
setting comes from the run config (pyproject.toml, ``powertrip flower run . --run-config ...``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from powertrip.config.recipe import LocalOptimizer
from powertrip.integrations.flower import PowerTripStrategy, ReportedProperties, TimedFedAvg
from powertrip_flower_app.report import report, summarise, write_json
from powertrip_flower_app.task import TaskConfig, evaluate, load_task, task_config

STRATEGIES = ("fedavg", "powertrip")
NODE_WAIT_S = 120.0  # how long the ServerApp waits for the federation's nodes to connect

app = ServerApp()


def local_optimizer(run_config: Mapping[str, Any]) -> LocalOptimizer | None:
    """The recipe both strategies send in every train config; None: plain SGD (no recipe)."""
    name, lr = str(run_config["optimizer"]), float(run_config["optimizer-lr"])
    if not name and not lr:
        return None
    return LocalOptimizer(name=name or "sgd", lr=lr or None)


def make_strategy(name: str, task: TaskConfig, run_config: Mapping[str, Any]) -> TimedFedAvg:
    """``fedavg`` (Flower's sampling, timed) or ``powertrip`` (the policy's nodes)."""
    emulation: dict[str, Any] = {
        "profiles": ReportedProperties(timeout=float(run_config["property-timeout-s"])),
        "ideal_compute_s": float(run_config["ideal-compute-s"]),
        "update_bytes": float(run_config["update-gb"]) * 1e9,
        "stop_at_accuracy": float(run_config["target-accuracy"]),
        "fraction_evaluate": 0.0,  # the centralized evaluation scores the rounds
        "min_available_nodes": task.nodes,
        "seed": task.seed,
        "local_optimizer": local_optimizer(run_config),
    }
    if name == "fedavg":
        return TimedFedAvg(fraction_train=float(run_config["fraction-train"]), **emulation)
    if name == "powertrip":
        return PowerTripStrategy(str(run_config["policy"]), **emulation)
    raise ValueError(f"unknown strategy {name!r} in the run config's strategies: {STRATEGIES}")


def wait_for_nodes(grid: Grid, nodes: int) -> None:
    """Wait until the federation's ``nodes`` nodes are connected; a federation of another size
    is refused (each node stands for one of ``num-nodes`` sites)."""
    deadline = time.monotonic() + NODE_WAIT_S
    connected = len(list(grid.get_node_ids()))
    while connected < nodes and time.monotonic() < deadline:
        time.sleep(1.0)
        connected = len(list(grid.get_node_ids()))
    if connected != nodes:
        raise RuntimeError(
            f"the federation has {connected} nodes and the run config's num-nodes is {nodes}: "
            f'run with --federation-config "num-supernodes={nodes}"'
        )


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_config = context.run_config
    task = task_config(run_config, int(run_config["num-nodes"]))
    names = [n.strip() for n in str(run_config["strategies"]).split(",") if n.strip()]
    target = float(run_config["target-accuracy"])
    wait_for_nodes(grid, task.nodes)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        accuracy, loss = evaluate(task, arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    initial = load_task(task).initial_params
    random.seed(task.seed)  # Flower's FedAvg samples nodes with the random module
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        strategy = make_strategy(name, task, run_config)
        started = time.perf_counter()
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(initial),
            num_rounds=int(run_config["num-server-rounds"]),
            train_config=ConfigRecord({}),
            evaluate_fn=evaluate_fn,
        )
        results[name] = summarise(strategy, target, time.perf_counter() - started)
    for line in report(results, target, task.nodes):
        log(INFO, "%s", line)
    if path := str(run_config["result-path"]):
        write_json(Path(path), task, dict(run_config), results)
