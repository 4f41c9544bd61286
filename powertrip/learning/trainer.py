"""Local training of one or many sites from the same global model.

The emulator trains tens of small site models per round on 2 CPU cores, so sites are trained
together: their parameters are stacked along a leading "site" axis and one SGD step for all of
them is a single ``vmap(grad(loss))`` call. Each site still does exactly its own local epochs
over its own partition (shorter partitions are masked once they are done), in an order drawn
from its own seed, so a site's update does not depend on which other sites share the batch.
The worker service runs the same code with one site.

Known layer chains (``CNN1D``; ``nn.Sequential`` of ``Conv1d``/``Linear``/``ReLU``/``Tanh``/
``Flatten``) train stacked instead when the step is eager (``stacked.py``): one plain model of
batched matmuls with a hand-written backward, ~2x vmap for the MNIST-1D CNN on the CPU; the
same update within float32 rounding. Other models, a workload's own per-sample ``loss`` and the
compiled step use vmap. A step gathers only as many batch rows as its fullest site has, so
padding costs no compute. A workload's own ``train_step`` trains one site at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from powertrip.learning.batches import (
    LocalTrainingConfig,
    round_batches,
    round_orders,
    site_schedule,
)
from powertrip.learning.compiled_step import CompiledSteps
from powertrip.learning.device import (
    TorchParams,
    array,
    host_rows,
    resolve_device,
    scalar,
    tensor,
    to_host,
)
from powertrip.learning.site_loop import LocalStep, batched_training_blocker, train_in_turn
from powertrip.learning.site_optim import SiteOptimizer, SiteState
from powertrip.learning.site_params import get_params, sample_losses
from powertrip.learning.stacked import StackedChain, stacked_chain

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SiteUpdates:
    """Per-site results of one round, stacked along axis 0 in the order the sites were given."""

    deltas: TorchParams  # w_i - w, shape [k, *param_shape], in host memory
    num_samples: np.ndarray  # n_i, the FedAvg weights
    steps: np.ndarray  # optimizer steps each site took
    loss: np.ndarray  # mean training loss per site over its steps
    #: each site's local optimizer state after the round, on the trainer's device (None for
    #: plain SGD, which keeps none); give it back to ``train`` to resume the site's moments
    opt_state: list[SiteState] | None = None


class SiteTrainer:
    """Local training of many sites at once with one local optimizer recipe (``config.recipe``,
    plain SGD by default); the model architecture is shared, the parameters are not. ``loss``:
    (logits, targets) -> per-sample losses [B], in training and evaluation (None: cross-entropy);
    ``train_step``: a workload's own local step, one site at a time (site_loop.py)."""

    def __init__(
        self,
        model: nn.Module,
        config: LocalTrainingConfig,
        device: torch.device | str | None = None,
        max_parallel_sites: int = 128,
        compile_step: bool | None = None,
        compile_mode: str = "default",
        stacked: bool = True,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        train_step: LocalStep | None = None,
    ) -> None:
        self.device = resolve_device(device or "auto")
        self.model = model.to(self.device)
        self.config = config
        self.max_parallel_sites = max_parallel_sites
        self.loss, self.train_step = loss, train_step
        per_sample_loss = loss or sample_losses

        def site_loss(params: TorchParams, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor):
            logits = functional_call(self.model, params, (x,))
            per_sample = per_sample_loss(logits, y)
            return (per_sample * m).sum() / m.sum().clamp_min(1.0)

        self._grad_and_loss = vmap(grad_and_value(site_loss))
        # A model vmap cannot batch (normalisation, dropout, recurrent layers, buffers) trains
        # one site at a time with the same schedule and step (site_loop.py); said once, here.
        self.unbatched_reason = batched_training_blocker(self.model)
        if train_step is not None:
            self.unbatched_reason = "the workload brings its own train_step"
        if self.unbatched_reason is not None:
            logger.info("training sites one at a time: %s", self.unbatched_reason)
            compile_step = False
        self.model.eval()  # evaluation mode unless a per-site loop is training
        # Compiled on CUDA by default (launch-bound there); eager on the CPU, where it is the
        # fast path and the emulator's bit-identical results come from (compiled_step.py).
        if compile_step is None:
            compile_step = self.device.type == "cuda"
        self._compiled = (
            CompiledSteps(self._grad_and_loss, config.recipe, compile_mode)
            if compile_step
            else None
        )
        # ``stacked=False`` keeps vmap (the reference the stacked path is tested against).
        self._stacked: StackedChain | None = None
        if stacked and self.unbatched_reason is None and loss is None:  # its backward is CE's
            self._stacked = stacked_chain(self.model)
        if self._stacked is not None and self._compiled is None:
            logger.info("training %s sites stacked (batched matmuls, no vmap)", self._stacked.label)

    @property
    def compiled(self) -> bool:
        """Whether the SGD step runs compiled (``compile_step``; default: on CUDA only)."""
        return self._compiled is not None

    def resident(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the trainer's device: data is moved once, when a run is built, so a round
        only indexes it (``train`` and ``evaluate`` copy tensors given elsewhere every call)."""
        return t.to(self.device)

    # -- batches --------------------------------------------------------------------------------
    def _site_schedule(self, n: int, seed: int) -> np.ndarray:
        """[steps, B] sample positions (-1 = padding) for one site's local epochs."""
        return site_schedule(self.config, n, seed)

    def train(
        self,
        global_params: TorchParams,
        x: torch.Tensor,
        y: torch.Tensor,
        site_indices: Sequence[np.ndarray],
        seeds: Sequence[int],
        states: Sequence[SiteState | None] | None = None,
    ) -> SiteUpdates:
        """Train every site in ``site_indices`` (rows of x/y it owns) from ``global_params``;
        ``states[i]``: site i's optimizer state from an earlier round (None: a fresh start)."""
        if len(site_indices) != len(seeds):
            raise ValueError("one seed per site is required")
        states = list(states) if states is not None else [None] * len(seeds)
        if len(states) != len(seeds):
            raise ValueError("one state (or None) per site is required")
        if not site_indices:
            raise ValueError("no site to train")
        sizes = [len(i) for i in site_indices]
        if 0 in sizes:
            raise ValueError(f"site at position {sizes.index(0)} has no training samples")
        k, step = len(site_indices), self.max_parallel_sites
        # the whole round's batch orders in one call, and one host buffer its deltas land in
        # (each chunk writes its rows: no concatenation of chunks afterwards)
        orders = None
        if self.unbatched_reason is None:
            orders = round_orders(self.config, sizes, seeds)
        b = self.config.batch_size  # eager: as many sites as fill max_parallel_sites full rows
        step *= 1 if self._compiled is not None else max(1, b // max(1, min(b, max(sizes))))
        deltas = host_rows(global_params, k)
        chunks = []
        for start in range(0, k, step):
            rows = slice(start, start + step)
            chunks.append(
                self._train_chunk(
                    (global_params, x, y, site_indices[rows], seeds[rows], states[rows]),
                    None if orders is None else orders[rows],
                    {name: d[rows] for name, d in deltas.items()},
                )
            )
        return SiteUpdates(
            deltas=deltas,
            num_samples=np.array([len(i) for i in site_indices], dtype=np.int64),
            steps=np.concatenate([c.steps for c in chunks]),
            loss=np.concatenate([c.loss for c in chunks]),
            opt_state=None
            if chunks[0].opt_state is None
            else sum((c.opt_state for c in chunks), []),
        )

    def _train_chunk(self, args: tuple, orders, out: TorchParams) -> SiteUpdates:
        """Train one chunk of sites; their deltas go into ``out`` (rows of the round's buffer)."""
        if self.unbatched_reason is not None:
            done = self._train_in_turn(*args)
            for name, d in done.deltas.items():
                out[name].copy_(d)
            return done
        if self._compiled is None:
            return self._train_rows(*args, orders, out)
        try:
            return self._train_rows(*args, orders, out)
        except Exception as exc:  # a compiler missing or failing on this machine: train eagerly
            logger.warning("compiled SGD step failed (%s); training eagerly from now on", exc)
            self._compiled = None
            return self._train_rows(*args, orders, out)

    def _train_rows(
        self, global_params, x, y, site_indices, seeds, states, orders, out
    ) -> SiteUpdates:
        k = len(site_indices)
        rows = self._compiled.rows(k) if self._compiled else k  # compiled: bucketed, padded
        fixed = self._compiled is not None
        plan = round_batches(self.config, site_indices, seeds, rows, fixed, orders)
        steps, order, active, widths = plan.steps, plan.order, plan.active, plan.widths
        gather_t = tensor(plan.gather, self.device)
        mask_t = tensor(plan.mask, self.device)
        x, y = self.resident(x), self.resident(y)  # no copy when built resident

        params = {
            name: p.to(self.device).unsqueeze(0).expand(rows, *p.shape).clone()
            for name, p in global_params.items()
        }
        loss_sum = torch.zeros(rows, device=self.device)
        opt = SiteOptimizer(self.config.recipe, rows)  # row j is site order[j]
        opt.load([states[i] for i in order], params)
        with torch.no_grad():
            if self._compiled is not None:
                self._compiled.run(params, x, y, gather_t, mask_t, active, loss_sum, opt)
            elif self._stacked is not None and self._stacked.accepts(x, y):
                self._stacked.run(params, x, y, gather_t, mask_t, active, widths, opt, loss_sum)
            else:
                self._eager_steps(params, x, y, gather_t, mask_t, active, widths, loss_sum, opt)
            back_np = np.argsort(order)
            back = tensor(back_np, self.device)
            same = rows == k and bool((back_np == np.arange(k)).all())  # rows in site order
            for name, p in params.items():  # into the host buffer: one copy per tensor
                g, p = global_params[name].to(self.device).unsqueeze(0), p if same else p[back]
                if self.device.type == "cpu":
                    torch.sub(p, g, out=out[name])
                else:
                    out[name].copy_(to_host(p - g))
        return SiteUpdates(
            deltas=out,
            num_samples=np.array([len(i) for i in site_indices], dtype=np.int64),
            steps=steps,
            loss=array(loss_sum[back]) / steps,
            opt_state=None if opt.recipe.plain_sgd else opt.export(back_np.tolist()),
        )

    def _train_in_turn(self, global_params, x, y, site_indices, seeds, states) -> SiteUpdates:
        schedules = [self._site_schedule(len(i), seeds[j]) for j, i in enumerate(site_indices)]
        args = (global_params, self.resident(x), self.resident(y), site_indices, schedules)
        return train_in_turn(self, *args, states)

    def _eager_steps(
        self,
        params: TorchParams,
        x: torch.Tensor,
        y: torch.Tensor,
        gather_t: torch.Tensor,
        mask_t: torch.Tensor,
        active: Sequence[int],
        widths: Sequence[int],
        loss_sum: torch.Tensor,
        opt: SiteOptimizer,
    ) -> None:
        """The round's local steps, one vmapped call each, shrinking as sites finish (in place;
        the arguments are those of ``CompiledSteps.run``, plus each step's batch width)."""
        for s, (a, w) in enumerate(zip(active, widths, strict=True)):
            g_idx = gather_t[s, :a, :w]
            xb, yb, mb = x[g_idx], y[g_idx], mask_t[s, :a, :w]
            live = {name: p[:a] for name, p in params.items()}
            with torch.enable_grad():
                grads, loss = self._grad_and_loss(live, xb, yb, mb)
            loss_sum[:a] += loss
            opt.update(live, grads, a)

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
