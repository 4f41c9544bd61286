"""What a study leaves behind: the results table, machine-readable files in the output folder."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from powertrip.learning.lm_eval import bits_per_byte as lm_bits_per_byte
from powertrip.rounds.loop import RunResult
from powertrip.sites.profiles import site_id
from powertrip.study.files import (
    data_label,
    json_safe,
    runtime_facts,
    summary_header,
    write_csv,
    write_json,
)
from powertrip.study.powertrip import RunSummary, StudyResult

RESULT_FIELDS = [
    "policy",
    "repeat",
    "seed",
    "time_to_accuracy_seconds",
    "time_to_accuracy_hours",
    "rounds",
    "reached_target",
    "rounds_run",
    "mean_sites",
    "max_sites",
    "final_accuracy",
    "best_accuracy",
    "power_model",
    "energy_kwh",
    "emissions_kg",
    "electricity_cost_usd",
]


@dataclass(frozen=True)
class PolicyRow:
    """One line of the results table: a policy aggregated over repeats."""

    policy: str
    tta_mean_s: float | None
    tta_std_s: float | None
    reached: int
    repeats: int
    rounds_mean: float | None
    mean_sites: float
    max_sites: int
    ratio_to_static_optimal: float | None
    #: means over the runs that reached the target, up to it (powertrip.footprint); None when
    #: none did or the policy has no grid (centralized)
    energy_kwh: float | None = None
    emissions_kg: float | None = None
    cost_usd: float | None = None
    #: an LM's validation bits per byte after its last round, mean over repeats; else None
    bits_per_byte: float | None = None


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values))


def policy_table(result: StudyResult) -> list[PolicyRow]:
    """Rows in the order the policies were asked for (sweep points are left to the sweep plot)."""
    by_policy: dict[str, list[RunSummary]] = {}
    for s in result.summaries:
        by_policy.setdefault(s.policy, []).append(s)
    static = by_policy.get("static-optimal", [])
    static_mean = _stats([t for s in static if (t := s.time_to_accuracy_s) is not None])[0]
    rows = []
    for name in result.config.policies:
        runs = by_policy.get(name, [])
        ttas = [s.time_to_accuracy_s for s in runs if s.time_to_accuracy_s is not None]
        mean, std = _stats(ttas)
        rounds = [float(s.rounds) for s in runs if s.rounds is not None]
        priced = [s.footprint for s in runs if s.reached and s.footprint is not None]
        ratio = None
        if mean is not None and static_mean and len(ttas) == len(runs):
            ratio = mean / static_mean
        rows.append(
            PolicyRow(
                policy=name,
                tta_mean_s=mean,
                tta_std_s=std,
                reached=len(ttas),
                repeats=len(runs),
                rounds_mean=_stats(rounds)[0],
                mean_sites=float(np.mean([s.mean_sites for s in runs])) if runs else 0.0,
                max_sites=max((s.max_sites for s in runs), default=0),
                ratio_to_static_optimal=ratio,
                energy_kwh=_stats([f.energy_kwh for f in priced])[0],
                emissions_kg=_stats([f.emissions_kg for f in priced])[0],
                cost_usd=_stats([f.cost_usd for f in priced])[0],
                bits_per_byte=_stats(final_bits_per_byte(result, name))[0],
            )
        )
    return rows


def bits_per_byte(result: StudyResult, loss: float) -> float | None:
    """A mean validation loss per token of the study's LM as bits per byte; None for other
    workloads and for token ids whose bytes are unknown (``lm_eval.validation_bytes``)."""
    if result.lm_validation is None:
        return None
    return lm_bits_per_byte(loss, *result.lm_validation)


def final_bits_per_byte(result: StudyResult, policy: str) -> list[float]:
    """Bits per byte after the last round of each of ``policy``'s runs (static-optimal's are
    static-k*'s); empty when the workload is not an LM."""
    name = f"static-{result.k_star}" if policy == "static-optimal" else policy
    out = []
    for _, run in result.runs:
        if run.policy == name and run.rounds:
            bpb = bits_per_byte(result, run.rounds[-1].loss)
            if bpb is not None:
                out.append(bpb)
    return out


def sweep_table(result: StudyResult) -> list[tuple[int, float | None, float | None, int, int]]:
    """(k, mean TTA s, std, reached, repeats) for each point of the static sweep."""
    out = []
    for k in result.config.effective_sweep:
        runs = [s for s in result.summaries if s.policy == f"static-{k}"]
        if not runs:
            continue
        ttas = [s.time_to_accuracy_s for s in runs if s.time_to_accuracy_s is not None]
        mean, std = _stats(ttas)
        out.append((k, mean, std, len(ttas), len(runs)))
    return out


ROUND_FIELDS = (
    "policy",
    "repeat",
    "round",
    "time_seconds",
    "duration_seconds",
    "sites",
    "accuracy",
    "loss",
    "selected",
)


def result_fields(result: StudyResult) -> list[str]:
    return [*RESULT_FIELDS, "final_bits_per_byte"] if result.lm_validation else RESULT_FIELDS


def round_fields(result: StudyResult) -> list[str]:
    lm = result.config.workload == "lm"  # an LM's rounds also report perplexity = exp(loss)
    bpb = result.lm_validation is not None
    return [*ROUND_FIELDS, *(["perplexity"] if lm else []), *(["bits_per_byte"] if bpb else [])]


def _replaced(path: Path, write: Any) -> Path:
    """``write(tmp)`` then rename over ``path``: a reader (or a crash) sees the old table or
    the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)
    return path


def write_outputs(result: StudyResult, out_dir: Path) -> dict[str, Path]:
    """results.csv (policy x repeat), rounds.csv (every round), summary.json (table + config).
    An LM's runs also report bits per byte (final, per round) and its rounds perplexity. The
    tables replace the ones a ``StudyLog`` grew run by run, rows in the study's order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lm = result.config.workload == "lm"
    paths = {
        "results": _replaced(
            out_dir / "results.csv",
            lambda p: write_csv(
                p, result_fields(result), (result_row(result, s) for s in result.summaries)
            ),
        ),
        "rounds": _replaced(
            out_dir / "rounds.csv",
            lambda p: write_csv(p, round_fields(result), _round_lines(result, lm)),
        ),
    }
    summary = {
        **summary_header(result.config),
        "target_accuracy": result.target_accuracy,
        "k_star": result.k_star,
        "data_label": data_label(result.config.workload, result.config.dataset_path),
        "power_model": result.power_label,
        **runtime_facts(result.wall_seconds),
        "trajectory_cache": {"hits": result.cache_hits, "misses": result.cache_misses},
        "policies": [
            {k: json_safe(v) for k, v in asdict(row).items()} for row in policy_table(result)
        ],
        "static_sweep": [
            {"k": k, "tta_mean_s": m, "tta_std_s": s, "reached": n, "repeats": r}
            for k, m, s, n, r in sweep_table(result)
        ],
        **({"lm_quality": _lm_quality(result)} if lm else {}),
    }
    paths["summary"] = write_json(out_dir / "summary.json", summary)
    return paths


def result_row(result: StudyResult, s: RunSummary) -> dict[str, object]:
    tta = s.time_to_accuracy_s
    return {
        "policy": s.policy,
        "repeat": s.repeat,
        "seed": s.seed,
        "time_to_accuracy_seconds": "" if tta is None else f"{tta:.3f}",
        "time_to_accuracy_hours": "" if tta is None else f"{tta / 3600:.5f}",
        "rounds": "" if s.rounds is None else s.rounds,
        "reached_target": s.reached,
        "rounds_run": s.rounds_run,
        "mean_sites": f"{s.mean_sites:.2f}",
        "max_sites": s.max_sites,
        "final_accuracy": f"{s.final_accuracy:.4f}",
        "best_accuracy": f"{s.best_accuracy:.4f}",
        "power_model": result.power_label,
        **_footprint_cells(s),
        **({"final_bits_per_byte": _bpb_cell(result, s)} if result.lm_validation else {}),
    }


def _bpb_cell(result: StudyResult, s: RunSummary) -> str:
    """The run's final bits per byte (a summary of static-optimal is static-k*'s run)."""
    policy = f"static-{result.k_star}" if s.policy == "static-optimal" else s.policy
    for rep, run in result.runs:
        if rep == s.repeat and run.policy == policy and run.rounds:
            bpb = bits_per_byte(result, run.rounds[-1].loss)
            return "" if bpb is None else f"{bpb:.4f}"
    return ""


def _footprint_cells(s: RunSummary) -> dict[str, str]:
    f = s.footprint
    if f is None:
        return {"energy_kwh": "", "emissions_kg": "", "electricity_cost_usd": ""}
    return {
        "energy_kwh": f"{f.energy_kwh:.3f}",
        "emissions_kg": f"{f.emissions_kg:.4f}",
        "electricity_cost_usd": f"{f.cost_usd:.4f}",
    }


def _lm_quality(result: StudyResult) -> list[dict[str, object]]:
    """Validation loss per token and perplexity after the first and the last round of every LM
    run."""
    out: list[dict[str, object]] = []
    for rep, run in result.runs:
        if not run.rounds:
            continue
        first, last = run.rounds[0].loss, run.rounds[-1].loss
        out.append(
            {
                "policy": run.policy,
                "repeat": rep,
                "first_round_loss": first,
                "final_loss": last,
                "first_round_perplexity": math.exp(first),
                "final_perplexity": math.exp(last),
                "first_round_bits_per_byte": bits_per_byte(result, first),
                "final_bits_per_byte": bits_per_byte(result, last),
            }
        )
    return out


def _round_lines(result: StudyResult, lm: bool) -> Iterator[list[object]]:
    for rep, run in result.runs:
        yield from run_round_lines(result, rep, run, lm)


def run_round_lines(
    result: StudyResult, rep: int, run: RunResult, lm: bool
) -> Iterator[list[object]]:
    for r in run.rounds:
        bpb = bits_per_byte(result, r.loss)
        yield [
            run.policy,
            rep,
            r.round,
            f"{r.time_s:.3f}",
            f"{r.duration_s:.3f}",
            r.sites,
            f"{r.accuracy:.4f}",
            f"{r.loss:.4f}",
            " ".join(site_id(s) for s in r.selected),
            *([f"{math.exp(r.loss):.4f}"] if lm else []),
            *([] if bpb is None else [f"{bpb:.4f}"]),
        ]
