"""Ranking only the prefix Algorithm 1 needs changes no decision: the partial ranking, and every
policy driven round after round, against the old path (a full lexsort of all sites each round)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from powertrip.selection.base import RoundContext, RoundFeedback, SelectionPolicy
from powertrip.selection.greedy import VARIANTS, PowerTripGreedy
from powertrip.selection.registry import PolicyContext, build_policy
from powertrip.selection.topk import full_order, top_order
from powertrip.sites.profiles import SiteProfile


class FullSortGreedy(PowerTripGreedy):
    """The decision path before the partial ranking, verbatim: a full order every round."""

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        order = self.config.ranking.order(ctx)
        n = order.size
        if self.k is None:
            self.k = min(max(self.config.scaled(n)[0], self.config.min_sites), n)
        elif self._feedback is not None:
            self.k = self._next_k(min(self.k, n), self.prefix_times(ctx, order), self._feedback)
        self.k = min(self.k, n)
        self._feedback = None
        self.k_history.append(self.k)
        return order[: self.k]


def random_profile(rng: np.random.Generator, n: int, ties: bool) -> SiteProfile:
    """Continuous values, or a few levels only so that many scores tie exactly."""
    if ties:
        power = rng.choice([0.25, 0.5, 0.75, 1.0], n)
        comm = rng.choice([0.1, 0.2, 0.4], n)
    else:
        power = rng.uniform(0.05, 1.0, n)
        comm = rng.uniform(0.01, 2.0, n)
    return SiteProfile(power, comm, rng.uniform(0, 3000, n))


def feedback(rng: np.random.Generator, r: int, selected: NDArray[np.int64], acc: float):
    """A plausible round: accuracy up by a noisy amount, update dispersion and projections."""
    k = float(selected.size)
    gain = float(rng.uniform(-0.002, 0.02))
    return RoundFeedback(
        r,
        selected,
        float(rng.uniform(1, 5)),
        acc + gain,
        acc,
        mean_sq_norm=float(rng.uniform(1, 2)),
        sq_norm_of_mean=float(rng.uniform(0.01, 1)),
        effective_sites=k,
        loss=1.0 - acc - gain,
        previous_loss=1.0 - acc,
        half_loss=1.0 - acc - gain * rng.uniform(0.3, 1.2),
        half_sites=max(k / 2, 1.0),
        half_accuracy=acc + gain * rng.uniform(0.3, 1.2),
        mean_proj=float(rng.uniform(0.01, 0.5)),
        mean_sq_proj=float(rng.uniform(0.3, 1)),
    )


def drive(new: SelectionPolicy, old: SelectionPolicy, n: int, seed: int, rounds: int) -> None:
    """Both policies see the same rounds; the profile is kept, rebuilt with equal values, or
    changed, so the memo is hit, kept by content and invalidated."""
    rng = np.random.default_rng(seed)
    ties = seed % 2 == 0
    profile, acc = random_profile(rng, n, ties), 0.1
    for r in range(1, rounds + 1):
        change = r % 4
        if change == 1 and r > 1:
            profile = random_profile(rng, n, ties)
        elif change == 2:
            profile = SiteProfile(profile.power.copy(), profile.comm_s.copy(), profile.distance_mi)
        ctx = RoundContext(r, 10.0 * r, profile, 2.0 + (r % 3 == 0), 1.5e9, rng)
        got, want = new.select(ctx), old.select(ctx)
        assert got.tolist() == want.tolist(), (r, n, seed)
        fb = feedback(rng, r, want, acc)
        acc = fb.accuracy
        new.observe(fb)
        old.observe(fb)


@pytest.mark.parametrize("n", [10, 200, 10_000])
# powertrip-joint ranks by its own grid-inflated key, with top_order directly (no memo): the
# prefix test below covers it
@pytest.mark.parametrize("name", [*VARIANTS, "powertrip-forecast", "static-7"])
def test_every_policy_selects_the_same_sites_as_the_full_sort(name, n):
    for seed in range(3 if n < 10_000 else 2):
        new = build_policy(name)
        old = build_policy(name)
        if isinstance(old, PowerTripGreedy):
            old = FullSortGreedy(old.config, name)
        drive(new, old, n, seed, rounds=12)


@pytest.mark.parametrize("window", [0, 1, 50])
def test_any_window_selects_the_same_sites(window):
    for seed in range(4):
        context = PolicyContext(greedy_overrides={"window": window, "k0": 3})
        new = build_policy("powertrip-paper", context)
        old = FullSortGreedy(build_policy("powertrip-paper", context).config)
        drive(new, old, 200, seed, rounds=15)


def test_the_prefix_is_the_full_orders_prefix_ties_and_nan_included():
    rng = np.random.default_rng(0)
    keys = [
        rng.choice([0.0, -0.0, 1.0, 2.0], 300),
        rng.normal(size=300),
        np.full(50, 3.0),
        np.where(rng.random(100) < 0.3, np.nan, rng.choice([1.0, np.inf, -np.inf], 100)),
        np.array([np.nan, np.nan, 1.0]),
    ]
    for key in keys:
        full = full_order(key)
        for m in range(0, key.size + 2):
            assert top_order(key, m).tolist() == full[:m].tolist(), m
