"""FedZero (Wiesner et al., "FedZero: Leveraging Renewable Excess Energy in Federated
Learning", e-Energy 2024) as a selection policy: the forecast filter, the search for the
shortest round, and the mixed-integer program, solved with HiGHS (``scipy.optimize.milp``).

Time is cut in steps of ``step_s`` (FedZero: one minute). A site's forecast excess power
f_i(t) (fraction of full power) lets it do f_i(t) * dt / tau local passes in a step, so within
a round of d steps, less its upload time comm_i, it can do

    W_i(d) = sum_{t < d - comm_i} f_i(t) * dt / tau          passes (energy-limited work)

Forecast filter: candidates C(d) = {i : W_i(d) >= m_min}. FedZero tries d = 1, 2, ... steps
and, at the first d with |C(d)| >= K, solves

    max   sum_i sigma_i m_i
    s.t.  sum_i x_i = K,   x_i in {0, 1}
          m_min x_i <= m_i <= m_max x_i,   m_i <= W_i(d)          (per-site energy)
          sum_{i in p} m_i <= B_p(d)  for each power domain p      (optional shared energy)

with sigma_i the site's statistical utility (Oort's |B_i| sqrt(mean loss^2), as FedZero uses;
an unexplored site gets the largest observed one, so it is tried). The emulator always trains
one full local pass, so m_min = m_max = 1 by default: the MIP then picks the K
highest-utility sites among those whose forecast energy covers a pass within d.

Forecast: ``forecast(ctx, steps, step_s) -> (N, steps)`` power fractions; by default the
persistence forecast f_i(t) = P_i(now). A forecast seam added to the round context later can be
passed as this function without changing the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.selection.base import RoundContext, RoundFeedback, SelectionPolicy
from powertrip.selection.oort import OortConfig, OortUtility, participants, site_round_times
from powertrip.selection.registration import register_policy

#: (ctx, steps, step_s) -> forecast power fraction of every site in each step, shape (N, steps)
Forecast = Callable[[RoundContext, int, float], NDArray[np.float64]]


def persistence_forecast(ctx: RoundContext, steps: int, step_s: float) -> NDArray[np.float64]:
    """Tomorrow is today: every site keeps its current power for the whole horizon."""
    return np.repeat(np.asarray(ctx.profile.power, dtype=np.float64)[:, None], steps, axis=1)


@dataclass(frozen=True)
class FedZeroConfig:
    k: int | None = None  # participants per round (None: DEFAULT_SHARE of the sites)
    step_s: float = 60.0  # forecast / round-duration granularity (FedZero: 1 min)
    max_steps: int = 1440  # d_max: the longest round searched (24 h of 1-min steps)
    min_work: float = 1.0  # m_min, local passes (the emulator trains exactly one)
    max_work: float = 1.0  # m_max

    def __post_init__(self) -> None:
        if self.step_s <= 0 or self.max_steps < 1:
            raise ValueError("fedzero needs step_s > 0 and max_steps >= 1")
        if not 0 < self.min_work <= self.max_work:
            raise ValueError("fedzero needs 0 < min_work <= max_work")


def window_work(
    forecast: NDArray[np.float64], comm_s: NDArray[np.float64], tau: float, step_s: float
) -> NDArray[np.float64]:
    """W_i(d) for d = 1..steps: passes site i's forecast energy allows before it must upload,
    shape (N, steps); the step the window ends in counts in part."""
    n, steps = forecast.shape
    ends = np.arange(1, steps + 1, dtype=np.float64) * step_s  # round lengths d * dt
    window = np.maximum(ends[None, :] - comm_s[:, None], 0.0)  # compute time in each round
    # energy in [0, window): full steps' forecast plus the started step's share
    full = np.minimum(np.floor(window / step_s).astype(np.int64), steps)
    csum = np.concatenate([np.zeros((n, 1)), np.cumsum(forecast, axis=1)], axis=1) * step_s
    rows = np.arange(n)[:, None]
    part = window - full * step_s
    nxt = forecast[rows, np.minimum(full, steps - 1)] * np.where(full < steps, part, 0.0)
    return (csum[rows, full] + nxt) / tau


def solve_selection(
    utility: NDArray[np.float64],
    work_cap: NDArray[np.float64],
    k: int,
    min_work: float = 1.0,
    max_work: float = 1.0,
    domains: NDArray[np.int64] | None = None,
    domain_cap: NDArray[np.float64] | None = None,
    tie_break: NDArray[np.float64] | None = None,
) -> NDArray[np.int64] | None:
    """FedZero's MIP over candidate sites: indices of the chosen ones, or None if infeasible.
    ``tie_break`` (tiny, added to the objective's utility) makes equal-utility choices
    deterministic."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # lazily: scipy is optional

    n = utility.size
    if k > n:
        return None
    sigma = utility + (0.0 if tie_break is None else tie_break)
    c = np.concatenate([np.zeros(n), -sigma])  # variables: x (binary), then m (passes)
    eye = np.eye(n)
    rows = [
        LinearConstraint(np.concatenate([np.ones(n), np.zeros(n)])[None, :], k, k),
        LinearConstraint(np.hstack([-min_work * eye, eye]), 0, np.inf),  # m >= m_min x
        LinearConstraint(np.hstack([-max_work * eye, eye]), -np.inf, 0),  # m <= m_max x
    ]
    if domains is not None and domain_cap is not None:
        member = (np.asarray(domains)[None, :] == np.arange(domain_cap.size)[:, None]).astype(float)
        rows.append(
            LinearConstraint(np.hstack([np.zeros_like(member), member]), -np.inf, domain_cap)
        )
    upper = np.concatenate([np.ones(n), np.minimum(work_cap, max_work)])
    res = milp(
        c,
        constraints=rows,
        integrality=np.concatenate([np.ones(n), np.zeros(n)]),
        bounds=Bounds(np.zeros(2 * n), np.maximum(upper, 0.0)),
    )
    if not res.success or res.x is None:
        return None
    return np.flatnonzero(res.x[:n] > 0.5).astype(np.int64)


class FedZero(SelectionPolicy):
    """Shortest round whose forecast excess energy lets K sites train, then the MIP."""

    def __init__(
        self,
        cfg: FedZeroConfig | None = None,
        forecast: Forecast | None = None,
        name: str = "fedzero",
    ) -> None:
        self.cfg = cfg or FedZeroConfig()
        self.forecast = forecast or persistence_forecast
        self.state = OortUtility(OortConfig())  # sigma_i: Oort's statistical utility
        self.name = name
        self.last_duration_s: float | None = None  # d * dt of the last round (None: fallback)

    def sigma(self, n: int) -> NDArray[np.float64]:
        """sigma_i: last statistical utility; unexplored sites get the largest one seen."""
        seen = self.state.utility
        top = max(seen.values(), default=1.0)
        return np.array([seen.get(i, top) for i in range(n)], dtype=np.float64)

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        cfg, n = self.cfg, ctx.profile.size
        k = participants(cfg.k, n)
        f = np.clip(np.asarray(self.forecast(ctx, cfg.max_steps, cfg.step_s), float), 0.0, None)
        if f.shape != (n, cfg.max_steps):
            raise ValueError(f"forecast must have shape {(n, cfg.max_steps)}, got {f.shape}")
        work = window_work(
            f, np.asarray(ctx.profile.comm_s, float), ctx.ideal_compute_s, cfg.step_s
        )
        ok = work >= cfg.min_work * (1 - 1e-12)  # (N, steps): candidate in a d-step round
        counts = ok.sum(axis=0)
        sigma = self.sigma(n)
        times = site_round_times(ctx)
        tie = 1e-9 * max(float(sigma.max()), 1e-12) * (1 - times / max(float(times.max()), 1e-12))
        for d in np.flatnonzero(counts >= k).tolist():  # FedZero: d = 1, 2, ... steps
            cand = np.flatnonzero(ok[:, d])
            chosen = solve_selection(
                sigma[cand], work[cand, d], k, cfg.min_work, cfg.max_work, tie_break=tie[cand]
            )
            if chosen is not None:
                self.last_duration_s = (d + 1) * cfg.step_s
                return np.sort(cand[chosen]).astype(np.int64)
        # No round within d_max (FedZero would wait for energy): the K fastest sites.
        self.last_duration_s = None
        return np.sort(np.lexsort((np.arange(n), times))[:k]).astype(np.int64)

    def observe(self, feedback: RoundFeedback) -> None:
        self.state.observe(feedback)

    def state_dict(self) -> dict[str, Any]:
        """Oort's utility (sigma_i) and the last round's length; the forecast is configuration."""
        return {"utility": self.state.state_dict(), "last_duration_s": self.last_duration_s}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        where = f"policy {self.name} state"
        d = sd.fields(state, where, {"utility", "last_duration_s"})
        last = sd.number(d["last_duration_s"], f"{where}.last_duration_s", optional=True)
        self.state.load_state_dict(d["utility"], f"{where}.utility")
        self.last_duration_s = last


__all__ = ["FedZero", "FedZeroConfig", "Forecast", "persistence_forecast", "solve_selection"]
__all__ += ["window_work"]


register_policy("fedzero", lambda name, ctx: FedZero())  # its paper's defaults
