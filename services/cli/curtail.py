"""``powertrip curtail``: the curtailment study (arXiv 2602.22760) — PowerTrip, curtailment-only and
the two combined, next to the always-on baselines. Its own command because its policies, options and
outputs (energy, emissions, availability) differ from ``powertrip experiment``'s. Bad input ends the
command with one line (exit 2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from powertrip.config.curtailment import CURTAIL_PRESETS, CurtailmentConfig, build_curtail_config
from powertrip.services.cli.common import (
    configured,
    err,
    fail,
    out,
)
from powertrip.services.cli.model_options import CURTAIL_FLAGS, curtail_options
from powertrip.services.cli.optimizer_options import optimizer_options
from powertrip.services.cli.study_command import StudyRun, study_options
from powertrip.services.cli.study_progress import CurtailProgress

if TYPE_CHECKING:
    from powertrip.study.record import StudyRecord


@click.command()
@study_options(CURTAIL_PRESETS, "curtailment", curtail_options, optimizer_options)
def curtail(study: StudyRun, **options: object) -> None:
    """Curtailment-aware elastic training on an emulated clock (arXiv 2602.22760).

    Prints time, accuracy, energy and emissions per run and writes runs.csv, baselines.csv,
    rounds.csv, availability.csv, modes.csv, summary.json and PNG plots, and each run's final
    model to models/ (load one with powertrip.load_model).
    """
    cfg = configured(
        lambda: build_curtail_config(study.preset, **options),
        "curtailment configuration",
        CURTAIL_FLAGS,
    )
    banner = (
        f"[bold]powertrip curtail[/] preset={cfg.name} policies={','.join(cfg.policies)} "
        f"carbon={cfg.carbon_trace_path or 'synthetic'}"
    )
    study.run(
        cfg, banner, lambda out_dir, kept: _run(cfg, out_dir, study.plots, study.device, kept)
    )


def _run(
    cfg: CurtailmentConfig, out_dir: Path, plots: bool, device: str, kept: StudyRecord
) -> None:
    from powertrip.learning.datasets import DatasetError
    from powertrip.study.curtailment import run_curtailment_study
    from powertrip.study.curtailment_plots import write_curtailment_plots
    from powertrip.study.curtailment_report import write_curtailment_outputs
    from powertrip.study.models import RunModels
    from powertrip.traces.io import TraceError

    models = RunModels(cfg, out_dir, "curtail")  # each run's final model, as it finishes
    try:  # per round with an ETA on a terminal, rate-limited lines elsewhere (study_progress.py)
        with CurtailProgress(err) as shown:
            study = run_curtailment_study(
                cfg,
                progress=shown.run,
                device=device,
                on_round=shown.round,
                record=kept,
                on_model=models.write_elastic,
            )
    except (TraceError, DatasetError) as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    paths = write_curtailment_outputs(study, out_dir)
    pngs = write_curtailment_plots(study, out_dir) if plots else []
    _print_table(study)
    out.print("outputs: " + "  ".join(str(p) for p in paths.values()), highlight=False)
    if pngs:
        out.print("plots: " + "  ".join(str(p) for p in pngs), highlight=False)
    out.print(f"models: {models.directory}", highlight=False)


def _print_table(study) -> None:  # noqa: ANN001 - CurtailmentStudy, imported lazily
    from powertrip.study.curtailment_report import lm_quality, run_rows

    regions = list(study.single_site)
    title = (
        f"carbon {study.trace.label} ({len(study.sites)} sites), target accuracy "
        f"{study.target_accuracy:.3f}; emissions vs one always-on site in "
        f"{'/'.join(regions)}"
    )
    table = Table(title=title, title_justify="left")
    cols = ["run", "sites", "runtime h", "done", "TTA h", "best acc", "final acc", "site-h"]
    cols += ["kWh", "kg CO2", "curtailed", "vs single site"]
    lm = study.config.workload == "lm"  # its quality is the validation loss and perplexity
    if lm:
        cols[5:7] = ["best loss", "final loss (ppl)"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("run", "vs single site") else "right")
    for r in run_rows(study):
        ratios = "/".join(
            "—" if v is None else f"{100 * v:.1f}" for v in r.emissions_vs_single.values()
        )
        quality = [f"{r.best_accuracy:.3f}", f"{r.final_accuracy:.3f}"]
        if lm:
            best, final = lm_quality(study, r.name)
            quality = [f"{best:.3f}", f"{final:.3f} ({math.exp(final):.2f})"]
        table.add_row(
            r.name,
            f"{r.sites} {r.availability}",
            f"{r.runtime_h:.2f}",
            "yes" if r.finished else "no",
            "—" if r.tta_h is None else f"{r.tta_h:.2f}",
            *quality,
            f"{r.training_site_hours:.1f}",
            f"{r.energy_kwh:.1f}",
            f"{r.emissions_kg:.2f}",
            f"{100 * r.curtailed_share:.0f}%",
            f"{ratios} %",
        )
    out.print(table)
    base = ", ".join(
        f"{r} {e.emissions_kg:.2f} kg ({100 * e.curtailed_share:.0f}% curtailed)"
        for r, e in study.single_site.items()
    )
    out.print(f"always-on single site: {base}", highlight=False)
    out.print(f"wall time {study.wall_seconds:.1f} s", highlight=False)
