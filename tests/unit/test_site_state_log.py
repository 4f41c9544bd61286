"""A worker's per-site state history (``SiteStateBook`` with ``depth``): a round trained again
starts from the state before it, a newer record supersedes a redone round, and history older
than kept starts the site fresh with one line naming it."""

from __future__ import annotations

from powertrip.learning.site_optim import SiteState
from powertrip.learning.state_book import SiteEntry, SiteStateBook, round_key


def st(step: int) -> SiteState:
    return SiteState(step, {})


def test_a_round_starts_from_the_newest_state_of_an_earlier_round():
    book = SiteStateBook(depth=2)
    assert book.for_round(0, round_key(1)) is None  # never trained
    book.update(0, round_key(1), state=st(5))
    book.update(0, round_key(3), state=st(10))
    assert book.for_round(0, round_key(4)).step == 10
    assert book.for_round(0, round_key(3)).step == 5  # round 3 redone: from the state before it
    assert book.for_round(0, round_key(2)).step == 5
    assert book.latest() == {0: SiteEntry(st(10))}


def test_recording_a_redone_round_supersedes_it_and_everything_after():
    book = SiteStateBook(depth=3)
    for r in (1, 2, 3):
        book.update(7, round_key(r), state=st(r))
    book.update(7, round_key(2), state=st(20))  # round 2 trained again
    assert book.states()[7].step == 20
    assert book.for_round(7, round_key(3)).step == 20 and book.for_round(7, round_key(2)).step == 1


def test_a_round_older_than_the_kept_history_starts_fresh_naming_the_site(caplog):
    book = SiteStateBook(depth=2)
    for r in (4, 5, 6):
        book.update(3, round_key(r), state=st(r))
    with caplog.at_level("WARNING"):
        assert book.for_round(3, round_key(5)) is None
        assert book.residual(3, round_key(5)) is None  # said once
    assert [r.getMessage() for r in caplog.records] == [
        "site-003: round 5 is older than its kept optimizer states (rounds [5, 6]); it starts this "
        "round fresh"
    ]
    assert book.for_round(3, round_key(6)).step == 5
