"""The optional DiLoCo-style outer step after the averaging, in both study modes.

Off by default (``outer: fedavg``): the logged curtailment run and the PowerTrip paper's numbers
used plain FedAvg. ``outer: nesterov`` treats the averaged update as a pseudo-gradient,
Δ = w_prev − w_avg, and takes one ``torch.optim.SGD(nesterov=True)`` step on it:

    m ← μ·m + Δ;  w ← w_prev − η·(Δ + μ·m)

It *is* torch's optimizer, called on CPU copies of the arrays (so it equals it bit for bit,
whatever torch version computes it), with numpy at the edge through the one device boundary.
The momentum ``m`` is the only state: the services checkpoint it (``momentum``/``restore``) so a
restarted run ends on the same model as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from numpy.typing import NDArray

from powertrip.aggregation.fold_inputs import UpdateRejected
from powertrip.config.outer import OuterRule, OuterSettings
from powertrip.learning.device import array, tensor

Arrays = Mapping[str, NDArray[np.floating]]
#: the outer optimizer's momentum buffers by parameter name; None before its first step
Momentum = dict[str, NDArray[np.floating]]


class NesterovOuter:
    """The outer optimizer of one run: its settings and its momentum."""

    def __init__(self, lr: float = 0.7, momentum: float = 0.9) -> None:
        if lr <= 0 or not 0 <= momentum < 1:
            raise ValueError(f"outer lr must be > 0 and momentum in [0, 1), got {lr}, {momentum}")
        self.lr = lr
        self.momentum = momentum
        self._m: Momentum | None = None

    @property
    def state(self) -> Momentum | None:
        """The momentum after the last committed step (read-only: a step never writes into
        arrays it handed out, so a cached or checkpointed state stays valid)."""
        return self._m

    def restore(self, state: Arrays | None) -> None:
        """Continue from ``state`` (a checkpoint's, or a cached round's)."""
        self._m = None if state is None else dict(state)

    def step(
        self, previous: Arrays, averaged: Arrays, commit: bool = True
    ) -> dict[str, NDArray[np.floating]]:
        """The new global model; ``commit=False`` previews it without advancing the momentum.

        A step that would make the model or the momentum non-finite (finite inputs can still
        overflow float32 through ``lr * momentum``) is refused, UpdateRejected("non_finite"),
        and the momentum is left as it was: the round is refused, not the run poisoned."""
        names = list(previous)
        params = [tensor(previous[k]).clone() for k in names]  # SGD writes into these
        for k, p in zip(names, params, strict=True):
            p.grad = tensor(previous[k]) - tensor(averaged[k]).to(p.dtype)
        opt = torch.optim.SGD(
            params, lr=self.lr, momentum=self.momentum, nesterov=self.momentum > 0
        )
        if self._m is not None:
            for k, p in zip(names, params, strict=True):
                opt.state[p]["momentum_buffer"] = tensor(self._m[k]).clone()
        opt.step()
        out = {k: array(p.detach()) for k, p in zip(names, params, strict=True)}
        buffers = [opt.state[p].get("momentum_buffer") for p in params]
        momentum = {k: array(b) for k, b in zip(names, buffers, strict=True) if b is not None}
        for k in names:
            if not (np.isfinite(out[k]).all() and np.isfinite(momentum.get(k, 0.0)).all()):
                raise UpdateRejected("non_finite", f"outer step makes {k!r} non-finite")
        if commit:
            self._m = momentum or None
        return out


def make_outer(rule: OuterRule, lr: float, momentum: float) -> NesterovOuter | None:
    """A run's outer optimizer from its configuration (``outer``, ``outer_lr``,
    ``outer_momentum``, named alike in both modes); None for plain FedAvg."""
    if rule == "fedavg":
        return None
    if rule == "nesterov":
        return NesterovOuter(lr, momentum)
    raise ValueError(f"outer must be fedavg or nesterov, got {rule!r}")


def outer_for(settings: OuterSettings) -> NesterovOuter | None:
    """A fresh outer optimizer for one run from its settings (no momentum yet); None for
    plain FedAvg."""
    return make_outer(settings.outer, settings.outer_lr, settings.outer_momentum)
