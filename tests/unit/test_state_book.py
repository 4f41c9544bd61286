"""The one book of per-site state (``SiteStateBook``): what a site resumes is decided in one
place (``for_round``), its optimizer state and its codec residual are saved in one file format
(``site_state_io``'s, so files written before residuals existed still read), and whatever is
read back, from a file or a checkpoint, goes through one check (finite, the model's shapes, a
step count in range, the moment kinds the recipe's rule keeps for each tensor): a bad entry is
set aside with one line naming the site and the reason while the others resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning import site_state_io
from powertrip.learning.site_optim import SiteState
from powertrip.learning.state_book import LOADED, SiteStateBook, round_key

SHAPES = {"w": (3, 2), "b": (2,)}
ADAMW = LocalOptimizer(name="adamw", lr=1e-3)
RUN = "run-7"


def adamw_state(step: int, seed: int = 0) -> SiteState:
    g = torch.Generator().manual_seed(seed)
    return SiteState(
        step,
        {
            n: {
                "exp_avg": torch.randn(s, generator=g),
                "exp_avg_sq": torch.randn(s, generator=g).square(),
            }
            for n, s in SHAPES.items()
        },
    )


def residual(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def same_state(a: SiteState | None, b: SiteState | None) -> bool:
    assert a is not None and b is not None
    return (a.step, a.moment_step) == (b.step, b.moment_step) and all(
        torch.equal(a.moments[n][k], t) for n, m in b.moments.items() for k, t in m.items()
    )


def test_a_state_carries_on_within_its_round_and_is_reset_per_the_recipe_in_a_new_one():
    kept, reset = (
        SiteStateBook(ADAMW),
        SiteStateBook(ADAMW.model_copy(update={"keep_state": False})),
    )
    for book in (kept, reset):
        book.update(4, round_key(1, 1), state=adamw_state(10))
    assert kept.for_round(4, round_key(2, 2)) is kept.states()[4]  # everything carries over
    fresh = reset.for_round(4, round_key(2, 2))  # a new round: the step count alone
    assert fresh is not None and (fresh.step, fresh.moments, fresh.moment_step) == (10, {}, 0)
    # a later sub-round of the same round (a lone site's next chunk) carries the moments on
    assert reset.for_round(4, round_key(1, 2)) is reset.states()[4]
    assert reset.for_round(5, round_key(2, 2)) is None  # never trained: a fresh start


def test_a_residual_is_written_beside_the_state_of_the_same_round():
    book = SiteStateBook(ADAMW, depth=2)
    book.update(0, round_key(1), state=adamw_state(3))
    book.update(0, round_key(1), residual=residual(1))
    book.update(0, round_key(2), state=adamw_state(6))  # trained, not yet coded: residual kept
    assert book.step(0) == 6 and book.residual(0) is book.residual(0, round_key(2))
    assert np.array_equal(book.residual(0)["w"], residual(1)["w"])
    assert book.for_round(0, round_key(2)).step == 3  # round 2 redone: from round 1's state


def test_a_saved_book_loads_bit_identically_residuals_included(tmp_path):
    path = tmp_path / "site-states.pt"
    book = SiteStateBook(ADAMW, SHAPES, depth=3)
    book.update(0, round_key(4), state=adamw_state(7, 0), residual=residual(0))
    book.update(3, round_key(4), state=adamw_state(9, 1))  # no residual: none saved
    book.save(path, RUN, 4)
    again = SiteStateBook(ADAMW, SHAPES, depth=3)
    loaded = again.load(path, RUN, hosted=[0, 3])
    assert loaded.trusted and loaded.round == 4
    assert all(same_state(again.states()[s], book.states()[s]) for s in (0, 3))
    assert all(np.array_equal(again.residual(0)[n], residual(0)[n]) for n in SHAPES)
    assert again.residual(3) is None and again.entry(0) == (LOADED, again.latest()[0])
    assert "residual" not in torch.load(path, weights_only=True)["states"][3]


def test_a_file_written_before_residuals_existed_reads_as_before(tmp_path):
    path = tmp_path / "site-states.pt"
    old = {"step": 5, "moment_step": None, "moments": {"w": {"exp_avg": torch.ones(3, 2)}}}
    torch.save(
        {"format": site_state_io.FORMAT, "identity": RUN, "round": 2, "states": {1: old}}, path
    )
    book = SiteStateBook(ADAMW, SHAPES)
    assert book.load(path, RUN, [1]).trusted
    assert book.step(1) == 5 and book.residual(1) is None


def entry(**change) -> dict:
    good = site_state_io.entry_payload(adamw_state(4), residual(2))
    return {**good, **change}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (entry(step=-3), "step count -3 is negative"),
        (
            entry(moments={"w": {"momentum": torch.zeros(3, 2)}}),
            "moments the recipe does not keep (momentum of 'w'; it keeps exp_avg, exp_avg_sq)",
        ),
        (entry(residual={"w": torch.full((3, 2), float("nan"))}), "non-finite residual (in 'w')"),
        (
            entry(residual={"w": torch.zeros(2, 3)}),
            "residual of another model ('w' has shape (2, 3), this model's is (3, 2))",
        ),
        (
            entry(residual={"w": torch.zeros(3, 2, dtype=torch.float64)}),
            "residual of 'w' is not a float32 tensor",
        ),
    ],
)
def test_a_bad_entry_is_set_aside_with_one_line_naming_the_site_and_the_others_resume(
    tmp_path, caplog, bad, reason
):
    path = tmp_path / "site-states.pt"
    good = entry()
    raw = {"format": site_state_io.FORMAT, "identity": RUN, "round": 3, "states": {0: good, 1: bad}}
    torch.save(raw, path)
    book = SiteStateBook(ADAMW, SHAPES)
    with caplog.at_level("WARNING"):
        book.load(path, RUN, [0, 1])
    (aside,) = sorted(tmp_path.glob("site-states.pt.bad-*"))
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{path} set aside as {aside.name}: {reason}; site-001 starts fresh, site-000 resumed "
        "from round 3"
    ]
    assert sorted(book.states()) == [0] and book.residual(0) is not None
    assert sorted(SiteStateBook(ADAMW, SHAPES).load(path, RUN, [0, 1]).states) == [
        0
    ]  # written back

    with pytest.raises(ValueError, match=f"site state of site-001: {reason.split(' (')[0]}"):
        SiteStateBook(ADAMW, SHAPES).load_state_dict({0: good, 1: bad})


def test_a_checkpoints_state_dict_round_trips():
    book = SiteStateBook(ADAMW, SHAPES)
    book.update(2, round_key(1), state=adamw_state(5), residual=residual(5))
    again = SiteStateBook(ADAMW, SHAPES)
    again.load_state_dict(book.state_dict())
    assert same_state(again.states()[2], book.states()[2])
    assert all(np.array_equal(again.residual(2)[n], residual(5)[n]) for n in SHAPES)


def test_the_rank_engines_zero_moments_are_left_at_the_books_boundary(tmp_path):
    """Muon keeps momentum on hidden matrices and AdamW's moments elsewhere; the rank engine's
    moment files hold every kind for every tensor (zero where none is kept). What the book saves
    is the rule's plan, and it reads back under the strict check."""
    shapes = {"emb.weight": (5, 4), "h.weight": (4, 4), "head.weight": (3, 4)}
    muon = LocalOptimizer(name="muon", lr=1e-3)
    kinds = ("exp_avg", "exp_avg_sq", "momentum")
    ranks_form = SiteState(2, {n: {k: torch.ones(s) for k in kinds} for n, s in shapes.items()})
    book = SiteStateBook(muon, shapes)
    book.update(0, round_key(1), state=ranks_form)
    book.save(tmp_path / "s.pt", RUN, 1)
    again = SiteStateBook(muon, shapes)
    assert again.load(tmp_path / "s.pt", RUN, [0]).trusted
    kept = {n: sorted(m) for n, m in again.states()[0].moments.items()}
    assert kept == {
        "emb.weight": ["exp_avg", "exp_avg_sq"],
        "h.weight": ["momentum"],
        "head.weight": ["exp_avg", "exp_avg_sq"],
    }


def test_a_state_trained_to_nan_is_kept_as_fresh_moments_with_one_line(caplog):
    book = SiteStateBook(ADAMW, SHAPES)
    nan = adamw_state(8)
    nan.moments["b"]["exp_avg"][0] = float("nan")
    with caplog.at_level("WARNING"):
        (kept,) = book.record_trained([6], round_key(2), [nan])
    assert (kept.step, kept.moments, kept.moment_step) == (8, {}, 0)
    assert book.states()[6] is kept
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("site-006: its optimizer state after round 2 is not kept nor saved")
