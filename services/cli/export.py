"""``powertrip export-tensorboard`` and the ``--tensorboard DIR`` of the study commands: one way
to turn an output folder into TensorBoard runs (``powertrip.study.tracking``), so a fresh study and
a
past one export alike. Bad input ends the command with one line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from powertrip.services.cli.common import OutputDir, fail, out

tensorboard_option = click.option(
    "--tensorboard",
    type=OutputDir(),
    help="Also write the per-round record as TensorBoard runs here (needs the tensorboard "
    "extra); the time axes are the emulated run clock.",
)


def require_tensorboard(logdir: Path | None) -> None:
    """Before a study with ``--tensorboard``: a missing package ends it now, not after the run."""
    if logdir is None:
        return
    from powertrip.study.tracking import TrackingError, summary_writer

    try:
        summary_writer()
    except TrackingError as exc:
        fail(str(exc))


def write_tensorboard(results_dir: Path, logdir: Path | None) -> list[Path]:
    """Export ``results_dir`` (a study's output folder) to ``logdir`` and say how to view it;
    nothing without a ``logdir`` (a command run without ``--tensorboard``)."""
    if logdir is None:
        return []
    from powertrip.study.tracking import TrackingError, export_tensorboard

    try:
        runs = export_tensorboard(results_dir, logdir)
    except TrackingError as exc:
        fail(str(exc))
    except OSError as exc:  # an unwritable logdir
        fail(f"tensorboard: {exc}")
    out.print(
        escape(
            f"tensorboard: {len(runs)} run(s) in {logdir}  (view: tensorboard --logdir {logdir})"
        ),
        highlight=False,
        soft_wrap=True,  # the command stays on one line, to copy
    )
    return runs


@click.command("export-tensorboard")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option(
    "--logdir",
    type=OutputDir(),
    help="Where the TensorBoard runs go (default: RESULTS_DIR/tensorboard).",
)
def export_tensorboard_command(results_dir: Path, logdir: Path | None) -> None:
    """Write the per-round record of an output folder (powertrip experiment, curtail or up) as
    TensorBoard runs, one per policy and repeat.

    Step is the round and wall time the emulated run clock (Relative counts from each curve's
    first point). Re-exporting to the same logdir replaces the earlier event files.
    """
    if not results_dir.exists():
        fail(f"{results_dir}: no such file or folder")
    base = results_dir if results_dir.is_dir() else results_dir.parent
    write_tensorboard(results_dir, logdir or base / "tensorboard")
