"""The static-k sweep's default: a function of the site count (docs/scale.md).

The sweep runs static-k for each k in it; k* and static-optimal come from it, and so does the
automatic target. A fixed list of counts does not scale: at 150 sites a sweep of k <= 50 never
reached the target. The default is therefore 10%, 20%, ..., 100% of the sites, rounded, at
least 1, deduplicated; at 100 sites that is the old fixed default (10, 20, ..., 100)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_SWEEP_FRACTIONS", "rescaled_sweep", "scaled_sweep"]

DEFAULT_SWEEP_FRACTIONS: tuple[float, ...] = tuple(i / 10 for i in range(1, 11))


def _count(fraction: float, num_sites: int) -> int:
    # round half up (not Python's banker's rounding), so 2.5 sites -> 3
    return min(num_sites, max(1, int(fraction * num_sites + 0.5)))


def scaled_sweep(
    num_sites: int, fractions: Sequence[float] = DEFAULT_SWEEP_FRACTIONS
) -> tuple[int, ...]:
    """Each fraction of ``num_sites`` rounded to a count in 1..num_sites, sorted, deduplicated."""
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    if any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"sweep fractions must be in (0, 1], got {tuple(fractions)}")
    return tuple(sorted({_count(f, num_sites) for f in fractions}))


def rescaled_sweep(sweep: Sequence[int], from_sites: int, to_sites: int) -> tuple[int, ...]:
    """A sweep stated for ``from_sites`` sites (a preset's) carried to ``to_sites``: each k
    keeps its share of the sites. Unchanged when the site count is."""
    if from_sites == to_sites:
        return tuple(sorted(set(sweep)))
    return scaled_sweep(to_sites, [min(1.0, k / from_sites) for k in sweep])
