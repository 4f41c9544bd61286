"""The aggregator's forecast (POWERTRIP_FORECAST): fitted on the power the profiler reported, never
on the future; the oracle is refused."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.services.aggregator.observed_power import ObservedPower, observed_forecaster
from powertrip.services.common.config import ConfigError
from powertrip.sites.forecast import EwmaAR1, Persistence
from tests.aggregator_in_process import small_run


def test_the_history_holds_each_report_until_the_next():
    h = ObservedPower()
    h.record(0.0, np.array([0.5, 1.0]))
    h.record(600.0, np.array([0.2, 0.9]))
    h.record(300.0, np.array([0.0, 0.0]))  # out of order: the history is never rewritten
    assert h.power_at(-100.0).tolist() == [0.5, 1.0]
    assert h.power_at(599.0).tolist() == [0.5, 1.0]
    assert h.power_at(1e6).tolist() == [0.2, 0.9]


def test_persistence_and_ewma_forecast_from_the_reports_only():
    h = ObservedPower()
    for k in range(40):  # site 0 oscillates around 0.5, site 1 holds 0.8
        h.record(300.0 * k, np.array([0.5 + 0.3 * (-1) ** k, 0.8]))
    now = 300.0 * 39
    assert observed_forecaster("none", h) is None
    persistence = observed_forecaster("persistence", h)
    assert persistence.mean_power(now, 3600.0).tolist() == [0.2, 0.8]
    assert isinstance(persistence.model, Persistence)
    ewma = observed_forecaster("ewma", h)
    p = ewma.mean_power(now, 3600.0)
    assert isinstance(ewma.model, EwmaAR1)
    assert 0.2 < p[0] < 0.8 and p[1] == pytest.approx(0.8)  # reverts toward the mean
    with pytest.raises(ValueError, match="oracle"):
        observed_forecaster("oracle", h)


def test_the_aggregator_builds_its_forecast_from_its_setting():
    assert small_run(POWERTRIP_INSECURE="1").forecast is None
    run = small_run(POWERTRIP_INSECURE="1", POWERTRIP_FORECAST="ewma")
    assert run.forecast.name == "ewma" and run.forecast.power is run.power_history
    with pytest.raises(ConfigError, match="oracle"):
        small_run(POWERTRIP_INSECURE="1", POWERTRIP_FORECAST="oracle")
