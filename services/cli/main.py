"""The ``powertrip`` command line."""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import ValidationError
from rich.table import Table

from powertrip.experiment import PRESETS, ExperimentConfig, build_config
from powertrip.services.cli import export
from powertrip.services.cli.certs import certs
from powertrip.services.cli.common import (
    CommaList,
    OneLineErrors,
    OutputDir,
    WorkloadName,
    check_sweep,
    describe_validation,
    device_option,
    err,
    fail,
    lm_options,
    out,
    preset_option,
    require_output,
)
from powertrip.services.cli.curtail import curtail
from powertrip.services.cli.optimizer_options import training_options
from powertrip.services.cli.study_progress import StudyProgress
from powertrip.services.cli.traces import traces
from powertrip.services.cli.up import up

# CLI flag for each config field, so validation errors name what the user typed.
FLAG_FOR_FIELD = {
    "num_sites": "--sites",
    "update_gb": "--update-gb",
    "target_accuracy": "--target",
    "ideal_compute_s": "--tau",
    "dataset_path": "--dataset-path",
    "static_sweep": "--sweep",
    "dirichlet_alpha": "--dirichlet-alpha",
    "power_trace_path": "--power-trace",
}


class TargetAccuracy(click.ParamType):
    """A number, or ``auto`` for the paper's rule: the lowest best accuracy of the static sweep."""

    name = "FLOAT|auto"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if isinstance(value, float) or value == "auto":
            return value
        try:
            return float(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number nor 'auto'", param, ctx)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="powertrip")
def main() -> None:
    """PowerTrip: power- and network-aware federated training across datacenters."""


main.add_command(traces)
main.add_command(up)
main.add_command(curtail)
main.add_command(certs)
main.add_command(export.export_tensorboard_command)


@main.command()
@preset_option(PRESETS, "quick")
@lm_options
@click.option(
    "--output",
    "-o",
    type=OutputDir(),
    default=None,
    help="Output folder (default: results/<preset>).",
)
@click.option("--policies", type=CommaList(str), help="Comma-separated policy names.")
@click.option("--sites", "num_sites", type=int, help="Number of emulated sites.")
@click.option("--update-gb", type=float, help="Model update size in decimal GB.")
@click.option(
    "--power-model",
    type=click.Choice(["uniform", "synthetic-trace", "google-trace"]),
    help="Site power: static U(0.1, 1), the embedded synthetic trace, or --power-trace files.",
)
@click.option(
    "--power-trace",
    "power_trace_path",
    type=click.Path(path_type=Path),
    help="Google powerdata_2019 file or folder (with --power-model google-trace).",
)
@click.option("--repeats", type=int, help="Training seeds per policy.")
@click.option("--seed", type=int, help="First training seed.")
@click.option("--site-seed", type=int, help="Seed of the site profiles (fixed across repeats).")
@click.option(
    "--workload",
    type=WorkloadName(),
    help="A built-in workload, or MODULE:ATTR naming your powertrip.CustomWorkload.",
)
@click.option(
    "--dataset-path",
    type=click.Path(path_type=Path),
    help="IDX folder (mnist/emnist), Shakespeare text(s), a Speech Commands or FSDD folder, or "
    "for lm a text file or a .npy of token ids (lm without it: an embedded synthetic corpus).",
)
@click.option(
    "--target",
    "target_accuracy",
    type=TargetAccuracy(),
    help="Target accuracy in (0, 1], or 'auto' for the paper's rule: the lowest best accuracy "
    "any static-k run reaches within the round budget.",
)
@click.option(
    "--num-samples", type=int, help="Samples to generate (mnist1d) or keep (shakespeare)."
)
@click.option(
    "--local-steps",
    "max_local_steps",
    type=int,
    help="Cap on local SGD steps per round (default: one full local epoch).",
)
@click.option("--partition", type=click.Choice(["iid", "dirichlet", "natural"]))
@click.option("--dirichlet-alpha", type=float)
@click.option(
    "--tau",
    "ideal_compute_s",
    type=float,
    help="Emulated local-training time per round at 100% power (s).",
)
@click.option(
    "--ground-truth",
    type=click.Choice(["per-site-max", "aggregate"]),
    help="Round-time model: per-site max (the paper's §5.1 emulation) or Eq. 7 aggregate.",
)
@click.option("--distance-mode", type=click.Choice(["stratified", "uniform"]))
@click.option("--sweep", "static_sweep", type=CommaList(int), help="Static-k sweep, e.g. 10,20,50.")
@click.option("--max-rounds", type=int, help="Round budget per run.")
@click.option("--k0", type=int, help="Algorithm 1: initial site count.")
@click.option("--window", type=int, help="Algorithm 1: candidate window (0 = all counts).")
@click.option("--patience", type=int, help="Algorithm 1: rounds before shrinking.")
@click.option("--trend-rounds", type=int, help="Algorithm 1: rounds in the accuracy trend (m).")
@click.option("--gain-floor", type=float, help="Algorithm 1: floor of the projected gain (eps).")
@click.option("--kappa", type=float, help="kappa-headroom gain: strength of the headroom term.")
@training_options
@click.option("--plots/--no-plots", default=True, show_default=True, help="Write PNG figures.")
@export.tensorboard_option
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    help="CPU threads for torch (default: one per core; use 1 when sharing cores).",
)
@device_option
def experiment(
    preset: str,
    output: Path | None,
    plots: bool,
    tensorboard: Path | None,
    threads: int | None,
    device: str,
    **options: object,
) -> None:
    """Reproduce and extend the PowerTrip study on one machine with an emulated clock.

    Runs every policy x repeat over emulated sites, prints a time-to-accuracy table and writes
    results.csv, rounds.csv, summary.json and PNG plots to the output folder.
    """
    names = ("k0", "window", "patience", "trend_rounds", "gain_floor", "kappa")
    greedy = {k: options.pop(k) for k in names}
    greedy = {k: v for k, v in greedy.items() if v is not None}
    try:
        cfg = build_config(preset, **options, **({"greedy": greedy} if greedy else {}))
    except ValidationError as exc:
        fail(describe_validation(exc, "experiment configuration", FLAG_FOR_FIELD, {"greedy"}))
    except ValueError as exc:
        fail(str(exc))
    check_sweep(cfg)
    out_dir = output or require_output(Path("results") / cfg.name)
    export.require_tensorboard(tensorboard)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    _run_experiment(cfg, out_dir, plots, device)
    export.write_tensorboard(out_dir, tensorboard)


def _run_experiment(cfg: ExperimentConfig, out_dir: Path, plots: bool, device: str) -> None:
    from powertrip.learning.datasets import DatasetError
    from powertrip.study.plots import write_plots
    from powertrip.study.powertrip import run_study
    from powertrip.study.results import write_outputs

    err.print(
        f"[bold]powertrip experiment[/] preset={cfg.name} workload={cfg.workload} "
        f"sites={cfg.num_sites} policies={','.join(cfg.policies)} repeats={cfg.repeats}",
        highlight=False,
    )
    try:  # per round with an ETA on a terminal, a line per run elsewhere (study_progress.py)
        with StudyProgress(err, cfg.max_rounds) as shown:
            result = run_study(cfg, progress=shown.run, on_round=shown.round, device=device)
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
            "—" if r.tta_mean_s is None else f"{r.tta_mean_s / 3600:.3f} ± {r.tta_std_s / 3600:.3f}"
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
            ]
        )
    return rows


if __name__ == "__main__":
    main()
