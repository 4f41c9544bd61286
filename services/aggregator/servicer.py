"""AggregatorService: registration, streamed updates, status. Validation and mapping only."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from powertrip.aggregation.fold_in_place import FoldCancelled
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.coded_intake import (
    assigned_codec,
    check_header,
    receive_update,
)
from powertrip.services.aggregator.collector import CountedReceiver
from powertrip.services.aggregator.lifecycle import Run
from powertrip.services.aggregator.run_status import WIRE_STATE
from powertrip.services.aggregator.served_model import model_replies
from powertrip.services.aggregator.site_owners import SiteOwners
from powertrip.services.aggregator.site_reports import note_update
from powertrip.services.aggregator.upload_flow import MiB, ReceiveBudget, credited
from powertrip.services.common.allow_list import AllowList, all_of
from powertrip.services.common.errors import BadRequest, NotFound, StaleRound, translate_errors
from powertrip.services.common.identity import (
    AGGREGATOR,
    OPERATOR,
    PROFILER,
    check_worker,
    deny,
    require_id,
    require_role,
    require_site_ids,
)
from powertrip.services.common.tensor_receiver import Sink
from powertrip.services.common.tensor_stream import StreamError, TensorSpec, shard_specs, specs_of
from powertrip.services.common.update_codec import DecodedUpdate
from powertrip.sites.profiles import site_id, site_index
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc

logger = logging.getLogger(__name__)
SERVICE = "AggregatorService"  # as metrics and refusal logs name it
#: GetStatus rounds per reply: by default, and at most whatever is asked (a reply's size and
#: the time the status lock is held do not grow with the run)
STATUS_PAGE, STATUS_PAGE_MAX = 100, 1000

#: tells the profiler about a worker (worker id, address, site ids); must not block, as it is
#: called in the registration handler (``WorkerTracker.track`` queues it)
TrackWorker = Callable[[str, str, list[str]], None]


class AggregatorServicer(aggregator_pb2_grpc.AggregatorServiceServicer):
    """Talks to the run only through ``Run``, so it serves either mode unchanged.

    Who may call (over TLS; docs/security.md): RegisterWorker and SubmitUpdate a worker whose
    certificate CN is the worker_id it claims, on the allow-list; GetStatus the operator, the
    aggregator, the profiler or a registered worker (also re-checked against the allow-list);
    GetModel the operator only: the model is the run's result, which no worker needs (each gets
    the model of the rounds it trains) and the profiler never reads.
    """

    def __init__(self, run: Run, track_worker: TrackWorker | None = None) -> None:
        self.run = run
        self.track_worker = track_worker
        self.codec = assigned_codec(run)  # what every update must be coded with
        cfg = run.cfg
        self.allow_list = AllowList(cfg.allowed_worker_ids, cfg.allowed_workers_file)
        self.owners = SiteOwners(cfg.site_owners, cfg.site_owners_file, run.registry.num_sites)
        self.budget = ReceiveBudget(  # UploadUpdate's credits (upload_flow)
            cfg.receive_budget_mib * MiB,
            cfg.stream_window_mib * MiB,
            getattr(run, "link_of", None),
        )
        # the owners map admits only the workers it names, besides the allow-list's own rule
        self.allow = all_of(self.allow_list, self.owners.verdict)
        if cfg.tls and not self.owners.active:
            logger.warning(
                "sites are first-come: set POWERTRIP_SITE_OWNERS to bind them to worker "
                "identities (any worker certificate can claim any free site)"
            )

    def _check(self, context: grpc.ServicerContext, worker_id: str, method: str) -> None:
        check_worker(context, worker_id, self.allow, SERVICE, method)

    def _registered(self, worker_id: str) -> bool:
        try:
            self.run.registry.worker(worker_id)
        except NotFound:
            return False
        return True

    @translate_errors
    def RegisterWorker(  # noqa: N802 - gRPC method name
        self, request: aggregator_pb2.RegisterWorkerRequest, context: grpc.ServicerContext
    ) -> aggregator_pb2.RegisterWorkerResponse:
        # the allow-list only: off the owners map, the refusal below names the sites
        check_worker(context, request.worker_id, self.allow_list, SERVICE, "RegisterWorker")
        sites = require_site_ids(SERVICE, "RegisterWorker", request.site_ids)
        refusal = self.owners.refusal(request.worker_id, sites)
        if refusal is not None:
            raise deny(SERVICE, "RegisterWorker", "site_not_assigned", refusal)
        worker, changed = self.run.registry.register(
            request.worker_id, request.address, sites, request.ready, self.owners.active
        )
        metrics.REGISTERED_SITES.set(self.run.registry.site_count)
        if not changed:  # a heartbeat from a worker we know
            return self._registration_reply()
        logger.info(
            "[AggregatorService.RegisterWorker] worker=%s address=%s sites=%d",
            worker.worker_id,
            worker.address,
            len(worker.sites),
        )
        if self.track_worker is not None:
            self.track_worker(worker.worker_id, worker.address, [site_id(s) for s in worker.sites])
        return self._registration_reply()

    def _registration_reply(self) -> aggregator_pb2.RegisterWorkerResponse:
        reg = self.run.registration()
        return aggregator_pb2.RegisterWorkerResponse(
            run_seed=reg.run_seed,
            mode=reg.mode,
            run_config_json=reg.run_config_json,
            curtail_config_json=reg.curtail_config_json,
        )

    @translate_errors
    def SubmitUpdate(  # noqa: N802
        self,
        request_iterator: Iterator[aggregator_pb2.SubmitUpdateRequest],
        context: grpc.ServicerContext,
    ) -> aggregator_pb2.SubmitUpdateResponse:
        return self._submit(request_iterator, context)

    def UploadUpdate(  # noqa: N802
        self,
        request_iterator: Iterator[aggregator_pb2.SubmitUpdateRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[aggregator_pb2.UploadReply]:
        """SubmitUpdate with credits (``upload_flow``); errors are mapped by the server's
        ``RequestGuard``, as for any streaming reply."""
        return credited(self._submit, request_iterator, context, self.budget)

    def _submit(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext
    ) -> aggregator_pb2.SubmitUpdateResponse:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "update":
            raise BadRequest("an update stream must open with its update header")
        head = first.update
        self._check(context, head.worker_id, "SubmitUpdate")
        require_id(SERVICE, "SubmitUpdate", head.site_id, "site id")
        try:
            site = site_index(head.site_id)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        owner = self.run.registry.owner(site)
        if owner is None:
            raise NotFound(f"{head.site_id} is not hosted by any registered worker")
        if owner.worker_id != head.worker_id:
            raise BadRequest(
                f"{head.site_id} is hosted by {owner.worker_id!r}, not {head.worker_id!r}"
            )
        collector = self.run.executor.collector
        if collector is None:
            raise StaleRound(f"no round is open (update for round {head.round})")
        model = specs_of(self.run.executor.params)
        # one of a site's per-rank shards (R31), or its whole update
        sharded = bool(head.shard_count or head.shard_index)
        index, count = head.shard_index, head.shard_count
        fail: Callable[[str], None]
        sink_for: Callable[[], Sink | None] | None
        if sharded:
            what = f"update from {head.site_id} for round {head.round}, shard {index} of {count},"
            try:
                check_header(head, self.codec)
                collector.admit_shard(site, head.round, index, count, head.num_samples, model)
                note_update(self.run.executor, collector, site, head)
            except StreamError as exc:
                collector.fail_shard(site, None, exc.reason)
                metrics.UPDATES.labels(exc.reason).inc()
                raise BadRequest(f"{what} refused: {exc}") from None
            specs, sink_for = shard_specs(model, count, index), None
            fail = lambda reason: collector.fail_shard(site, index, reason)  # noqa: E731
        else:
            collector.admit(site, head.round)
            what, fail = f"update from {head.site_id}", lambda r: collector.fail(site, r)
            try:
                check_header(head, self.codec)
            except StreamError as exc:
                fail(exc.reason)
                metrics.UPDATES.labels(exc.reason).inc()
                raise BadRequest(f"{what} rejected: {exc}") from None
            note_update(self.run.executor, collector, site, head)
            specs, sink_for = model, lambda: collector.direct_sink(site, head.num_samples)
        # raw: verified (a whole update streamed into the fold); coded: decoded whole
        rx: CountedReceiver | DecodedUpdate = receive_update(
            self._receive,
            collector,
            site,
            head,
            specs,
            request_iterator,
            what,
            fail,
            self.codec,
            sink_for,
        )
        if sharded:
            collector.commit_shard(site, index, rx)  # the collector owns rx from here
        else:
            collector.commit(site, rx, head.num_samples)  # the collector owns rx from here
        metrics.UPDATE_BYTES.labels(head.site_id, "up").inc(rx.total_bytes)
        metrics.UPDATES.labels("accepted").inc()
        return aggregator_pb2.SubmitUpdateResponse(accepted=True)

    @staticmethod
    def _receive(
        collector: Any,
        site: int,
        head: aggregator_pb2.UpdateHeader,
        expected: list[TensorSpec],
        requests: Iterator[aggregator_pb2.SubmitUpdateRequest],
        what: str,
        fail: Callable[[str], None],
        sink_for: Callable[[], Sink | None] | None = None,
    ) -> CountedReceiver:
        """An admitted stream, verified (weight, then every chunk); ``fail`` on any refusal.
        ``sink_for``: the receiver's (where the chunks may go once it is the update's turn)."""
        # powertrip_update_streams_open while it lives
        rx = CountedReceiver(expected, sink_for=sink_for)
        try:
            # the weight is checked against what this round assigned the site before a byte of
            # the update is read (R26)
            bad_weight = collector.weight_problem(site, head.num_samples)
            if bad_weight is not None:
                raise StreamError("bad_weight", bad_weight)
            rx.consume(requests)
        except StreamError as exc:
            rx.close()
            fail(exc.reason)
            metrics.UPDATES.labels(exc.reason).inc()
            raise BadRequest(f"{what} rejected: {exc}") from None
        except FoldCancelled:  # the round closed while the update was folding in
            rx.close()
            fail("stale_round")
            raise StaleRound(f"{what}: round {head.round} closed before it finished") from None
        except BaseException:
            rx.close()
            fail("aborted")
            raise
        return rx

    def GetModel(  # noqa: N802
        self, request: aggregator_pb2.GetModelRequest, context: grpc.ServicerContext
    ) -> Iterator[aggregator_pb2.GetModelReply]:
        """The current model and its card (``served_model``). Errors are mapped by the server's
        ``RequestGuard``, as for any streaming reply."""
        cn = require_role(context, SERVICE, "GetModel", (OPERATOR,))
        state, card = self.run.served.current()
        logger.info(
            "[AggregatorService.GetModel] %s pulls the model of round %d",
            cn or "a plaintext peer",
            card.round,
        )
        yield from model_replies(state, card)

    @translate_errors
    def GetStatus(  # noqa: N802
        self, request: aggregator_pb2.GetStatusRequest, context: grpc.ServicerContext
    ) -> aggregator_pb2.GetStatusResponse:
        services = (OPERATOR, AGGREGATOR, PROFILER)
        cn = require_role(context, SERVICE, "GetStatus", services, self._registered)
        if cn is not None and cn not in services:  # a worker: still on the allow-list?
            self._check(context, cn, "GetStatus")
        page = min(request.max_rounds or STATUS_PAGE, STATUS_PAGE_MAX)
        snap = self.run.status_snapshot(request.after_round, page)
        st, energy = snap.status, snap.status.energy
        return aggregator_pb2.GetStatusResponse(
            total_rounds=st.total_rounds,
            first_round=snap.first_round,
            more_rounds=snap.more_rounds,
            mode=st.mode,
            active_sites=st.active_sites,
            energy_kwh=energy.energy_kwh if energy else 0.0,
            emissions_kg=energy.emissions_kg if energy else 0.0,
            state=WIRE_STATE[st.state],
            round=st.round,
            accuracy=st.accuracy,
            clock_seconds=st.clock_s,
            target_accuracy=snap.target or 0.0,
            time_to_accuracy_seconds=st.time_to_accuracy_s or 0.0,
            registered_sites=snap.registered_sites,
            expected_sites=snap.expected_sites,
            policy=snap.policy,
            clock=snap.clock,
            message=st.message,
            rounds=[
                aggregator_pb2.RoundSummary(
                    round=r.record.round,
                    clock_seconds=r.record.time_s,
                    duration_seconds=r.record.duration_s,
                    selected_site_ids=[site_id(s) for s in r.record.selected],
                    contributions=r.record.contributions,
                    accuracy=r.record.accuracy,
                    loss=r.record.loss,
                    outcome=r.record.outcome,
                    steps=r.steps,
                    start_seconds=r.start_s,
                )
                for r in st.rounds
            ],
        )
