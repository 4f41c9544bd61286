"""Per-site optimizer states saved to and loaded from one file (``site_state_io``): a round
trip is bit-identical, a failed write leaves the old file, and a file that is corrupt, not this
model's, or another run's is never resumed."""

from __future__ import annotations

import os

import pytest
import torch

from powertrip.learning import site_state_io as io
from powertrip.learning.site_optim import SiteState

SHAPES = {"w": (3, 2), "b": (2,)}
RUN = io.run_identity('{"seed": 0}', 0)


def state(step: int, seed: int, dtype=torch.float32, moment_step=None) -> SiteState:
    g = torch.Generator().manual_seed(seed)
    return SiteState(
        step,
        {
            n: {k: torch.randn(s, generator=g).to(dtype) for k in ("exp_avg", "exp_avg_sq")}
            for n, s in SHAPES.items()
        },
        moment_step,
    )


def same(a: SiteState, b: SiteState) -> bool:
    return (a.step, a.moment_step) == (b.step, b.moment_step) and all(
        torch.equal(a.moments[n][k], b.moments[n][k]) and a.moments[n][k].dtype == t.dtype
        for n, m in b.moments.items()
        for k, t in m.items()
    )


def test_a_round_trip_is_bit_identical_and_drops_sites_no_longer_hosted(tmp_path):
    path = tmp_path / "s.pt"
    saved = {0: state(7, 0, moment_step=3), 3: state(12, 1, torch.bfloat16), 5: state(0, 2)}
    io.save_site_states(path, saved, RUN, 4)
    loaded = io.load_site_states(path, RUN, SHAPES, hosted=[0, 3])
    assert loaded.round == 4 and loaded.fresh_because is None and loaded.dropped == (5,)
    assert sorted(loaded.states) == [0, 3]
    assert all(same(loaded.states[s], saved[s]) for s in (0, 3))


def test_no_file_is_a_fresh_start(tmp_path):
    loaded = io.load_site_states(tmp_path / "none.pt", RUN, SHAPES, [0])
    assert loaded.states == {} and loaded.fresh_because is None


def test_another_runs_file_is_not_resumed_and_says_why(tmp_path):
    path = tmp_path / "s.pt"
    io.save_site_states(path, {0: state(3, 0)}, io.run_identity('{"seed": 1}', 1), 2)
    loaded = io.load_site_states(path, RUN, SHAPES, [0])
    assert loaded.states == {}
    assert str(path) in loaded.fresh_because and "starting fresh" in loaded.fresh_because


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "s.pt"
    io.save_site_states(path, {0: state(3, 0)}, RUN, 1)
    before = path.read_bytes()

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        io.save_site_states(path, {0: state(9, 1)}, RUN, 2)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pt"]  # no temporary left
    assert io.load_site_states(path, RUN, SHAPES, [0]).round == 1


def bad(tmp_path, payload) -> str:
    path = tmp_path / "bad.pt"
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        torch.save(payload, path)
    with pytest.raises(io.SiteStateFileError) as err:
        io.load_site_states(path, RUN, SHAPES, [0])
    assert str(path) in str(err.value)
    return str(err.value)


def entry(step=1, moments=None, moment_step=None) -> dict:
    return {
        "step": step, "moment_step": moment_step,
        "moments": moments or {"w": {"exp_avg": torch.zeros(3, 2)}},
    }  # fmt: skip


def payload(**states) -> dict:
    return {"format": io.FORMAT, "identity": RUN, "round": 1, "states": states}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a torch file", "unreadable"),
        ({"format": "other"}, "not a site-state file"),
        (payload(x=entry()), "not a site index"),
        ({"format": io.FORMAT, "identity": RUN, "round": -1, "states": {}}, "malformed"),
    ],
)
def test_a_corrupt_file_is_refused_naming_it(tmp_path, content, message):
    assert message in bad(tmp_path, content)


def test_a_truncated_file_is_refused(tmp_path):
    good = tmp_path / "good.pt"
    io.save_site_states(good, {0: state(3, 0)}, RUN, 1)
    assert "unreadable" in bad(tmp_path, good.read_bytes()[:-40])


@pytest.mark.parametrize(
    ("site_entry", "message"),
    [
        (entry(step=-1), "step -1"),
        (entry(moments={"conv": {"exp_avg": torch.zeros(3, 2)}}), "'conv' is not in this model"),
        (entry(moments={"w": {"exp_avg": torch.zeros(2, 3)}}), "shape (2, 3)"),
        (entry(moments={"w": {"velocity": torch.zeros(3, 2)}}), "moment kinds"),
        (entry(moments={"w": {"exp_avg": torch.zeros(3, 2, dtype=torch.int64)}}), "float"),
        (entry(step=2, moment_step=3), "moment_step 3 is not in [0, 2]"),
        ({"step": 1}, "exactly 'step', 'moment_step' and 'moments'"),
    ],
)
def test_a_state_that_does_not_fit_the_model_is_refused(tmp_path, site_entry, message):
    assert message in bad(tmp_path, {**payload(), "states": {0: site_entry}})
