"""The Flower baseline: Flower's simulation engine (Ray) on the training section's workload.

Run as a script by ``flower.py``; prints one JSON line with the per-round seconds. Each node is
a ClientApp training its partition with one ``nn.Module`` and ``torch.optim.SGD``
(``bench_site_training.train_one_by_one``, the usual Flower client) from the emulator's own
federation (same data, partitions, model and batch order); the server is Flower's ``FedAvg``
with every node training every round and no evaluation. A round is timed from
``configure_train`` to the end of ``aggregate_train`` (messages, training, FedAvg); Ray's
start-up and each strategy's first round (actors loading the data) are not counted.

    python benchmarks/suite/flower_sim.py --rounds 4 --workers 2
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parents[1]), str(HERE.parent)):  # Flower passes sys.path on to Ray
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import torch  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from benchmarks.suite.training import SEED, STEPS, Workload, workload  # noqa: E402
from powertrip.rounds.emulate import site_seed  # noqa: E402


@functools.cache
def _task(steps: int, sites: int) -> Workload:
    torch.set_num_threads(1)  # one CPU per ClientApp actor
    return workload(steps, sites)


def make_client_app(sites: int) -> ClientApp:
    from bench_site_training import train_one_by_one

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = int(context.node_config["partition-id"])
        config = msg.content["config"]
        w = _task(int(config["local-steps"]), sites)
        params = msg.content["arrays"].to_torch_state_dict()
        part = w.fed.partitions[node]
        seed = site_seed(SEED, 1, node)  # the emulator's first-round seed for this site
        deltas = train_one_by_one(
            w.fed.trainer, w.model, params, w.fed.x_train, w.fed.y_train, [part], [seed]
        )
        new = {k: params[k] + deltas[k][0] for k in params}
        metrics = MetricRecord({"num-examples": len(part)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


class TimedRounds(FedAvg):
    """Flower's FedAvg, unchanged, with each round's wall time recorded."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started: dict[int, float] = {}
        self.seconds: list[float] = []
        self.failed = 0  # replies that carry an error instead of a trained model

    def configure_train(self, server_round, arrays, config, grid):  # type: ignore[no-untyped-def]
        self.started[server_round] = time.perf_counter()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
        replies = list(replies)
        self.failed += sum(r.has_error() for r in replies)
        out = super().aggregate_train(server_round, replies)
        self.seconds.append(time.perf_counter() - self.started[server_round])
        return out


def make_server_app(sites: int, rounds: int, results: dict[str, Any]) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        initial = _task(STEPS[0], sites).fed.initial_params
        for steps in STEPS:
            strategy = TimedRounds(
                fraction_train=1.0,
                fraction_evaluate=0.0,
                min_train_nodes=sites,
                min_available_nodes=sites,
            )
            strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord(initial),
                num_rounds=rounds,
                train_config=ConfigRecord({"local-steps": steps}),
            )
            results[str(steps)] = strategy.seconds
            results[f"failed-{steps}"] = strategy.failed

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=4, help="per step count; the first is warm-up")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    from flwr.simulation import run_simulation

    # Ray's actors unpickle the apps by module name, which "__main__" is not for them: take
    # the apps from this file imported under its package name.
    from benchmarks.suite import flower_sim as apps

    logging.getLogger("flwr").setLevel(logging.WARNING)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    run_simulation(
        server_app=apps.make_server_app(args.sites, args.rounds, results),
        client_app=apps.make_client_app(args.sites),
        num_supernodes=args.sites,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": args.workers, "include_dashboard": False},
        },
    )
    out = {"rounds": results, "wall_s": time.perf_counter() - started, "workers": args.workers}
    print("FLOWER_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
