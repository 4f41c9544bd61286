"""One site as a torch.distributed job (``SiteGroup``) on the CPU over gloo: two ranks give the
update of one process training the same global batches (DDP, and FSDP2), and a rank that dies
or exits mid-round fails the round promptly with a clear error; the next round starts fresh
ranks. Ranks are spawned processes (~3 s of imports each), so a module shares its groups."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.engines import train_sites_in_turn
from powertrip.learning.gpt import GPT, GPTShape
from powertrip.learning.site_engine import RankFailed, SiteEngineConfig, SiteGroup
from powertrip.learning.trainer import get_params

VOCAB, SHAPE = 20, GPTShape(n_layer=2, n_head=2, d_model=32, context_length=16)
N = 44
#: eps 1e-5: AdamW divides by sqrt(v), so a coordinate whose gradient is ~0 (the key bias's is
#: exactly 0 up to rounding: softmax ignores a per-row shift) turns float32 rounding into steps
#: of up to +-lr. At eps 1e-8 the one-process reference differs from itself by 5e-5 when only
#: its attention kernel changes (1e-6 at eps 1e-5), so a 1e-5 tolerance needs eps 1e-5.
ADAMW = LocalOptimizer(
    name="adamw",
    lr=0.01,
    eps=1e-5,
    weight_decay=0.1,
    schedule="cosine",
    warmup_steps=1,
    total_steps=20,
    min_lr_ratio=0.1,
    clip_norm=0.5,
)


class ExitingGPT(GPT):
    """GPT whose rank 1 exits (code 3) in the forward pass while the file ``exit_when`` exists."""

    def __init__(self, exit_when: str) -> None:
        super().__init__(VOCAB, SHAPE, fused_attention=True)
        self.exit_when = exit_when

    def forward(self, idx):
        if dist.is_initialized() and dist.get_rank() == 1 and os.path.exists(self.exit_when):
            os._exit(3)
        return super().forward(idx)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (N, SHAPE.context_length), generator=g)
    return x, torch.roll(x, -1, 1)


def schedule(batch: int, seed: int = 0) -> np.ndarray:
    """One epoch over the N samples in batches of ``batch``, the last one short (-1 padding)."""
    rows = np.full(-(-N // batch) * batch, -1)
    rows[:N] = np.random.default_rng(seed).permutation(N)
    return rows.reshape(-1, batch)


def global_params() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return get_params(GPT(VOCAB, SHAPE))


def reference(recipe: LocalOptimizer, rows: np.ndarray, with_state: bool = False):
    """One process, the whole batch at once: the per-site loop (``SiteOptimizer``)."""
    x, y = data()
    cpu = torch.device("cpu")
    out = train_sites_in_turn(
        GPT(VOCAB, SHAPE), global_params(), x, y, [np.arange(N)], [rows], recipe, cpu
    )
    got = {n: d[0] for n, d in out.deltas.items()}, float(out.loss[0])
    return (*got, out.opt_state[0]) if with_state else got


def assert_same_moments(got, want, tol: float = 1e-5) -> None:
    """Two ``SiteState``s' moments: the same names, kinds, shapes and (closely) values."""
    assert {n: set(m) for n, m in got.moments.items()} == {
        n: set(m) for n, m in want.moments.items()
    }
    for name, kinds in want.moments.items():
        for kind, t in kinds.items():
            torch.testing.assert_close(got.moments[name][kind], t, rtol=tol, atol=tol * 1e-2)


def assert_same_update(got: dict, want: dict, tol: float = 1e-5) -> None:
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(
            got[name], want[name], rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.fixture(scope="module")
def marker(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exit") / "exit-now"


@pytest.fixture(scope="module")
def ddp(marker):
    x, y = data()
    # micro-batches of 4 (batch 12: 6 per rank, two micro-batches, the first under no_sync;
    # batch 7: 4 per rank, one) and activation checkpointing: neither may change the update
    cfg = SiteEngineConfig(ranks=2, micro_batch=4, activation_checkpointing=True, timeout_s=60)
    factory = functools.partial(ExitingGPT, str(marker))
    with SiteGroup(factory, x, y, ADAMW, cfg, device="cpu", site=3, threads=1) as group:
        yield group


@pytest.mark.parametrize("batch", [12, 7])  # 44 = 3 x 12 + 8, 6 x 7 + 2 (a rank all padding)
def test_two_ddp_ranks_give_the_update_of_one_process_with_adamw(ddp, batch):
    assert ddp.config.sharding == "ddp"
    rows = schedule(batch)
    out = ddp.train_round(global_params(), rows, state_reset=True, first_step=0)
    want, loss = reference(ADAMW, rows)
    assert_same_update(out.delta, want)
    assert out.loss == pytest.approx(loss, rel=1e-5)
    assert (out.steps, out.num_samples, out.first_step) == (rows.shape[0], N, 0)
    assert out.fresh_state and out.seconds > 0
    assert len(out.rank_cpu_seconds) == 2 and min(out.rank_cpu_seconds) > 0
    for r, shard in enumerate(out.shards):  # rank r's rows of every tensor, for the upload
        lo = -(-out.delta["tok.weight"].shape[0] // 2) * r
        assert torch.equal(shard["tok.weight"], out.delta["tok.weight"][lo : lo + 10])


def test_two_fsdp2_ranks_on_gloo_give_the_update_of_one_process():
    x, y = data()
    rows = schedule(12)
    cfg = SiteEngineConfig(ranks=2, sharding="fsdp", timeout_s=60)
    factory = functools.partial(GPT, VOCAB, SHAPE, fused_attention=True)
    with SiteGroup(factory, x, y, ADAMW, cfg, device="cpu", threads=1) as group:
        first = group.train_round(global_params(), rows)
        state = group.site_state  # each rank wrote its FSDP2 shard of every moment
        second = group.train_round(global_params(), rows)  # moments kept, schedule moved on
        group.load_state(state)  # the ranks load their shards back before the next round
        again = group.train_round(global_params(), rows)
    want, _, want_state = reference(ADAMW, rows, with_state=True)
    assert_same_update(first.delta, want)
    assert state.step == rows.shape[0] and state.moment_step is None
    assert_same_moments(state, want_state)
    assert not again.fresh_state
    assert_same_update(again.delta, second.delta, tol=1e-6)
    assert second.first_step == rows.shape[0] and not second.fresh_state
    assert not torch.allclose(second.delta["blocks.0.fc.weight"], first.delta["blocks.0.fc.weight"])


def test_fresh_ranks_after_a_killed_rank_resume_the_sites_moments(ddp):
    """The moments a round ends with outlive its ranks: a rank killed between rounds costs the
    next round a retry, not its AdamW state (without it, the update differs)."""
    start, rows1, rows2 = global_params(), schedule(12, seed=1), schedule(7, seed=2)
    ddp.train_round(start, rows1, state_reset=True, first_step=0)
    os.kill(ddp.pids[1], signal.SIGKILL)
    with pytest.raises(RankFailed, match="rank 1 exited with code -9"):
        ddp.train_round(start, rows2)
    resumed = ddp.train_round(start, rows2)  # fresh ranks, the site's moments loaded
    assert not resumed.fresh_state and resumed.first_step == rows1.shape[0]

    ddp.train_round(start, rows1, state_reset=True, first_step=0)  # the same, uninterrupted
    kept = ddp.train_round(start, rows2)
    assert_same_update(resumed.delta, kept.delta, tol=1e-6)
    ddp.train_round(start, rows1, state_reset=True, first_step=0)
    forgot = ddp.train_round(start, rows2, state_reset=True)  # what a lost state would give
    assert forgot.first_step == resumed.first_step
    assert not torch.allclose(forgot.delta["blocks.0.fc.weight"], kept.delta["blocks.0.fc.weight"])


@pytest.mark.reliability("R32")
def test_a_rank_killed_or_exiting_mid_round_fails_the_round_quickly_then_fresh_ranks_train(
    ddp, marker
):
    start, rows = global_params(), schedule(4)
    ddp.train_round(start, rows[:1])  # the ranks are up
    long = np.concatenate([rows] * 200)  # 2,200 steps: still training when the kill lands
    victim = ddp.pids[1]
    threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
    began = time.monotonic()
    with pytest.raises(RankFailed, match=r"^site 3: rank 1 exited with code -9 during round \d+$"):
        ddp.train_round(start, long)
    assert time.monotonic() - began < 60 and not ddp.running

    out = ddp.train_round(start, rows, state_reset=True, first_step=0)  # fresh ranks
    assert out.fresh_state and ddp.pids and victim not in ddp.pids
    assert_same_update(out.delta, reference(ADAMW, rows)[0])

    marker.touch()
    try:
        with pytest.raises(RankFailed, match="rank 1 exited with code 3") as failed:
            ddp.train_round(start, rows)
    finally:
        marker.unlink()
    assert failed.value.rank == 1 and failed.value.site == "3"
