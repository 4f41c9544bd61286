"""Local training of one or many sites from the same global model: the front the emulator,
the curtailment learner, the worker hosts and the Flower client train through.

``SiteTrainer`` holds a model, its local schedule and optimizer recipe, and the local-training
engine chosen once, by name, when it is built (``engine="auto"``: the choice and the engines
are documented in ``powertrip.learning.engines``). ``train`` checks the request and hands the
sites to the engine; ``evaluate`` scores one set of parameters on a held-out set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from powertrip.learning import engines
from powertrip.learning.batches import LocalTrainingConfig, Seeds, site_schedule
from powertrip.learning.device import TorchParams, resolve_device, scalar
from powertrip.learning.engines import SiteUpdates
from powertrip.learning.site_optim import SiteState
from powertrip.learning.site_params import get_params, sample_losses


class SiteTrainer:
    """Local training of many sites with one local optimizer recipe (``config.recipe``, plain
    SGD by default); the model architecture is shared, the parameters are not. ``engine``: a
    registered engine's name, or ``"auto"``; ``loss``: (logits, targets) -> per-sample losses
    [B], in training and evaluation (None: cross-entropy); ``train_step``: a workload's own
    local step (its sites train one at a time)."""

    def __init__(
        self,
        model: nn.Module,
        config: LocalTrainingConfig,
        device: torch.device | str | None = None,
        max_parallel_sites: int = 128,
        engine: str = "auto",
        loss: engines.LossFn | None = None,
        train_step: engines.LocalStep | None = None,
    ) -> None:
        self.device = resolve_device(device or "auto")
        self.model = model.to(self.device)
        self.loss, self.train_step = loss, train_step
        self._spec = engines.EngineSpec(
            self.model, config, self.device, loss, train_step, max_parallel_sites
        )
        self._engine_name = engine
        #: why these sites cannot train batched (None: they can), said once by the engine
        self.unbatched_reason = engines.why_not_batched(self._spec)
        self.engine: engines.LocalEngine = engines.build_engine(engine, self._spec)
        self.model.eval()  # evaluation mode; an engine trains copies or parameters it stacks

    @property
    def config(self) -> LocalTrainingConfig:
        """The local schedule and optimizer recipe the engine trains with."""
        return self._spec.config

    @config.setter
    def config(self, config: LocalTrainingConfig) -> None:
        """Another schedule or recipe: the engine is built again for it (same name)."""
        self._spec = dataclasses.replace(self._spec, config=config)
        self.engine = engines.build_engine(self._engine_name, self._spec)

    def resident(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the trainer's device: data is moved once, when a run is built, so a round
        only indexes it (``train`` and ``evaluate`` copy tensors given elsewhere every call)."""
        return t.to(self.device)

    def _site_schedule(self, n: int, seed: int) -> np.ndarray:
        """[steps, B] sample positions (-1 = padding) for one site's local epochs."""
        return site_schedule(self.config, n, seed)

    def train(
        self,
        global_params: TorchParams,
        x: torch.Tensor,
        y: torch.Tensor,
        site_indices: Sequence[np.ndarray],
        seeds: Seeds,
        states: Sequence[SiteState | None] | None = None,
    ) -> SiteUpdates:
        """Train every site in ``site_indices`` (rows of x/y it owns) from ``global_params``;
        ``states[i]``: site i's optimizer state from an earlier round (None: a fresh start)."""
        x, y = self.resident(x), self.resident(y)
        given = list(states) if states is not None else []
        local_round = engines.LocalRound(global_params, x, y, site_indices, seeds, given)
        return self.engine.train(local_round)

    def evaluate(
        self, params: TorchParams, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096
    ) -> tuple[float, float]:
        """(accuracy, mean loss) of one set of parameters on a held-out set. Sums stay on the
        device and are read once (float64: the same value as adding per-batch floats)."""
        n = y.shape[0]
        params = {k: v.to(self.device) for k, v in params.items()}
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        with torch.no_grad():
            for start in range(0, n, batch_size):
                xb = self.resident(x[start : start + batch_size])  # no copy when built resident
                yb = self.resident(y[start : start + batch_size])
                logits = functional_call(self.model, params, (xb,))
                if self.loss is not None:  # the workload's own loss, per sample
                    batch_loss = self.loss(logits, yb).sum()
                elif yb.dim() == 1:
                    batch_loss = nn.functional.cross_entropy(logits, yb, reduction="sum")
                else:  # a sequence model: each sample's mean over its positions
                    batch_loss = sample_losses(logits, yb).sum()
                loss += batch_loss.double()
                correct += (logits.argmax(-1) == yb).sum()
        targets = y[0].numel() if n else 1  # tokens per sample for a sequence model
        return scalar(correct) / (n * targets), scalar(loss) / n


__all__ = ["LocalTrainingConfig", "sample_losses", "SiteTrainer", "SiteUpdates", "get_params"]
