"""The one protocol a worker trains through, whatever its run mode.

A worker hosts its sites in exactly one way, chosen once when it joins a run
(``powertrip.services.worker.run_mode``): partitioned sites trained together in this process
(``SitesHost``), sites reading one data stream (``StreamHost``, curtailment mode) or sites that
each train as a ``torch.distributed`` job over several devices (``DistributedSitesHost``). The
host owns its part of the round spec (``round_inputs``: what a round must carry for it, checked
before the model is read) and its round (``run_round``); the servicer and the runner only ever
see this protocol.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip.v1 import common_pb2

if TYPE_CHECKING:  # types only: this module loads no torch
    import torch

__all__ = ["RoundJob", "SiteHost", "SiteUpdate", "batched_updates", "no_stream_rows"]


@dataclass(frozen=True)
class SiteUpdate:
    site: int
    #: the update (with ``codec``: its payload's parts, ``"<tensor>#<part>"``; empty when the
    #: coded update travels as ``shards``)
    delta: dict[str, NDArray]
    num_samples: float
    train_seconds: float  # wall time of the (batched) local training that produced it
    #: a site trained over N ranks may send its update as N per-rank shards (one stream each)
    shards: list[dict[str, NDArray]] | None = None
    #: the site's mean local training loss over the round's steps (None: not measured)
    loss: float | None = None
    #: the run's codec whose payload ``delta`` (or each shard) holds; "": the raw update
    codec: str = ""


@dataclass
class RoundJob:
    round: int
    sites: list[int]
    params: Mapping[str, NDArray]
    deadline_s: float
    pace_by_power: bool = False
    power: dict[int, float] = field(default_factory=dict)
    # what the host's ``round_inputs`` read from the spec (curtailment: each site's stream rows)
    stream_rows: dict[int, NDArray[np.int64]] | None = None
    received_at: float = field(default_factory=time.monotonic)


class SiteHost(Protocol):
    """The sites one worker hosts, and how a round trains them."""

    #: the aggregator's run mode this host serves ("powertrip" or "curtailment")
    mode: str
    sites: list[int]

    def round_inputs(self, spec: common_pb2.RoundSpec) -> dict[int, NDArray[np.int64]] | None:
        """This mode's part of a round spec, checked (ValueError names what is wrong)."""
        ...

    def run_round(self, job: RoundJob) -> list[SiteUpdate]:
        """Train the job's sites from its params: one update per site."""
        ...

    def close(self) -> None:
        """Release what the host holds beyond memory (rank processes, files)."""
        ...


def no_stream_rows(spec: common_pb2.RoundSpec) -> None:
    """The partitioned modes' check: a round must not name stream rows (they would be ignored,
    and a spec carrying them was meant for a curtailment-mode worker)."""
    if spec.stream_rows:
        raise ValueError(
            "stream rows are only for a curtailment-mode worker; this one trains "
            "its sites' partitions"
        )


def batched_updates(
    sites: Sequence[int],
    deltas: Mapping[str, torch.Tensor],
    weights: NDArray,
    seconds: float,
    losses: NDArray | None = None,
) -> list[SiteUpdate]:
    """One update per site of a batched local training, whose row j (of every stacked delta,
    of ``weights`` and ``losses``) is ``sites[j]``'s; each timed as the whole batch."""
    from powertrip.learning.device import row_to_numpy  # torch: loaded by the training hosts

    return [
        SiteUpdate(
            site=s,
            delta=row_to_numpy(deltas, j),
            num_samples=float(weights[j]),
            train_seconds=seconds,
            loss=None if losses is None else float(losses[j]),
        )
        for j, s in enumerate(sites)
    ]
