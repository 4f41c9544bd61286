"""One rank of a site's distributed job: a process that joins the site's process group, keeps
its (wrapped) model and torch optimizer across rounds, and trains its share of every batch.

It talks to the parent (``SiteGroup``) over one pipe: it says ``ready`` once set up, then
answers every ``round`` with ``done`` (or ``error`` and a traceback, then exits); ``close`` or
the parent going away ends it. The model is built on the ``meta`` device and materialised on
the rank's own device after wrapping (FSDP2 shards before any memory is spent), since every
round starts by loading the global model from the group's file anyway.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from powertrip.config.recipe import LocalOptimizer
from powertrip.config.site_engine import SiteEngineConfig
from powertrip.learning.device import scalar, tensor, to_host
from powertrip.learning.shards import shard_rows
from powertrip.learning.site_engine.files import Layout, TensorFile, layout_of, load_tokens
from powertrip.learning.site_engine.moments import (
    MomentFiles,
    export_moments,
    import_moments,
    moment_kinds,
)
from powertrip.learning.site_engine.optim import build_optimizer, reset_moments, round_lrs
from powertrip.learning.site_engine.split import rank_share

__all__ = ["RankSpec", "rank_main"]


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs, pickled once when it is spawned."""

    site: str
    world: int
    factory: Callable[[], nn.Module]
    recipe: LocalOptimizer
    config: SiteEngineConfig
    device_type: str  # "cpu" or "cuda" (rank r uses cuda:r)
    workdir: str
    store: str  # the FileStore the ranks meet at (fresh for each generation of ranks)
    layout: Layout
    threads: int | None


def rank_main(rank: int, spec: RankSpec, conn) -> None:
    """The rank process's entry point (the target ``SiteGroup`` spawns)."""
    try:
        worker = _Rank(rank, spec)
        conn.send(("ready", os.getpid()))
        while True:
            try:
                kind, payload = conn.recv()
            except EOFError:  # the parent is gone
                break
            if kind == "close":
                break
            note = lambda: conn.send(("exporting", None))  # noqa: E731
            conn.send(("done", worker.train_round(**payload, note=note)))
    except BaseException:  # reported, then the process ends; the parent ends the others
        with contextlib.suppress(Exception):
            conn.send(("error", traceback.format_exc()))
        os._exit(1)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing left to clean up: skip the interpreter's (slow) teardown of torch


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the entries of its ``nn.ModuleList`` children (GPT's
    transformer blocks), the unit FSDP2 shards and activation checkpointing recomputes."""
    return [b for m in model.modules() if isinstance(m, nn.ModuleList) for b in m]


def checkpoint_block(block: nn.Module) -> None:
    """Recompute ``block``'s activations in the backward pass. Its forward is wrapped in
    place, so parameter names (the wire's, the checkpoints') do not change."""
    inner = block.forward

    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward


def _local_shard(p: torch.Tensor) -> torch.Tensor:
    """This rank's rows of an FSDP2 parameter (FSDP2 shards every parameter as a DTensor)."""
    from torch.distributed.tensor import DTensor

    assert isinstance(p, DTensor), "an FSDP2 parameter is a DTensor"
    return p.to_local()


class _Rank:
    def __init__(self, rank: int, spec: RankSpec) -> None:
        self.rank, self.spec, self.world = rank, spec, spec.world
        cfg = spec.config
        if spec.threads:
            torch.set_num_threads(spec.threads)
        if spec.device_type == "cuda":
            self.device = torch.device("cuda", rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(
            cfg.resolved_backend(self.device.type),
            store=dist.FileStore(spec.store, spec.world),
            rank=rank,
            world_size=spec.world,
            timeout=timedelta(seconds=cfg.timeout_s),
        )
        with torch.device("meta"):
            model = spec.factory()
        if any(True for _ in model.buffers()):
            raise ValueError("the site engine trains parameters only; this model has buffers")
        if layout_of(list(model.named_parameters())) != spec.layout:
            raise ValueError("the ranks' model is not the group's (names or shapes differ)")
        self.bf16 = cfg.resolved_precision(self.device.type) == "bf16"
        compiled = cfg.resolved_compile(self.device.type)
        blocks = blocks_of(model)
        if cfg.activation_checkpointing:
            for b in blocks:
                checkpoint_block(b)
        self.fsdp = cfg.sharding == "fsdp"
        if self.fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(self.device.type, (spec.world,))
            for b in blocks:
                if compiled:
                    b.compile()
                fully_shard(b, mesh=mesh)
            fully_shard(model, mesh=mesh)
            model.to_empty(device=self.device)
            self.net: nn.Module = model
        else:
            model.to_empty(device=self.device)
            self.net = model
            if spec.world > 1:
                ids = [self.device.index] if self.device.type == "cuda" else None
                self.net = DistributedDataParallel(
                    model, device_ids=ids, gradient_as_bucket_view=True
                )
            if compiled:
                self.net.compile()
        self.model = model
        self.params = dict(model.named_parameters())
        self.opt = build_optimizer(
            spec.recipe, self.params.items(), fused=self.device.type == "cuda"
        )
        work = Path(spec.workdir)
        self.global_ = TensorFile(work / "global.f32", spec.layout)
        self.delta = TensorFile(work / "delta.f32", spec.layout)
        self.x, self.y = load_tokens(work)
        kinds = moment_kinds(spec.recipe) if cfg.keep_moments else ()
        self.moments = MomentFiles(work, spec.layout, kinds)

    # -- one round --------------------------------------------------------------------------
    def train_round(
        self, rows: np.ndarray, first_step: int, reset: bool, load: int | None, note
    ) -> dict:
        """``load``: the moments' step count when the site's moments are to be loaded from
        their files first (fresh ranks); ``note()`` tells the parent the files are about to
        change (a failure from then on leaves them half written)."""
        recipe = self.spec.recipe
        cpu = time.process_time()
        self._load_global()
        fused = self.device.type == "cuda"
        if load is not None and self.moments:
            import_moments(self.opt, self.params, self.moments, self._rows, self.fsdp, load, fused)
        elif reset or not recipe.keep_state:
            reset_moments(self.opt)
        lrs = round_lrs(recipe, first_step, rows.shape[0])
        params = list(self.params.values())
        loss = torch.zeros((), device=self.device)
        self.model.train()
        for s in range(rows.shape[0]):
            for group in self.opt.param_groups:
                group["lr"] = float(lrs[s])
            loss += self._step(rows[s])
            if recipe.clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, recipe.clip_norm, foreach=True)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if self.world > 1:
            dist.all_reduce(loss)
        self._write_delta()
        moment_step = None
        if self.moments:
            note()
            moment_step = export_moments(self.opt, self.params, self.moments, self._rows, self.fsdp)
        return {
            "loss": scalar(loss) / (self.world * rows.shape[0]),
            "cpu_s": time.process_time() - cpu,
            "moment_step": moment_step,
        }

    def _step(self, row: np.ndarray) -> torch.Tensor:
        """Forward and backward of this rank's share of one batch, in micro-batches (the
        gradient synchronised on the last only); the weighted loss it contributed."""
        from powertrip.learning.site_params import sample_losses

        idx, w = rank_share(row, self.world, self.rank)
        xb = tensor(self.x[idx], self.device)
        yb = tensor(self.y[idx], self.device).long()
        if not xb.is_floating_point():
            xb = xb.long()
        wb = tensor(w, self.device)
        size = self.spec.config.micro_batch or len(idx)
        starts = range(0, len(idx), size)
        total = torch.zeros((), device=self.device)
        for k, lo in enumerate(starts):
            last = k == len(starts) - 1
            with (
                self._sync(last),
                torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16),
            ):
                logits = self.net(xb[lo : lo + size])
                per = sample_losses(logits.float(), yb[lo : lo + size])
                part = (per * wb[lo : lo + size]).sum()
                part.backward()
            total += part.detach()
        return total

    def _sync(self, last: bool):
        """Gradients reduced across ranks on the last micro-batch only."""
        if self.world == 1:
            return contextlib.nullcontext()
        if self.fsdp:
            from torch.distributed.fsdp import FSDPModule

            assert isinstance(self.model, FSDPModule)  # fully_shard made it one
            self.model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        assert isinstance(self.net, DistributedDataParallel)  # world > 1 without fsdp
        return contextlib.nullcontext() if last else self.net.no_sync()

    # -- the files --------------------------------------------------------------------------
    def _rows(self, p: torch.Tensor) -> slice | None:
        """The rows of a tensor this rank writes: its FSDP2 shard (every parameter is a
        DTensor sharded on dim 0), or (DDP: every rank holds all) ``shard_rows``' share, so N
        ranks write the update in parallel."""
        if p.dim() == 0:
            return slice(None) if self.rank == 0 else None
        lo, hi = shard_rows(p.shape[0], self.world, self.rank)
        return slice(lo, hi)

    @torch.no_grad()
    def _load_global(self) -> None:
        for name, p in self.params.items():
            src = self.global_[name]
            if not self.fsdp:
                p.copy_(src)
                continue
            local = _local_shard(p)
            if p.dim() == 0:
                local.copy_(src)
                continue
            lo, hi = shard_rows(p.shape[0], self.world, self.rank)
            if local.shape[0] != hi - lo:
                raise RuntimeError(
                    f"{name}: FSDP2 gave rank {self.rank} {local.shape[0]} rows, shard_rows "
                    f"{hi - lo}"
                )
            local.copy_(src[lo:hi])

    @torch.no_grad()
    def _write_delta(self) -> None:
        for name, p in self.params.items():
            rows = self._rows(p)
            if rows is None:
                continue
            mine = _local_shard(p) if self.fsdp else p[rows]
            torch.sub(to_host(mine), self.global_[name][rows], out=self.delta[name][rows])
