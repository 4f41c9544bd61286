"""Decision time: what a user waits for between two rounds of ``build_policy("powertrip")`` at
10,000 sites, the previous round's feedback (``observe``) plus the next ``select``.

Timed round after round (rounds 2..R+1; round 1 has no feedback and is untimed) on fresh policies,
so the count k moves and the noise-scale gain learns as in a run. Two profiles: the same object
every round (a static federation) and a new, changed one every round (the ranking is rebuilt).
The baseline is the floor of any ranking policy: one ``np.argsort`` of the sites' power, timed in
the same run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from benchmarks.suite import Row, verdict
from powertrip.selection.base import RoundContext, RoundFeedback
from powertrip.selection.registry import build_policy
from powertrip.sites.profiles import (
    ModelledLinks,
    SiteProfile,
    StaticPower,
    generate_sites,
    profile_at,
)

TARGET_MS, UPDATE_BYTES, TAU = 1.0, 1.5e9, 50.0


def feedback(rng: np.random.Generator, r: int, selected: np.ndarray, acc: float) -> RoundFeedback:
    """A plausible round: a noisy accuracy gain, update dispersion and direction projections."""
    gain, k = float(rng.uniform(-0.002, 0.02)), float(selected.size)
    return RoundFeedback(
        r,
        selected,
        float(rng.uniform(1, 5)),
        acc + gain,
        acc,
        mean_sq_norm=float(rng.uniform(1, 2)),
        sq_norm_of_mean=float(rng.uniform(0.01, 1)),
        effective_sites=k,
        loss=1 - acc - gain,
        previous_loss=1 - acc,
        mean_proj=float(rng.uniform(0.01, 0.5)),
        mean_sq_proj=float(rng.uniform(0.3, 1)),
    )


def decisions_ms(profiles: list[SiteProfile], repeats: int) -> list[float]:
    """ms of every timed decision: observe(round r-1) + select(round r), r = 2..len(profiles)."""
    out: list[float] = []
    for rep in range(repeats):
        rng, policy, acc = np.random.default_rng(rep), build_policy("powertrip"), 0.1
        ctx = RoundContext(1, 0.0, profiles[0], TAU, UPDATE_BYTES, rng)
        selected = policy.select(ctx)
        for r, profile in enumerate(profiles[1:], start=2):
            fb = feedback(rng, r - 1, selected, acc)
            acc = fb.accuracy
            ctx = RoundContext(r, 60.0 * r, profile, TAU, UPDATE_BYTES, rng)
            start = time.perf_counter()
            policy.observe(fb)
            selected = policy.select(ctx)
            out.append(1e3 * (time.perf_counter() - start))
    return out


def spread(ms: list[float]) -> str:
    return f"{min(ms):.3g}/{statistics.median(ms):.3g}/{max(ms):.3g}"


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    sites_n, rounds, repeats = (10_000, 10, 3) if quick else (10_000, 30, 10)
    sites = generate_sites(sites_n, np.random.default_rng(0))
    base = profile_at(
        sites, StaticPower(sites.base_power), ModelledLinks(sites), 0.0, UPDATE_BYTES
    ).for_ranking()
    rng = np.random.default_rng(1)
    changing = [
        SiteProfile(base.power * rng.uniform(0.8, 1.0, sites_n), base.comm_s, base.distance_mi)
        for _ in range(rounds + 1)
    ]
    decisions_ms([base] * 3, 1)  # warm-up
    sort_ms = []
    for _ in range(rounds * repeats):
        start = time.perf_counter()
        np.argsort(base.power)
        sort_ms.append(1e3 * (time.perf_counter() - start))
    sort_med, rows = statistics.median(sort_ms), []
    for label, profiles in (("same profile", [base] * (rounds + 1)), ("new profile", changing)):
        ms = decisions_ms(profiles, repeats)
        med = statistics.median(ms)
        rows.append(
            Row(
                f"decision: powertrip observe+select at {sites_n} sites, {label} each round",
                med,
                "ms",
                sort_med,
                "np.argsort of power",
                sort_med / med,
                f"<= {TARGET_MS:g} ms",
                verdict(med <= TARGET_MS),
                spread=(min(ms), max(ms)),
                note=f"min/median/max {spread(ms)} ms over rounds 2-{rounds + 1} x {repeats} runs; "
                f"argsort {spread(sort_ms)} ms",
            )
        )
    return rows
