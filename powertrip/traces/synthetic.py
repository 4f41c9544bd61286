"""The embedded offline power trace: a stand-in for the Google traces when no real trace is given.

Per domain: a mean spare evenly spaced over [0.26, 0.51] (the paper's "typically 26% to 51%"),
a ±5-point diurnal sinusoid with a random phase, and AR(1) noise at 5-minute steps, clipped to
[0.2, 0.6]. The noise's sigma = 0.02 is its stationary standard deviation, so changing
``ar_coef`` changes how fast the noise wanders, not how far. Deterministic from ``seed``. The
result is a ``PowerTrace`` labelled "synthetic-trace".
"""

from __future__ import annotations

import numpy as np

from powertrip.traces.io import ar1
from powertrip.traces.power import (
    PRODUCTION,
    SLOT_S,
    SYNTHETIC_LABEL,
    PowerSeries,
    PowerTrace,
)

DAY_S = 86_400.0


def synthetic_power_trace(
    num_domains: int = 10,
    days: float = 31.0,
    seed: int = 0,
    spare_range: tuple[float, float] = (0.26, 0.51),
    diurnal_amplitude: float = 0.05,
    noise_sigma: float = 0.02,
    ar_coef: float = 0.95,
    clip: tuple[float, float] = (0.2, 0.6),
    slot_s: float = SLOT_S,
) -> PowerTrace:
    """``num_domains`` series of ``days`` at ``slot_s`` steps (default: the paper's 10 domains,
    one month like May 2019)."""
    if num_domains < 1:
        raise ValueError(f"need at least one power domain, got {num_domains}")
    if not 0 <= ar_coef < 1:
        raise ValueError(f"AR(1) coefficient must be in [0, 1), got {ar_coef}")
    steps = int(round(days * DAY_S / slot_s))
    if steps < 1:
        raise ValueError(f"{days} days is shorter than one {slot_s:g} s slot")
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=np.float64) * slot_s
    means = np.linspace(*spare_range, num_domains)
    innovation = noise_sigma * np.sqrt(1.0 - ar_coef**2)
    series = []
    for d, mean in enumerate(means):
        phase = rng.uniform(0.0, 2 * np.pi)
        shocks = rng.normal(0.0, innovation, size=steps)
        # start in the stationary distribution
        noise = ar1(rng.normal(0.0, noise_sigma), shocks, ar_coef)
        spare = mean + diurnal_amplitude * np.sin(2 * np.pi * t / DAY_S + phase) + noise
        spare = np.clip(spare, *clip)
        series.append(PowerSeries(f"synthetic-{d}", t.copy(), 1.0 - spare))
    notes = {
        "seed": seed,
        "spare_means": [round(float(m), 4) for m in means],
        "diurnal_amplitude": diurnal_amplitude,
        "noise_sigma": noise_sigma,
        "ar_coef": ar_coef,
        "clip": list(clip),
    }
    source = f"embedded generator (offline stand-in for the Google traces), seed {seed}"
    return PowerTrace(tuple(series), PRODUCTION, SYNTHETIC_LABEL, source, slot_s, notes)
