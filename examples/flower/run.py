"""PowerTrip vs Flower's FedAvg sampling, in one Flower simulation: time-to-accuracy in emulated
datacenter hours.

    python examples/flower/run.py --nodes 20 --target 0.8 --out flower-result.json

Both strategies train the same MNIST-1D model on the same nodes (one emulated datacenter each:
power fraction, RTT, bandwidth from ``generate_sites``); FedAvg samples ``--fraction-train`` of
them at random each round as Flower does, PowerTrip chooses them by Eq. 8 and Algorithm 1.
Each round costs the emulated time of its slowest selected node (powertrip.timing). The run
prints both times to ``--target`` and their ratio, and writes them to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # task, client_app, server_app; Flower passes sys.path to Ray
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no network here, and none needed

from client_app import make_client_app  # noqa: E402
from server_app import RunConfig, make_server_app  # noqa: E402
from task import TaskConfig  # noqa: E402

from powertrip.learning.local_optim import LocalOptimizer  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    task, run = TaskConfig(), RunConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=task.nodes, help="Flower nodes (= datacenters)")
    p.add_argument("--rounds", type=int, default=run.rounds, help="round budget per strategy")
    p.add_argument("--target", type=float, default=run.target, help="test accuracy to reach")
    p.add_argument("--fraction-train", type=float, default=run.fraction_train)
    p.add_argument("--policy", default=run.policy, help="a powertrip policy name")
    p.add_argument("--partition", choices=("iid", "dirichlet"), default=task.partition)
    p.add_argument("--samples", type=int, default=task.num_samples, help="MNIST-1D samples")
    p.add_argument("--local-epochs", type=int, default=task.local_epochs)
    p.add_argument("--optimizer", choices=("sgd", "momentum", "nesterov", "adamw"), default=None,
                   help="the nodes' local optimizer, sent in the train config (default: plain "
                        "SGD at the task's lr, as without a recipe)")  # fmt: skip
    p.add_argument("--optimizer-lr", type=float, default=None,
                   help="its peak lr (default: the task's lr, 0.2)")  # fmt: skip
    p.add_argument("--ideal-compute-s", type=float, default=run.ideal_compute_s)
    p.add_argument("--update-gb", type=float, default=run.update_gb)
    p.add_argument("--seed", type=int, default=task.seed)
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help="ClientApps run at once (one CPU each)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    p.add_argument("--verbose", action="store_true", help="Flower's per-round INFO logs")
    return p.parse_args(argv)


def summarise(strategy: Any, target: float, wall_s: float) -> dict[str, Any]:
    """One strategy's run: time and rounds to target, nodes per round, the per-round record."""
    rounds = strategy.result.rounds
    reached_s = strategy.time_to(target)
    upto = strategy.result.rounds_to(target) or len(rounds)
    return {
        "name": strategy.result.policy,
        "reached": reached_s is not None,
        "time_to_target_s": reached_s,
        "time_to_target_h": None if reached_s is None else reached_s / 3600,
        "rounds_to_target": strategy.result.rounds_to(target),
        "mean_nodes_per_round": sum(r.sites for r in rounds[:upto]) / max(upto, 1),
        "final_accuracy": rounds[-1].accuracy if rounds else strategy.result.initial_accuracy,
        "wall_s": wall_s,
        "rounds": [
            {
                "round": r.round,
                "clock_h": r.time_s / 3600,
                "nodes": list(r.selected),
                "accuracy": r.accuracy,
            }  # fmt: skip
            for r in rounds
        ],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    task = TaskConfig(
        nodes=args.nodes,
        seed=args.seed,
        num_samples=args.samples,
        partition=args.partition,
        local_epochs=args.local_epochs,
    )
    optimizer = None
    if args.optimizer is not None or args.optimizer_lr is not None:
        optimizer = LocalOptimizer(name=args.optimizer or "sgd", lr=args.optimizer_lr)
    run = RunConfig(
        rounds=args.rounds,
        target=args.target,
        fraction_train=args.fraction_train,
        policy=args.policy,
        ideal_compute_s=args.ideal_compute_s,
        update_gb=args.update_gb,
        optimizer=optimizer,
    )
    from flwr.simulation import run_simulation  # after the environment above

    if not args.verbose:  # the summary below says what matters; Flower logs every message
        logging.getLogger("flwr").setLevel(logging.WARNING)

    results: dict[str, Any] = {}
    started = time.perf_counter()
    run_simulation(
        server_app=make_server_app(task, run, results),
        client_app=make_client_app(task),
        num_supernodes=task.nodes,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": args.workers, "include_dashboard": False},
        },
    )
    wall = time.perf_counter() - started
    if set(results) != {"fedavg", "powertrip"}:
        raise SystemExit(f"the simulation did not finish both strategies (got {sorted(results)})")
    out = {
        "task": task.as_dict(),
        "run": vars(run) | {"nodes": task.nodes, "optimizer": recipe_json(optimizer)},
        "wall_s": wall,
        **{k: summarise(v["strategy"], run.target, v["wall_s"]) for k, v in results.items()},
    }
    fed, pt = out["fedavg"]["time_to_target_h"], out["powertrip"]["time_to_target_h"]
    out["speedup"] = fed / pt if fed is not None and pt else None
    report(out)
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return out


def recipe_json(recipe: LocalOptimizer | None) -> dict[str, Any] | None:
    return None if recipe is None else recipe.model_dump(mode="json", exclude_none=True)


def report(out: dict[str, Any]) -> None:
    target, nodes = out["run"]["target"], out["task"]["nodes"]
    print(f"\ntime to {target:.0%} test accuracy, {nodes} nodes, emulated hours:")
    for key in ("fedavg", "powertrip"):
        r = out[key]
        when = "not reached" if not r["reached"] else f"{r['time_to_target_h']:.3f} h"
        rounds = r["rounds_to_target"] or len(r["rounds"])
        print(f"  {r['name']:<18} {when:>12}  in {rounds:>3} rounds, "
              f"{r['mean_nodes_per_round']:.1f} nodes/round, wall {r['wall_s']:.0f} s")  # fmt: skip
    if out["speedup"] is not None:
        print(f"  PowerTrip reaches it {out['speedup']:.2f}x sooner than FedAvg sampling")
    print(f"  simulation wall time {out['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
