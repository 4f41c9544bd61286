"""Many sites as one batched step: the driver the batched engines (vmap, stacked) share.

Each site's parameters are a row of tensors stacked along a leading "site" axis, and one local
step of every site is one call of the engine's ``BatchedStep``. Each site still does exactly
its own local epochs over its own partition, in an order drawn from its own seed
(``round_batches``): longest schedules first, so the sites still training at a step are a
prefix of the rows (finished sites leave the batch), and a step gathers only as many batch
rows as its fullest site has, so padding costs no compute. One ``SiteOptimizer`` applies every
step's update to the active rows (the local optimizer seam).

A model whose state is not exactly its parameters, or whose forward is not a pure function of
them, cannot be batched (``batched_training_blocker``); its sites train one at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
from torch import nn

from powertrip.learning.batches import round_batches, round_orders
from powertrip.learning.device import TorchParams, array, tensor, to_host
from powertrip.learning.engines.base import EngineSpec, LocalRound, SiteUpdates, delta_rows
from powertrip.learning.site_optim import SiteOptimizer

__all__ = ["BatchedEngine", "BatchedStep", "batched_training_blocker", "why_not_batched"]

#: module types no batched engine can run, and why (named in the engine choice's log line)
_UNBATCHABLE: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.modules.batchnorm._BatchNorm, "batch normalisation updates buffers in place"),
    (nn.modules.dropout._DropoutNd, "dropout draws random masks"),
    (nn.RNNBase, "torch's recurrent layers have no vmap rule"),
)


def batched_training_blocker(model: nn.Module) -> str | None:
    """Why ``model`` cannot train batched, or None when it can."""
    for module in model.modules():
        for kind, why in _UNBATCHABLE:
            if isinstance(module, kind) and not (
                isinstance(module, nn.modules.dropout._DropoutNd) and module.p == 0
            ):
                return f"{type(module).__name__}: {why}"
    if any(True for _ in model.buffers()):
        return "the model has buffers, state the batched trainer would not carry"
    return None


def why_not_batched(spec: EngineSpec) -> str | None:
    """Why the sites of ``spec`` cannot train batched (None: they can)."""
    if spec.train_step is not None:
        return "the workload brings its own train_step"
    return batched_training_blocker(spec.model)


class BatchedStep(ABC):
    """One local step of stacked site rows, in place: each row's gradient and loss (the
    engine's own ``grads_and_loss``), then ``opt``'s update of the rows."""

    @abstractmethod
    def grads_and_loss(
        self, params: TorchParams, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> tuple[TorchParams, torch.Tensor]:
        """Rows ``params`` ([S, ...]) on their batches ``x``/``y`` ([S, B, ...]; ``mask``
        [S, B]: 1 for a real sample): each row's gradient of its masked mean loss (valid until
        the next call), and that loss [S]."""

    def step(
        self,
        params: TorchParams,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        opt: SiteOptimizer,
    ) -> torch.Tensor:
        """Train the S rows one step on their batches; returns their losses before the step."""
        grads, loss = self.grads_and_loss(params, x, y, mask)
        opt.update(params, grads, y.shape[0])
        return loss


class BatchedEngine:
    """A ``LocalEngine`` that trains a chunk of sites at a time as stacked rows, each local
    step of them one call of ``step``."""

    def __init__(self, name: str, spec: EngineSpec, step: BatchedStep) -> None:
        self.name, self.spec, self.step = name, spec, step

    def train(self, sites: LocalRound, out: TorchParams | None = None) -> SiteUpdates:
        cfg = self.spec.config
        out = delta_rows(sites, out)
        sizes = sites.num_samples
        # the whole round's batch orders in one call; as many sites per chunk as fill
        # max_parallel_sites full batch rows (sites smaller than a batch leave rows unused)
        orders = round_orders(cfg, sizes, sites.seeds)
        b = cfg.batch_size
        chunk = self.spec.max_parallel_sites * max(1, b // max(1, min(b, int(sizes.max()))))
        parts = []
        for start in range(0, len(sizes), chunk):
            rows = slice(start, start + chunk)
            delta = {name: d[rows] for name, d in out.items()}
            parts.append(self._train_rows(sites.rows(rows), orders[rows], delta))
        states = [s for p in parts for s in p.opt_state or ()]
        return SiteUpdates(
            deltas=out,
            num_samples=sizes,
            steps=np.concatenate([p.steps for p in parts]),
            loss=np.concatenate([p.loss for p in parts]),
            opt_state=None if parts[0].opt_state is None else states,
        )

    def _train_rows(self, sites: LocalRound, orders: np.ndarray, out: TorchParams) -> SiteUpdates:
        """One chunk of sites; their deltas go into ``out`` (rows of the round's buffer)."""
        device, k = self.spec.device, len(sites.site_indices)
        plan = round_batches(self.spec.config, sites.site_indices, sites.seeds, k, False, orders)
        gather_t = tensor(plan.gather, device)
        mask_t = tensor(plan.mask, device)
        params = {
            name: p.to(device).unsqueeze(0).expand(k, *p.shape).clone()
            for name, p in sites.global_params.items()
        }
        loss_sum = torch.zeros(k, device=device)
        x, y = sites.x, sites.y
        opt = SiteOptimizer(self.spec.config.recipe, k)  # row j is site order[j]
        opt.load([sites.states[i] for i in plan.order], params)
        with torch.no_grad():
            # the round's steps, shrinking as sites finish: step s trains the first active[s]
            # rows on the first widths[s] columns of their batches (the fullest site's samples)
            for s, (a, w) in enumerate(zip(plan.active, plan.widths, strict=True)):
                rows = gather_t[s, :a, :w]
                live = {name: p[:a] for name, p in params.items()}
                loss_sum[:a] += self.step.step(live, x[rows], y[rows], mask_t[s, :a, :w], opt)
            back_np = np.argsort(plan.order)
            back = tensor(back_np, device)
            same = bool((back_np == np.arange(k)).all())  # rows already in site order
            for name, p in params.items():  # into the host buffer: one copy per tensor
                g, p = sites.global_params[name].to(device).unsqueeze(0), p if same else p[back]
                if device.type == "cpu":
                    torch.sub(p, g, out=out[name])
                else:
                    out[name].copy_(to_host(p - g))
        return SiteUpdates(
            deltas=out,
            num_samples=sites.num_samples,
            steps=plan.steps,
            loss=array(loss_sum[back]) / plan.steps,
            opt_state=None if opt.recipe.plain_sgd else opt.export(back_np.tolist()),
        )
