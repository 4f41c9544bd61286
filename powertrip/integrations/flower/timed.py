"""Flower's FedAvg on PowerTrip's emulated clock: the common base of both strategies.

Flower measures nothing about geography or power, so a Flower simulation cannot say how long
a round would take between datacenters. ``TimedFedAvg`` keeps Flower's FedAvg sampling and
adds PowerTrip's round time model: each training round advances an emulated clock by the time
of its slowest selected node (``powertrip.sites.timing.round_time_s`` over the nodes' profile,
Eqs. 3-4), and records the clock, the nodes and the accuracy, so time-to-accuracy is reported
in emulated time (``result``, a ``powertrip.rounds.loop.RunResult``).
Each trained round logs (Flower's logger, INFO) its nodes, its emulated duration and the clock.

Accuracy comes from Flower's centralized evaluation (``evaluate_fn`` given to ``start``) or,
without it, from the federated evaluation's aggregated metrics, under ``accuracy_key``.
Evaluation takes no emulated time (the paper's clock counts training rounds only).

**Aggregation** is the library's rule (``powertrip.aggregation.robust``), robust by default as
in every other mode: Flower's FedAvg averages whatever the nodes return, so one node answering with
every float 1e30 sets the global model (it does, see tests/unit/test_flower_strategy.py). Each
reply's delta from the model sent is checked (one ArrayRecord and one MetricRecord, a numeric
weight under ``weighted_by_key``, the sent tensors' names, shapes and dtypes, finite values) and
folded into ``Aggregation(rule).make(sent, direction, bound)``; a reply that fails is skipped
with one WARNING line naming the node and counted. The new model is ``sent + mean_delta``.
``robust`` (TFF's ``robust_aggregator``) drops an update above its zeroing norm and clips the
rest to an adaptive norm, in units of the sent model's norm; its ``AdaptiveBound`` moves once
per round that judged an update, from that round's norms, and is kept by the strategy
(``aggregation_bound``). ``aggregation="fedavg"`` is Flower's FedAvg up to float rounding;
``trimmed-mean`` and ``median`` are the library's order statistics. Non-floating tensors
(integer buffers such as BatchNorm's ``num_batches_tracked``) take the weighted mean (fedavg)
or the median (other rules) of the accepted replies, rounded back to their dtype. The train
MetricRecord is Flower's ``train_metrics_aggr_fn`` over the replies the rule accepted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from numpy.typing import NDArray

from powertrip.aggregation.fedavg import UpdateRejected
from powertrip.aggregation.robust import DEFAULT_RULE, Aggregation, Aggregator
from powertrip.aggregation.robust_fedavg import AdaptiveBound, RobustFedAvg
from powertrip.config.recipe import LocalOptimizer
from powertrip.config.sites import RoundTimeModel
from powertrip.integrations.flower.loop import EvaluateFn, run_rounds
from powertrip.integrations.flower.profiles import NodeProfiles
from powertrip.integrations.flower.recipe import add_recipe
from powertrip.integrations.flower.site_info import NodeIndex
from powertrip.learning.params import NumpyParams
from powertrip.rounds.clock import EmulatedClock
from powertrip.rounds.loop import RoundRecord, RunResult
from powertrip.sites.profiles import SiteProfile
from powertrip.sites.timing import round_time_s


def _float_arrays(record: ArrayRecord) -> NumpyParams:
    """The floating-point tensors of a model record by name (integer buffers are bookkeeping).

    Flower's records hold host numpy arrays already, so no device is crossed here.
    """
    arrays = zip(record.keys(), record.to_numpy_ndarrays(), strict=True)
    return {k: a for k, a in arrays if np.issubdtype(a.dtype, np.floating)}


def _weight(content: RecordDict, key: str) -> float:
    """An accepted reply's weight (``_fold`` refused any reply whose weight is not a number)."""
    (metrics,) = content.metric_records.values()
    weight = metrics[key]
    assert isinstance(weight, int | float)
    return float(weight)


def _named_array(record: ArrayRecord, key: str) -> NDArray:
    """One tensor of a model record as a host numpy array (Flower's records hold them there)."""
    return dict(zip(record.keys(), record.to_numpy_ndarrays(), strict=True))[key]


@dataclass
class RoundAggregation:
    """What one ``aggregate_train`` did with the replies: ``accepted`` folded into the model,
    ``skipped`` failed the checks (``problems``: node id -> reason), ``dropped`` above the
    robust rule's zeroing norm, ``clipped`` shrunk to its clip norm (``clip_norm``, in units of
    the sent model's norm; None for the rules without an adaptive bound)."""

    round: int
    accepted: int = 0
    skipped: int = 0
    dropped: int = 0
    clipped: int = 0
    clip_norm: float | None = None
    problems: dict[int, str] = field(default_factory=dict)


@dataclass
class PendingRound:
    """A round between ``configure_train`` and its accuracy."""

    round: int
    nodes: tuple[int, ...]  # Flower node ids, in the order they were sent
    rows: NDArray[np.int64]  # the same nodes as profile rows (what a policy returns)
    started_s: float
    duration_s: float
    trained: bool = False
    contributions: int = 0


class TimedFedAvg(FedAvg):
    """Flower's ``flwr.serverapp.strategy.FedAvg`` (the Message API), timed on PowerTrip's
    emulated clock. Subclasses change which nodes train by overriding ``choose_train``.

    ``profiles`` gives each round's per-node power and link (``ReportedProperties`` or
    ``TracedSites``); ``ideal_compute_s`` is tau, one local-training pass at full power;
    ``update_bytes`` the size of an update on the wire (None: the global model's size).
    ``stop_at_accuracy`` ends the run at the round that reaches it (``start`` runs no round
    after it; driven by hand, ``configure_train`` then returns no messages).
    ``local_optimizer``: the recipe every training message carries in its config
    (``recipe_to_config``; None: no recipe, the nodes train as they would anyway).
    ``aggregation``: the rule the replies are folded with
    (``powertrip.aggregation.robust.RULES``: robust, fedavg, trimmed-mean, median; or an
    ``Aggregation``); see the module docstring.
    Other keyword arguments go to Flower's FedAvg (``fraction_train``, ``min_train_nodes``...).
    """

    def __init__(
        self,
        *,
        profiles: NodeProfiles,
        ideal_compute_s: float,
        update_bytes: float | None = None,
        time_model: RoundTimeModel = RoundTimeModel.PER_SITE_MAX,
        accuracy_key: str = "accuracy",
        loss_key: str = "loss",
        stop_at_accuracy: float | None = None,
        initial_accuracy: float = 0.0,
        name: str = "fedavg",
        seed: int = 0,
        local_optimizer: LocalOptimizer | None = None,
        aggregation: str | Aggregation = DEFAULT_RULE,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        if not isinstance(aggregation, Aggregation):
            aggregation = Aggregation(aggregation)  # type: ignore[arg-type]  # checked there
        if ideal_compute_s <= 0:
            raise ValueError(f"ideal_compute_s must be > 0, got {ideal_compute_s}")
        if update_bytes is not None and update_bytes < 0:
            raise ValueError(f"update_bytes must be >= 0, got {update_bytes}")
        self.profiles = profiles
        self.ideal_compute_s = float(ideal_compute_s)
        self.update_bytes = update_bytes
        self.time_model = RoundTimeModel(time_model)
        self.accuracy_key = accuracy_key
        self.loss_key = loss_key
        self.stop_at_accuracy = stop_at_accuracy
        self.local_optimizer = local_optimizer
        self.clock = EmulatedClock()
        self.result = RunResult(name, seed, stop_at_accuracy, initial_accuracy=initial_accuracy)
        self.accuracy, self.loss = initial_accuracy, math.nan
        self.stopped = False
        self._pending: PendingRound | None = None
        self._profile: tuple[int, NodeIndex, SiteProfile] | None = None
        self._centralized = False
        self.aggregation = aggregation
        self._bound = AdaptiveBound()  # the robust rule's state, handed from round to round
        self._sent: tuple[ArrayRecord, NumpyParams] | None = None  # this round's global model
        self._previous: NumpyParams | None = None  # last round's (for the update direction)
        self.fold: Aggregator | None = None  # the last aggregated round's fold (its statistics)
        self.last_aggregation: RoundAggregation | None = None

    @property
    def aggregation_bound(self) -> AdaptiveBound:
        """The robust rule's bound the next round is judged by (relative clip/zeroing norms)."""
        return self._bound

    def summary(self) -> None:
        """Flower logs this at ``start``; add the aggregation rule, which replaces FedAvg's."""
        super().summary()
        log(INFO, "\t└──> Aggregation: %s (powertrip.aggregation.robust)", self.aggregation.rule)

    # -- the round's nodes and their profile ----------------------------------------------------
    def round_profile(self, server_round: int, grid: Grid) -> tuple[NodeIndex, SiteProfile]:
        """Every connected node and its profile at the clock's time, once per round (after
        waiting, as Flower's sampling does, for ``min_available_nodes``)."""
        if self._profile is None or self._profile[0] != server_round:
            _, connected = sample_nodes(grid, self.min_available_nodes, 0)
            index = NodeIndex(connected)
            profile = self.profiles.profile(
                grid, index, self.clock.now(), float(self.update_bytes or 0.0)
            )
            self._profile = (server_round, index, profile)
        return self._profile[1], self._profile[2]

    def choose_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The round's training messages: here Flower's FedAvg sampling, unchanged."""
        return super().configure_train(server_round, arrays, config, grid)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's hook: choose the nodes (``choose_train``) and time the round over them."""
        self._close_unscored_round()
        if self.stopped:
            return []
        if self.update_bytes is None:
            self.update_bytes = float(arrays.count_bytes())
        if self.local_optimizer is not None:
            add_recipe(config, self.local_optimizer)
        messages = list(self.choose_train(server_round, arrays, config, grid))
        if not messages:
            return []
        sent = _float_arrays(arrays)
        self._previous = None if self._sent is None else self._sent[1]
        self._sent = (arrays, sent)
        index, profile = self.round_profile(server_round, grid)
        nodes = tuple(int(m.metadata.dst_node_id) for m in messages)
        rows = index.rows(nodes)
        duration = round_time_s(
            self.time_model,
            self.ideal_compute_s,
            profile.power[rows],
            profile.comm_s[rows],
            total_sites=profile.size,
        )
        self._pending = PendingRound(server_round, nodes, rows, self.clock.now(), duration)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The library's rule over the replies (module docstring); the round's emulated time
        passes when it ends."""
        replies = list(replies)
        self._check_and_log_replies(replies, is_train=True, validate=False)  # Flower's log
        arrays, metrics = self._aggregate(server_round, replies)
        p = self._pending
        if p is not None and p.round == server_round and not p.trained:
            self.clock.advance(p.duration_s)
            p.trained = True
            done = self.last_aggregation
            p.contributions = 0 if arrays is None or done is None else done.accepted
            now = self.clock.now()
            log(
                INFO,
                "%s round %d: nodes %s (%d replied); emulated round %.1f s, clock %.1f s (%.3f h)",
                self.result.policy,
                server_round,
                list(p.nodes),
                p.contributions,
                p.duration_s,
                now,
                now / 3600,
            )
        return arrays, metrics

    def fold_direction(self, sent: NumpyParams) -> NumpyParams | None:
        """The direction the round's updates are projected on (``StreamingFedAvg``); none here,
        ``PowerTripStrategy`` uses the last global delta."""
        return None

    def _aggregate(
        self, server_round: int, replies: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.fold = None
        if self._sent is None:
            raise RuntimeError(
                f"aggregate_train round {server_round}: no model was sent (call configure_train)"
            )
        record, sent = self._sent
        agg = self.aggregation.make(sent, self.fold_direction(sent), bound=self._bound)
        robust = agg if isinstance(agg, RobustFedAvg) else None
        clip = None if robust is None else self._bound.clip_norm
        done = RoundAggregation(server_round, clip_norm=clip)
        self.last_aggregation = done
        spec = {
            k: (a.shape, a.dtype) for k, a in zip(record, record.to_numpy_ndarrays(), strict=True)
        }
        accepted: list[RecordDict] = []
        for reply in replies:
            if reply.has_error():
                continue  # Flower logged it; a failed node, not a bad update
            dropped = robust.dropped if robust is not None else 0
            problem = self._fold_reply(agg, spec, sent, reply.content)
            if problem is not None:
                node = int(reply.metadata.src_node_id)
                done.skipped += 1
                done.problems[node] = problem
                log(WARNING, "round %d: node %d reply skipped: %s", server_round, node, problem)
            elif robust is not None and robust.dropped > dropped:
                done.dropped += 1
            else:
                accepted.append(reply.content)
        done.accepted = len(accepted)
        done.clipped = int(getattr(agg, "clipped", 0))
        if robust is not None and robust.norms:
            self._bound = robust.bound_after()
        if done.dropped or done.clipped or done.skipped:
            log(
                INFO,
                "round %d aggregation (%s): %d accepted, %d clipped, %d dropped, %d skipped",
                server_round,
                self.aggregation.rule,
                done.accepted,
                done.clipped,
                done.dropped,
                done.skipped,
            )
        if not accepted:
            log(WARNING, "round %d: no reply could be aggregated: the model is kept", server_round)
            return None, None
        mean = agg.mean_delta()
        new: dict[str, NDArray] = {}
        for key in record:
            if key in sent:
                new[key] = sent[key] + mean[key]
            else:
                new[key] = self._aggregate_buffer(key, accepted)
        if not all(np.isfinite(a).all() for a in new.values() if a.dtype.kind == "f"):
            log(WARNING, "round %d: the aggregated model is not finite: kept", server_round)
            return None, None
        self.fold = agg
        arrays = ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()})
        return arrays, self.train_metrics_aggr_fn(accepted, self.weighted_by_key)

    def _fold_reply(
        self,
        agg: Aggregator,
        spec: dict[str, tuple[tuple[int, ...], np.dtype]],
        sent: NumpyParams,
        content: RecordDict,
    ) -> str | None:
        """Fold one reply's delta; the reason it cannot be folded, or None."""
        if len(content.array_records) != 1 or len(content.metric_records) != 1:
            return "expected one ArrayRecord and one MetricRecord"
        (got_record,) = content.array_records.values()
        (metrics,) = content.metric_records.values()
        weight = metrics.get(self.weighted_by_key)
        if not isinstance(weight, int | float) or isinstance(weight, bool):
            return f"MetricRecord {self.weighted_by_key!r} is {weight!r}, not a number"
        if set(got_record.keys()) != spec.keys():
            return f"arrays {sorted(got_record.keys())} differ from the model's {sorted(spec)}"
        try:
            got = dict(zip(got_record.keys(), got_record.to_numpy_ndarrays(), strict=True))
        except Exception as err:  # noqa: BLE001 - a node's bytes: any decoding error
            return f"arrays do not decode ({type(err).__name__}: {err})"
        for key, (shape, dtype) in spec.items():
            a = got[key]
            if a.shape != shape or a.dtype != dtype:
                return f"array {key!r} is {a.dtype}{list(a.shape)}, the model's {dtype}{shape}"
        # a delta past float's range is inf, a norm past it too: the fold refuses or drops them
        with np.errstate(over="ignore", invalid="ignore"):
            delta = {k: got[k] - v for k, v in sent.items()}
            try:
                agg.add(delta, float(weight))
            except UpdateRejected as err:
                return str(err)
        return None

    def _aggregate_buffer(self, key: str, accepted: list[RecordDict]) -> NDArray:
        """A non-floating tensor: the weighted mean (fedavg) or the median of the accepted
        replies, rounded to its dtype (Flower's FedAvg would leave a float64 mean)."""
        values = [_named_array(next(iter(c.array_records.values())), key) for c in accepted]
        stacked = np.stack(values)
        if self.aggregation.rule == "fedavg":
            key_w = self.weighted_by_key
            w = np.asarray([_weight(c, key_w) for c in accepted])
            agg = np.tensordot(w / w.sum(), stacked.astype(np.float64), axes=1)
        else:
            agg = np.median(stacked.astype(np.float64), axis=0)
        return np.rint(agg).astype(values[0].dtype)

    # -- accuracy ----------------------------------------------------------------------------
    def record_accuracy(
        self, server_round: int, accuracy: float, loss: float | None = None
    ) -> None:
        """Score the round that just trained (round 0: the initial model). ``start`` calls it
        from the evaluation; call it yourself when driving the strategy without ``start``."""
        loss = math.nan if loss is None else float(loss)
        p = self._pending
        if server_round == 0 or p is None:
            if not self.result.rounds:
                self.result.initial_accuracy = self.accuracy = float(accuracy)
                self.loss = loss
            return
        if p.round != server_round or not p.trained:
            return
        outcome = "completed" if p.contributions else "failed"
        record = RoundRecord(
            server_round,
            self.clock.now(),
            p.duration_s,
            len(p.nodes),
            float(accuracy),
            loss,
            p.nodes,
            p.contributions,
            outcome,
        )
        self.result.rounds.append(record)
        self._pending = None
        previous = (self.accuracy, self.loss)
        self.accuracy, self.loss = float(accuracy), loss
        self.on_round_scored(p, previous[0], previous[1])
        if self.stop_at_accuracy is not None and self.accuracy >= self.stop_at_accuracy:
            self.stopped = True
            log(
                INFO,
                "%s round %d reached accuracy %.4f >= target %.4f at emulated %.1f s: stopping",
                self.result.policy,
                server_round,
                self.accuracy,
                self.stop_at_accuracy,
                self.clock.now(),
            )

    def on_round_scored(  # noqa: B027 - optional hook
        self, pending: PendingRound, previous_accuracy: float, previous_loss: float
    ) -> None:
        """Hook after a round is scored (``self.accuracy`` is its accuracy); PowerTrip's
        policy learns here."""

    def _close_unscored_round(self) -> None:
        """A trained round whose evaluation reported no accuracy keeps the last one."""
        p = self._pending
        if p is not None and p.trained:
            key, acc = self.accuracy_key, self.accuracy
            log(WARNING, "round %d reported no %r: keeping %.4f", p.round, key, acc)
            self.record_accuracy(p.round, self.accuracy, self.loss)
        self._pending = None

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's federated evaluation, skipped once training has stopped."""
        if self.stopped:
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Flower's aggregation; its accuracy scores the round unless ``start`` got an
        ``evaluate_fn`` (centralized evaluation wins)."""
        metrics = super().aggregate_evaluate(server_round, replies)
        if not self._centralized:
            self._score(server_round, metrics)
        return metrics

    def _score(self, server_round: int, metrics: MetricRecord | None) -> None:
        accuracy = None if metrics is None else metrics.get(self.accuracy_key)
        if metrics is None or not isinstance(accuracy, int | float):
            return
        loss = metrics.get(self.loss_key)
        self.record_accuracy(
            server_round, float(accuracy), float(loss) if isinstance(loss, int | float) else None
        )

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Flower's round loop (``loop.run_rounds``), with the evaluation wired to the
        emulated-time record, ending at the round that reaches ``stop_at_accuracy``."""
        if evaluate_fn is None and self.fraction_evaluate == 0:
            raise ValueError(
                f"{type(self).__name__} needs an accuracy every round: pass evaluate_fn "
                "(centralized) or keep fraction_evaluate > 0 (federated evaluation)"
            )
        self._centralized = evaluate_fn is not None
        wrapped: EvaluateFn | None = None
        if evaluate_fn is not None:
            fn = evaluate_fn

            def wrapped(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
                metrics = fn(server_round, arrays)
                self._score(server_round, metrics)
                return metrics

        out = run_rounds(
            self,
            grid,
            initial_arrays,
            num_rounds,
            timeout,
            train_config,
            evaluate_config,
            wrapped,
            should_stop=lambda: self.stopped,
        )
        self._close_unscored_round()
        return out

    def time_to(self, accuracy: float) -> float | None:
        """Emulated seconds until the first round at ``accuracy`` or above; None if never."""
        return self.result.time_to(accuracy)
