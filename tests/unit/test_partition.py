"""Per-site partitions: disjoint, sized as promised, deterministic, and skewed when asked."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.learning.partition import (
    partition,
    partition_dirichlet,
    partition_iid,
    partition_natural,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def balanced_labels(n: int = 2000, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(99).permutation(np.arange(n) % classes)


def assert_disjoint(parts: list[np.ndarray], n: int) -> np.ndarray:
    everything = np.concatenate(parts)
    assert len(np.unique(everything)) == len(everything), "a sample is on two sites"
    assert everything.min() >= 0 and everything.max() < n
    assert all(p.dtype == np.int64 for p in parts)
    return everything


# ------------------------------------------------------------------------------------- IID


def test_iid_partition_covers_every_sample_once_with_sizes_within_one():
    parts = partition_iid(1003, 10, rng())
    assert len(parts) == 10
    assert sorted(assert_disjoint(parts, 1003)) == list(range(1003))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_iid_partition_is_deterministic_per_seed():
    a, b, c = (partition_iid(500, 7, rng(s)) for s in (1, 1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_partition_needs_a_sample_per_site():
    with pytest.raises(ValueError, match="10 sites"):
        partition_iid(5, 10, rng())


# ------------------------------------------------------------------------------------- Dirichlet


def label_share_of_top_class(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean over sites of the fraction of the site's samples in its most common class."""
    return float(np.mean([np.bincount(labels[p]).max() / len(p) for p in parts]))


def test_dirichlet_partition_with_small_alpha_concentrates_labels():
    labels = balanced_labels()
    skewed = partition_dirichlet(labels, 10, alpha=0.1, rng=rng())
    mixed = partition_dirichlet(labels, 10, alpha=100.0, rng=rng())
    assert label_share_of_top_class(skewed, labels) > 0.5
    assert label_share_of_top_class(mixed, labels) < 0.2


def test_dirichlet_partition_is_disjoint_and_respects_min_size():
    labels = balanced_labels()
    parts = partition_dirichlet(labels, 20, alpha=0.5, rng=rng(3), min_size=10)
    assert len(parts) == 20
    assert len(assert_disjoint(parts, len(labels))) == len(labels)
    assert min(len(p) for p in parts) >= 10


def test_dirichlet_partition_is_deterministic_per_seed():
    labels = balanced_labels()
    a = partition_dirichlet(labels, 8, 0.5, rng(5))
    b = partition_dirichlet(labels, 8, 0.5, rng(5))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_dirichlet_partition_gives_up_with_a_clear_error_when_min_size_is_unreachable():
    labels = balanced_labels(200)
    with pytest.raises(ValueError, match=r"fewer than 9 samples in 5 attempts"):
        partition_dirichlet(labels, 20, alpha=0.01, rng=rng(), min_size=9, max_attempts=5)


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_dirichlet_partition_rejects_non_positive_alpha(alpha):
    with pytest.raises(ValueError, match="alpha must be > 0"):
        partition_dirichlet(balanced_labels(), 5, alpha, rng())


# ------------------------------------------------------------------------------------- natural


def test_natural_partition_keeps_each_group_on_one_site():
    groups = np.random.default_rng(0).integers(0, 40, size=3000)
    parts = partition_natural(groups, 10, rng())
    assert len(assert_disjoint(parts, len(groups))) == len(groups)
    site_of_group = {}
    for site, p in enumerate(parts):
        for g in np.unique(groups[p]):
            assert site_of_group.setdefault(int(g), site) == site
    assert len(site_of_group) == 40


def test_natural_partition_balances_site_sizes_greedily():
    sizes = [500, 300, 200, 200, 100, 100, 100, 50, 50]  # 1600 samples
    groups = np.repeat(np.arange(len(sizes)), sizes)
    parts = partition_natural(groups, 3, rng())
    assert sorted(len(p) for p in parts) == [500, 550, 550]


def test_natural_partition_with_fewer_groups_than_sites_names_the_counts():
    with pytest.raises(ValueError, match="3 groups for 5 sites"):
        partition_natural(np.array([0, 0, 1, 2, 2]), 5, rng())


def test_natural_partition_is_deterministic_per_seed():
    groups = np.random.default_rng(1).integers(0, 30, size=1000)
    a, b = partition_natural(groups, 6, rng(2)), partition_natural(groups, 6, rng(2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------- dispatch


def test_partition_dispatches_on_kind():
    labels = balanced_labels(300)
    groups = np.arange(300) % 12
    assert len(partition("iid", labels, 4, rng())) == 4
    assert len(partition("dirichlet", labels, 4, rng(), alpha=1.0)) == 4
    natural = partition("natural", labels, 4, rng(), groups=groups)
    assert all(len(np.unique(groups[p])) == 3 for p in natural)


def test_partition_rejects_unknown_kind_listing_valid_ones():
    with pytest.raises(ValueError, match="valid kinds: iid, dirichlet, natural"):
        partition("pathological", balanced_labels(), 4, rng())


def test_partition_rejects_zero_sites():
    with pytest.raises(ValueError, match="num_sites must be >= 1"):
        partition("iid", balanced_labels(), 0, rng())


def test_partition_rejects_bad_alpha():
    with pytest.raises(ValueError, match="alpha"):
        partition("dirichlet", balanced_labels(), 4, rng(), alpha=0)


def test_natural_partition_on_a_dataset_without_groups_is_an_error():
    with pytest.raises(ValueError, match="has none"):
        partition("natural", balanced_labels(), 4, rng(), groups=None)
