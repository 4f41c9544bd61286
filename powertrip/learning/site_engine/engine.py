"""The rank engine: a ``SiteGroup`` (one site trained as a ``torch.distributed`` job) behind the
``LocalEngine`` interface the in-process engines share.

It trains the one site whose samples the group holds, with the batches of ``site_schedule``
(the in-process engines' order: positions in the site's partition are rows of the group's
samples, which the ranks read from the group's files, so the round's ``x``/``y`` are not read),
and follows the interface's contract on state: ``None`` is a fresh start (step 0, fresh
moments); the state this engine handed back last round continues in the ranks without a copy;
any other state (a restored one, ``for_round``'s reset, ``fresh_moments``) is loaded first.
"""

from __future__ import annotations

import numpy as np

from powertrip.learning.batches import LocalTrainingConfig, site_schedule
from powertrip.learning.device import TorchParams
from powertrip.learning.engines.base import LocalRound, SiteUpdates, delta_rows
from powertrip.learning.site_engine.group import SiteGroup
from powertrip.learning.site_engine.result import SiteRoundResult
from powertrip.learning.site_optim import SiteState

__all__ = ["RankEngine"]


class RankEngine:
    """A ``LocalEngine`` over ``group``, with ``config``'s schedule (batch size, epochs, step
    cap; the group holds the recipe). ``last``: the last round's ``SiteRoundResult`` (the
    per-rank shards of the update, wall and rank CPU seconds)."""

    name = "ranks"

    def __init__(self, group: SiteGroup, config: LocalTrainingConfig) -> None:
        if config.recipe != group.recipe:
            raise ValueError(f"site {group.site}: the group trains another recipe than config's")
        self.group, self.config = group, config
        self.last: SiteRoundResult | None = None
        self._handed: SiteState | None = None  # the state the last round handed back

    def train(
        self,
        sites: LocalRound,
        out: TorchParams | None = None,
        *,
        deadline_s: float | None = None,
        round_index: int | None = None,
    ) -> SiteUpdates:
        """The group's site trained from ``sites`` (one site); ``deadline_s``/``round_index``
        as ``SiteGroup.train_round`` takes them (``RankFailed`` when a rank dies or the round
        outlives its deadline)."""
        group = self.group
        if len(sites.site_indices) != 1:
            raise ValueError(
                f"site {group.site}: the rank engine trains one site, given "
                f"{len(sites.site_indices)}"
            )
        n, state = len(sites.site_indices[0]), sites.states[0]
        if n != group.num_rows:
            raise ValueError(
                f"site {group.site}: {n} samples given, the group holds {group.num_rows}"
            )
        rows = site_schedule(self.config, n, sites.seeds[0])
        if state is not None and state is not self._handed:
            group.load_state(state)
        result = group.train_round(
            sites.global_params,
            rows,
            state_reset=state is None,
            first_step=0 if state is None else None,
            deadline_s=deadline_s,
            round_index=round_index,
        )
        self.last = result
        deltas = delta_rows(sites, out)
        for name, d in result.delta.items():
            deltas[name][0].copy_(d)
        self._handed = None if group.recipe.plain_sgd else group.site_state
        return SiteUpdates(
            deltas=deltas,
            num_samples=sites.num_samples,
            steps=np.array([result.steps]),
            loss=np.array([result.loss]),
            opt_state=None if self._handed is None else [self._handed],
        )
