"""One optimizer step for many sites whose parameters are stacked along axis 0.

The update itself is the recipe's rule (``powertrip.learning.optimizers``: a built-in or a
user's own); this module keeps what every rule shares. Elementwise AdamW (or momentum SGD)
over [rows, *shape] tensors is exactly per-site AdamW when the three things that are not
elementwise are kept per row: the step count (bias
correction, the schedule's position), the lr, and the gradient clipping norm (a site's global
norm over all its tensors). Rows follow the engines' active-prefix convention: ``update(...,
active=a)`` touches rows ``[:a]`` only, so a finished site neither moves, nor decays its
moments, nor advances its step count.

Plain SGD at a constant lr (the default recipe) runs exactly ``p[:a].sub_(g, alpha=lr)``,
the trainer's old step, so its results are bit-identical to before the seam existed.

State (``SiteState``) is per site and lives where the parameters live (the trainer's device);
``export``/``load`` move it in and out by row, so a caller can keep it across rounds.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.lr_schedule import lr_factors
from powertrip.learning.optimizers.base import RowStep, per_row, resolved_lr
from powertrip.learning.optimizers.registry import moment_kinds, rule_for

__all__ = ["MAX_STEP", "SiteOptimizer", "SiteState"]

_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s guard
#: the most local steps a site's state may claim: 2**40 is 35 years at a million steps a
#: second, so a larger count is damage, not training (a schedule read at it would be garbage)
MAX_STEP = 2**40


@dataclass(frozen=True)
class SiteState:
    """One site's optimizer state: its cumulative local steps and its moments per tensor, by
    the kind names its rule declares (AdamW: ``exp_avg``/``exp_avg_sq``; momentum/nesterov:
    ``momentum``; a rule may keep different kinds on different tensors), unstacked."""

    step: int
    moments: Mapping[str, Mapping[str, torch.Tensor]]
    #: steps since the moments began (AdamW's bias correction); None: ``step``
    moment_step: int | None = None

    def for_round(self, recipe: LocalOptimizer) -> SiteState:
        """What a site resumes at the start of a round: everything when the recipe keeps its
        state; otherwise only the step count, so the schedule still runs on the site's
        cumulative steps while the moments start afresh (the curtailment paper's inner
        optimizer, rebuilt every round)."""
        return self if recipe.keep_state else SiteState(self.step, {}, 0)

    def nbytes(self) -> int:
        """Bytes of the moments (AdamW: two model copies)."""
        return sum(t.numel() * t.element_size() for m in self.moments.values() for t in m.values())

    def fresh_moments(self) -> SiteState:
        """The same position in the schedule with moments starting afresh: what a site whose
        moments cannot be trusted resumes (its schedule is not rewound)."""
        return SiteState(self.step, {}, 0)

    def problem(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> str | None:
        """Why this state must not be resumed, in plain words (None: it may). A step count that
        is not a whole number in ``0..MAX_STEP``, a ``moment_step`` beyond it, moments that are
        not float tensors of ``shapes`` (another model's), non-finite moments (every update
        trained from them is NaN) or negative second moments (AdamW takes their root)."""
        why = _step_problem("step count", self.step, MAX_STEP, "2**40")
        if why is None and self.moment_step is not None:
            why = _step_problem(
                "moment step count", self.moment_step, self.step, f"the step count {self.step}"
            )
        if why is not None:
            return why
        for name, kinds in self.moments.items():
            if shapes is not None and name not in shapes:
                return f"moments of another model (this model has no tensor {name!r})"
            for kind, t in kinds.items():
                if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                    return f"{kind} of {name!r} is not a float tensor"
                if shapes is not None and tuple(t.shape) != tuple(shapes[name]):
                    return (
                        f"moments of another model ({name!r} has shape {tuple(t.shape)}, "
                        f"this model's is {tuple(shapes[name])})"
                    )
        return self._value_problem()

    def _value_problem(self) -> str | None:
        """Non-finite or negative-second moments, found with one device sync when there are
        none (this runs on every trained state)."""
        tensors = [(n, k, t) for n, m in self.moments.items() for k, t in m.items()]
        if not tensors:
            return None
        second = {name for name, kind in moment_kinds().items() if kind.nonnegative}
        sound = [
            torch.isfinite(t).all() & (t >= 0).all() if k in second else torch.isfinite(t).all()
            for _, k, t in tensors
        ]
        if bool(torch.stack([f.to(sound[0].device) for f in sound]).all()):
            return None
        for name, kind, t in tensors:
            if not bool(torch.isfinite(t).all()):
                what = "NaN" if bool(torch.isnan(t).any()) else "Inf"
                return f"non-finite moments ({what} in {kind} of {name!r})"
            if kind in second and bool((t < 0).any()):
                return f"negative second moments (in {kind} of {name!r})"
        return None


def _step_problem(what: str, value: object, most: int, most_name: str) -> str | None:
    """Why ``value`` is not a step count in ``0..most`` (None: it is)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return f"{what} {value!r} is not a whole number"
    if value < 0:
        return f"{what} {value} is negative"
    if value > most:
        return f"{what} {value} is absurd (more than {most_name})"
    return None


class SiteOptimizer:
    """Per-row optimizer state and step for ``rows`` stacked sites of one round: the parts
    every optimizer shares (step counts, the schedule, clipping, the moments' storage by row),
    around the recipe's rule (``powertrip.learning.optimizers``), which does the update."""

    def __init__(self, recipe: LocalOptimizer, rows: int) -> None:
        self.recipe = recipe
        self.lr = resolved_lr(recipe)
        self.rule = rule_for(recipe)
        self.rows = rows
        self.steps = np.zeros(rows, dtype=np.int64)  # cumulative local steps per row
        # steps since each row's moments began (AdamW's bias correction): ``steps`` unless the
        # recipe resets its moments every round (``keep_state=False``), when the schedule's
        # position still carries over but the moments and their correction start afresh
        self.moment_steps = np.zeros(rows, dtype=np.int64)
        self._moments: dict[str, dict[str, torch.Tensor]] = {}  # name -> kind -> [rows, ...]
        self._kinds: dict[str, tuple[str, ...]] | None = None  # name -> the rule's kinds
        self._fast = recipe.plain_sgd

    # -- state in and out ---------------------------------------------------------------------
    def _moment(self, name: str, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``name``'s moments [rows, ...], zero when first asked for (``params``: every stacked
        tensor, from which the rule says which moments each keeps)."""
        m = self._moments.get(name)
        if m is None:
            if self._kinds is None:
                shapes = {n: tuple(t.shape[1:]) for n, t in params.items()}
                plan = self.rule.moments(self.recipe, shapes)
                self._kinds = {n: tuple(k.name for k in kinds) for n, kinds in plan.items()}
            like = params[name]
            shape = (self.rows, *like.shape[1:])
            m = {
                k: torch.zeros(shape, dtype=like.dtype, device=like.device)
                for k in self._kinds.get(name, ())
            }
            self._moments[name] = m
        return m

    def load(self, states: Sequence[SiteState | None], params: Mapping[str, torch.Tensor]) -> None:
        """Row i resumes ``states[i]`` (None: a fresh start). Whether the moments outlive a
        round (``keep_state``) is the keeper's decision: ``SiteState.for_round``."""
        for row, st in enumerate(states):
            if st is None:
                continue
            self.steps[row] = st.step
            self.moment_steps[row] = st.step if st.moment_step is None else st.moment_step
            for name, kinds in st.moments.items():
                mine = self._moment(name, params)
                for kind, t in kinds.items():
                    if kind in mine:
                        mine[kind][row].copy_(t)

    def export(self, rows: Sequence[int]) -> list[SiteState]:
        """The state of each row in ``rows`` (copies, on the parameters' device)."""
        return [
            SiteState(
                int(self.steps[r]),
                {n: {k: t[r].clone() for k, t in m.items()} for n, m in self._moments.items()},
                None if self.moment_steps[r] == self.steps[r] else int(self.moment_steps[r]),
            )
            for r in rows
        ]

    # -- the step -----------------------------------------------------------------------------
    def update(
        self, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], active: int
    ) -> None:
        """One step of rows ``[:active]`` in place (``grads`` may have more rows: ignored)."""
        a = active
        if self._fast:
            for name, g in grads.items():
                params[name][:a].sub_(g[:a], alpha=self.lr)
            return
        r = self.recipe
        self.steps[:a] += 1
        self.moment_steps[:a] += 1
        t = self.steps[:a]
        lr_np = self.lr * lr_factors(
            t - 1, r.schedule, r.warmup_steps, r.total_steps, r.min_lr_ratio, r.decay_fraction
        )
        like = next(iter(params.values()))
        lr = torch.tensor(lr_np, dtype=like.dtype, device=like.device)
        gs = {n: g[:a] for n, g in grads.items()}
        if r.clip_norm is not None:
            sq = reduce(operator.add, (g.reshape(a, -1).float().pow(2).sum(1) for g in gs.values()))
            coef = (r.clip_norm / (sq.sqrt() + _CLIP_EPS)).clamp(max=1.0).to(like.dtype)
            gs = {n: g * per_row(coef, g) for n, g in gs.items()}

        def moments(name: str) -> dict[str, torch.Tensor]:
            return {k: m[:a] for k, m in self._moment(name, params).items()}

        step = RowStep(r, a, lr, self.moment_steps[:a], moments)
        self.rule.update(step, {n: params[n][:a] for n in gs}, gs)
