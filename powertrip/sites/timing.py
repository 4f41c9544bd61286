"""The PowerTrip paper's time model: Eqs. 3, 4, 6, 7 and its emulated compute time (§5.1).

Pure functions over numpy arrays so the emulator, the aggregator's estimators and the profiler
share one definition of "how long does a round take".
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from powertrip.config.sites import RoundTimeModel

SPEED_IN_FIBRE_M_PER_S = 2.0e8  # c in fibre; the paper gives no value
METERS_PER_MILE = 1609.344
DEFAULT_MAX_BANDWIDTH_BPS = 10e9  # 10 Gbps, the paper's own example link (140 GB in ~2 min)
DEFAULT_REFERENCE_DISTANCE_MI = 1000.0
BITS_PER_BYTE = 8


def bandwidth_bps(
    distance_mi: ArrayLike,
    max_bps: float = DEFAULT_MAX_BANDWIDTH_BPS,
    reference_mi: float = DEFAULT_REFERENCE_DISTANCE_MI,
) -> NDArray[np.float64]:
    """B(d) = B_max / sqrt(1 + (d/d_ref)^2): flat within d_ref, inverse-proportional far out."""
    d = np.asarray(distance_mi, dtype=np.float64)
    return max_bps / np.sqrt(1.0 + (d / reference_mi) ** 2)


def propagation_delay_s(
    distance_mi: ArrayLike, speed_m_per_s: float = SPEED_IN_FIBRE_M_PER_S
) -> NDArray[np.float64]:
    """d / c, the first term of Eq. 3."""
    return np.asarray(distance_mi, dtype=np.float64) * METERS_PER_MILE / speed_m_per_s


def comm_time_s(
    latency_s: ArrayLike, bandwidth: ArrayLike, update_bytes: float, round_trip: bool = False
) -> NDArray[np.float64]:
    """Eq. 3 with equality: one-way latency plus serialisation time of an update of M bytes.

    ``round_trip`` also counts the broadcast leg; Eq. 3 itself is one way.
    """
    if update_bytes < 0:
        raise ValueError(f"update size must be >= 0 bytes, got {update_bytes}")
    lat = np.asarray(latency_s, dtype=np.float64)
    bw = np.asarray(bandwidth, dtype=np.float64)
    if np.any(bw <= 0):
        raise ValueError("bandwidth must be > 0 for every site")
    one_way = lat + update_bytes * BITS_PER_BYTE / bw
    return 2.0 * one_way if round_trip else one_way


def straggler_max(times: ArrayLike) -> float:
    """Eq. 4: a synchronous phase lasts as long as its slowest member."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0:
        raise ValueError("straggler_max needs at least one site")
    return float(t.max())


def effective_gpus(physical_gpus: int, available_power_w: float, power_per_gpu_w: float) -> int:
    """Eq. 6: GPUs that the site's power budget can keep busy, capped by what it owns."""
    if power_per_gpu_w <= 0:
        raise ValueError("power per GPU must be > 0 W")
    if available_power_w <= 0:
        return 0
    return int(min(physical_gpus, math.floor(available_power_w / power_per_gpu_w)))


def compute_time_s(ideal_s: float, power: ArrayLike) -> NDArray[np.float64]:
    """The paper's emulation (§5.1): at power fraction P a site takes T_ideal / P (0.5: 2x)."""
    p = np.asarray(power, dtype=np.float64)
    if np.any(p <= 0):
        raise ValueError("power fraction must be > 0 for a site that trains")
    return ideal_s / p


def round_time_s(
    model: RoundTimeModel,
    ideal_s: float,
    power: ArrayLike,
    comm_s: ArrayLike,
    total_sites: int | None = None,
) -> float:
    """Duration of one synchronous round over the selected sites under the chosen ground truth.

    For the aggregate model the round's work is W = total_sites * ideal_s (the whole federation's
    per-round workload, spread over the participants in proportion to their power); this is the
    calibration that fits the paper's reported ordering (docs/reproduction.md).
    """
    p = np.asarray(power, dtype=np.float64)
    c = np.asarray(comm_s, dtype=np.float64)
    if p.shape != c.shape or p.size == 0:
        raise ValueError("power and comm_s must be non-empty arrays of one shape")
    model = RoundTimeModel(model)
    if model is RoundTimeModel.PER_SITE_MAX:
        return straggler_max(compute_time_s(ideal_s, p) + c)
    if total_sites is None or total_sites < p.size:
        raise ValueError("the aggregate model needs total_sites (N) >= the selected sites")
    return float(total_sites * ideal_s / p.sum()) + straggler_max(c)


def centralized_round_time_s(ideal_s: float, power_fraction: float) -> float:
    """Centralized baseline: the whole per-round workload at one site capped at P_c; no network."""
    if not 0 < power_fraction <= 1:
        raise ValueError(f"centralized power fraction must be in (0, 1], got {power_fraction}")
    return ideal_s / power_fraction
