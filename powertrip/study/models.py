"""The study commands' model files: the final global model of each run they compute, in
``OUTPUT/models/``, in the one model file format (``powertrip.learning.model_file``):
``POLICY-repeat-R.safetensors`` + ``.json`` for ``powertrip experiment``, ``RUN.safetensors`` +
``.json`` for ``powertrip curtail``. A run is written as it finishes, so an interrupted study keeps
the models of the runs it finished, and a study holds no model longer than its run.

The card's ``ModelSpec`` (classes, input shape) is read from the run's data once, when the first
model is written: the study's own copy of the data stays inside ``run_study``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from powertrip.curtailment.run_model import ElasticRun
from powertrip.learning.custom import RunSettings
from powertrip.learning.model_file import ModelSpec, model_card, save_model
from powertrip.rounds.loop import RunResult
from powertrip.study.powertrip import RunLog, RunSummary, StudyResult

__all__ = ["MODELS_DIR", "ModelLog", "RunModels", "model_name"]

MODELS_DIR = "models"


def model_name(run: str, repeat: int | None = None) -> str:
    """A run's model file name, without its suffix."""
    return run if repeat is None else f"{run}-repeat-{repeat}"


class RunModels:
    """Writes runs' final models into ``out_dir/models`` for the study ``settings``."""

    def __init__(
        self, settings: RunSettings, out_dir: Path, source: str, spec: ModelSpec | None = None
    ) -> None:
        self.settings = settings
        self.directory = out_dir / MODELS_DIR
        self.source = source  # the command: "experiment" or "curtail"
        self._spec = spec

    @property
    def spec(self) -> ModelSpec:
        if self._spec is None:
            from powertrip.federation import load_workload

            cfg = self.settings
            self._spec = ModelSpec.of(load_workload(cfg, seed=cfg.seed))
        return self._spec

    def write(
        self,
        run: str,
        state: Mapping[str, Any],
        round_index: int,
        accuracy: float | None,
        loss: float | None,
        repeat: int | None = None,
        aside: str = "",
    ) -> Path:
        """``state`` (the run's final ``state_dict``) as the model of ``run`` after
        ``round_index`` (``aside``: in that subfolder of the models' folder)."""
        card = model_card(
            self.settings,
            self.spec,
            round=round_index,
            accuracy=accuracy,
            loss=loss,
            policy=run,
            repeat=repeat,
            source=self.source,
        )
        return save_model(self.directory / aside / model_name(run, repeat), state, card)

    def write_elastic(self, name: str, run: ElasticRun, state: Mapping[str, Any]) -> None:
        """A curtailment study's run (``run_curtailment_study``'s ``on_model``)."""
        if not run.rounds:
            self.write(name, state, 0, None, None)
            return
        last = run.rounds[-1]
        self.write(name, state, last.index, last.accuracy, last.loss)


def _last(run: RunResult) -> tuple[int, float | None, float | None]:
    """The round a run ended with, and the accuracy and loss it reported for it."""
    if not run.rounds:
        return 0, run.initial_accuracy, None
    r = run.rounds[-1]
    return r.round, r.accuracy, r.loss


class ModelLog:
    """A ``run_study`` log (``powertrip.study.powertrip.RunLog``) that writes the final model of
    each run of a policy the study names as the run finishes, before it hands the run on to
    ``inner`` (the output folder's log, which records it), so a run a resume reads back has its
    model on disk already. ``static-optimal`` is the sweep's static-k* run: the sweep's runs are
    written aside (``models/.sweep``) until k* is known, then k*'s becomes
    ``static-optimal-repeat-R`` and the rest go."""

    SWEEP = ".sweep"

    def __init__(
        self, models: RunModels, policies: Collection[str], inner: RunLog | None = None
    ) -> None:
        self.models = models
        self.policies = frozenset(policies)
        self.inner = inner

    def recorded(self, repeat: int, policy: str) -> tuple[RunResult, tuple[int, int]] | None:
        return None if self.inner is None else self.inner.recorded(repeat, policy)

    def finished(
        self,
        result: StudyResult,
        repeat: int,
        run: RunResult,
        cache: tuple[int, int],
        computed: bool,
    ) -> None:
        # the model first: a run is on record only once its model is on disk
        state = getattr(run, "model", None)  # an EmulatedRun's final state_dict
        if computed and state is not None:
            if run.policy in self.policies:
                self.models.write(run.policy, state, *_last(run), repeat=repeat)
            elif "static-optimal" in self.policies and run.policy.startswith("static-"):
                self.models.write(run.policy, state, *_last(run), repeat=repeat, aside=self.SWEEP)
        if self.inner is not None:
            self.inner.finished(result, repeat, run, cache, computed)

    def scored(self, result: StudyResult, summaries: Sequence[RunSummary]) -> None:
        if self.inner is not None:
            self.inner.scored(result, summaries)
        aside = self.models.directory / self.SWEEP
        if result.k_star is None or not aside.is_dir():
            return
        for path in sorted(aside.iterdir()):
            stem, _, repeat = path.stem.rpartition("-repeat-")
            if path.suffix not in (".safetensors", ".json"):  # a write a kill cut short
                path.unlink()
            elif stem == f"static-{result.k_star}":
                target = model_name("static-optimal", int(repeat)) + path.suffix
                path.replace(self.models.directory / target)
            else:
                path.unlink()
        aside.rmdir()
