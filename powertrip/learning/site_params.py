"""What a site's training reads and sends, shared by the batched trainer and the per-site loop:
the per-sample loss and the state FedAvg averages (re-exported by ``trainer``)."""

from __future__ import annotations

import torch
from torch import nn

from powertrip.learning.device import TorchParams

__all__ = ["get_params", "running_statistics", "sample_losses"]


def sample_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per sample: one label per sample (``y`` [B], logits [B, C]), or one per
    position of a sequence model (``y`` [B, T], logits [B, T, V]; the sample's mean over T)."""
    per_target = nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none")
    if y.dim() == 1:
        return per_target
    return per_target.view(y.shape[0], -1).mean(1)


def get_params(model: nn.Module) -> TorchParams:
    """A site's state, what it sends and FedAvg averages: detached copies of the parameters and
    of the floating-point buffers (a normalisation layer's running statistics), on the model's
    device. Integer buffers (BatchNorm's batch counter) are bookkeeping and stay in the module."""
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    state.update((n, b.detach().clone()) for n, b in model.named_buffers() if b.is_floating_point())
    return state


def running_statistics(model: nn.Module) -> frozenset[str]:
    """The names in ``get_params`` that are not trained: the floating-point buffers (running
    means and variances). A robust rule averages them unclipped
    (``powertrip.aggregation.robust_fedavg``):
    they are estimates of the data, not steps, and a shortened one is simply wrong."""
    return frozenset(n for n, b in model.named_buffers() if b.is_floating_point())
