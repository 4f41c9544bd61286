"""R6 with the Nesterov outer step: its momentum is run state, so an aggregator SIGKILLed in the
middle of a fold and restarted must resume it from the checkpoint, or the rounds after the
restart step from a different momentum and the final model differs from an uninterrupted run's.

The sites train inner AdamW with kept state, which lives on the workers: the round redone
after the restart must start from each site's state before that round, not the one the killed
aggregator's round left behind (``SiteStateBook``).

The machinery is ``test_crash_recovery``'s (one cluster, the golden run first, the crashed run
in its own checkpoint directory), with ``POWERTRIP_OUTER=nesterov``.
"""

from __future__ import annotations

import pytest

from powertrip.services.aggregator import checkpoint
from powertrip.v1 import aggregator_pb2
from tests.integration.test_crash_recovery import (
    CRASH_ROUND,
    crash_plan,
    files,
    golden_run,
    model_sha256,
    rounds,
    start_aggregator,
)

pytestmark = pytest.mark.slow
ADAMW = '{"name": "adamw", "lr": 0.001}'


@pytest.fixture(scope="module")
def nesterov_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("crash-outer")
    plan = crash_plan(out, POWERTRIP_OUTER="nesterov", POWERTRIP_LOCAL_OPTIMIZER=ADAMW)
    yield from golden_run(out, plan)


@pytest.mark.reliability("R6")
def test_a_nesterov_run_killed_in_a_fold_resumes_its_momentum_and_ends_bit_identical(
    nesterov_bench,
):
    b = nesterov_bench
    golden = checkpoint.load_latest(b.out / "golden")
    assert golden is not None and golden.momentum is not None  # the outer step ran
    ckpts = b.out / "crashed"

    first = start_aggregator(b, ckpts, f"aggregation@{CRASH_ROUND}")
    assert first.left_behind == files(1, 2)

    last = start_aggregator(b, ckpts, None)
    assert f"resuming after round {CRASH_ROUND - 1}" in last.log
    assert b.final is not None and b.final.state == aggregator_pb2.RUN_STATE_DONE, b.final
    assert rounds(b.final) == rounds(b.golden_status)
    assert model_sha256(ckpts) == b.golden_sha
