"""Wall-clock rounds, as in the curtailment paper (arXiv 2602.22760): a round lasts at least a
minimum time, every site does as many optimizer steps as its power allows meanwhile, and a stop
only takes effect at a step boundary. Shared by the elastic emulator and the policies that
estimate it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

_EPS = 1e-9  # a stop that lands on a step boundary (up to float error) ends that step


@dataclass(frozen=True)
class WallClockRounds:
    step_s: float  # one optimizer step at full power
    round_min_s: float = 600.0
    overhead_s: float = 45.0  # load, compile, serialise, aggregate: the logged 646 s - 600 s

    def __post_init__(self) -> None:
        if self.step_s <= 0 or self.round_min_s < 0 or self.overhead_s < 0:
            raise ValueError("step time must be > 0 s; round minimum and overhead >= 0 s")

    def step_time_s(self, power: float) -> float:
        """A site at power fraction P takes step_s / P per step (Eq. 6: GPUs scale with power)."""
        if not 0 < power <= 1:
            raise ValueError(f"site power must be in (0, 1], got {power}")
        return self.step_s / power

    @staticmethod
    def steps_by(elapsed_s: float, step_time_s: float) -> int:
        """Steps done when told to stop ``elapsed_s`` into training: the current one finishes."""
        if elapsed_s <= 0:
            return 0
        return max(math.ceil(elapsed_s / step_time_s - _EPS), 0)

    def site_round_s(
        self, power: NDArray[np.float64], comm_s: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """Length of a round that each site alone would make: overhead, the minimum rounded up to
        its step boundary, and its upload."""
        step = self.step_s / np.asarray(power, dtype=np.float64)
        steps = np.maximum(np.ceil(self.round_min_s / step - _EPS), 1.0)
        return self.overhead_s + steps * step + np.asarray(comm_s, dtype=np.float64)
