"""A worker's per-site optimizer state history: a round trained again starts from the state
before it, a newer record supersedes a redone round, and history older than kept is refused."""

from __future__ import annotations

import pytest

from powertrip.learning.site_optim import SiteState, SiteStateLog


def st(step: int) -> SiteState:
    return SiteState(step, {})


def test_a_round_starts_from_the_newest_state_of_an_earlier_round():
    log = SiteStateLog()
    assert log.before(0, 1) is None  # never trained
    log.record(0, 1, st(5))
    log.record(0, 3, st(10))
    assert log.before(0, 4).step == 10
    assert log.before(0, 3).step == 5  # round 3 redone: from the state before it
    assert log.before(0, 2).step == 5
    assert log.latest() == {0: st(10)}


def test_recording_a_redone_round_supersedes_it_and_everything_after():
    log = SiteStateLog(depth=3)
    for r in (1, 2, 3):
        log.record(7, r, st(r))
    log.record(7, 2, st(20))  # round 2 trained again
    assert log.latest()[7].step == 20
    assert log.before(7, 3).step == 20 and log.before(7, 2).step == 1


def test_a_round_older_than_the_kept_history_is_refused_naming_the_site():
    log = SiteStateLog(depth=2)
    for r in (4, 5, 6):
        log.record(3, r, st(r))
    with pytest.raises(LookupError, match="site 3: round 5 is older"):
        log.before(3, 5)
    assert log.before(3, 6).step == 5
