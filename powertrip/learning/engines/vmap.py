"""The vmap engine: one local step of every site is one ``vmap(grad(loss))`` call over the
stacked site parameters (``torch.func.functional_call`` of the shared model).

It runs any model whose state is its parameters and whose forward is a pure function of them
(``batched_training_blocker``), with cross-entropy or a workload's own per-sample loss: the
batched engine for every model that is not a layer chain (transformers, skip connections, 2-D
convolutions) or brings its own loss, about 4-6x one model at a time on the CPU
(benchmarks/bench_site_training.py).
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad_and_value, vmap

from powertrip.learning.device import TorchParams
from powertrip.learning.engines.base import EngineSpec, register_engine
from powertrip.learning.engines.batched import BatchedEngine, BatchedStep, why_not_batched
from powertrip.learning.site_params import sample_losses

__all__ = ["VmapStep", "vmap_engine"]


class VmapStep(BatchedStep):
    """One local step of every site: one vmapped ``grad_and_value`` call, then the update."""

    def __init__(self, spec: EngineSpec) -> None:
        model, per_sample_loss = spec.model, spec.loss or sample_losses

        def site_loss(params: TorchParams, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor):
            logits = functional_call(model, params, (x,))
            per_sample = per_sample_loss(logits, y)
            return (per_sample * m).sum() / m.sum().clamp_min(1.0)

        self._grad_and_loss = vmap(grad_and_value(site_loss))

    def grads_and_loss(
        self, params: TorchParams, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> tuple[TorchParams, torch.Tensor]:
        with torch.enable_grad():
            return self._grad_and_loss(params, x, y, mask)


def vmap_engine(spec: EngineSpec) -> BatchedEngine:
    return BatchedEngine("vmap", spec, VmapStep(spec))


register_engine("vmap", vmap_engine, why_not_batched, auto_rank=20)
