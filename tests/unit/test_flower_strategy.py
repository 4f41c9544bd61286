"""The Flower adapter without a simulation: Flower's own strategies, records and messages, driven
over a small in-process ``Grid`` whose nodes answer like the example's ClientApp would (property
queries through the real client helper; training as a fixed per-node step). The real Ray
simulation runs in tests/integration/test_flower_example.py.
"""

from __future__ import annotations

import importlib
import random
import sys
from collections.abc import Iterable

import numpy as np
import pytest

from powertrip.aggregation.robust_fedavg import CLIP
from tests.needs import extra_reason

flwr = pytest.importorskip("flwr", reason=extra_reason("flower", "flwr"))

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from powertrip.config.recipe import LocalOptimizer  # noqa: E402
from powertrip.config.sites import RoundTimeModel  # noqa: E402
from powertrip.integrations.flower import (  # noqa: E402
    BANDWIDTH_MBPS,
    DEFAULT_POLICY,
    MissingNodeProperty,
    NodeIndex,
    PowerTripStrategy,
    ReportedProperties,
    TimedFedAvg,
    TracedSites,
    profile_from_properties,
    recipe_from_config,
    site_properties,
)
from powertrip.integrations.flower.client import properties_reply  # noqa: E402
from powertrip.selection.base import RoundContext, RoundFeedback, StaticTopK  # noqa: E402
from powertrip.selection.registry import build_policy  # noqa: E402
from powertrip.sites.profiles import (  # noqa: E402
    ModelledLinks,
    StaticPower,
    generate_sites,
    profile_at,
)
from powertrip.sites.timing import round_time_s  # noqa: E402

TAU = 50.0
UPDATE = 1.5e9
NODE_IDS = [9001, 17, 4242, 5, 77, 123456, 31, 808]  # Flower ids are arbitrary integers


@pytest.fixture(autouse=True)
def _server_identity(monkeypatch):
    """Flower's ServerApp runtime sets the task identity every message is stamped with."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class SmallGrid(Grid):
    """Nodes in-process: each answers PowerTrip's query with ``properties_reply`` over its node
    config, and a train message with the sent model plus its own fixed step."""

    def __init__(self, node_config: dict[int, dict]) -> None:
        self.node_config = node_config
        self.sent: list[Message] = []

    def set_run(self, run) -> None:  # pragma: no cover - not used outside a runtime
        pass

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_config)

    def push_messages(self, messages):  # pragma: no cover
        raise NotImplementedError

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError

    def _answer(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type.startswith(MessageType.QUERY):
            if self.node_config[node].get("broken"):
                return Message(Error(1, "no query handler"), reply_to=msg)
            ctx = Context(1, node, self.node_config[node], RecordDict(), {})
            return properties_reply(msg, ctx)
        sent = msg.content["arrays"]
        i = NODE_IDS.index(node)
        step = 0.01 * (1 + i)
        # a floating tensor takes the node's step, an integer one (a counter) counts the round
        arrays = {
            k: a.numpy() + (step if a.numpy().dtype.kind == "f" else 1) for k, a in sent.items()
        }
        arrays = self.tamper(node, arrays)
        n = 10 * (1 + i)
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(a) for k, a in arrays.items()}),
                "metrics": MetricRecord({"num-examples": n, "train-loss": 1.0 / (1 + i)}),
            }
        )
        return Message(content, reply_to=msg)

    def tamper(self, node: int, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """An honest node's arrays are its step; ``HostileGrid`` overrides this."""
        return arrays

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.sent += messages
        return [self._answer(m) for m in messages]

    def count(self, message_type: str) -> int:
        return sum(m.metadata.message_type.startswith(message_type) for m in self.sent)


def sites_and_grid(seed: int = 3, grid: type[SmallGrid] = SmallGrid):
    sites = generate_sites(len(NODE_IDS), np.random.default_rng(seed))
    config = {n: site_properties(sites, i) | {"partition-id": i} for i, n in enumerate(NODE_IDS)}
    return sites, grid(config)


def model() -> ArrayRecord:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.zeros(2, dtype=np.float32)
    return ArrayRecord({"w": Array(w), "b": Array(b)})


def expected_duration(grid: SmallGrid, nodes: list[int]) -> float:
    index = NodeIndex(grid.get_node_ids())
    profile = profile_from_properties(index, grid.node_config, UPDATE)
    rows = index.rows(nodes)
    return round_time_s(RoundTimeModel.PER_SITE_MAX, TAU, profile.power[rows], profile.comm_s[rows])


def strategy(policy="powertrip-paper", **kw) -> PowerTripStrategy:
    kw.setdefault("profiles", ReportedProperties())
    return PowerTripStrategy(
        policy, ideal_compute_s=TAU, update_bytes=UPDATE, fraction_evaluate=0.0, **kw
    )


# -- node <-> site mapping and properties ------------------------------------------------------
def test_node_index_orders_ids_and_maps_rows_both_ways():
    index = NodeIndex([30, 10, 20, 10])
    assert index.node_ids == (10, 20, 30)
    assert index.rows([30, 10]).tolist() == [2, 0]
    assert index.nodes([2, 0]) == [30, 10]
    with pytest.raises(ValueError, match="node 99"):
        index.rows([99])


def test_reported_properties_reproduce_the_sites_profile():
    sites, grid = sites_and_grid()
    index = NodeIndex(grid.get_node_ids())
    got = profile_from_properties(index, grid.node_config, UPDATE)
    want = profile_at(sites, StaticPower(sites.base_power), ModelledLinks(sites), 0.0, UPDATE)
    rows = [grid.node_config[n]["partition-id"] for n in index.node_ids]
    np.testing.assert_allclose(got.power, want.power[rows])
    np.testing.assert_allclose(got.comm_s, want.comm_s[rows], rtol=1e-12)
    np.testing.assert_allclose(got.distance_mi, want.distance_mi[rows])


def test_distance_defaults_to_the_rtt_at_fibre_speed():
    sites, grid = sites_and_grid()
    props = {n: dict(p) for n, p in grid.node_config.items()}
    for p in props.values():
        del p["distance-mi"]
    got = profile_from_properties(NodeIndex(props), props, UPDATE)
    np.testing.assert_allclose(np.sort(got.distance_mi), np.sort(sites.distance_mi), rtol=1e-9)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        (BANDWIDTH_MBPS, None, "missing"),
        ("power-fraction", 1.5, "outside"),
        ("rtt-ms", "x", "number"),
    ],
)
def test_a_bad_property_names_the_node_and_the_key(key, value, problem):
    _, grid = sites_and_grid()
    props = {n: dict(p) for n, p in grid.node_config.items()}
    if value is None:
        del props[77][key]
    else:
        props[77][key] = value
    with pytest.raises(MissingNodeProperty, match=f"node 77 .*'{key}'.*{problem}") as err:
        profile_from_properties(NodeIndex(props), props, UPDATE)
    assert (err.value.node_id, err.value.key) == (77, key)


def test_the_strategy_reports_a_missing_property_before_training():
    _, grid = sites_and_grid()
    del grid.node_config[31]["rtt-ms"]
    with pytest.raises(MissingNodeProperty, match="node 31 .*'rtt-ms'"):
        strategy().configure_train(1, model(), ConfigRecord(), grid)
    assert grid.count(MessageType.TRAIN) == 0


def test_a_node_without_the_query_handler_is_named():
    _, grid = sites_and_grid()
    grid.node_config[5]["broken"] = True
    with pytest.raises(RuntimeError, match="register_property_query.*node 5: no query handler"):
        strategy().configure_train(1, model(), ConfigRecord(), grid)


def test_traced_sites_map_nodes_by_partition_id():
    sites, grid = sites_and_grid()
    source = TracedSites(sites)
    index = NodeIndex(grid.get_node_ids())
    got = source.profile(grid, index, 0.0, UPDATE)
    assert source.node_sites == {n: grid.node_config[n]["partition-id"] for n in NODE_IDS}
    reported = profile_from_properties(index, grid.node_config, UPDATE)
    np.testing.assert_allclose(got.comm_s, reported.comm_s)
    source.profile(grid, index, 10.0, UPDATE)
    assert grid.count(MessageType.QUERY) == len(NODE_IDS)  # asked once per node


def test_traced_sites_name_a_node_without_a_site():
    sites, grid = sites_and_grid()
    del grid.node_config[808]["partition-id"]
    with pytest.raises(MissingNodeProperty, match="node 808 .*'partition-id'.*node_sites"):
        TracedSites(sites).profile(grid, NodeIndex(grid.get_node_ids()), 0.0, UPDATE)


# -- selection, aggregation and the clock ------------------------------------------------------
def test_powertrip_trains_exactly_the_policys_nodes_on_the_policys_clock():
    _, grid = sites_and_grid()
    s = strategy()
    messages = list(s.configure_train(1, model(), ConfigRecord(), grid))
    # the same policy, fed the same profile, picks the same rows
    index = NodeIndex(grid.get_node_ids())
    profile = profile_from_properties(index, grid.node_config, UPDATE)
    twin = build_policy("powertrip-paper")
    ctx = RoundContext(1, 0.0, profile, TAU, UPDATE, np.random.default_rng(0))
    chosen = index.nodes(twin.select(ctx))
    assert [m.metadata.dst_node_id for m in messages] == chosen
    assert all(m.metadata.message_type == MessageType.TRAIN for m in messages)
    assert all(m.content["config"]["server-round"] == 1 for m in messages)

    arrays, _ = s.aggregate_train(1, grid.send_and_receive(messages))
    weights = np.array([10.0 * (1 + NODE_IDS.index(n)) for n in chosen])
    steps = np.array([0.01 * (1 + NODE_IDS.index(n)) for n in chosen])
    want = model()["w"].numpy() + float(weights @ steps / weights.sum())
    np.testing.assert_allclose(arrays["w"].numpy(), want, rtol=1e-6)  # Flower's FedAvg
    assert s.clock.now() == pytest.approx(expected_duration(grid, chosen), rel=1e-12)

    s.record_accuracy(1, 0.4, 1.2)
    (record,) = s.result.rounds
    assert record.selected == tuple(chosen) and record.accuracy == 0.4
    assert record.time_s == record.duration_s == pytest.approx(expected_duration(grid, chosen))


def test_flower_fedavg_sampling_is_kept_and_timed():
    _, grid = sites_and_grid()
    s = TimedFedAvg(
        profiles=ReportedProperties(), ideal_compute_s=TAU, update_bytes=UPDATE, fraction_train=0.5
    )
    random.seed(4)
    messages = list(s.configure_train(1, model(), ConfigRecord(), grid))
    random.seed(4)
    flower_pick = random.sample(list(grid.get_node_ids()), 4)  # what Flower's sample_nodes does
    nodes = [m.metadata.dst_node_id for m in messages]
    assert nodes == flower_pick
    s.aggregate_train(1, grid.send_and_receive(messages))
    assert s.clock.now() == pytest.approx(expected_duration(grid, nodes), rel=1e-12)


@pytest.mark.parametrize("kind", ["powertrip", "fedavg"])
def test_the_strategies_send_their_local_optimizer_recipe_every_round(kind):
    _, grid = sites_and_grid()
    recipe = LocalOptimizer(name="nesterov", lr=0.05, schedule="cosine", total_steps=90)
    if kind == "powertrip":
        s = strategy(local_optimizer=recipe)
    else:
        s = TimedFedAvg(profiles=ReportedProperties(), ideal_compute_s=TAU, local_optimizer=recipe)
    config = ConfigRecord({"epochs": 2})
    for server_round in (1, 2):  # Flower hands the same train config to every round
        messages = list(s.configure_train(server_round, model(), config, grid))
        assert messages
        for m in messages:
            sent = m.content["config"]
            assert recipe_from_config(sent) == recipe
            assert sent["epochs"] == 2 and sent["server-round"] == server_round
        s.aggregate_train(server_round, grid.send_and_receive(messages))
        s.record_accuracy(server_round, 0.1 * server_round)


def test_no_recipe_sends_no_recipe_and_a_second_recipe_is_refused():
    _, grid = sites_and_grid()
    (m, *_) = strategy().configure_train(1, model(), ConfigRecord(), grid)
    assert recipe_from_config(m.content["config"]) is None
    s = strategy(local_optimizer=LocalOptimizer(name="adamw"))
    other = ConfigRecord({"local-optimizer.name": "sgd"})
    with pytest.raises(ValueError, match="local-optimizer"):
        s.configure_train(1, model(), other, grid)


class Recording(StaticTopK):
    """A real (static top-k) policy that keeps its feedback and asks for the projections."""

    wants_direction = True

    def __init__(self, k: int) -> None:
        super().__init__(k, name="recording")
        self.feedback: list[RoundFeedback] = []

    def observe(self, feedback: RoundFeedback) -> None:
        self.feedback.append(feedback)


def test_start_runs_flowers_loop_scores_rounds_and_stops_at_the_target():
    _, grid = sites_and_grid()
    policy = Recording(3)
    s = strategy(policy, stop_at_accuracy=0.3)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": 0.1 * server_round, "loss": 2.0 - 0.1 * server_round})

    s.start(grid, model(), num_rounds=6, evaluate_fn=evaluate)
    assert [r.round for r in s.result.rounds] == [1, 2, 3]  # stopped at 0.3
    assert grid.count(MessageType.TRAIN) == 9
    clock = 0.0
    for r in s.result.rounds:
        clock += expected_duration(grid, list(r.selected))
        assert r.time_s == pytest.approx(clock, rel=1e-12)
    assert s.time_to(0.3) == pytest.approx(clock)
    assert [f.round for f in policy.feedback] == [1, 2, 3]
    assert [f.accuracy for f in policy.feedback] == pytest.approx([0.1, 0.2, 0.3])
    assert policy.feedback[0].previous_accuracy == 0.0  # round 0's evaluation
    assert all(f.mean_sq_norm is not None and f.effective_sites > 1 for f in policy.feedback)
    assert policy.feedback[0].mean_proj is None and policy.feedback[1].mean_proj is not None


@pytest.mark.parametrize("name", [DEFAULT_POLICY, "powertrip"])
def test_the_noise_scale_policies_learn_from_flowers_rounds(name):
    """The noise-scale gains need the updates' dispersion (and ``powertrip`` their projections
    on the last global delta): both come from the replies Flower aggregates."""
    _, grid = sites_and_grid()
    s = strategy(name)
    assert s.policy.name == name

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": 1 - 0.9**server_round})

    s.start(grid, model(), num_rounds=5, evaluate_fn=evaluate)
    assert len(s.result.rounds) == 5 and len(s.k_history) == 5
    assert s.k_history[0] == min(10, len(NODE_IDS))  # Algorithm 1 starts at k0
    assert s.policy.gain.isotropic.value is not None  # the dispersion reached the policy
    if name == "powertrip":
        assert s.policy.gain.along_direction.value is not None  # projections from round 2 on
    assert [r.sites for r in s.result.rounds] == s.k_history


def test_federated_evaluation_scores_rounds_without_an_evaluate_fn():
    _, grid = sites_and_grid()
    s = strategy(StaticTopK(2))
    s.fraction_evaluate = 0.0
    with pytest.raises(ValueError, match="needs an accuracy every round"):
        s.start(grid, model(), num_rounds=1)
    messages = list(s.configure_train(1, model(), ConfigRecord(), grid))
    s.aggregate_train(1, grid.send_and_receive(messages))
    metrics = MetricRecord({"accuracy": 0.7, "num-examples": 5})
    reply = Message(RecordDict({"m": metrics}), reply_to=grid.sent[-1])
    s.aggregate_evaluate(1, [reply])
    assert s.result.rounds[0].accuracy == pytest.approx(0.7)


@pytest.mark.parametrize("name", ["centralized-25", "powertrip-split"])
def test_policies_the_adapter_cannot_run_are_refused(name):
    with pytest.raises(ValueError, match=name):
        strategy(name)


def test_missing_flower_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr", None)  # as if not installed: find_spec -> None
    monkeypatch.delitem(sys.modules, "powertrip.integrations.flower")
    with pytest.raises(ImportError, match=r"pip install 'powertrip\[flower\]'"):
        importlib.import_module("powertrip.integrations.flower")


# -- aggregation: the library's rule, robust by default ----------------------------------------
HOSTILE = 77  # one of the eight nodes, weight 50 of 360: well inside any weight check


class HostileGrid(SmallGrid):
    """``HOSTILE`` answers with every float set to ``poison`` (a finite value), or its honest
    step times ``scale``."""

    poison: float | None = 1e30
    scale = 1.0

    def tamper(self, node: int, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if node != HOSTILE:
            return arrays
        if self.poison is not None:
            return {k: np.full_like(a, self.poison) for k, a in arrays.items()}
        w = model()
        return {k: (w[k].numpy() + (a - w[k].numpy()) * self.scale) for k, a in arrays.items()}


def every_node(kind: str, **kw) -> TimedFedAvg:
    """A strategy that trains all eight nodes (the hostile one among them)."""
    if kind == "powertrip":
        return strategy(StaticTopK(len(NODE_IDS)), **kw)
    s = TimedFedAvg(profiles=ReportedProperties(), ideal_compute_s=TAU, fraction_train=1.0, **kw)
    s.fraction_evaluate = 0.0
    return s


def one_round(s: TimedFedAvg, grid: SmallGrid, arrays: ArrayRecord | None = None, rnd: int = 1):
    messages = list(s.configure_train(rnd, arrays or model(), ConfigRecord(), grid))
    assert len(messages) == len(NODE_IDS)
    replies = grid.send_and_receive(messages)
    return replies, s.aggregate_train(rnd, replies)


def flower_fedavg(replies) -> tuple[ArrayRecord, MetricRecord]:
    from flwr.serverapp.strategy import FedAvg

    return FedAvg().aggregate_train(1, replies)


def move_norm(new: ArrayRecord, old: ArrayRecord) -> float:
    return float(np.sqrt(sum(np.sum((new[k].numpy() - old[k].numpy()) ** 2.0) for k in old)))


@pytest.mark.parametrize("kind", ["powertrip", "fedavg-sampling"])
def test_one_node_answering_1e30_cannot_move_the_default_strategys_model(kind):
    """The default (robust) rule drops the 1e30 update (above 21 |w| in a first round) and
    moves the model by the honest nodes' mean; Flower's FedAvg, and ``aggregation="fedavg"``
    with it, takes the 1e30 into the model (the control)."""
    _, grid = sites_and_grid(grid=HostileGrid)
    s = every_node(kind)
    assert s.aggregation.rule == "robust"
    replies, (arrays, metrics) = one_round(s, grid)
    clip = s.fold.clip_norm  # type: ignore[union-attr]  # CLIP.estimate x |w| in round 1
    assert clip == pytest.approx(
        CLIP.estimate * float(np.sqrt(sum(np.sum(a**2) for a in model().to_numpy_ndarrays())))
    )
    assert all(np.isfinite(a).all() for a in arrays.to_numpy_ndarrays())
    assert move_norm(arrays, model()) <= clip
    done = s.last_aggregation
    assert (done.accepted, done.dropped, done.skipped) == (7, 1, 0)
    honest = [r for r in replies if r.metadata.src_node_id != HOSTILE]
    want, want_metrics = flower_fedavg(honest)  # what the seven honest nodes alone give
    for k in want:
        np.testing.assert_allclose(arrays[k].numpy(), want[k].numpy(), rtol=1e-6, atol=1e-6)
    assert dict(metrics) == pytest.approx(dict(want_metrics))  # the dropped loss is left out

    control = every_node(kind, aggregation="fedavg")
    _, (poisoned, _) = one_round(control, grid)
    flower, _ = flower_fedavg(replies)
    assert np.abs(flower["w"].numpy()).max() > 1e28  # Flower's FedAvg: poisoned
    assert np.abs(poisoned["w"].numpy()).max() > 1e28
    np.testing.assert_allclose(poisoned["w"].numpy(), flower["w"].numpy(), rtol=1e-5)


def test_a_large_update_below_the_zeroing_norm_is_clipped_to_the_clip_norm():
    """A hostile step 100x an honest one (|d| ~ 1.9 |w|) is clipped: it keeps its weight
    and pulls the model, but the model moves at most the clip norm."""
    _, grid = sites_and_grid(grid=HostileGrid)
    grid.poison, grid.scale = None, 100.0
    s = every_node("powertrip")
    replies, (arrays, _) = one_round(s, grid)
    done = s.last_aggregation
    assert (done.accepted, done.clipped, done.dropped) == (8, 1, 0)
    assert move_norm(arrays, model()) <= s.fold.clip_norm  # type: ignore[union-attr]
    flower, _ = flower_fedavg(replies)
    assert move_norm(arrays, model()) < move_norm(flower, model())  # FedAvg: unclipped


@pytest.mark.parametrize("rule", ["fedavg", "trimmed-mean", "median"])
def test_every_rule_is_selectable_and_the_order_statistics_absorb_one_hostile_node(rule):
    _, grid = sites_and_grid(grid=HostileGrid)
    s = every_node("powertrip", aggregation=rule)
    _, (arrays, _) = one_round(s, grid)
    finite = all(np.isfinite(a).all() and np.abs(a).max() < 1e3 for a in arrays.to_numpy_ndarrays())
    assert finite == (rule != "fedavg")


def test_an_unknown_rule_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="aggregation must be one of robust, fedavg"):
        every_node("powertrip", aggregation="krum")


@pytest.mark.parametrize("rule", ["robust", "fedavg"])
def test_honest_rounds_give_flowers_fedavg_up_to_float32_rounding(rule):
    """Nothing is clipped or dropped: robust is FedAvg, and both are Flower's FedAvg (sent +
    weighted mean delta against Flower's weighted mean of the replies), the same record
    keys, dtypes and MetricRecord."""
    _, grid = sites_and_grid()
    s = every_node("powertrip", aggregation=rule)
    replies, (arrays, metrics) = one_round(s, grid)
    assert (s.last_aggregation.clipped, s.last_aggregation.dropped) == (0, 0)
    flower, flower_metrics = flower_fedavg(replies)
    assert list(arrays.keys()) == list(flower.keys())
    for k in flower:
        got, want = arrays[k].numpy(), flower[k].numpy()
        assert got.dtype == want.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=2e-7)
    assert dict(metrics) == pytest.approx(dict(flower_metrics))


def test_the_robust_bound_is_carried_from_round_to_round():
    """Each round is judged by what the earlier ones left: honest norms below the clip shrink
    it by exp(-lr * (1 - gamma)) per round (quantile matching,
    ``powertrip.aggregation.robust_fedavg``)."""
    from powertrip.aggregation.robust_fedavg import AdaptiveBound

    _, grid = sites_and_grid()
    s = every_node("powertrip")
    assert s.aggregation_bound == AdaptiveBound()
    arrays = model()
    for rnd in (1, 2, 3):
        fold_bound = None
        _, (arrays, _) = one_round(s, grid, arrays, rnd)
        fold_bound = s.fold.bound  # type: ignore[union-attr]
        shrink = np.exp(-CLIP.lr * (1 - CLIP.gamma))
        assert fold_bound.clip_norm == pytest.approx(CLIP.estimate * shrink ** (rnd - 1))
        assert s.aggregation_bound == s.fold.bound_after()  # type: ignore[union-attr]
        s.record_accuracy(rnd, 0.1 * rnd)


def test_a_malformed_reply_is_skipped_and_counted_not_the_round():
    """Flower's FedAvg raises InconsistentMessageReplies over one reply with a wrong shape or
    no weight (the whole round is lost); here that reply is skipped and named."""
    _, grid = sites_and_grid()
    s = every_node("powertrip")
    messages = list(s.configure_train(1, model(), ConfigRecord(), grid))
    replies = grid.send_and_receive(messages)
    bad = {
        5: ArrayRecord(
            {"w": Array(np.zeros((3, 2), np.float32)), "b": Array(np.zeros(2, np.float32))}
        )
    }
    for i, r in enumerate(replies):
        node = r.metadata.src_node_id
        if node in bad:
            content = RecordDict({"arrays": bad[node], "metrics": r.content["metrics"]})
            replies[i] = Message(content, reply_to=messages[i])
        if node == 31:
            content = RecordDict({"arrays": r.content["arrays"], "metrics": MetricRecord({"x": 1})})
            replies[i] = Message(content, reply_to=messages[i])
    arrays, _ = s.aggregate_train(1, replies)
    done = s.last_aggregation
    assert (done.accepted, done.skipped) == (6, 2)
    assert "'w'" in done.problems[5] and "(2, 3)" in done.problems[5]
    assert "'num-examples'" in done.problems[31]
    assert s._pending.contributions == 6  # type: ignore[union-attr]
    honest = [r for r in replies if r.metadata.src_node_id not in (5, 31)]
    want, _ = flower_fedavg(honest)
    np.testing.assert_allclose(arrays["w"].numpy(), want["w"].numpy(), rtol=1e-6)


@pytest.mark.parametrize("rule", ["robust", "fedavg"])
def test_integer_buffers_are_aggregated_in_their_dtype(rule):
    """A counter (BatchNorm's num_batches_tracked) stays an integer tensor, so the next round's
    replies still match the model."""
    _, grid = sites_and_grid()
    s = every_node("powertrip", aggregation=rule)
    start = ArrayRecord(
        {**{k: model()[k] for k in model()}, "seen": Array(np.array([4], np.int64))}
    )
    _, (arrays, _) = one_round(s, grid, start)
    assert arrays["seen"].numpy().dtype == np.int64 and arrays["seen"].numpy().tolist() == [5]
    _, (again, _) = one_round(s, grid, arrays, 2)
    assert s.last_aggregation.accepted == len(NODE_IDS) and again["seen"].numpy().tolist() == [6]
