"""The trainer's batched SGD step captured with ``torch.compile``, for GPUs.

On a GPU the vmapped step of small site models is bound by kernel launches and Python, not by
arithmetic: one step is a few dozen small kernels. Compiling the whole step (gather the batch,
``vmap(grad(loss))``, the SGD update) fuses them, and ``mode="reduce-overhead"`` also replays
it as a CUDA graph. On the CPU the eager step is already the fast path (and the one the
emulator's bit-identical results come from), so the trainer compiles only when asked or when
it runs on CUDA.

A compiled graph is specialised to the number of sites it steps (vmap's batch size), while the
eager trainer shrinks the batch as sites finish their local epochs. So rows come in buckets
(8, 16, 32, ...): a step runs the smallest bucket that holds the sites still training, the
extra rows being sites already done or padding, with an all-zero mask, so their gradient is
zero and their update is not written back. About five graphs per trainer, whatever the mix of
partition sizes.

Plain SGD updates inside the graph. Any other local optimizer (momentum, AdamW, a schedule,
clipping) keeps per-site state and a per-site lr: the graph returns the gradients and the
trainer's ``SiteOptimizer`` steps the active rows outside it (site_optim.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.device import TorchParams
from powertrip.learning.site_optim import SiteOptimizer

__all__ = ["CompiledSteps", "row_bucket"]

#: vmapped ``grad_and_value`` of the masked site loss: (params, x, y, mask) -> (grads, loss)
GradAndLoss = Callable[
    [TorchParams, torch.Tensor, torch.Tensor, torch.Tensor], tuple[TorchParams, torch.Tensor]
]


def row_bucket(n: int, smallest: int = 8) -> int:
    """The bucket of ``n`` stacked sites: the next power of two, at least ``smallest``."""
    return max(smallest, 1 << max(0, n - 1).bit_length())


class CompiledSteps:
    """Runs a round's SGD steps with one compiled graph per row bucket."""

    def __init__(
        self, grad_and_loss: GradAndLoss, recipe: LocalOptimizer | float, mode: str = "default"
    ) -> None:
        if not isinstance(recipe, LocalOptimizer):
            recipe = LocalOptimizer(lr=recipe)
        lr, self.in_graph = recipe.lr, recipe.plain_sgd

        def step(
            params: TorchParams,
            x: torch.Tensor,
            y: torch.Tensor,
            rows: torch.Tensor,
            m: torch.Tensor,
        ) -> tuple[TorchParams, torch.Tensor]:
            grads, loss = grad_and_loss(params, x[rows], y[rows], m)
            if not self.in_graph:
                return grads, loss
            return {n: torch.sub(p, grads[n], alpha=lr) for n, p in params.items()}, loss

        # Dynamo counts graphs per code object, so every trainer's buckets add up: keep room
        # for several trainers (a study builds one per repeat) before it falls back to eager.
        dynamo = torch._dynamo.config
        name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
        setattr(dynamo, name, max(getattr(dynamo, name), 64))  # torch < 2.6: cache_size_limit
        self._step = torch.compile(step, mode=mode, dynamic=False, fullgraph=True)

    def rows(self, sites: int) -> int:
        """Rows to stack for ``sites`` sites (padding rows train nothing)."""
        return row_bucket(sites)

    def run(
        self,
        params: TorchParams,
        x: torch.Tensor,
        y: torch.Tensor,
        gather: torch.Tensor,
        mask: torch.Tensor,
        active: Sequence[int],
        loss_sum: torch.Tensor,
        opt: SiteOptimizer | None = None,
    ) -> None:
        """Every step of the round, in place: ``params`` [rows, ...], ``gather``/``mask``
        [steps, rows, batch], ``active[s]`` sites still training at step s (a prefix);
        ``opt`` steps the rows when the update is not in the graph."""
        if not self.in_graph and opt is None:
            raise ValueError("this recipe updates outside the graph: pass its SiteOptimizer")
        for s, a in enumerate(active):
            r = self.rows(a)
            live = {name: p[:r] for name, p in params.items()}
            out, loss = self._step(live, x, y, gather[s, :r], mask[s, :r])
            if self.in_graph:
                for name, p in live.items():
                    p[:a].copy_(out[name][:a])
            else:
                opt.update(live, out, a)
            loss_sum[:a] += loss[:a]
