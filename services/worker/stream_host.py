"""The sites a worker hosts in curtailment mode: no partitions, one data stream. A round names,
per site, the stream positions to train on; the site trains exactly those rows, in order, with
the trainer the emulator's ``StreamLearner`` uses, and its update is weighted by its steps.

Each site's local optimizer state follows the recipe exactly as ``StreamLearner`` keeps it: kept
between its sub-rounds unless the recipe is plain SGD, and reset at the site's first sub-round
of each elastic round (``RoundSpec.stream_round``) when the recipe does not keep its state
(``SiteState.for_round``: the step count, and so the schedule, runs on; the moments start
afresh). With a state directory (POWERTRIP_WORKER_STATE_DIR) the states are saved after each
sub-round through the store partitioned sites use (``state_dir.SiteStateStore``: the same file,
validation and setting aside of what cannot be trusted), and a restarted worker resumes them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from numpy.typing import NDArray

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.curtailment.learner import check_stream_trainer, train_stream_rows
from powertrip.federation import StreamSetup
from powertrip.learning.device import to_torch
from powertrip.learning.site_optim import SiteState
from powertrip.services.worker.site_host import RoundJob, SiteUpdate, batched_updates
from powertrip.services.worker.state_dir import SiteStateStore, kept_after_training
from powertrip.sites.profiles import site_index
from powertrip.v1 import common_pb2

#: rounds of history kept per site: the one a resumed aggregator may redo (its checkpoint of
#: round r is written while round r+1 trains), the one before it, and the newest
ROUNDS_KEPT = 3


class StreamHost:
    """The ``SiteHost`` of a curtailment-mode worker."""

    mode = "curtailment"

    def __init__(
        self,
        cfg: CurtailmentConfig,
        sites: Sequence[int],
        device: torch.device | str = "auto",
        store: SiteStateStore | None = None,
    ) -> None:
        self.cfg = cfg
        self.sites = sorted(sites)
        self.setup = StreamSetup.load(cfg, device)  # the stream is resident on ``device``
        check_stream_trainer(self.setup.trainer)
        self._recipe = recipe = self.setup.trainer.config.recipe
        # site -> ((elastic round, sub-round), its state after it), the newest of each of its
        # last ``ROUNDS_KEPT`` rounds: a round redone (the aggregator resumed from a checkpoint
        # taken before it) starts from the state the site had before it. None: plain SGD.
        self._log: dict[int, list[tuple[tuple[int, int], SiteState]]] | None = (
            None if recipe.plain_sgd else {}
        )
        self._store = store if self._log is not None else None
        self._stream_round: dict[int, int] = {}  # sub-round -> its elastic round (specs seen)
        if self._store is not None and self._log is not None:
            params = self.setup.params
            shapes = {k: tuple(v.shape) for k, v in params.items()}
            device_of = next(iter(params.values())).device
            for site, state in self._store.load(shapes, self.sites, device_of).items():
                self._log[site] = [((-1, -1), state)]  # from before this process: a new round

    @property
    def site_states(self) -> dict[int, SiteState] | None:
        """Each hosted site's newest optimizer state (None: the recipe carries nothing)."""
        return None if self._log is None else {s: log[-1][1] for s, log in self._log.items()}

    @property
    def total_rows(self) -> int:
        return len(self.setup.data.y_train)

    def round_inputs(self, spec: common_pb2.RoundSpec) -> dict[int, NDArray[np.int64]]:
        """Each site's stream positions, in the spec's site order (the same batch on every
        run): a stream round must name rows for exactly its sites, and at least one each."""
        if sorted(spec.stream_rows) != sorted(spec.site_ids):
            raise ValueError("stream rows must be given for exactly the round's sites")
        rows = {
            site_index(k): np.asarray(spec.stream_rows[k].positions, dtype=np.int64)
            for k in spec.site_ids
        }
        if any(r.size == 0 for r in rows.values()):
            raise ValueError("every site of a stream round needs at least one row")
        # an aggregator that does not name the round: each sub-round a round of its own
        self._stream_round[spec.round] = spec.stream_round or spec.round
        for old in sorted(self._stream_round)[:-16]:  # specs refused after this point
            del self._stream_round[old]
        return rows

    def run_round(self, job: RoundJob) -> list[SiteUpdate]:
        if job.stream_rows is None:
            raise ValueError("a curtailment-mode round needs stream rows for its sites")
        stream_round = self._stream_round.pop(job.round, job.round)
        return self.train_rows(job.params, job.stream_rows, job.round, stream_round)

    def close(self) -> None:
        pass  # saved after every sub-round: nothing to flush

    def _resumed(self, site: int, key: tuple[int, int]) -> SiteState | None:
        """The state ``site`` starts sub-round ``key`` (elastic round, sub-round) from: its
        newest from before it, reset per the recipe when it is from an earlier round."""
        assert self._log is not None
        before = [(k, st) for k, st in self._log.get(site, []) if k < key]
        if not before:
            return None
        (trained_in, _), state = before[-1]
        return state if trained_in == key[0] else state.for_round(self._recipe)

    def _record(self, site: int, key: tuple[int, int], state: SiteState) -> None:
        """``state`` is the site's after sub-round ``key``: it supersedes the site's states
        from that sub-round on (a redo) and its earlier one from the same round."""
        assert self._log is not None
        kept = [(k, st) for k, st in self._log.get(site, []) if k < key and k[0] != key[0]]
        self._log[site] = [*kept, (key, state)][-ROUNDS_KEPT:]

    def train_rows(
        self,
        params: Mapping[str, NDArray],
        rows: Mapping[int, NDArray[np.int64]],
        round_index: int = 0,
        stream_round: int | None = None,
    ) -> list[SiteUpdate]:
        """Train each site of ``rows`` (all hosted here) on its stream positions from ``params``
        in sub-round ``round_index`` of elastic round ``stream_round`` (None: a round of its
        own); the FedAvg weight is the site's optimizer steps (work-weighted, as in the
        emulator)."""
        foreign = sorted(set(rows) - set(self.sites))
        if foreign:
            raise ValueError(f"sites {foreign} are not hosted by this worker")
        bad = [
            s for s, r in rows.items() if len(r) == 0 or r.min() < 0 or r.max() >= self.total_rows
        ]
        if bad:
            raise ValueError(
                f"sites {bad}: stream positions empty or outside 0..{self.total_rows - 1}"
            )
        sites = list(rows)
        key = (round_index if stream_round is None else stream_round, round_index)
        torch_params = to_torch(params)
        s = self.setup
        started = time.perf_counter()
        upd = train_stream_rows(
            s.trainer,
            s.data.x_train,
            s.data.y_train,
            s.order,
            torch_params,
            [rows[i] for i in sites],
            None if self._log is None else [self._resumed(i, key) for i in sites],
        )
        if self._log is not None and upd.opt_state is not None:
            for site, state in zip(sites, upd.opt_state, strict=True):
                self._record(site, key, kept_after_training(site, round_index, state))
            if self._store is not None:  # before any update leaves: a fold implies it
                states = self.site_states
                assert states is not None
                self._store.save(states, round_index)
        seconds = time.perf_counter() - started
        return batched_updates(sites, upd.deltas, upd.steps, seconds)  # no loss reported
