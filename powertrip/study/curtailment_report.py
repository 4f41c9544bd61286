"""What a curtailment study leaves behind: one row per run (time, quality, energy, emissions),
the single-site baselines per region, and the timelines the plots are drawn from."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from powertrip.curtailment.availability import availability_events
from powertrip.study.curtailment import CurtailmentStudy

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


def _num(v: float | None, digits: int = 4) -> str:
    return "" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def write_curtailment_outputs(study: CurtailmentStudy, out_dir: Path) -> dict[str, Path]:
    """runs.csv, baselines.csv, rounds.csv, availability.csv, modes.csv, summary.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {k: out_dir / f"{k}.csv" for k in ("runs", "baselines", "rounds", "availability")}
    paths["modes"] = out_dir / "modes.csv"
    paths["summary"] = out_dir / "summary.json"
    rows = run_rows(study)
    regions = list(study.single_site)
    with paths["runs"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
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
                *[f"emissions_vs_single_{r}" for r in regions],
            ]
        )
        for r in rows:
            w.writerow(
                [
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
            )
    with paths["baselines"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["region", "energy_kwh", "emissions_kg", "curtailed_energy_share"])
        for region, e in study.single_site.items():
            w.writerow([region, _num(e.energy_kwh), _num(e.emissions_kg), _num(e.curtailed_share)])
    with paths["rounds"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
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
            ]
        )
        for name, res in study.results.items():
            run = res.run
            for r in run.rounds:
                names = [run.sites[x.site].name for x in r.work]
                w.writerow(
                    [
                        name,
                        r.index,
                        f"{r.start_s:.1f}",
                        f"{r.train_start_s:.1f}",
                        f"{r.stop_s:.1f}",
                        f"{r.end_s:.1f}",
                        ";".join(names),
                        ";".join(str(x.steps) for x in r.work),
                        sum(len(x.rows) for x in r.work),
                        ";".join(run.sites[x.site].name for x in r.work if x.left),
                        f"{r.accuracy:.4f}",
                        f"{r.loss:.4f}",
                    ]
                )
    with paths["availability"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "hours", "site", "event"])
        for ev in availability_events(study.availability, study.config.hours * HOURS):
            w.writerow([f"{ev.time_s:.1f}", f"{ev.time_s / HOURS:.3f}", ev.site, ev.kind])
    with paths["modes"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "start_s", "end_s", "mode"])
        for name, res in study.results.items():
            for a, b, mode in res.run.mode_segments():
                w.writerow([name, f"{a:.1f}", f"{b:.1f}", mode])
    cfg = study.config
    summary = {
        "preset": cfg.name,
        "config": json.loads(cfg.model_dump_json()),
        "carbon_trace": {"label": study.trace.label, "source": study.trace.source},
        "data_label": "synthetic (mnist1d)" if cfg.workload == "mnist1d" else "real",
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
        "wall_seconds": round(study.wall_seconds, 2),
        "torch_threads": torch.get_num_threads(),
    }
    paths["summary"].write_text(json.dumps(summary, indent=2))
    return paths
