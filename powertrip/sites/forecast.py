"""Short-term forecasts of each site's spare power, and the power a round really runs on.

A ``Forecaster`` answers one question: each site's mean power fraction over [now, now + horizon].
Three models (docs/forecasts.md):

- ``persistence``: the current value, P_hat_i = P_i(now);
- ``ewma``: an AR(1) reversion to an exponentially weighted mean, fitted online on the history
  sampled every ``step_s`` (telemetry up to now, including a warm-up day before the run):
  P_hat_i = m_i + (P_i(now) - m_i) * g(phi_i, H), the mean over the horizon of
  m + (x - m) phi^(s / step);
- ``oracle``: the true mean of the power source over the window, times (1 + error * z_i) with
  z_i ~ N(0, 1) (FedZero's relative forecast error), deterministic from (seed, now).

``compute_times_s`` is the other half: how long each site needs for tau seconds of full-power
work when its power changes during the round (the ``integrated`` round-power model); without it
the emulator charges every round at the power its sites had when it started.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip.config.forecast import ForecastModel
from powertrip.sites.profiles import PowerSource

POWER_FLOOR = 1e-3  # a forecast never predicts less (rankings divide by power)


class Forecaster(Protocol):
    name: str

    def mean_power(self, now_s: float, horizon_s: float) -> NDArray[np.float64]:
        """Each site's predicted mean power fraction over [now_s, now_s + horizon_s]."""
        ...


def window_mean(
    power: PowerSource, start_s: float, horizon_s: float, step_s: float = 60.0
) -> NDArray[np.float64]:
    """The true mean of ``power`` over the window: midpoint rule on at most ``step_s`` slices
    (exact for piecewise-linear power; a horizon <= 0 is the value at ``start_s``)."""
    if horizon_s <= 0:
        return np.array(power.power_at(start_s), dtype=np.float64)
    n = max(1, math.ceil(horizon_s / step_s))
    width = horizon_s / n
    total = sum(np.asarray(power.power_at(start_s + (j + 0.5) * width)) for j in range(n))
    return np.asarray(total, dtype=np.float64) / n


class Persistence:
    """The current value holds for the whole horizon."""

    name = "persistence"

    def __init__(self, power: PowerSource) -> None:
        self.power = power

    def mean_power(self, now_s: float, horizon_s: float) -> NDArray[np.float64]:
        return np.array(self.power.power_at(now_s), dtype=np.float64)


class EwmaAR1:
    """AR(1) reversion to an exponentially weighted mean, both fitted online.

    History samples x_k = P(t_k) on the grid t_k = -warmup + k * step. With d_k = x_k - m_{k-1}:
    m_k = m_{k-1} + a * d_k, a = 1 - 2^(-step / half_life); phi = EW(d_k d_{k-1}) / EW(d_{k-1}^2),
    clipped to [0.01, 0.999]. The state at a time is a function of that time only (the grid
    never depends on who asks), so one forecaster serves every run of a study.
    """

    name = "ewma"

    def __init__(
        self,
        power: PowerSource,
        step_s: float = 300.0,
        half_life_s: float = 3 * 3600.0,
        warmup_s: float = 86_400.0,
    ) -> None:
        if step_s <= 0 or half_life_s <= 0 or warmup_s < 0:
            raise ValueError("ewma forecast needs step > 0, half-life > 0, warm-up >= 0")
        self.power, self.step_s, self.warmup_s = power, step_s, warmup_s
        self.a = 1.0 - 2.0 ** (-step_s / half_life_s)
        first = np.array(power.power_at(-warmup_s), dtype=np.float64)
        zero = np.zeros_like(first)
        # per grid index: (mean, last deviation, EW(d_k d_{k-1}), EW(d^2))
        self._states = [(first, zero, zero, zero + 1e-12)]

    def state(self, now_s: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(m, phi) from the history sampled at or before ``now_s``."""
        k = max(0, math.floor((now_s + self.warmup_s) / self.step_s + 1e-9))
        while len(self._states) <= k:
            m, d_prev, cov, var = self._states[-1]
            x = np.asarray(self.power.power_at(len(self._states) * self.step_s - self.warmup_s))
            d = x - m
            cov = (1 - self.a) * cov + self.a * d * d_prev
            var = (1 - self.a) * var + self.a * d_prev * d_prev
            self._states.append((m + self.a * d, d, cov, var))
        m, _, cov, var = self._states[k]
        phi = np.clip(cov / np.maximum(var, 1e-12), 0.01, 0.999)
        return m, phi

    def mean_power(self, now_s: float, horizon_s: float) -> NDArray[np.float64]:
        m, phi = self.state(now_s)
        x = np.asarray(self.power.power_at(now_s), dtype=np.float64)
        return np.clip(m + (x - m) * reversion(phi, horizon_s / self.step_s), POWER_FLOOR, 1.0)


def reversion(phi: NDArray[np.float64], steps: float) -> NDArray[np.float64]:
    """g = (1/h) * integral_0^h phi^s ds = (1 - phi^h) / (h * -ln phi); 1 at h = 0."""
    if steps <= 0:
        return np.ones_like(phi)
    log_phi = np.log(phi)
    return (1.0 - phi**steps) / (steps * -log_phi)


class NoisyOracle:
    """The true window mean with multiplicative Gaussian error: mean * (1 + error * z).

    z depends on (seed, now, site) only, not on the horizon, so every question a policy asks
    in one round sees the same relative error; clipped to [POWER_FLOOR, 1]."""

    name = "oracle"

    def __init__(
        self, power: PowerSource, error: float = 0.0, seed: int = 0, step_s: float = 60.0
    ) -> None:
        if error < 0:
            raise ValueError(f"forecast error must be >= 0, got {error}")
        self.power, self.error, self.seed, self.step_s = power, error, seed, step_s

    def noise(self, now_s: float, n: int) -> NDArray[np.float64]:
        stamp = int(np.float64(now_s).view(np.uint64))
        return np.random.default_rng([self.seed, 0xF0CA, stamp]).standard_normal(n)

    def mean_power(self, now_s: float, horizon_s: float) -> NDArray[np.float64]:
        mean = window_mean(self.power, now_s, horizon_s, self.step_s)
        if self.error == 0:
            return mean
        noisy = mean * (1.0 + self.error * self.noise(now_s, mean.size))
        return np.clip(noisy, POWER_FLOOR, 1.0)


def build_forecaster(
    model: ForecastModel, power: PowerSource, error: float = 0.0, seed: int = 0
) -> Forecaster | None:
    """The configured forecaster, or None for ``none`` (RoundContext.forecast stays None)."""
    if model == "none":
        return None
    if error and model != "oracle":
        raise ValueError(f"forecast error applies to the oracle forecast only, not {model!r}")
    if model == "persistence":
        return Persistence(power)
    if model == "ewma":
        return EwmaAR1(power)
    if model == "oracle":
        return NoisyOracle(power, error, seed)
    raise ValueError(f"unknown forecast model {model!r}")


def compute_times_s(
    power: PowerSource,
    start_s: float,
    ideal_compute_s: float,
    sites: NDArray[np.int64],
    step_s: float = 60.0,
    max_steps: int = 100_000,
) -> NDArray[np.float64]:
    """Seconds each site in ``sites`` needs for ``ideal_compute_s`` of full-power work when its
    power follows ``power`` from ``start_s`` (read every ``step_s``, held in between): the
    first T with integral_start^{start+T} P_i(t) dt = tau."""
    sites = np.asarray(sites, dtype=np.int64)
    done = np.zeros(sites.size)
    out = np.full(sites.size, np.nan)
    t = 0.0
    for _ in range(max_steps):
        p = np.maximum(np.asarray(power.power_at(start_s + t))[sites], 1e-12)
        need = ideal_compute_s - done
        open_ = np.isnan(out)
        finish = open_ & (p * step_s >= need)
        out[finish] = t + need[finish] / p[finish]
        done += p * step_s
        t += step_s
        if not np.isnan(out).any():
            return out
    left = np.isnan(out)  # past the step budget: the rest at the last power read
    out[left] = t + (ideal_compute_s - done[left]) / p[left]
    return out
