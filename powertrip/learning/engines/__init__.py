"""Local training engines: one interface (``LocalEngine``: train these sites from these
parameters and states, give back their updates and states), engines chosen once, by name.

Built in, in ``"auto"``'s order of preference (the first that can train the model is taken;
this list is the only place the choice is made):

1. ``stacked`` (``stacked.py``): a model whose forward is a chain of ``Conv1d``/``Linear``/
   ReLU/tanh/flatten (the built-in ``CNN1D``, or a user's own module of that shape) with
   cross-entropy, as batched matmuls with a hand-written backward pass: ~1.5-2x vmap on the
   CPU.
2. ``vmap`` (``vmap.py``): any model whose state is its parameters and whose forward is a pure
   function of them, with cross-entropy or the workload's own per-sample loss: the batched
   engine for every other model (a transformer, a skip connection, a 2-D convolution).
3. ``in-turn`` (``in_turn.py``): one site after another, for a model no batched engine can run
   (batch normalisation, active dropout, torch's recurrent layers, buffers) and for a workload's
   own ``train_step``.

All of them take the same batches in the same order and apply the update with the same
``SiteOptimizer``, so a model two engines can run gets the same update from both, within float32
rounding. The figures that keep each engine are in benchmarks/README.md
(``bench_site_training.py``). Another engine registers itself with ``register_engine``.
"""

from __future__ import annotations

from powertrip.learning.engines import in_turn, stacked, vmap  # noqa: F401  (they register)
from powertrip.learning.engines.base import (
    EngineSpec,
    LocalEngine,
    LocalRound,
    LocalStep,
    LossFn,
    SiteUpdates,
    build_engine,
    engine_names,
    register_engine,
)
from powertrip.learning.engines.batched import batched_training_blocker, why_not_batched
from powertrip.learning.engines.in_turn import train_sites_in_turn

__all__ = [
    "EngineSpec",
    "LocalEngine",
    "LocalRound",
    "LocalStep",
    "LossFn",
    "SiteUpdates",
    "batched_training_blocker",
    "build_engine",
    "engine_names",
    "register_engine",
    "train_sites_in_turn",
    "why_not_batched",
]
