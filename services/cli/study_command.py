"""What the study commands (``powertrip experiment``, ``powertrip curtail``) share around their
own settings: the options that choose the preset, the output folder, resuming, the figures, the
TensorBoard export, torch's threads and the device, and the steps around the study itself, so
both read and run alike."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from powertrip.services.cli.common import (
    OutputDir,
    device_option,
    err,
    fail,
    preset_option,
    require_output,
)
from powertrip.services.cli.export import require_tensorboard, tensorboard_option, write_tensorboard

if TYPE_CHECKING:
    from powertrip.config.experiment import RunConfig
    from powertrip.study.record import StudyRecord


@dataclass(frozen=True)
class StudyRun:
    """The options every study command takes besides its own settings."""

    preset: str
    output: Path | None
    resume: bool
    plots: bool
    tensorboard: Path | None
    threads: int | None
    device: str

    def run(
        self,
        config: RunConfig,
        banner: str,
        study: Callable[[Path, StudyRecord], None],
    ) -> None:
        """Run ``study`` of ``config`` (configured, checked; its ``name`` is the preset's) into
        its output folder (``--output``, or results/<name> when that is free), said first on
        stderr (``banner``: the command and what it runs). The study records each run there as
        it finishes (``StudyRecord``); with ``--resume`` it continues the record the folder
        holds. A missing TensorBoard ends the command before the run, the export follows it,
        and the record is marked complete once every output is written."""
        out_dir = self.output or require_output(Path("results") / config.name)
        require_tensorboard(self.tensorboard)
        record = self._record(out_dir, config)
        if record is None:
            return
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        err.print(banner, highlight=False)
        study(out_dir, record)
        write_tensorboard(out_dir, self.tensorboard)
        record.finish()

    def _record(self, out_dir: Path, config: RunConfig) -> StudyRecord | None:
        """The folder's record of the study (new, or the one ``--resume`` continues); None,
        said on stderr, when the study there is complete. Refused in one line when the folder
        holds a study and ``--resume`` is off, or a study of another configuration."""
        from powertrip.study.record import RECORD, RecordError, RecordExists, StudyRecord

        kind = type(config).__name__
        execution = {"threads": self.threads, "device": self.device}
        try:
            record = StudyRecord.open(
                out_dir, kind, json.loads(config.model_dump_json()), self.resume, execution
            )
        except RecordError as exc:
            exists = isinstance(exc, RecordExists)
            hint = "; pass --resume to continue it, or choose another folder" if exists else ""
            fail(f"--output {out_dir}: {exc}{hint}")
        if record.complete:
            err.print(
                f"--resume: the study in {out_dir} is complete ({len(record)} runs recorded); "
                "nothing to do",
                highlight=False,
            )
            return None
        if self.resume and record.created:
            err.print(
                f"--resume: no study recorded in {out_dir} ({RECORD}): starting it",
                highlight=False,
            )
        elif self.resume:
            err.print(
                f"--resume: continuing the study in {out_dir}: {len(record)} runs recorded",
                highlight=False,
            )
            then = {k: record.execution.get(k) for k in execution}
            if then != execution:  # float reduction order depends on them
                err.print(
                    f"[bold yellow]warning:[/] --resume: the recorded runs ran with "
                    f"{_shown(then)}, these with {_shown(execution)}: their numbers may differ "
                    "in the last digits from one process's",
                    highlight=False,
                )
        return record


def _shown(execution: Mapping[str, object]) -> str:
    threads = execution.get("threads")
    return f"--threads {threads or 'default'} --device {execution.get('device')}"


def study_options(
    presets: Mapping[str, Mapping[str, object]],
    default: str,
    *settings: Callable[[Any], Any],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The command's options in help order: ``--preset`` (of ``presets``), ``--output``,
    ``--resume``, the command's own ``settings`` decorators, then ``--plots``, ``--tensorboard``,
    ``--threads`` and ``--device``. The command takes the shared ones as a ``StudyRun`` and its
    settings as ``**options``."""
    decorators = [
        preset_option(presets, default),
        click.option(
            "--output",
            "-o",
            type=OutputDir(),
            default=None,
            help="Output folder (default: results/<preset>).",
        ),
        click.option(
            "--resume",
            is_flag=True,
            help="Continue the interrupted study in the output folder: the runs it recorded "
            "are read back, the rest run. Refused when the folder holds another configuration.",
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
