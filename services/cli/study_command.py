"""What the study commands (``powertrip experiment``, ``powertrip curtail``) share around their
own settings: the options that choose the preset, the output folder, the figures, the TensorBoard
export, torch's threads and the device, and the steps around the study itself, so both read and
run alike."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click

from powertrip.services.cli.common import (
    OutputDir,
    device_option,
    err,
    preset_option,
    require_output,
)
from powertrip.services.cli.export import require_tensorboard, tensorboard_option, write_tensorboard


@dataclass(frozen=True)
class StudyRun:
    """The options every study command takes besides its own settings."""

    preset: str
    output: Path | None
    plots: bool
    tensorboard: Path | None
    threads: int | None
    device: str

    def run(self, name: str, banner: str, study: Callable[[Path], None]) -> None:
        """Run ``study`` (configured, checked) into its output folder (``--output``, or
        results/``name`` when that is free), said first on stderr (``banner``: the command and
        what it runs): a missing TensorBoard ends the command before the run, the export
        follows it."""
        out_dir = self.output or require_output(Path("results") / name)
        require_tensorboard(self.tensorboard)
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        err.print(banner, highlight=False)
        study(out_dir)
        write_tensorboard(out_dir, self.tensorboard)


def study_options(
    presets: Mapping[str, Mapping[str, object]],
    default: str,
    *settings: Callable[[Any], Any],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The command's options in help order: ``--preset`` (of ``presets``), ``--output``, the
    command's own ``settings`` decorators, then ``--plots``, ``--tensorboard``, ``--threads`` and
    ``--device``. The command takes the shared ones as a ``StudyRun`` and its settings as
    ``**options``."""
    decorators = [
        preset_option(presets, default),
        click.option(
            "--output",
            "-o",
            type=OutputDir(),
            default=None,
            help="Output folder (default: results/<preset>).",
        ),
        *settings,
        click.option(
            "--plots/--no-plots", default=True, show_default=True, help="Write PNG figures."
        ),
        tensorboard_option,
        click.option(
            "--threads",
            type=click.IntRange(min=1),
            help="CPU threads for torch (default: one per core; use 1 when sharing cores).",
        ),
        device_option,
    ]

    def apply(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def with_study(**options: Any) -> None:
            shared = {f.name: options.pop(f.name) for f in fields(StudyRun)}
            command(StudyRun(**shared), **options)

        for decorator in reversed(decorators):  # the first listed is the first in the help
            with_study = decorator(with_study)
        return with_study

    return apply
