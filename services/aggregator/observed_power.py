"""The aggregator's forecast of spare power (docs/forecasts.md, "Over the services").

The aggregator knows the future of no site's power: only what the profiler has told it so far.
``ObservedPower`` is that history as a ``PowerSource`` (each site's last reported power fraction
holds until the next report; before the first one, the first), and ``observed_forecaster``
builds the run's ``forecast`` model on it: ``persistence`` (the last report holds) or ``ewma``
(the AR(1) reversion to an exponentially weighted mean, fitted on the reports as they arrive).
``oracle`` needs the true future and is refused at start-up.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np
from numpy.typing import NDArray

from powertrip.config.forecast import ForecastModel
from powertrip.sites.forecast import Forecaster, build_forecaster

__all__ = ["ObservedPower", "observed_forecaster"]


class ObservedPower:
    """Power fractions reported at increasing times; ``power_at(t)``: the last at or before t."""

    def __init__(self) -> None:
        self._times: list[float] = []
        self._power: list[NDArray[np.float64]] = []
        self._lock = threading.Lock()

    def record(self, t_s: float, power: NDArray[np.float64]) -> None:
        """A report at ``t_s``; one at the time of the last replaces it (a replayed round)."""
        p = np.array(power, dtype=np.float64)
        with self._lock:
            if self._times and t_s <= self._times[-1]:
                if t_s < self._times[-1]:
                    return  # the history is never rewritten: forecasts already made stand
                self._power[-1] = p
                return
            self._times.append(float(t_s))
            self._power.append(p)

    def state_dict(self) -> dict[str, NDArray[np.float64]]:
        """The reports so far as arrays (times (R,), power (R, N)): a forecast that reads the
        past (ewma) is fitted on all of them, so a resumed run needs them to forecast as an
        uninterrupted one."""
        with self._lock:
            n = self._power[0].size if self._power else 0
            power = np.array(self._power, dtype=np.float64).reshape(len(self._power), n)
            return {"times": np.array(self._times, dtype=np.float64), "power": power}

    def load_state_dict(self, state: object) -> None:
        """``state_dict``'s value back; TypeError or ValueError naming what does not fit."""
        if not isinstance(state, dict) or set(state) != {"times", "power"}:
            raise TypeError("power history state is not {times, power}")
        times, power = state["times"], state["power"]
        if not isinstance(times, np.ndarray) or not isinstance(power, np.ndarray):
            raise TypeError("power history state holds a value that is not an array")
        if times.ndim != 1 or power.ndim != 2 or power.shape[0] != times.size:
            raise ValueError("power history: times and power do not pair up")
        if times.size > 1 and not bool(np.all(np.diff(times) > 0)):
            raise ValueError("power history: times are not increasing")
        with self._lock:
            self._times = [float(t) for t in times]
            self._power = [np.array(p, dtype=np.float64) for p in power]

    def power_at(self, t_s: float) -> NDArray[np.float64]:
        with self._lock:
            if not self._power:
                raise RuntimeError("no power reported yet")
            i = bisect.bisect_right(self._times, t_s) - 1
            return self._power[max(i, 0)].copy()


def observed_forecaster(model: ForecastModel, history: ObservedPower) -> Forecaster | None:
    """The run's forecast over what the profiler reported (None for ``none``); the setting's
    type has already refused an unknown model."""
    if model == "oracle":
        raise ValueError(
            "POWERTRIP_FORECAST=oracle needs the true future power, which the aggregator does "
            "not have; use persistence or ewma"
        )
    if model == "none":
        return None
    return _Deferred(model, history)


class _Deferred:
    """The forecaster, built at its first question (after the first report: ewma reads its
    history from the start)."""

    def __init__(self, model: ForecastModel, history: ObservedPower) -> None:
        self.name: str = model  # as a Forecaster names itself
        self._model, self.power = model, history
        self.model: Forecaster | None = None

    def mean_power(self, now_s: float, horizon_s: float) -> NDArray[np.float64]:
        if self.model is None:
            self.model = build_forecaster(self._model, self.power)
        assert self.model is not None
        return self.model.mean_power(now_s, horizon_s)
