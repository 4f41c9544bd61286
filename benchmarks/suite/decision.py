"""Decision time: ``build_policy("powertrip").select`` on a 10,000-site profile.

The baseline is the floor of any ranking policy: one ``np.argsort`` of the sites' power.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.suite import Row, median_time, verdict
from powertrip.selection.base import RoundContext
from powertrip.selection.registry import build_policy
from powertrip.sites import ModelledLinks, StaticPower, generate_sites, profile_at

TARGET_MS, UPDATE_BYTES, TAU = 10.0, 1.5e9, 50.0


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    sites_n, repeats = (10_000, 5) if quick else (10_000, 25)
    sites = generate_sites(sites_n, np.random.default_rng(0))
    profile = profile_at(
        sites, StaticPower(sites.base_power), ModelledLinks(sites), 0.0, UPDATE_BYTES
    ).for_ranking()
    context = RoundContext(1, 0.0, profile, TAU, UPDATE_BYTES, np.random.default_rng(0))
    policy = build_policy("powertrip")
    policy.select(context)  # warm-up
    ms = 1e3 * median_time(lambda: policy.select(context), repeats)
    sort_ms = 1e3 * median_time(lambda: np.argsort(profile.power), repeats)
    return [
        Row(f"decision: powertrip select at {sites_n} sites", ms, "ms", sort_ms,
            "np.argsort of power", sort_ms / ms, f"<= {TARGET_MS:g} ms",
            verdict(ms <= TARGET_MS), note=f"median of {repeats}, round 1"),
    ]  # fmt: skip
