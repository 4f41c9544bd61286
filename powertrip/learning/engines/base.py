"""The local-training seam: what an engine is given, what it gives back, and the open registry
of engines, chosen once by name.

An engine trains a group of sites from the same global parameters, each site from its own
optimizer state, over its own partition in its own batch order (``site_schedule``: a site's
update never depends on the other sites it trains with), and gives back each site's update
(its parameters after minus the global ones), its step count, its mean training loss and its
optimizer state after the round. How it does that is its own business: many sites as one
batched step, or one site after another.

An engine registers itself with ``register_engine``: a name, a builder, and ``why_not`` (the
reason it cannot train a given model and workload, None when it can). ``build_engine(name,
spec)`` builds a named engine and refuses one that cannot run the spec, saying why;
``"auto"`` builds the first engine, in ``auto_rank`` order, that can.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import nn

from powertrip.learning.batches import LocalTrainingConfig, Seeds
from powertrip.learning.device import TorchParams, host_rows
from powertrip.learning.site_optim import SiteState

logger = logging.getLogger(__name__)

#: per-sample losses: (logits, targets) -> [B]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: a workload's own local step: (model holding the site's weights, x, y, lr) -> the batch's loss
LocalStep = Callable[[nn.Module, torch.Tensor, torch.Tensor, float], float]


@dataclass(frozen=True)
class SiteUpdates:
    """Per-site results of one round, stacked along axis 0 in the order the sites were given."""

    deltas: TorchParams  # w_i - w, shape [k, *param_shape], in host memory
    num_samples: np.ndarray  # n_i, the FedAvg weights
    steps: np.ndarray  # optimizer steps each site took
    loss: np.ndarray  # mean training loss per site over its steps
    #: each site's local optimizer state after the round, on the engine's device (None for
    #: plain SGD, which keeps none); give it back to the next round to resume the moments
    opt_state: list[SiteState] | None = None


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is built for: the model (its architecture; the parameters come with each
    round), the local schedule and optimizer recipe, the device, and a workload's own
    per-sample ``loss`` (None: cross-entropy) or own local ``train_step``."""

    model: nn.Module
    config: LocalTrainingConfig
    device: torch.device
    loss: LossFn | None = None
    train_step: LocalStep | None = None
    #: sites stacked in one batched step at full batch width (more when batches are narrower)
    max_parallel_sites: int = 128


@dataclass(frozen=True)
class LocalRound:
    """One round of some sites: the global parameters (and floating-point buffers) they all
    start from, the training set on the engine's device, each site's rows of it, its seed (its
    batch order) and its optimizer state from an earlier round (None: a fresh start)."""

    global_params: TorchParams
    x: torch.Tensor
    y: torch.Tensor
    site_indices: Sequence[np.ndarray]
    seeds: Seeds
    states: Sequence[SiteState | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        k = len(self.site_indices)
        if k == 0:
            raise ValueError("no site to train")
        if len(self.seeds) != k:
            raise ValueError("one seed per site is required")
        if not self.states:
            object.__setattr__(self, "states", [None] * k)
        if len(self.states) != k:
            raise ValueError("one state (or None) per site is required")
        sizes = [len(i) for i in self.site_indices]
        if 0 in sizes:
            raise ValueError(f"site at position {sizes.index(0)} has no training samples")

    @property
    def num_samples(self) -> np.ndarray:
        return np.array([len(i) for i in self.site_indices], dtype=np.int64)

    def rows(self, part: slice) -> LocalRound:
        """The sites of ``part`` (a chunk of this round)."""
        return dataclasses.replace(
            self,
            site_indices=self.site_indices[part],
            seeds=self.seeds[part],
            states=self.states[part],
        )


class LocalEngine(Protocol):
    """Trains sites locally: ``train`` returns every site's update and optimizer state."""

    name: str

    def train(self, sites: LocalRound, out: TorchParams | None = None) -> SiteUpdates:
        """Train every site of ``sites``; their deltas are written into ``out`` ([k, ...] host
        rows per tensor, allocated when None) and returned in ``SiteUpdates.deltas``."""
        ...


def delta_rows(sites: LocalRound, out: TorchParams | None) -> TorchParams:
    """``out``, or fresh host rows for every site's delta."""
    return out if out is not None else host_rows(sites.global_params, len(sites.site_indices))


@dataclass(frozen=True)
class _Entry:
    build: Callable[[EngineSpec], LocalEngine]
    why_not: Callable[[EngineSpec], str | None]
    auto_rank: int | None


_ENGINES: dict[str, _Entry] = {}


def register_engine(
    name: str,
    build: Callable[[EngineSpec], LocalEngine],
    why_not: Callable[[EngineSpec], str | None] = lambda spec: None,
    *,
    auto_rank: int | None = None,
) -> None:
    """Make ``name`` an engine: ``build(spec)`` builds it, ``why_not(spec)`` says why it cannot
    train ``spec`` (None: it can). ``auto_rank``: ``"auto"``'s preference among the engines
    that can (lowest first); None: built only when asked for by name."""
    if name == "auto" or not name:
        raise ValueError(f"{name!r} cannot name an engine")
    _ENGINES[name] = _Entry(build, why_not, auto_rank)


def engine_names() -> tuple[str, ...]:
    """The registered engines, in ``"auto"``'s order of preference, then the others by name."""
    ranked = sorted(
        _ENGINES, key=lambda n: (_ENGINES[n].auto_rank is None, _ENGINES[n].auto_rank or 0, n)
    )
    return tuple(ranked)


def build_engine(name: str, spec: EngineSpec) -> LocalEngine:
    """The engine ``name`` (or ``"auto"``: the first in ``engine_names()`` order that can train
    ``spec``), built for ``spec``; a name that is unknown or cannot train ``spec`` is refused."""
    if name == "auto":
        passed: list[str] = []
        for candidate in engine_names():
            entry = _ENGINES[candidate]
            if entry.auto_rank is None:
                continue
            reason = entry.why_not(spec)
            if reason is None:
                logger.debug("auto engine: %s", "; ".join([*passed, f"{candidate} can"]))
                return entry.build(spec)
            passed.append(f"not {candidate}: {reason}")
        raise ValueError(f"no local engine can train {type(spec.model).__name__}: {passed}")
    named = _ENGINES.get(name)
    if named is None:
        known = ", ".join(("auto", *engine_names()))
        raise ValueError(f"unknown local engine {name!r}: known engines are {known}")
    reason = named.why_not(spec)
    if reason is not None:
        raise ValueError(f"the {name} engine cannot train {type(spec.model).__name__}: {reason}")
    return named.build(spec)
