"""Muon for the hidden matrices, AdamW for everything else: the curtailment paper's recipe, as
in nanochat (and Keller Jordan's Muon, whose constants ``torch.optim.Muon`` keeps).

A hidden matrix's step: Nesterov momentum 0.95 (``buf = lerp(buf, g, 0.05)``, ``u = lerp(g,
buf, 0.95)``), ``u`` orthogonalised by 5 quintic Newton-Schulz steps in bf16 with coefficients
(3.4445, -4.7750, 2.0315) after scaling it to unit Frobenius norm, then ``p -= lr_m *
sqrt(max(1, rows / cols)) * O`` (the shape scaling: a tall matrix's orthogonal update has
smaller entries). Decoupled weight decay ``p *= 1 - lr_m * wd``, the recipe's. ``lr_m`` is
``MATRIX_LR_RATIO`` times the scheduled lr: the recipe's ``lr`` is the AdamW part's, so
``{"name": "muon", "lr": 2e-3}`` runs the matrices at nanochat's 0.02 beside the LM's measured
AdamW lr. The momentum is nanochat's 0.95 whatever the recipe's ``momentum`` (SGD's) says.
Every other tensor takes the recipe's AdamW (betas, eps, decay groups): ``adamw_update``.

Which tensors are hidden matrices (``hidden_matrices``), from names and shapes alone (all an
engine sees): 2-D tensors, except

- embeddings: a name part containing ``emb`` or equal to ``tok``/``pos``/``wte``/``wpe`` (the
  project's GPT names its tables ``tok``/``pos``; its output head is ``tok``, tied);
- output heads: a name part containing ``head`` or ``classifier``, and the model's last 2-D
  tensor when it belongs to a top-level module (a CNN's or MLP's final ``Linear``: CNN2D's
  ``fc2``, ``nn.Sequential``'s last layer), not to a block inside the model (the GPT's last
  MLP projection stays a hidden matrix).

Convolution kernels (3-D and 4-D) take AdamW, not Muon on a flattened ``[out, in * k]``:
``torch.optim.Muon``, the rank engine's, refuses tensors that are not 2-D, and both engines
must run one update. So on the CNN1D (three convolutions and a head) Muon is AdamW throughout;
on the GPT the 4 matrices of every block (qkv, proj, fc, out) are Muon's.

In the rank engine the matrices go to ``torch.optim.Muon`` and the rest to torch's AdamW,
stepped as one optimizer (``RoutedOptimizer``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import torch

from powertrip.config.recipe import LocalOptimizer, decays
from powertrip.learning.optimizers.adamw import adamw_groups, adamw_update
from powertrip.learning.optimizers.base import (
    EXP_AVG,
    EXP_AVG_SQ,
    MOMENTS,
    MOMENTUM,
    MomentKind,
    OptimizerRule,
    RowStep,
    per_row,
    resolved_lr,
)

__all__ = ["MUON", "MuonRule", "RoutedOptimizer", "hidden_matrices", "orthogonalise"]

MUON_MOMENTUM = 0.95
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7  # the norm's floor before the iterations (torch's and Keller Jordan's)
#: the matrices' lr over the recipe's (AdamW's): nanochat's matrix lr 0.02 at lr 2e-3
MATRIX_LR_RATIO = 10.0
_EMBEDDINGS = frozenset({"tok", "pos", "wte", "wpe"})


def hidden_matrices(shapes: Mapping[str, tuple[int, ...]]) -> frozenset[str]:
    """The tensors of a model of ``shapes`` (in its parameter order) that Muon trains."""
    return _hidden(tuple(shapes.items()))


@cache
def _hidden(shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> frozenset[str]:
    two_d = [name for name, shape in shapes if len(shape) == 2]

    def named_out(name: str) -> bool:
        return any(
            "emb" in part or "head" in part or "classifier" in part or part in _EMBEDDINGS
            for part in name.lower().split(".")
        )

    hidden = {name for name in two_d if not named_out(name)}
    if two_d and two_d[-1].count(".") <= 1:  # the output layer of a top-level module
        hidden.discard(two_d[-1])
    return frozenset(hidden)


def orthogonalise(g: torch.Tensor) -> torch.Tensor:
    """Newton-Schulz orthogonalisation of each matrix of ``g`` [rows, m, n] (bf16 out), with
    batched matmuls: ``torch.optim.Muon``'s iteration over stacked sites at once."""
    a, b, c = NS_COEFFICIENTS
    x = g.bfloat16()
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=NS_EPS)
    for _ in range(NS_STEPS):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class MuonRule(OptimizerRule):
    kinds = (MOMENTUM, EXP_AVG, EXP_AVG_SQ)

    def moments(
        self, recipe: LocalOptimizer, shapes: Mapping[str, tuple[int, ...]]
    ) -> dict[str, tuple[MomentKind, ...]]:
        hidden = hidden_matrices(shapes)
        return {n: (MOMENTUM,) if n in hidden else (EXP_AVG, EXP_AVG_SQ) for n in shapes}

    def update(
        self, step: RowStep, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]
    ) -> None:
        hidden = hidden_matrices({n: tuple(p.shape[1:]) for n, p in params.items()})
        adamw_update(step, params, {n: g for n, g in grads.items() if n not in hidden})
        r, lr = step.recipe, step.lr * MATRIX_LR_RATIO
        for name in hidden.intersection(grads):
            p, g = params[name], grads[name]
            buf = step.moments(name)[MOMENTUM.name]
            buf.lerp_(g, 1 - MUON_MOMENTUM)
            o = orthogonalise(g.lerp(buf, MUON_MOMENTUM))
            if r.weight_decay and decays(name, tuple(p.shape[1:])):
                p.mul_(1 - per_row(lr, p) * r.weight_decay)
            scale = max(1.0, p.size(-2) / p.size(-1)) ** 0.5
            p.sub_(o.to(p.dtype) * per_row(lr * scale, p))

    def torch_optimizer(
        self, recipe: LocalOptimizer, named: Sequence[tuple[str, torch.Tensor]], fused: bool
    ) -> torch.optim.Optimizer:
        hidden = hidden_matrices({n: tuple(p.shape) for n, p in named})
        matrices = [p for n, p in named if n in hidden]
        rest = [(n, p) for n, p in named if n not in hidden]
        parts: list[torch.optim.Optimizer] = []
        if matrices:
            group = {"params": matrices, MOMENTS: (MOMENTUM.name,), "lr_ratio": MATRIX_LR_RATIO}
            parts.append(
                torch.optim.Muon(
                    [group],
                    lr=resolved_lr(recipe),
                    weight_decay=recipe.weight_decay,
                    momentum=MUON_MOMENTUM,
                    nesterov=True,
                    ns_coefficients=NS_COEFFICIENTS,
                    eps=NS_EPS,
                    ns_steps=NS_STEPS,
                    adjust_lr_fn="original",
                )
            )
        if rest:
            parts.append(adamw_groups(recipe, rest, fused))
        return RoutedOptimizer(parts)


class RoutedOptimizer(torch.optim.Optimizer):
    """torch optimizers over disjoint tensors stepped as one: one list of param groups (the rank
    engine sets every group's lr) and one state (its moment files read and write it). A group
    with an ``lr_ratio`` steps at that multiple of the lr it is given."""

    def __init__(self, parts: Sequence[torch.optim.Optimizer]) -> None:
        super().__init__([p for o in parts for g in o.param_groups for p in g["params"]], {})
        self.parts = list(parts)
        self.param_groups = [g for o in self.parts for g in o.param_groups]
        for o in self.parts:
            o.state = self.state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:  # noqa: ANN401 - torch's
        for o in self.parts:
            given = [(g, g["lr"]) for g in o.param_groups if "lr_ratio" in g]
            for g, lr in given:
                g["lr"] = lr * g["lr_ratio"]
            try:
                o.step()
            finally:
                for g, lr in given:
                    g["lr"] = lr
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none)


MUON = MuonRule()
