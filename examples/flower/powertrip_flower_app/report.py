"""What the ServerApp reports: each strategy's time and rounds to the target, in emulated hours
(Flower's log, and a JSON file when the run config's ``result-path`` is set)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from powertrip.integrations.flower import TimedFedAvg
from powertrip_flower_app.task import TaskConfig


def summarise(strategy: TimedFedAvg, target: float, wall_s: float) -> dict[str, Any]:
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
        "rounds_run": len(rounds),
        "mean_nodes_per_round": sum(r.sites for r in rounds[:upto]) / max(upto, 1),
        "final_accuracy": rounds[-1].accuracy if rounds else strategy.result.initial_accuracy,
        "wall_s": wall_s,
        "rounds": [
            {
                "round": r.round,
                "clock_h": r.time_s / 3600,
                "nodes": list(r.selected),
                "accuracy": r.accuracy,
            }
            for r in rounds
        ],
    }


def speedup(results: dict[str, dict[str, Any]]) -> float | None:
    """FedAvg's time to the target over PowerTrip's (None unless both reached it)."""
    if "fedavg" not in results or "powertrip" not in results:
        return None
    fed, pt = results["fedavg"]["time_to_target_h"], results["powertrip"]["time_to_target_h"]
    return fed / pt if fed is not None and pt else None


def report(results: dict[str, dict[str, Any]], target: float, nodes: int) -> list[str]:
    """The summary lines the ServerApp logs at the end."""
    lines = [f"time to {target:.0%} test accuracy, {nodes} nodes, emulated hours:"]
    for r in results.values():
        when = "not reached" if not r["reached"] else f"{r['time_to_target_h']:.3f} h"
        lines.append(
            f"  {r['name']:<18} {when:>12}  in {r['rounds_run']:>3} rounds, "
            f"{r['mean_nodes_per_round']:.1f} nodes/round, wall {r['wall_s']:.0f} s"
        )
    if (ratio := speedup(results)) is not None:
        lines.append(f"  PowerTrip reaches it {ratio:.2f}x sooner than FedAvg sampling")
    return lines


def write_json(
    path: Path, task: TaskConfig, run_config: dict[str, Any], results: dict[str, dict[str, Any]]
) -> None:
    out = {"task": task.as_dict(), "run": run_config, **results, "speedup": speedup(results)}
    path.write_text(json.dumps(out, indent=2) + "\n")
