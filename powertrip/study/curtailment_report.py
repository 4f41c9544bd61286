"""What a curtailment study leaves behind: one row per run (time, quality, energy, emissions),
the single-site baselines per region, and the timelines the plots are drawn from."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from powertrip.curtailment.availability import availability_events
from powertrip.study.curtailment import CurtailmentStudy
from powertrip.study.files import (
    data_label,
    runtime_facts,
    summary_header,
    write_csv,
    write_json,
)

HOURS = 3600.0


@dataclass(frozen=True)
class RunRow:
    name: str
    availability: str
    sites: int
    finished: bool
    runtime_h: float
    rounds: int
    solo_rounds: int
    federated_rounds: int
    tta_h: float | None
    best_accuracy: float
    final_accuracy: float
    training_site_hours: float
    energy_kwh: float
    emissions_kg: float
    curtailed_share: float
    emissions_vs_single: dict[str, float | None]  # by region


def run_rows(study: CurtailmentStudy) -> list[RunRow]:
    rows = []
    for name, res in study.results.items():
        run, e = res.run, res.energy
        tta = run.time_to(study.target_accuracy)
        solo = sum(len(r.contributors) == 1 for r in run.rounds)
        rows.append(
            RunRow(
                name=name,
                availability=res.availability,
                sites=len(run.sites),
                finished=run.finished,
                runtime_h=run.end_s / HOURS,
                rounds=len(run.rounds),
                solo_rounds=solo,
                federated_rounds=sum(len(r.contributors) >= 2 for r in run.rounds),
                tta_h=None if tta is None else tta / HOURS,
                best_accuracy=run.best_accuracy,
                final_accuracy=run.final_accuracy,
                training_site_hours=e.training_site_hours,
                energy_kwh=e.energy_kwh,
                emissions_kg=e.emissions_kg,
                curtailed_share=e.curtailed_share,
                emissions_vs_single=study.emissions_ratios(name),
            )
        )
    return rows


def lm_quality(study: CurtailmentStudy, name: str) -> tuple[float, float]:
    """(best, final) validation loss per token of a run; perplexity is exp of it. Reported for
    the language model, whose quality is its loss, not its token accuracy."""
    losses = [loss for _, _, loss in study.results[name].run.evaluations]
    return min(losses), losses[-1]


def _num(v: float | None, digits: int = 4) -> str:
    return "" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


RUN_FIELDS = (
    "run",
    "availability",
    "sites",
    "finished",
    "runtime_hours",
    "rounds",
    "solo_rounds",
    "federated_rounds",
    "time_to_accuracy_hours",
    "best_accuracy",
    "final_accuracy",
    "training_site_hours",
    "energy_kwh",
    "emissions_kg",
    "curtailed_energy_share",
)
ROUND_FIELDS = (
    "run",
    "round",
    "start_s",
    "train_start_s",
    "stop_s",
    "end_s",
    "sites",
    "batches_per_site",
    "samples",
    "left",
    "accuracy",
    "loss",
)


def write_curtailment_outputs(study: CurtailmentStudy, out_dir: Path) -> dict[str, Path]:
    """runs.csv, baselines.csv, rounds.csv, availability.csv, modes.csv, summary.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = run_rows(study)
    regions = list(study.single_site)
    lm = study.config.workload == "lm"  # LM runs add loss and perplexity columns
    lm_fields = ("best_loss", "final_loss", "final_perplexity") if lm else ()
    paths = {
        "runs": write_csv(
            out_dir / "runs.csv",
            [*RUN_FIELDS, *[f"emissions_vs_single_{r}" for r in regions], *lm_fields],
            (_run_line(r, regions) + (_lm_cells(study, r.name) if lm else []) for r in rows),
        ),
        "baselines": write_csv(
            out_dir / "baselines.csv",
            ["region", "energy_kwh", "emissions_kg", "curtailed_energy_share"],
            (
                [region, _num(e.energy_kwh), _num(e.emissions_kg), _num(e.curtailed_share)]
                for region, e in study.single_site.items()
            ),
        ),
        "rounds": write_csv(
            out_dir / "rounds.csv",
            (*ROUND_FIELDS, "perplexity") if lm else ROUND_FIELDS,
            _round_lines(study, lm),
        ),
        "availability": write_csv(
            out_dir / "availability.csv",
            ["time_s", "hours", "site", "event"],
            (
                [f"{ev.time_s:.1f}", f"{ev.time_s / HOURS:.3f}", ev.site, ev.kind]
                for ev in availability_events(study.availability, study.config.hours * HOURS)
            ),
        ),
        "modes": write_csv(
            out_dir / "modes.csv",
            ["run", "start_s", "end_s", "mode"],
            (
                [name, f"{a:.1f}", f"{b:.1f}", mode]
                for name, res in study.results.items()
                for a, b, mode in res.run.mode_segments()
            ),
        ),
    }
    cfg = study.config
    summary = {
        **summary_header(cfg),
        "carbon_trace": {"label": study.trace.label, "source": study.trace.source},
        "data_label": data_label(cfg.workload, cfg.dataset_path),
        "sites": [
            {"name": s.name, "region": s.region, "power": s.power, "comm_s": round(s.comm_s, 3)}
            for s in study.sites
        ],
        "step_seconds": study.rounds.step_s,
        "training_samples": study.total_rows,
        "target_accuracy": study.target_accuracy,
        "single_site": {
            r: {"emissions_kg": e.emissions_kg, "curtailed_share": e.curtailed_share}
            for r, e in study.single_site.items()
        },
        "runs": [asdict(r) for r in rows],
        **({"lm_quality": _lm_summary(study)} if lm else {}),
        **runtime_facts(study.wall_seconds),
    }
    paths["summary"] = write_json(out_dir / "summary.json", summary)
    return paths


def _run_line(r: RunRow, regions: list[str]) -> list[object]:
    return [
        r.name,
        r.availability,
        r.sites,
        r.finished,
        _num(r.runtime_h),
        r.rounds,
        r.solo_rounds,
        r.federated_rounds,
        _num(r.tta_h),
        _num(r.best_accuracy),
        _num(r.final_accuracy),
        _num(r.training_site_hours),
        _num(r.energy_kwh),
        _num(r.emissions_kg),
        _num(r.curtailed_share),
        *[_num(r.emissions_vs_single[g]) for g in regions],
    ]


def _lm_summary(study: CurtailmentStudy) -> dict[str, dict[str, float]]:
    out = {}
    for name in study.results:
        best, final = lm_quality(study, name)
        out[name] = {"best_loss": best, "final_loss": final, "final_perplexity": math.exp(final)}
    return out


def _lm_cells(study: CurtailmentStudy, name: str) -> list[str]:
    best, final = lm_quality(study, name)
    return [_num(best), _num(final), _num(math.exp(final))]


def _round_lines(study: CurtailmentStudy, lm: bool) -> Iterator[list[object]]:
    for name, res in study.results.items():
        run = res.run
        for r in run.rounds:
            yield [
                name,
                r.index,
                f"{r.start_s:.1f}",
                f"{r.train_start_s:.1f}",
                f"{r.stop_s:.1f}",
                f"{r.end_s:.1f}",
                ";".join(run.sites[x.site].name for x in r.work),
                ";".join(str(x.steps) for x in r.work),
                sum(len(x.rows) for x in r.work),
                ";".join(run.sites[x.site].name for x in r.work if x.left),
                f"{r.accuracy:.4f}",
                f"{r.loss:.4f}",
                *([f"{math.exp(r.loss):.4f}"] if lm else []),
            ]
