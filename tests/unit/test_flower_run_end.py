"""How a Flower run of the adapter ends and what it says on the way: it stops at the round that
reaches the target (no empty rounds after it), logs each round's nodes and emulated time, and
waits for the nodes' property replies long enough for a busy machine. Same in-process grid as
tests/unit/test_flower_strategy.py."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from tests.needs import extra_reason

pytest.importorskip("flwr", reason=extra_reason("flower", "flwr"))

from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord  # noqa: E402

from powertrip.integrations.flower import (  # noqa: E402
    PROPERTY_QUERY_TIMEOUT_S,
    ReportedProperties,
    TimedFedAvg,
    TracedSites,
)
from powertrip.selection.base import StaticTopK  # noqa: E402
from tests.unit.test_flower_strategy import (  # noqa: E402, F401 - the fixture applies here too
    NODE_IDS,
    TAU,
    UPDATE,
    SmallGrid,
    _server_identity,
    expected_duration,
    model,
    sites_and_grid,
    strategy,
)

ROUND_LINE = re.compile(
    r"(?P<name>\S+) round (?P<round>\d+): nodes \[(?P<nodes>[\d, ]+)\] "
    r"\((?P<replied>\d+) replied\); emulated round (?P<duration>[\d.]+) s, "
    r"clock (?P<clock>[\d.]+) s \((?P<hours>[\d.]+) h\)"
)


class CountingGrid(SmallGrid):
    """The small grid, counting what it is sent per message type and the timeouts it is given."""

    def __init__(self, node_config: dict[int, dict]) -> None:
        super().__init__(node_config)
        self.timeouts: list[float | None] = []

    def send_and_receive(self, messages, *, timeout=None):
        self.timeouts.append(timeout)
        return super().send_and_receive(messages, timeout=timeout)


def grid() -> CountingGrid:
    _, small = sites_and_grid()
    return CountingGrid(small.node_config)


def rising(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """A centralized evaluation whose accuracy is 0.1 per round trained."""
    return MetricRecord({"accuracy": 0.1 * server_round})


@pytest.mark.parametrize("kind", ["powertrip", "fedavg"])
def test_the_run_ends_at_the_round_that_reaches_the_target(kind):
    g = grid()
    if kind == "powertrip":
        s = strategy(StaticTopK(3), stop_at_accuracy=0.4)
    else:
        s = TimedFedAvg(
            profiles=ReportedProperties(),
            ideal_compute_s=TAU,
            update_bytes=UPDATE,
            fraction_train=0.5,
            fraction_evaluate=0.0,
            stop_at_accuracy=0.4,
        )
    configured: list[int] = []
    configure = s.configure_train

    def spy(server_round, *args):
        configured.append(server_round)
        return configure(server_round, *args)

    s.configure_train = spy
    out = s.start(g, model(), num_rounds=20, evaluate_fn=rising)

    assert configured == [1, 2, 3, 4]  # Flower's loop asked for no round after the target
    assert [r.round for r in s.result.rounds] == [1, 2, 3, 4]
    assert s.result.rounds_to(0.4) == 4 and s.stopped
    assert sorted(out.evaluate_metrics_serverapp) == [0, 1, 2, 3, 4]  # Flower's Result
    per_round = len(s.result.rounds[0].selected)
    assert g.count(MessageType.TRAIN) == 4 * per_round


def test_a_run_that_never_reaches_the_target_runs_every_round():
    g = grid()
    s = strategy(StaticTopK(2), stop_at_accuracy=0.99)
    s.start(g, model(), num_rounds=5, evaluate_fn=rising)
    assert [r.round for r in s.result.rounds] == [1, 2, 3, 4, 5] and not s.stopped
    assert g.count(MessageType.TRAIN) == 10


def test_each_round_logs_its_nodes_and_emulated_time(caplog):
    g = grid()
    s = strategy(StaticTopK(3), stop_at_accuracy=0.3)
    with caplog.at_level(logging.INFO):
        s.start(g, model(), num_rounds=8, evaluate_fn=rising)

    logged = [r for r in caplog.records if ROUND_LINE.search(r.getMessage())]
    assert all(r.levelno == logging.INFO for r in logged)
    lines = [ROUND_LINE.search(r.getMessage()) for r in logged]
    assert len(lines) == len(s.result.rounds) == 3
    clock = 0.0
    for line, record in zip(lines, s.result.rounds, strict=True):
        nodes = [int(n) for n in line["nodes"].split(", ")]
        assert line["name"] == "static-3"
        assert int(line["round"]) == record.round
        assert nodes == list(record.selected) and set(nodes) <= set(NODE_IDS)
        assert int(line["replied"]) == 3
        duration = expected_duration(g, nodes)
        clock += duration
        assert float(line["duration"]) == pytest.approx(duration, abs=0.05)
        assert float(line["clock"]) == pytest.approx(clock, abs=0.05)
        assert float(line["hours"]) == pytest.approx(clock / 3600, abs=5e-4)
    stop = [r.getMessage() for r in caplog.records if "stopping" in r.getMessage()]
    assert stop == [
        f"static-3 round 3 reached accuracy 0.3000 >= target 0.3000 at emulated "
        f"{clock:.1f} s: stopping"
    ]
    assert any("Stopping after round 3 of 8" in r.getMessage() for r in caplog.records)


def test_the_property_query_waits_300_s_unless_told_otherwise():
    assert PROPERTY_QUERY_TIMEOUT_S == 300.0
    sites, _ = sites_and_grid()
    for source, timeout in [
        (ReportedProperties(), 300.0),
        (ReportedProperties(timeout=900.0), 900.0),
        (TracedSites(sites), 300.0),
        (TracedSites(sites, timeout=None), None),
    ]:
        g = grid()
        s = strategy(StaticTopK(2), profiles=source)
        assert list(s.configure_train(1, model(), ConfigRecord(), g))
        assert g.count(MessageType.QUERY) == len(NODE_IDS)
        assert g.timeouts[0] == timeout, source  # the query is the first thing the grid is sent


def test_the_timeout_does_not_change_what_the_nodes_report():
    g = grid()
    a = strategy(StaticTopK(4), profiles=ReportedProperties(timeout=5.0))
    b = strategy(StaticTopK(4), profiles=ReportedProperties())
    ma = [m.metadata.dst_node_id for m in a.configure_train(1, model(), ConfigRecord(), g)]
    mb = [m.metadata.dst_node_id for m in b.configure_train(1, model(), ConfigRecord(), g)]
    assert ma == mb
    np.testing.assert_array_equal(a.round_profile(1, g)[1].power, b.round_profile(1, g)[1].power)
