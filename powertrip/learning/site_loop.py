"""Training sites one at a time, for models the batched (``vmap``) trainer cannot run.

``vmap(grad(loss))`` over stacked site parameters needs a model whose state is exactly its
parameters and whose forward pass is a pure function of them. Batch normalisation updates
running statistics in place, dropout draws random masks, recurrent cuDNN layers have no batching
rule: such a model is trained here instead, one site after another, with the same local
schedule (the same batches in the same order), the same masked mean loss and the same plain SGD
step as the batched path, so a model both paths can run gives the same update within float32
rounding (tests/unit/test_site_loop.py).

A site's state is what ``trainer.get_params`` returns: the parameters plus the floating-point
buffers (running means and variances), which FedAvg averages like the parameters.

A workload's own local step (``CustomWorkload.train_step``) trains here too, with the same
schedule: ``train_sites_with_step`` hands each batch to it and sends what it made of the weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.device import TorchParams, tensor, to_host
from powertrip.learning.site_optim import SiteOptimizer, SiteState

if TYPE_CHECKING:
    from powertrip.learning.trainer import SiteTrainer, SiteUpdates

__all__ = ["LocalStep", "batched_training_blocker", "train_in_turn", "train_sites_in_turn"]
__all__ += ["train_sites_with_step"]

#: a workload's own local step: (model holding the site's weights, x, y, lr) -> the batch's loss
LocalStep = Callable[[nn.Module, torch.Tensor, torch.Tensor, float], float]

#: module types the batched trainer cannot run, and why (named in the fallback's log line)
_UNBATCHABLE: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.modules.batchnorm._BatchNorm, "batch normalisation updates buffers in place"),
    (nn.modules.dropout._DropoutNd, "dropout draws random masks"),
    (nn.RNNBase, "torch's recurrent layers have no vmap rule"),
)


def batched_training_blocker(model: nn.Module) -> str | None:
    """Why ``model`` cannot train with the batched trainer, or None when it can."""
    for module in model.modules():
        for kind, why in _UNBATCHABLE:
            if isinstance(module, kind) and not (
                isinstance(module, nn.modules.dropout._DropoutNd) and module.p == 0
            ):
                return f"{type(module).__name__}: {why}"
    if any(True for _ in model.buffers()):
        return "the model has buffers, state the batched trainer would not carry"
    return None


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
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> SiteUpdates:
    """Each site's update (state after minus ``global_state``, stacked along axis 0 in the given
    order, in host memory) and its mean training loss. ``schedules[i]`` holds site i's batches
    as positions into its own rows, -1 for padding (the batched trainer's schedule). ``recipe``:
    the local optimizer (a float: plain SGD at that lr); ``states[i]``: site i's optimizer state
    to resume (the batched trainer's convention, one row per site); ``loss_fn``: per-sample
    losses instead of cross-entropy."""
    from powertrip.learning.trainer import SiteUpdates, sample_losses  # shared with the batch path

    loss_fn = loss_fn or sample_losses

    names = {n for n, _ in model.named_parameters()}
    params = {n: p.to(device) for n, p in global_state.items() if n in names}
    buffers = {n: b.to(device) for n, b in global_state.items() if n not in params}
    deltas: dict[str, list[torch.Tensor]] = {name: [] for name in global_state}
    losses = np.zeros(len(site_indices))
    if not isinstance(recipe, LocalOptimizer):
        recipe = LocalOptimizer(lr=recipe)
    opt_states: list[SiteState] = []
    model.train()
    try:
        for i, (idx, sched) in enumerate(zip(site_indices, schedules, strict=True)):
            rows = tensor(np.asarray(idx, dtype=np.int64), device)
            live = {n: p.clone().requires_grad_(True) for n, p in params.items()}
            own = {n: b.clone() for n, b in buffers.items()}  # updated in place by the forward
            total = torch.zeros((), device=device)
            opt = SiteOptimizer(recipe, 1)  # one row: the batched trainer's step, per site
            rows_view = {n: p.detach().unsqueeze(0) for n, p in live.items()}
            opt.load([states[i] if states else None], rows_view)
            for step in sched:
                pick = rows[tensor(step[step >= 0], device)]
                out = functional_call(model, {**live, **own}, (x[pick],))
                loss = loss_fn(out, y[pick]).mean()
                grads = torch.autograd.grad(loss, list(live.values()))
                with torch.no_grad():
                    opt.update(
                        rows_view, {n: g.unsqueeze(0) for n, g in zip(live, grads, strict=True)}, 1
                    )
                total += loss.detach()
            losses[i] = float(total) / max(len(sched), 1)
            opt_states += opt.export([0])
            for n, v in {**live, **own}.items():
                deltas[n].append(v.detach() - global_state[n].to(device))
    finally:
        model.eval()
    return SiteUpdates(
        deltas={n: to_host(torch.stack(d)) for n, d in deltas.items()},
        num_samples=np.array([len(i) for i in site_indices], dtype=np.int64),
        steps=np.array([s.shape[0] for s in schedules]),
        loss=losses,
        opt_state=opt_states if not recipe.plain_sgd else None,
    )


def train_in_turn(
    trainer: SiteTrainer,
    global_state: TorchParams,
    x: torch.Tensor,
    y: torch.Tensor,
    site_indices: Sequence[np.ndarray],
    schedules: Sequence[np.ndarray],
    states: Sequence[SiteState | None] | None,
) -> SiteUpdates:
    """``trainer``'s sites one at a time: with its workload's own step, else with its loss."""
    recipe, device = trainer.config.recipe, trainer.device
    if trainer.train_step is not None:
        return train_sites_with_step(
            trainer.model, trainer.train_step, global_state, x, y, site_indices, schedules,
            recipe.lr, device,
        )  # fmt: skip
    return train_sites_in_turn(
        trainer.model, global_state, x, y, site_indices, schedules, recipe, device, states,
        trainer.loss,
    )  # fmt: skip


def train_sites_with_step(
    model: nn.Module,
    step: LocalStep,
    global_state: TorchParams,
    x: torch.Tensor,
    y: torch.Tensor,
    site_indices: Sequence[np.ndarray],
    schedules: Sequence[np.ndarray],
    lr: float,
    device: torch.device,
) -> SiteUpdates:
    """Each site's update made by ``step``: the site gets a fresh copy of ``model`` holding
    ``global_state`` (training mode), ``step(copy, x, y, lr)`` on each batch of its schedule
    (``train_sites_in_turn``'s), and sends its state after minus ``global_state``, which is
    what FedAvg averages; its loss is the mean of what ``step`` returned."""
    from powertrip.learning.trainer import SiteUpdates, get_params

    deltas: dict[str, list[torch.Tensor]] = {name: [] for name in global_state}
    losses = np.zeros(len(site_indices))
    for i, (idx, sched) in enumerate(zip(site_indices, schedules, strict=True)):
        site = copy.deepcopy(model).to(device).train()
        own = {**dict(site.named_parameters()), **dict(site.named_buffers())}
        with torch.no_grad():
            for name, value in global_state.items():
                own[name].copy_(value)
        rows = tensor(np.asarray(idx, dtype=np.int64), device)
        total = 0.0
        for batch in sched:
            pick = rows[tensor(batch[batch >= 0], device)]
            total += step(site, x[pick], y[pick], lr)
        losses[i] = total / max(len(sched), 1)
        after = get_params(site)
        for name, value in global_state.items():
            deltas[name].append(after[name] - value.to(device))
    return SiteUpdates(
        deltas={n: to_host(torch.stack(d)) for n, d in deltas.items()},
        num_samples=np.array([len(i) for i in site_indices], dtype=np.int64),
        steps=np.array([s.shape[0] for s in schedules]),
        loss=losses,
    )
