"""The global data cursor (as in the curtailment paper's prototype): shards dealt most-progressed
first, progress committed per batch, so nothing is trained twice or skipped as sites come and go."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.curtailment.cursor import ShardCursor


def test_shards_cover_the_stream_contiguously():
    c = ShardCursor(total_rows=10, num_shards=3)

    assert list(zip(c.start, c.end, strict=True)) == [(0, 3), (3, 7), (7, 10)]
    assert c.remaining() == 10 and not c.done


def test_deal_puts_the_most_progressed_shards_first_round_robin():
    c = ShardCursor(100, 5)  # 20 rows each
    c.take([3], 15)
    c.take([1], 5)
    c.take([4], 20)  # complete: never dealt again

    deal = c.deal(["a", "b"])

    assert deal == {"a": [3, 0], "b": [1, 2]}


def test_take_crosses_shard_boundaries_in_the_dealt_order_and_commits():
    c = ShardCursor(100, 5)

    rows = c.take([2, 0], 25)

    assert rows.tolist() == list(range(40, 60)) + list(range(0, 5))
    assert c.progress.tolist() == [5, 0, 20, 0, 0]
    assert c.take([0], 3).tolist() == [5, 6, 7]  # resumes at the recorded row


def test_a_departed_sites_unconsumed_shards_go_back_to_the_pool():
    c = ShardCursor(60, 6)
    deal = c.deal(["leaving", "staying"])
    c.take(deal["leaving"], 4)  # it trained on 4 rows of its first shard, then left

    again = c.deal(["staying"])

    assert again["staying"][0] == deal["leaving"][0]  # the partial shard is continued first
    assert sorted(again["staying"]) == list(range(6))
    assert c.take(again["staying"], 56).tolist() == list(range(4, 60))


def test_every_row_is_taken_exactly_once_whatever_the_membership():
    c = ShardCursor(1_000, 17)
    rng = np.random.default_rng(0)
    taken = []
    while not c.done:
        sites = [f"s{i}" for i in range(int(rng.integers(1, 4)))]
        deal = c.deal(sites)
        for s in sites:
            n = min(int(rng.integers(0, 90)), c.remaining(deal[s]))
            taken.append(c.take(deal[s], n))

    rows = np.concatenate(taken)
    assert np.array_equal(np.sort(rows), np.arange(1_000))


@pytest.mark.parametrize(
    ("rows", "shards", "message"), [(0, 1, "at least one row"), (5, 6, r"\[1, 5\]")]
)
def test_bad_sizes_are_refused(rows, shards, message):
    with pytest.raises(ValueError, match=message):
        ShardCursor(rows, shards)


def test_taking_more_than_is_left_is_refused_without_side_effects():
    c = ShardCursor(10, 2)

    with pytest.raises(ValueError, match="only 5 left"):
        c.take([0], 6)
    assert c.rows_done == 0
