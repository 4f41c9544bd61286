"""Per-site optimizer states saved to and loaded from one file (``site_state_io``): a round
trip is bit-identical, a failed write leaves the old file, and what a file holds is data, not
trust: a file that is empty, cut, random, not a state file or another run's resumes nothing, a
site whose entry is wrong (its step count, another model's shapes, non-finite moments) starts
fresh, each with the reason in plain words, and nothing is raised (a worker keeps serving)."""

from __future__ import annotations

import os

import pytest
import torch

from powertrip.learning import site_state_io as io
from powertrip.learning.site_optim import SiteState

SHAPES = {"w": (3, 2), "b": (2,)}
RUN = io.run_identity('{"seed": 0}', 0)


def state(step: int, seed: int, dtype=torch.float32, moment_step=None) -> SiteState:
    """AdamW moments: a first moment of either sign, a second one >= 0."""
    g = torch.Generator().manual_seed(seed)
    return SiteState(
        step,
        {
            n: {
                "exp_avg": torch.randn(s, generator=g).to(dtype),
                "exp_avg_sq": torch.randn(s, generator=g).square().to(dtype),
            }
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
    assert loaded.round == 4 and loaded.trusted and loaded.dropped == (5,)
    assert sorted(loaded.states) == [0, 3]
    assert all(same(loaded.states[s], saved[s]) for s in (0, 3))


def test_no_file_is_a_fresh_start(tmp_path):
    loaded = io.load_site_states(tmp_path / "none.pt", RUN, SHAPES, [0])
    assert loaded.states == {} and loaded.trusted


def test_another_runs_file_is_not_resumed_and_says_why(tmp_path):
    path = tmp_path / "s.pt"
    io.save_site_states(path, {0: state(3, 0)}, io.run_identity('{"seed": 1}', 1), 2)
    loaded = io.load_site_states(path, RUN, SHAPES, [0])
    assert loaded.states == {}
    assert (
        loaded.unusable == f"another run's states (run {loaded_run(path)!r}; this run is {RUN!r})"
    )


def loaded_run(path) -> str:
    return torch.load(path, weights_only=True)["identity"]


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


def unusable(tmp_path, content) -> str:
    """Why a file holding ``content`` (bytes as they are, else ``torch.save``d) resumes nothing."""
    path = tmp_path / "bad.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    loaded = io.load_site_states(path, RUN, SHAPES, [0])
    assert loaded.states == {} and loaded.unusable is not None
    return loaded.unusable


def entry(step=1, moments=None, moment_step=None) -> dict:
    return {
        "step": step,
        "moment_step": moment_step,
        "moments": moments or {"w": {"exp_avg": torch.zeros(3, 2)}},
    }


def payload(**states) -> dict:
    return {"format": io.FORMAT, "identity": RUN, "round": 1, "states": states}


def saved_file(tmp_path) -> bytes:
    good = tmp_path / "good.pt"
    io.save_site_states(good, {0: state(3, 0), 1: state(4, 1)}, RUN, 1)
    return good.read_bytes()


class Evil:  # what a pickle may carry and a state file never does
    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty (0 bytes)"),
        (bytes(range(256)) * 4, "not a state file (1024 bytes, not in the saved-tensor format)"),
        ({"format": "other"}, "not a site-state file (format 'other')"),
        ({"w": torch.zeros(3, 2)}, "not a site-state file (a torch file holding something else)"),
        ([Evil()], "not a state file (it holds Python objects a state file never has)"),
        (payload(x=entry()), "damaged (site key 'x' is not a site index)"),
        ({**payload(), "round": -1}, "damaged (no valid round number or site table)"),
    ],
)
def test_a_file_that_is_not_a_state_file_resumes_nothing_and_says_why(tmp_path, content, reason):
    assert unusable(tmp_path, content) == reason


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_a_truncated_file_resumes_nothing_and_says_it_is_cut(tmp_path, keep):
    whole = saved_file(tmp_path)
    cut = whole[: int(len(whole) * keep)]
    assert (
        unusable(tmp_path, cut) == f"truncated ({len(cut)} bytes; the end of the file is missing)"
    )


def test_random_bytes_never_quote_the_library(tmp_path):
    for seed in range(5):
        noise = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(seed))
        why = unusable(tmp_path, bytes(noise.to(torch.uint8).tolist()))
        assert why.startswith("not a state file") and "weights_only" not in why


def nan_like(shape):
    return torch.full(shape, float("nan"))


@pytest.mark.parametrize(
    ("site_entry", "reason"),
    [
        (entry(step=-1), "step count -1 is negative"),
        (entry(step=2.5), "step count 2.5 is not a whole number"),
        (entry(step="7"), "step count '7' is not a whole number"),
        (entry(step=2**50), f"step count {2**50} is absurd (more than 2**40)"),
        (
            entry(step=2, moment_step=3),
            "moment step count 3 is absurd (more than the step count 2)",
        ),
        (
            entry(moments={"w": {"exp_avg": torch.zeros(2, 3)}}),
            "moments of another model ('w' has shape (2, 3), this model's is (3, 2))",
        ),
        (
            entry(moments={"conv": {"exp_avg": torch.zeros(3, 2)}}),
            "moments of another model (this model has no tensor 'conv')",
        ),
        (
            entry(moments={"w": {"exp_avg": torch.zeros(3, 2), "exp_avg_sq": nan_like((3, 2))}}),
            "non-finite moments (NaN in exp_avg_sq of 'w')",
        ),
        (
            entry(moments={"b": {"momentum": torch.tensor([0.0, float("-inf")])}}),
            "non-finite moments (Inf in momentum of 'b')",
        ),
        (
            entry(moments={"b": {"exp_avg_sq": torch.tensor([0.0, -1e-3])}}),
            "negative second moments (in exp_avg_sq of 'b')",
        ),
        (
            entry(moments={"w": {"velocity": torch.zeros(3, 2)}}),
            "damaged entry (moment kinds other than ['exp_avg', 'exp_avg_sq', 'momentum'])",
        ),
        (
            entry(moments={"w": {"exp_avg": torch.zeros(3, 2, dtype=torch.int64)}}),
            "exp_avg of 'w' is not a float tensor",
        ),
        ({"step": 1}, "damaged entry (not exactly 'step', 'moment_step' and 'moments')"),
    ],
)
def test_a_site_whose_state_is_wrong_starts_fresh_and_the_others_resume(
    tmp_path, site_entry, reason
):
    path = tmp_path / "s.pt"
    torch.save({**payload(), "states": {0: site_entry, 1: entry(step=4)}}, path)
    loaded = io.load_site_states(path, RUN, SHAPES, [0, 1])
    assert dict(loaded.refused) == {0: reason} and loaded.unusable is None
    assert sorted(loaded.states) == [1] and loaded.states[1].step == 4 and not loaded.trusted


def test_a_bad_site_no_longer_hosted_is_only_dropped(tmp_path):
    path = tmp_path / "s.pt"
    torch.save({**payload(), "states": {0: entry(step=-1), 1: entry(step=4)}}, path)
    loaded = io.load_site_states(path, RUN, SHAPES, [1])
    assert loaded.trusted and loaded.dropped == (0,) and sorted(loaded.states) == [1]


def test_set_aside_keeps_the_file_under_a_new_name_and_never_overwrites_one(tmp_path):
    path = tmp_path / "s.pt"
    names = []
    for content in (b"one", b"two"):
        path.write_bytes(content)
        names.append(io.set_aside(path))
    assert not path.exists() and len(set(names)) == 2
    assert [n.read_bytes() for n in names] == [b"one", b"two"]
    assert all(n.name.startswith("s.pt.bad-") for n in names)
