"""The best m sites of a ranking without sorting all N, and a per-policy memo of that prefix.

Algorithm 1 only ever looks at the first k + w sites of the ranking (its candidate window), so a
full ``np.lexsort`` of 10,000 sites was most of a decision's time. ``top_order`` returns exactly
the first m entries of the full order (ascending key, ties by site index, NaN last), so every
selection is unchanged; ``RankedPrefix`` keeps that prefix while the round's profile is the same,
since a static federation would otherwise re-rank identical numbers every round.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from powertrip.sites.profiles import SiteProfile

#: Sort at least this many sites when a prefix is (re)built: a later, slightly larger window
#: (k grows by up to w a round) is then served from the memo, and sorting 64 keys costs nothing.
MIN_PREFIX = 64


def full_order(key: NDArray[np.float64]) -> NDArray[np.int64]:
    """Ascending by key; ties broken by site index so rankings are deterministic."""
    return np.lexsort((np.arange(key.size), key)).astype(np.int64)


def top_order(key: NDArray[np.float64], m: int) -> NDArray[np.int64]:
    """``full_order(key)[:m]``, in O(N) plus a sort of the m-th smallest key's lower set.

    The candidates are every key <= the m-th smallest (all its ties included), so the stable sort
    of that set in index order breaks ties by site index exactly as the full lexsort does; NaN keys
    (sorted last by numpy) are never candidates unless the m-th key is NaN, then we sort all.
    """
    n = key.size
    if m >= n:
        return full_order(key)
    if m <= 0:
        return np.empty(0, dtype=np.int64)
    threshold = np.partition(key, m - 1)[m - 1]
    if np.isnan(threshold):
        return full_order(key)[:m]
    candidates = np.flatnonzero(key <= threshold)
    ranked = candidates[np.argsort(key[candidates], kind="stable")]
    return ranked[:m].astype(np.int64)


@runtime_checkable
class KeyedRanking(Protocol):
    """A ranking that exposes its sort key (ascending = best), so it can be ranked partially."""

    def key(self, ctx: _HasProfile) -> NDArray[np.float64]: ...


class _HasProfile(Protocol):
    @property
    def profile(self) -> SiteProfile: ...
    @property
    def update_bytes(self) -> float: ...
    @property
    def ideal_compute_s(self) -> float: ...


class RankedPrefix:
    """Memo of the best sites under one ranking, kept while the profile is unchanged.

    Profiles are immutable values (frozen dataclasses; ``for_ranking`` builds a new one), so the
    profile object and its arrays' identities, plus the context's scalars the keys depend on, are
    the cheap version stamp. A new profile object with the same keys (a static federation, rebuilt
    each round by ``profile_at``) keeps the prefix too: comparing the keys costs one pass, the
    re-ranking it avoids costs several.
    """

    def __init__(self) -> None:
        self._stamp: tuple[object, ...] | None = None
        self._key: NDArray[np.float64] | None = None
        self._prefix: NDArray[np.int64] = np.empty(0, dtype=np.int64)

    def top(self, ranking: KeyedRanking, ctx: _HasProfile, m: int) -> NDArray[np.int64]:
        """The first ``m`` sites of ``ranking`` in this round (a fresh array the caller owns)."""
        p = ctx.profile
        objects, scalars = (ranking, p, p.power, p.comm_s), (ctx.update_bytes, ctx.ideal_compute_s)
        old = self._stamp
        unchanged = old is not None and scalars == old[4:]
        if not (
            unchanged
            and old is not None
            and all(a is b for a, b in zip(objects, old[:4], strict=False))
        ):
            key = ranking.key(ctx)
            same_keys = unchanged and old is not None and old[0] is ranking
            if not (same_keys and self._key is not None and np.array_equal(key, self._key)):
                self._key, self._prefix = key, np.empty(0, dtype=np.int64)
            self._stamp = (*objects, *scalars)
        assert self._key is not None
        n = self._key.size
        m = min(m, n)
        if self._prefix.size < m:
            self._prefix = top_order(self._key, min(n, max(2 * m, MIN_PREFIX)))
        return self._prefix[:m].copy()
