"""The trained model as a file: one format, written by ``powertrip experiment``, ``powertrip
curtail`` and the aggregator, and by ``powertrip model pull``, read back by ``load_model``.

A model file is a pair:

* ``NAME.safetensors``: the model's ``state_dict`` (every entry, so ``model.load_state_dict``
  takes it strictly; a tied tensor under each of its names). safetensors is a flat header plus
  raw little-endian bytes: reading one never unpickles, so a file from elsewhere cannot run
  code. Its metadata holds the model card (``"powertrip"``: the card's JSON), so the one file
  is enough to rebuild the model.
* ``NAME.json``: the same card, beside it, for people and tools that do not read safetensors.

The card says how to rebuild the model: the workload, what its model factory reads of the data
(``ModelSpec``: classes, input shape), and the run's settings (an LM's size comes from them);
and what the weights are: the round, the accuracy and loss the run reported for them, the
policy, the PowerTrip version. ``load_model`` builds the workload's model from the card and
loads the weights, refusing a file whose tensors do not fit that model with one line naming
the tensor.

Importing this module loads no torch (the pull client writes files without it); building a
model does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import torch
    from torch import nn

    from powertrip.learning.custom import RunSettings
    from powertrip.learning.datasets.record import Dataset

__all__ = [
    "FORMAT",
    "ModelCard",
    "ModelFileError",
    "ModelSpec",
    "StateLayout",
    "card_path",
    "final_state",
    "load_model",
    "model_card",
    "read_model",
    "read_model_card",
    "save_model",
    "weights_path",
]

#: the card's ``format``: bumped when a reader of the old one could misread the new one
FORMAT = "powertrip-model/1"
SUFFIX = ".safetensors"
#: the safetensors metadata key holding the card's JSON
METADATA_KEY = "powertrip"
Study = Literal["experiment", "curtailment"]


class ModelFileError(ValueError):
    """A model file that cannot be read or does not fit its model; the message names the file."""


@dataclass(frozen=True)
class ModelSpec:
    """What a workload's model factory reads of its dataset: enough to build the model again
    without the data (``shape_only`` is a ``Dataset`` of no samples with these shapes)."""

    dataset: str
    task: str
    num_classes: int
    in_shape: tuple[int, ...]
    #: the inputs' dtype: float32 for features, int64 for token ids
    input_dtype: str = "float32"

    @classmethod
    def of(cls, data: Dataset) -> ModelSpec:
        dtype = str(data.x_train.dtype).removeprefix("torch.")
        return cls(data.name, data.task, int(data.num_classes), data.in_shape, dtype)

    def shape_only(self) -> Dataset:
        import torch

        from powertrip.learning.datasets.record import Dataset

        dtype = getattr(torch, self.input_dtype)
        no_rows = torch.zeros((0, *self.in_shape), dtype=dtype)
        labels = torch.zeros(0, dtype=torch.int64)
        return Dataset(
            self.dataset, self.task, no_rows, labels, no_rows, labels, self.num_classes, None
        )


@dataclass(frozen=True)
class ModelCard:
    """Everything beside the weights: how to rebuild the model, and what the weights are."""

    workload: str
    study: Study
    #: the run's settings as JSON (``ExperimentConfig`` or ``CurtailmentConfig``)
    config: dict[str, Any]
    model: ModelSpec
    #: the round these weights ended (0: the initial model)
    round: int = 0
    #: what the run reported for these weights (None: not evaluated)
    accuracy: float | None = None
    loss: float | None = None
    policy: str = ""
    repeat: int | None = None
    #: who wrote it: "experiment", "curtail", "aggregator"
    source: str = ""
    powertrip_version: str = field(default_factory=lambda: _version())
    format: str = FORMAT

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(asdict(self), indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> ModelCard:
        """The card in ``text``; ModelFileError naming ``where`` and the field otherwise."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelFileError(f"{where}: the model card is not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ModelFileError(f"{where}: the model card is not a JSON object")
        if raw.get("format") != FORMAT:
            raise ModelFileError(
                f"{where}: model card format {raw.get('format')!r}, this PowerTrip reads {FORMAT!r}"
            )
        try:
            spec = dict(raw["model"])
            spec["in_shape"] = tuple(int(d) for d in spec["in_shape"])
            return cls(**{**raw, "model": ModelSpec(**spec)})
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{where}: the model card does not fit ({exc})") from None

    def settings(self) -> RunSettings:
        """The run's settings, validated again (ModelFileError if they are not valid here). A
        dataset path that does not exist on this machine is dropped: the model is rebuilt from
        the card's ``ModelSpec``, not from the data."""
        from pydantic import ValidationError

        from powertrip.config.curtailment import CurtailmentConfig
        from powertrip.config.experiment import ExperimentConfig

        kind = CurtailmentConfig if self.study == "curtailment" else ExperimentConfig
        config = dict(self.config)
        path = config.get("dataset_path")
        if path is not None and not Path(path).exists():
            config["dataset_path"] = None
        try:
            return kind.model_validate(config)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "config"
            raise ModelFileError(
                f"the model card's run settings are not valid here: {where}: {first['msg']}"
            ) from None


def model_card(
    settings: RunSettings,
    data: Dataset | ModelSpec,
    *,
    round: int = 0,  # noqa: A002 - the card's field
    accuracy: float | None = None,
    loss: float | None = None,
    policy: str = "",
    repeat: int | None = None,
    source: str = "",
) -> ModelCard:
    """The card of a model of the run ``settings`` over ``data`` (or its ``ModelSpec``)."""
    from powertrip.config.curtailment import CurtailmentConfig

    study: Study = "curtailment" if isinstance(settings, CurtailmentConfig) else "experiment"
    return ModelCard(
        workload=settings.workload,
        study=study,
        config=json.loads(settings.model_dump_json()),
        model=data if isinstance(data, ModelSpec) else ModelSpec.of(data),
        round=round,
        accuracy=accuracy,
        loss=loss,
        policy=policy,
        repeat=repeat,
        source=source,
    )


def _version() -> str:
    try:
        return version("powertrip")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "unknown"


# -- paths -------------------------------------------------------------------------------------
def weights_path(path: str | Path) -> Path:
    """``NAME.safetensors`` for ``NAME``, ``NAME.safetensors`` or ``NAME.json``."""
    p = Path(path)
    if p.suffix == ".json":
        return p.with_suffix(SUFFIX)
    return p if p.suffix == SUFFIX else p.with_name(p.name + SUFFIX)


def card_path(path: str | Path) -> Path:
    """The card's JSON beside the weights: ``NAME.json``."""
    return weights_path(path).with_suffix(".json")


# -- the model's state -------------------------------------------------------------------------
class StateLayout:
    """A model's ``state_dict`` names in order, and where each entry's value comes from given
    the parameters a run averages (``get_params``' names): the averaged value, a tied twin's,
    or the model's own (an integer buffer FedAvg leaves alone, kept as built). Built once per
    model; ``full`` is then torch-free, so a server can call it per request."""

    def __init__(self, model: nn.Module, averaged: Mapping[str, object]) -> None:
        from powertrip.learning.device import array

        own = model.state_dict(keep_vars=True)
        first = {id(t): name for name, t in own.items() if name in averaged}
        #: state_dict name -> the averaged name it takes its value from
        self.sources = {n: first.get(id(t), n) for n, t in own.items()}
        self.fixed = {
            n: array(t.detach(), copy=True)
            for n, t in own.items()
            if self.sources[n] not in averaged
        }

    def full(self, params: Mapping[str, NDArray]) -> dict[str, NDArray]:
        """The whole ``state_dict`` as arrays, ``params`` where the run averages."""
        return {
            name: self.fixed[name] if name in self.fixed else params[source]
            for name, source in self.sources.items()
        }


def final_state(model: nn.Module, params: Mapping[str, torch.Tensor]) -> dict[str, NDArray]:
    """``model``'s whole ``state_dict`` as host arrays holding ``params`` (a run's global model,
    as ``get_params`` names it) where the run averages: what a model file holds."""
    from powertrip.learning.device import to_numpy

    return StateLayout(model, params).full(to_numpy(params, copy=True))


# -- writing -----------------------------------------------------------------------------------
def save_model(path: str | Path, state: Mapping[str, Any], card: ModelCard) -> Path:
    """Write ``state`` (a ``state_dict``: tensors or arrays by name) and ``card`` as the pair
    ``NAME.safetensors`` + ``NAME.json``, each atomically (a reader sees the old file or the new
    one, never a part). Returns the weights' path."""
    from safetensors.numpy import save

    weights = weights_path(path)
    arrays = {name: np.ascontiguousarray(_host_array(v)) for name, v in state.items()}
    text = card.to_json()
    blob = save(arrays, metadata={METADATA_KEY: text})
    weights.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(weights, blob)
    _write_atomic(card_path(weights), (card.to_json(indent=2) + "\n").encode())
    return weights


def _host_array(value: Any) -> NDArray:
    if isinstance(value, np.ndarray):
        return value
    from powertrip.learning.device import array

    return array(value.detach(), copy=True)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# -- reading -----------------------------------------------------------------------------------
def read_model(path: str | Path) -> tuple[dict[str, NDArray], ModelCard]:
    """The tensors and the card of a model file (the card from the file's metadata, else the
    JSON beside it); ModelFileError naming the file for anything else. Never unpickles."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    weights = weights_path(path)
    try:
        blob = weights.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"model file {weights}: {exc.strerror or exc}") from None
    try:
        tensors = load(blob)
        metadata = _metadata(blob)
    except (SafetensorError, ValueError) as exc:
        raise ModelFileError(f"model file {weights} is not a safetensors file ({exc})") from None
    text = metadata.get(METADATA_KEY)
    where = str(weights)
    if text is None:
        beside = card_path(weights)
        if not beside.exists():
            raise ModelFileError(f"model file {weights} holds no PowerTrip model card ({beside})")
        text, where = beside.read_text(encoding="utf-8"), str(beside)
    return tensors, ModelCard.from_json(text, where)


def _metadata(blob: bytes) -> dict[str, str]:
    """The safetensors header's ``__metadata__`` (its first 8 bytes: the header's length)."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise ValueError("__metadata__ is not an object")
    return {str(k): str(v) for k, v in meta.items()}


def read_model_card(path: str | Path) -> ModelCard:
    """Only the card (``read_model``'s checks)."""
    return read_model(path)[1]


def load_model(
    path: str | Path, data: Dataset | None = None, device: torch.device | str = "cpu"
) -> nn.Module:
    """The workload's model rebuilt from the file's card, holding the file's weights (every
    ``state_dict`` entry, same shapes and dtypes: ModelFileError naming the first that differs),
    in evaluation mode on ``device``. ``data``: the dataset to build it for, if the workload's
    model factory reads more than the card's ``ModelSpec`` (classes, input shape)."""
    import torch

    from powertrip.learning.custom import declared_workload
    from powertrip.learning.device import tensor

    tensors, card = read_model(path)
    workload = declared_workload(card.workload)
    with torch.random.fork_rng(devices=[]):  # the weights are overwritten: leave torch's seed be
        torch.manual_seed(0)
        shapes = data if data is not None else card.model.shape_only()
        if workload.run_model is None:
            model = workload.build_model(shapes)
        else:
            model = workload.initial_model(card.settings(), shapes)
    _check_fits(weights_path(path), tensors, model.state_dict(), card.workload)
    model.load_state_dict({n: tensor(a) for n, a in tensors.items()}, strict=True)
    return model.to(device).eval()


def _check_fits(
    where: Path, tensors: Mapping[str, NDArray], own: Mapping[str, torch.Tensor], workload: str
) -> None:
    what = f"model file {where} does not fit workload {workload!r}'s model"
    missing, extra = sorted(own.keys() - tensors.keys()), sorted(tensors.keys() - own.keys())
    if missing or extra:
        raise ModelFileError(f"{what}: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, t in own.items():
        a = tensors[name]
        if tuple(a.shape) != tuple(t.shape):
            raise ModelFileError(
                f"{what}: {name} has shape {tuple(a.shape)} in the file, {tuple(t.shape)} in "
                "the model"
            )
        want = str(t.dtype).removeprefix("torch.")
        if a.dtype.name != want:
            raise ModelFileError(
                f"{what}: {name} is {a.dtype.name} in the file, {want} in the model"
            )
