"""What a site's round gives back (``SiteRoundResult``), or how it failed (``RankFailed``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RankFailed", "SiteRoundResult"]


class RankFailed(RuntimeError):
    """A rank of a site's job died, failed or missed the round's deadline; the group has ended
    its other ranks and starts fresh ones on the next ``train_round``."""

    def __init__(
        self, site: str, rank: int | None, round_index: int, reason: str, starting: bool = False
    ) -> None:
        who = f"rank {rank}" if rank is not None else "the ranks"
        when = ("while starting for" if starting else "during") + f" round {round_index}"
        head, _, detail = reason.partition("\n")
        super().__init__(f"site {site}: {who} {head} {when}" + (f"\n{detail}" if detail else ""))
        self.site, self.rank, self.round_index, self.reason = site, rank, round_index, reason
        self.starting = starting


@dataclass(frozen=True)
class SiteRoundResult:
    """One round of one site."""

    delta: dict[str, torch.Tensor]  # params after minus the global params, float32, host
    loss: float  # mean training loss over the round's steps (each the batch's mean)
    steps: int  # optimizer steps taken
    num_samples: int  # distinct samples the round trained on (the FedAvg weight)
    seconds: float  # wall time of ``train_round``, the delta in host memory included
    #: shard r: rows ``shard_rows(dim0, ranks, r)`` of every tensor of ``delta`` (views; a 0-d
    #: tensor is whole in shard 0), what rank r sends in a sharded upload
    shards: tuple[dict[str, torch.Tensor], ...]
    #: the optimizer's moments started afresh this round (first round, ``state_reset``,
    #: ``keep_state=False``, or fresh ranks after a failure with no moments kept)
    fresh_state: bool
    first_step: int  # the site's cumulative local steps before the round (schedule position)
    #: CPU seconds each rank's process spent on the round (a rank starved of cores shows here)
    rank_cpu_seconds: tuple[float, ...] = ()
