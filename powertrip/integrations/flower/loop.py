"""Flower's round loop with a stop condition: the run ends at the round that reaches the target.

Flower 1.41's ``Strategy.start`` (``flwr.serverapp.strategy.Strategy``) runs a fixed number of
rounds and has no way to end early; Flower's guide to custom strategies overrides ``start``
for anything beyond that. ``run_rounds`` is that loop, step for step (configure -> send ->
aggregate, federated then centralized evaluation, the same ``Result`` and log lines), checking
``should_stop`` after each round's evaluation: no round after the target sends a message, and
Flower's log says how many rounds ran.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def run_rounds(
    strategy: Strategy,
    grid: Grid,
    initial_arrays: ArrayRecord,
    num_rounds: int,
    timeout: float,
    train_config: ConfigRecord | None,
    evaluate_config: ConfigRecord | None,
    evaluate_fn: EvaluateFn | None,
    should_stop: Callable[[], bool],
) -> Result:
    """Up to ``num_rounds`` rounds of ``strategy`` (Flower's ``Strategy.start``), ending after
    the first round at whose end ``should_stop()`` is true."""
    log(INFO, "Starting %s strategy:", type(strategy).__name__)
    log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
    strategy.summary()
    log(INFO, "")
    train_config = ConfigRecord() if train_config is None else train_config
    evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
    result = Result()
    started = time.time()
    if evaluate_fn is not None:
        res = evaluate_fn(0, initial_arrays)
        log(INFO, "Initial global evaluation results: %s", res)
        if res is not None:
            result.evaluate_metrics_serverapp[0] = res

    arrays = initial_arrays
    for current in range(1, num_rounds + 1):
        log(INFO, "")
        log(INFO, "[ROUND %s/%s]", current, num_rounds)
        messages = strategy.configure_train(current, arrays, train_config, grid)
        replies = grid.send_and_receive(messages=messages, timeout=timeout)
        new_arrays, train_metrics = strategy.aggregate_train(current, replies)
        if new_arrays is not None:
            result.arrays = arrays = new_arrays
        if train_metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", train_metrics)
            result.train_metrics_clientapp[current] = train_metrics

        messages = strategy.configure_evaluate(current, arrays, evaluate_config, grid)
        replies = grid.send_and_receive(messages=messages, timeout=timeout)
        evaluate_metrics = strategy.aggregate_evaluate(current, replies)
        if evaluate_metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", evaluate_metrics)
            result.evaluate_metrics_clientapp[current] = evaluate_metrics

        if evaluate_fn is not None:
            log(INFO, "Global evaluation")
            res = evaluate_fn(current, arrays)
            log(INFO, "\t└──> MetricRecord: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[current] = res
        if should_stop():
            log(INFO, "")
            log(INFO, "Stopping after round %d of %d: stop condition met", current, num_rounds)
            break

    log(INFO, "")
    log(INFO, "Strategy execution finished in %.2fs", time.time() - started)
    log(INFO, "")
    log(INFO, "Final results:")
    log(INFO, "")
    for line in io.StringIO(str(result)):
        log(INFO, "\t%s", line.strip("\n"))
    log(INFO, "")
    return result
