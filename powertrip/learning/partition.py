"""Split a training set into per-site index arrays (pure numpy; deterministic for a given rng).

The PowerTrip paper (§5.1) names its datasets but not how they were spread over its 100 sites,
so these are the three usual federated recipes: IID (the default), Dirichlet label skew (the
usual non-IID variant) and natural groups (LEAF Shakespeare: whole speaking roles per site, so
no role's text is spread over several sites). Every function returns one sorted int64 index
array per site, and no sample is given to two sites.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = [
    "PARTITION_KINDS",
    "partition",
    "partition_dirichlet",
    "partition_iid",
    "partition_natural",
]

PARTITION_KINDS = ("iid", "dirichlet", "natural")


def _check_sites(num_sites: int, num_samples: int) -> None:
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    if num_samples < num_sites:
        raise ValueError(f"cannot give each of {num_sites} sites a sample: only {num_samples}")


def partition_iid(num_samples: int, num_sites: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal samples out equally: site sizes differ by at most one."""
    _check_sites(num_sites, num_samples)
    perm = rng.permutation(num_samples)
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, num_sites)]


def partition_dirichlet(
    labels: np.ndarray,
    num_sites: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 2,
    max_attempts: int = 100,
) -> list[np.ndarray]:
    """Label-skewed split: each class is spread over sites with proportions ~ Dir(alpha).

    The standard FL recipe (Hsu et al. 2019; the NIID-Bench variant): a site that already holds
    more than its fair share (n / num_sites) gets no more of the next class, which keeps site
    sizes from exploding. Small alpha concentrates each label on few sites; large alpha tends to
    IID. The whole draw is repeated until every site has >= min_size samples, at most
    `max_attempts` times.
    """
    labels = np.asarray(labels)
    if alpha <= 0:
        raise ValueError(f"Dirichlet alpha must be > 0, got {alpha}")
    _check_sites(num_sites, len(labels))
    if min_size * num_sites > len(labels):
        raise ValueError(
            f"{len(labels)} samples cannot give {num_sites} sites {min_size} samples each"
        )
    fair_share = len(labels) / num_sites
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max_attempts):
        sites: list[list[np.ndarray]] = [[] for _ in range(num_sites)]
        sizes = np.zeros(num_sites, dtype=np.int64)
        for members in by_class:
            members = rng.permutation(members)
            open_sites = sizes < fair_share  # never empty: the sizes sum to less than n
            weights = rng.dirichlet(np.full(num_sites, alpha)) * open_sites
            total = weights.sum()  # can underflow to 0 for tiny alpha
            weights = weights / total if total > 0 else open_sites / open_sites.sum()
            cuts = (np.cumsum(weights) * len(members)).astype(np.int64)[:-1]
            for site, chunk in enumerate(np.split(members, cuts)):
                sites[site].append(chunk)
                sizes[site] += len(chunk)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(parts)).astype(np.int64) for parts in sites]
    raise ValueError(
        f"Dirichlet(alpha={alpha}) split of {len(labels)} samples over {num_sites} sites left a "
        f"site with fewer than {min_size} samples in {max_attempts} attempts; "
        "raise alpha or lower num_sites/min_size"
    )


def partition_natural(
    groups: np.ndarray, num_sites: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Assign whole natural groups (writers, speaking roles) to sites, balancing sample counts.

    Greedy longest-processing-time: groups in decreasing size (ties broken by a random shuffle)
    each go to the site with the fewest samples so far.
    """
    groups = np.asarray(groups)
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    ids, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if len(ids) < num_sites:
        raise ValueError(
            f"natural partition needs at least one group per site: {len(ids)} groups for "
            f"{num_sites} sites"
        )
    order = rng.permutation(len(ids))
    order = order[np.argsort(-counts[order], kind="stable")]
    members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    heap = [(0, site) for site in range(num_sites)]
    assigned: list[list[np.ndarray]] = [[] for _ in range(num_sites)]
    for g in order:
        size, site = heapq.heappop(heap)
        assigned[site].append(members[g])
        heapq.heappush(heap, (size + int(counts[g]), site))
    return [np.sort(np.concatenate(parts)).astype(np.int64) for parts in assigned]


def partition(
    kind: str,
    labels: np.ndarray,
    num_sites: int,
    rng: np.random.Generator,
    *,
    groups: np.ndarray | None = None,
    alpha: float = 0.5,
    min_size: int = 2,
) -> list[np.ndarray]:
    """Dispatch on kind: "iid" | "dirichlet" (over `labels`) | "natural" (over `groups`)."""
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    labels = np.asarray(labels)
    if kind == "iid":
        return partition_iid(len(labels), num_sites, rng)
    if kind == "dirichlet":
        return partition_dirichlet(labels, num_sites, alpha, rng, min_size=min_size)
    if kind == "natural":
        if groups is None:
            raise ValueError(
                "natural partition needs natural groups (writer or speaking role per sample); "
                "this dataset has none: use 'iid' or 'dirichlet'"
            )
        if len(groups) != len(labels):
            raise ValueError(f"groups has {len(groups)} entries but there are {len(labels)} labels")
        return partition_natural(groups, num_sites, rng)
    raise ValueError(f"unknown partition kind {kind!r}; valid kinds: {', '.join(PARTITION_KINDS)}")
