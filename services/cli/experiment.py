"""``powertrip experiment``: the emulated-clock study on one machine, and its result table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from powertrip.config.experiment import ExperimentConfig, GreedyParams, build_config
from powertrip.config.presets import PRESETS
from powertrip.services.cli.common import check_sweep, configured, err, fail, out
from powertrip.services.cli.model_options import EXPERIMENT_FLAGS, experiment_options
from powertrip.services.cli.optimizer_options import optimizer_options
from powertrip.services.cli.study_command import StudyRun, study_options
from powertrip.services.cli.study_progress import StudyProgress

if TYPE_CHECKING:
    from powertrip.study.record import StudyRecord


@click.command()
@study_options(PRESETS, "quick", experiment_options, optimizer_options)
def experiment(study: StudyRun, **options: object) -> None:
    """Reproduce and extend the PowerTrip study on one machine with an emulated clock.

    Runs every policy x repeat over emulated sites, prints a time-to-accuracy table and writes
    results.csv, rounds.csv, summary.json and PNG plots to the output folder, and each
    policy's final model to models/ (load one with powertrip.load_model).
    """
    greedy = {k: options.pop(k) for k in GreedyParams.model_fields}
    greedy = {k: v for k, v in greedy.items() if v is not None}
    cfg = configured(
        lambda: build_config(study.preset, **options, **({"greedy": greedy} if greedy else {})),
        "experiment configuration",
        EXPERIMENT_FLAGS,
        {"greedy"},
    )
    check_sweep(cfg)
    banner = (
        f"[bold]powertrip experiment[/] preset={cfg.name} workload={cfg.workload} "
        f"sites={cfg.num_sites} policies={','.join(cfg.policies)} repeats={cfg.repeats}"
    )
    study.run(
        cfg,
        banner,
        lambda out_dir, record: _run_experiment(cfg, out_dir, study.plots, study.device, record),
    )


def _run_experiment(
    cfg: ExperimentConfig, out_dir: Path, plots: bool, device: str, record: StudyRecord
) -> None:
    from powertrip.learning.datasets import DatasetError
    from powertrip.study.models import ModelLog, RunModels
    from powertrip.study.plots import write_plots
    from powertrip.study.powertrip import run_study
    from powertrip.study.results import write_outputs
    from powertrip.study.run_log import StudyLog

    models = RunModels(cfg, out_dir, "experiment")  # each policy's final model, as well
    # each run kept as it finishes; a resume reads them back
    log = ModelLog(models, cfg.policies, StudyLog(record, out_dir))
    try:  # per round with an ETA on a terminal, a line per run elsewhere (study_progress.py)
        with StudyProgress(err, cfg.max_rounds) as shown:
            result = run_study(
                cfg, progress=shown.run, on_round=shown.round, device=device, log=log
            )
    except DatasetError as exc:
        fail(f"dataset: {exc}")
    except ValueError as exc:  # a configuration the data cannot satisfy (e.g. natural split)
        fail(str(exc))
    paths = write_outputs(result, out_dir)
    pngs = write_plots(result, out_dir) if plots else []
    _print_table(result)
    out.print(
        f"results: {paths['results']}  rounds: {paths['rounds']}  summary: {paths['summary']}",
        highlight=False,
    )
    if pngs:
        out.print("plots: " + "  ".join(str(p) for p in pngs), highlight=False)
    out.print(f"models: {models.directory}", highlight=False)


def _print_table(result) -> None:  # noqa: ANN001 - StudyResult, imported lazily
    from powertrip.study.files import data_label

    c = result.config
    title = (
        f"time to accuracy {result.target_accuracy:.3f} — {c.workload}"
        f"{' (synthetic)' if data_label(c.workload, c.dataset_path) != 'real' else ''}, "
        f"{c.partition}, "
        f"{c.num_sites} sites, {c.update_gb:g} GB, tau {c.ideal_compute_s:g} s, "
        f"{c.ground_truth}, {result.power_label} power; k* = {result.k_star}"
    )
    table = Table(title=title, title_justify="left")
    for col in (
        "policy",
        "TTA (h) mean ± std",
        "× static-opt",
        "reached",
        "rounds",
        "mean sites",
        "max sites",
        "energy (kWh)",
        "CO2 (kg)",
        *(["bits/byte (final)"] if result.lm_validation is not None else []),
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for row in result_rows(result):
        table.add_row(*row)
    out.print(table)
    out.print(
        f"wall time {result.wall_seconds:.1f} s; trajectory cache "
        f"{result.cache_hits} hits / {result.cache_misses} trained rounds",
        highlight=False,
    )


def result_rows(result) -> list[list[str]]:  # noqa: ANN001
    from powertrip.study.results import policy_table

    rows = []
    for r in policy_table(result):
        tta = (
            "—"
            if r.tta_mean_s is None or r.tta_std_s is None
            else f"{r.tta_mean_s / 3600:.3f} ± {r.tta_std_s / 3600:.3f}"
        )
        ratio = "—" if r.ratio_to_static_optimal is None else f"{r.ratio_to_static_optimal:.2f}"
        rounds = "—" if r.rounds_mean is None else f"{r.rounds_mean:.1f}"
        rows.append(
            [
                r.policy,
                tta,
                ratio,
                f"{r.reached}/{r.repeats}",
                rounds,
                f"{r.mean_sites:.1f}",
                str(r.max_sites),
                "—" if r.energy_kwh is None else f"{r.energy_kwh:.1f}",
                "—" if r.emissions_kg is None else f"{r.emissions_kg:.2f}",
                *_bits_per_byte_cell(result, r.bits_per_byte),
            ]
        )
    return rows


def _bits_per_byte_cell(result, bpb: float | None) -> list[str]:  # noqa: ANN001
    """An LM study's last column: the policy's final validation bits per byte."""
    if result.lm_validation is None:
        return []
    return ["—" if bpb is None else f"{bpb:.3f}"]
