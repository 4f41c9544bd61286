"""The service's RoundExecutor: broadcast the model to the workers of the selected sites, collect
their streamed updates, then commit and report the round with ``powertrip.rounds.outcome`` (each
site's
reported loss and samples added, ``site_reports``): the emulator's round loop and arithmetic.

A round commits only with a quorum (POWERTRIP_MIN_CONTRIBUTIONS accepted updates); below it, or
with no selected site alive, it fails with the model unchanged and ``failure`` says why
(docs/liveness.md)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
from numpy.typing import NDArray

from powertrip.aggregation.fedavg import delta_sketch, sketch_stride
from powertrip.aggregation.outer_step import NesterovOuter
from powertrip.aggregation.robust import Aggregation
from powertrip.aggregation.robust_fedavg import AdaptiveBound
from powertrip.learning.params import NumpyParams
from powertrip.rounds.loop import RoundOutcome
from powertrip.rounds.outcome import Evaluate, round_outcome
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.collector import RoundCollector, RoundGate
from powertrip.services.aggregator.registry import WorkerRegistry
from powertrip.services.aggregator.site_reports import SiteReports, with_site_reports
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.fault_points import fault_point
from powertrip.services.common.grpc_client import make_channel
from powertrip.services.common.tensor_stream import (
    DEFAULT_CHUNK_BYTES,
    encode,
    specs_of,
    wrap_tensor_stream,
)
from powertrip.sites.profiles import SiteProfile, site_id
from powertrip.v1 import common_pb2, worker_pb2, worker_pb2_grpc

logger = logging.getLogger(__name__)


class EncodedModel:
    """One round's model broadcast, encoded once and replayed to every worker.

    Every worker gets the same header, chunks and checksum trailer, so they are encoded (and
    hashed) once, not once per worker: a round's broadcast costs one encoding whatever the
    number of workers. The encoding is lazy and shared: whichever stream is ahead cuts the next
    chunk (under a lock) and keeps it; the others replay the kept messages, so the first chunk
    still leaves at once. Memory: one encoded copy of the model (its size plus framing), held
    while the round's broadcasts run and released when the round ends (``release_broadcast``;
    a stream still running keeps it until its RPC ends, at the round deadline at the latest).
    """

    def __init__(self, params: NumpyParams, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.params = params
        self.total_bytes = sum(s.nbytes for s in specs_of(params))
        self._source = wrap_tensor_stream(encode(params, chunk_bytes), worker_pb2.StartRoundRequest)
        self._messages: list[worker_pb2.StartRoundRequest] = []
        self._finished = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def _message(self, i: int) -> worker_pb2.StartRoundRequest | None:
        """Message ``i``, encoding it if no stream has yet; None past the trailer."""
        if i < len(self._messages):  # already encoded: the list only grows
            return self._messages[i]
        with self._lock:
            while len(self._messages) <= i and not self._finished:
                if self._error is not None:
                    raise self._error
                try:
                    self._messages.append(next(self._source))
                except StopIteration:
                    self._finished = True
                except BaseException as exc:
                    self._error = exc
                    raise
            return self._messages[i] if i < len(self._messages) else None

    def __iter__(self) -> Iterator[worker_pb2.StartRoundRequest]:
        i = 0
        while (msg := self._message(i)) is not None:
            yield msg
            i += 1


class GrpcRoundExecutor:
    def __init__(
        self,
        registry: WorkerRegistry,
        params: NumpyParams,
        evaluate: Evaluate,
        run_seed: int,
        deadline_s: float,
        pace_by_power: bool,
        channel_cfg: ServiceConfig,
        initial: tuple[float, float] | None = None,
        aggregation: Aggregation | None = None,
        min_contributions: int = 1,
        site_weights: Sequence[float] | None = None,
        outer: NesterovOuter | None = None,
    ) -> None:
        self.registry = registry
        self.outer = outer  # the run's outer step after the aggregate (its momentum restored)
        # per site, its partition's samples: the most weight a worker may claim (weight_problem)
        self.site_weights = site_weights
        self.min_contributions = min_contributions  # quorum: fewer accepted updates fail a round
        self.failure: tuple[int, str] | None = None  # (round, reason) of the last failed round
        # the run's rule (powertrip.aggregation.robust)
        self.aggregation = aggregation or Aggregation()
        #: the robust rule's bound from the rounds so far (checkpointed; ``restore_bound``),
        #: None for a rule that carries none
        self.bound: AdaptiveBound | None = None
        self.restore_bound(None)
        self.params = params
        self.evaluate = evaluate
        self.run_seed = run_seed
        self.deadline_s = deadline_s
        self.pace_by_power = pace_by_power
        self.channel_cfg = channel_cfg
        self._initial = initial
        self._channels: dict[str, tuple[str, grpc.Channel]] = {}
        self._lock = threading.Lock()
        self.collector: RoundGate | None = None  # the open round, fed by the servicer
        self.reports = SiteReports()  # per-site loss and samples, as the updates report them
        # Directional noise scale: keep the last global delta (one model-sized copy) so the
        # next round can fold each update's projection on it. Off unless a policy asks.
        self.track_direction = False
        self._direction: NumpyParams | None = None
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="broadcast")
        self._encoded: EncodedModel | None = None  # this round's broadcast, shared by workers
        self._encode_lock = threading.Lock()

    def restore_bound(self, bound: AdaptiveBound | None) -> None:
        """Continue the robust rule from ``bound`` (a checkpoint's; None: a fresh run's)."""
        if self.aggregation.adaptive:
            self.bound = bound or AdaptiveBound()
            metrics.AGGREGATION_BOUND.labels("clip").set(self.bound.clip_norm)
            metrics.AGGREGATION_BOUND.labels("zeroing").set(self.bound.zeroing_norm)

    def evaluate_initial(self) -> tuple[float, float]:
        if self._initial is None:
            self._initial = self.evaluate(self.params)
        return self._initial

    def _stub(self, worker_id: str) -> worker_pb2_grpc.WorkerServiceStub:
        worker = self.registry.worker(worker_id)
        with self._lock:
            cached = self._channels.get(worker_id)
            if cached is None or cached[0] != worker.address:  # new or re-registered elsewhere
                if cached is not None:
                    cached[1].close()
                channel = make_channel(worker.address, self.channel_cfg, worker_id)
                cached = (worker.address, channel)
                self._channels[worker_id] = cached
        return worker_pb2_grpc.WorkerServiceStub(cached[1])

    def encoded(self, params: NumpyParams) -> EncodedModel:
        """``params`` encoded for broadcast, once per round: the first worker's stream encodes
        (the others wait on the lock), every later one reuses the same messages. A new model
        replaces the old encoding (encodings are lazy: nothing is built until a stream reads),
        so at most one round's encoding is held."""
        with self._encode_lock:
            if self._encoded is None or self._encoded.params is not params:
                self._encoded = EncodedModel(params)
            return self._encoded

    def release_broadcast(self) -> None:
        """Drop the round's encoding once its broadcasts are over (a stream still running holds
        its own reference until its RPC ends, at the latest at the round deadline)."""
        with self._encode_lock:
            self._encoded = None

    def _round_stream(
        self, spec: common_pb2.RoundSpec, model: EncodedModel
    ) -> Iterator[worker_pb2.StartRoundRequest]:
        yield worker_pb2.StartRoundRequest(spec=spec)
        yield from model

    def _start_worker(
        self,
        collector: RoundCollector,
        worker_id: str,
        sites: list[int],
        profile: SiteProfile,
        model: EncodedModel,
    ) -> None:
        spec = common_pb2.RoundSpec(
            round=collector.round,
            run_seed=self.run_seed,
            site_ids=[site_id(s) for s in sites],
            deadline_seconds=self.deadline_s,
            pace_by_power=self.pace_by_power,
            power_fraction={site_id(s): float(profile.power[s]) for s in sites},
        )
        self.send_round(collector, worker_id, sites, spec, self.params, model)

    def send_round(
        self,
        collector: RoundGate,
        worker_id: str,
        sites: list[int],
        spec: common_pb2.RoundSpec,
        params: NumpyParams,
        model: EncodedModel | None = None,
    ) -> None:
        """Start ``spec`` on one worker with ``params``; a refusal fails its sites in
        ``collector`` (the round goes on without them). ``model`` is ``params`` already
        encoded; without it the round's shared encoding (``encoded``) is used."""
        model = model if model is not None else self.encoded(params)
        try:
            self._stub(worker_id).StartRound(
                self._round_stream(spec, model), timeout=self.deadline_s
            )
            metrics.BROADCAST_BYTES.labels(worker_id).inc(model.total_bytes)
            fault_point("broadcast", collector.round)  # test hook: dies with the round in flight
        except grpc.RpcError as exc:
            logger.warning(
                "round %d: worker %s did not start (%s: %s)",
                collector.round,
                worker_id,
                exc.code().name,
                exc.details(),
            )
            for s in sites:
                collector.fail(s, f"start_{exc.code().name.lower()}")
            if exc.code() is grpc.StatusCode.UNAVAILABLE:  # dead, not slow: out until it beats
                self.registry.unreachable(worker_id)

    def open_round(
        self, round_index: int, selected: Iterable[int], split_half: bool = False
    ) -> RoundCollector:
        """The collector of a new round, open to the servicer: the run's rule, the direction
        to project on, and each selected site's weight allowance (what the run assigned it)."""
        sites = [int(s) for s in selected]
        allowance = None
        if self.site_weights is not None:
            allowance = {s: float(self.site_weights[s]) for s in sites}
        self.collector = RoundCollector(
            round_index,
            sites,
            self.params,
            split_half,
            self._direction if self.track_direction else None,
            self.aggregation,
            allowance,
            self.bound,
        )
        return self.collector

    @metrics.ROUND_WALL.time()
    def execute(
        self,
        round_index: int,
        selected: NDArray[np.int64],
        profile: SiteProfile,
        split_half: bool,
    ) -> RoundOutcome | None:
        if selected.size == 0:  # the round loop dropped every selected site: none is alive
            logger.warning("round %d: no selected site is alive; model unchanged", round_index)
            self.failure = (round_index, "no_site_alive")
            return None
        collector = self.open_round(round_index, selected, split_half)
        groups, orphans = self.registry.group(collector.selected)
        for s in orphans:
            collector.fail(s, "unhosted")
        model = self.encoded(self.params)  # encoded lazily, once, while the first stream runs
        try:
            for wid, sites in groups.items():  # a hung worker costs its own thread, not the round
                self._pool.submit(self._start_worker, collector, wid, sites, profile, model)
            collector.wait(self.deadline_s)
            collector.close()
        finally:
            self.release_broadcast()
        for reason in collector.failed.values():
            metrics.UPDATES.labels(reason).inc()
        dropped = getattr(collector.agg, "dropped", 0)  # extreme: robust aggregation's zeroing
        metrics.UPDATES_DROPPED.inc(dropped)
        metrics.UPDATES_CLIPPED.inc(getattr(collector.agg, "clipped", 0))
        got = len(collector.accepted) - dropped
        if got < self.min_contributions:  # the sums are dropped: nothing of this round is kept
            logger.warning(
                "round %d: %d of %d updates arrived and were kept (%d dropped as extreme), "
                "quorum %d; model unchanged",
                round_index,
                got,
                len(selected),
                dropped,
                self.min_contributions,
            )
            self.failure = (round_index, "quorum" if got else "no_update")
            return None
        previous = self.params
        outcome = round_outcome(
            collector.agg,
            previous,
            self.evaluate,
            selected=len(selected),
            half=collector.half,
            outer=self.outer,
        )
        self.params = outcome.params
        fault_point("evaluation", round_index)  # test hook: dies before the round is recorded
        if outcome.aggregation_state is not None:
            self.restore_bound(outcome.aggregation_state)
        outcome = with_site_reports(outcome, self.reports, collector)
        if self.track_direction:  # new - old, the emulator's arithmetic
            self.resume_direction(previous)
        return outcome

    def resume_direction(self, previous: NumpyParams) -> None:
        """Set the last global delta from the model before the current one (after a restart,
        from the fallback checkpoint), so the next round projects as in an uninterrupted run.
        Only a strided sketch is kept (``fold_inputs.SKETCH_MAX``), never a model-sized copy."""
        self._direction = delta_sketch(self.params, previous, sketch_stride(self.params))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for _, ch in self._channels.values():
                ch.close()
