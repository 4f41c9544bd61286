"""The optional DiLoCo-style Nesterov outer step of the curtailment paper's code (arXiv 2602.22760).

Off by default: the logged run that the headline numbers come from used plain work-weighted
FedAvg, and the outer step was added to the code only afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from powertrip.fold_inputs import UpdateRejected

Arrays = Mapping[str, NDArray[np.floating]]


class NesterovOuter:
    """Δ = w_prev − w_avg;  m ← μ·m + Δ;  w ← w_prev − η·(μ·m + Δ)."""

    def __init__(self, lr: float = 0.7, momentum: float = 0.9) -> None:
        if lr <= 0 or not 0 <= momentum < 1:
            raise ValueError(f"outer lr must be > 0 and momentum in [0, 1), got {lr}, {momentum}")
        self.lr = lr
        self.momentum = momentum
        self._m: dict[str, NDArray[np.floating]] | None = None

    def step(
        self, previous: Arrays, averaged: Arrays, commit: bool = True
    ) -> dict[str, NDArray[np.floating]]:
        """The new global model; ``commit=False`` previews it without advancing the momentum.

        A step that would make the model or the momentum non-finite (finite inputs can still
        overflow float32 through ``lr * momentum``) is refused, UpdateRejected("non_finite"),
        and the momentum is left as it was: the round is refused, not the run poisoned."""
        before = self._m or {k: np.zeros_like(v) for k, v in previous.items()}
        momentum: dict[str, NDArray[np.floating]] = {}
        out = {}
        for k, w_prev in previous.items():
            with np.errstate(over="ignore", invalid="ignore"):  # checked right below
                delta = w_prev - averaged[k]
                momentum[k] = self.momentum * before[k] + delta
                step = self.lr * (self.momentum * momentum[k] + delta)
                out[k] = (w_prev - step).astype(w_prev.dtype, copy=False)
            if not (np.isfinite(out[k]).all() and np.isfinite(momentum[k]).all()):
                raise UpdateRejected("non_finite", f"outer step makes {k!r} non-finite")
        if commit:
            self._m = momentum
        return out
