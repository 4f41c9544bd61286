"""The in-turn engine: sites trained one after another, each on its own copy of the model.

The batched engines need a model whose state is exactly its parameters and whose forward is a
pure function of them. Batch normalisation updates running statistics in place, dropout draws
random masks, recurrent cuDNN layers have no batching rule: such a model trains here instead,
with the same local schedule (the same batches in the same order), the same mean loss and the
same ``SiteOptimizer`` step as the batched engines, so a model both can run gives the same
update within float32 rounding (tests/unit/test_in_turn_engine.py).

A site's state is what ``get_params`` returns: the parameters plus the floating-point buffers
(running means and variances), which FedAvg averages like the parameters.

A workload's own local step (``CustomWorkload.train_step``) trains here too, with the same
schedule: each site gets a fresh copy of the model holding the global state, the step is
handed each batch (``step(copy, x, y, lr)``) and the site sends what it made of the weights.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.batches import site_schedule
from powertrip.learning.device import TorchParams, tensor, to_host
from powertrip.learning.engines.base import (
    EngineSpec,
    LocalRound,
    LocalStep,
    LossFn,
    SiteUpdates,
    register_engine,
)
from powertrip.learning.engines.batched import why_not_batched
from powertrip.learning.site_optim import SiteOptimizer, SiteState
from powertrip.learning.site_params import get_params, sample_losses

__all__ = ["InTurnEngine", "train_sites_in_turn"]

logger = logging.getLogger(__name__)

#: one batch of one site: (the site's model, x, y) -> the batch's loss (a float or a 0-d tensor)
_BatchStep = Callable[[nn.Module, torch.Tensor, torch.Tensor], float | torch.Tensor]


class InTurnEngine:
    """A ``LocalEngine`` that trains one site at a time (``train_sites_in_turn``)."""

    name = "in-turn"

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec

    def train(self, sites: LocalRound, out: TorchParams | None = None) -> SiteUpdates:
        cfg, spec = self.spec.config, self.spec
        schedules = [
            site_schedule(cfg, len(idx), seed)
            for idx, seed in zip(sites.site_indices, sites.seeds, strict=True)
        ]
        done = train_sites_in_turn(
            spec.model,
            sites.global_params,
            sites.x,
            sites.y,
            sites.site_indices,
            schedules,
            cfg.recipe,
            spec.device,
            sites.states,
            spec.loss,
            spec.train_step,
        )
        if out is None:
            return done
        for name, d in done.deltas.items():
            out[name].copy_(d)
        return SiteUpdates(out, done.num_samples, done.steps, done.loss, done.opt_state)


def train_sites_in_turn(
    model: nn.Module,
    global_state: TorchParams,
    x: torch.Tensor,
    y: torch.Tensor,
    site_indices: Sequence[np.ndarray],
    schedules: Sequence[np.ndarray],
    recipe: LocalOptimizer | float,
    device: torch.device,
    states: Sequence[SiteState | None] | None = None,
    loss_fn: LossFn | None = None,
    train_step: LocalStep | None = None,
) -> SiteUpdates:
    """Each site's update (state after minus ``global_state``, stacked along axis 0 in the given
    order, in host memory) and its mean training loss. ``schedules[i]`` holds site i's batches
    as positions into its own rows, -1 for padding (``site_schedule``). ``recipe``: the local
    optimizer (a float: plain SGD at that lr); ``states[i]``: site i's optimizer state to
    resume; ``loss_fn``: per-sample losses instead of cross-entropy; ``train_step``: the
    workload's own step instead (called with ``recipe``'s lr; no optimizer state is kept)."""
    if not isinstance(recipe, LocalOptimizer):
        recipe = LocalOptimizer(lr=recipe)
    lr = recipe.lr
    if lr is None:
        raise ValueError("the recipe's lr must be resolved (LocalOptimizer.with_lr)")
    deltas: dict[str, list[torch.Tensor]] = {name: [] for name in global_state}
    losses = np.zeros(len(site_indices))
    opt_states: list[SiteState] = []
    # the built-in step trains one working copy, reset to the global state (and the model's
    # own bookkeeping buffers) for each site; a workload's step gets a fresh copy per site
    work = None if train_step is not None else copy.deepcopy(model).to(device).train()
    start = {n: b.detach().clone() for n, b in model.named_buffers() if n not in global_state}
    start.update((n, v.to(device)) for n, v in global_state.items())
    for i, (idx, sched) in enumerate(zip(site_indices, schedules, strict=True)):
        site = work if work is not None else copy.deepcopy(model).to(device).train()
        own = {**dict(site.named_parameters()), **dict(site.named_buffers())}
        with torch.no_grad():
            for name, value in start.items():
                own[name].copy_(value)
        step: _BatchStep
        if train_step is not None:
            step = lambda m, xb, yb: train_step(m, xb, yb, lr)  # noqa: E731
        else:
            opt = SiteOptimizer(recipe, 1)  # one row: the batched engines' step, per site
            step = _optimizer_step(site, opt, states[i] if states else None, loss_fn)
        rows = tensor(np.asarray(idx, dtype=np.int64), device)
        total: float | torch.Tensor = 0.0
        for batch in sched:
            pick = rows[tensor(batch[batch >= 0], device)]
            total += step(site, x[pick], y[pick])
        losses[i] = float(total) / max(len(sched), 1)
        if train_step is None:
            opt_states += opt.export([0])
        after = get_params(site)
        for name in global_state:
            deltas[name].append(after[name] - start[name])
    keeps_state = train_step is None and not recipe.plain_sgd
    return SiteUpdates(
        deltas={n: to_host(torch.stack(d)) for n, d in deltas.items()},
        num_samples=np.array([len(i) for i in site_indices], dtype=np.int64),
        steps=np.array([s.shape[0] for s in schedules]),
        loss=losses,
        opt_state=opt_states if keeps_state else None,
    )


def _optimizer_step(
    site: nn.Module, opt: SiteOptimizer, state: SiteState | None, loss_fn: LossFn | None
) -> _BatchStep:
    """The built-in step of ``site``: the batch's mean loss, its gradient, ``opt``'s update
    (one row: views of the site's parameters), resuming ``state``."""
    loss_of = loss_fn or sample_losses
    params = dict(site.named_parameters())
    for p in params.values():
        p.requires_grad_(True)
    rows_view = {n: p.detach().unsqueeze(0) for n, p in params.items()}
    opt.load([state], rows_view)

    def step(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = loss_of(model(xb), yb).mean()
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            opt.update(
                rows_view, {n: g.unsqueeze(0) for n, g in zip(params, grads, strict=True)}, 1
            )
        return loss.detach()

    return step


def in_turn_engine(spec: EngineSpec) -> InTurnEngine:
    why = why_not_batched(spec)
    logger.info("training sites one at a time: %s", why or "the in-turn engine was asked for")
    return InTurnEngine(spec)


register_engine("in-turn", in_turn_engine, auto_rank=90)
