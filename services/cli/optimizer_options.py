"""The sites' local optimizer on the command line (``powertrip experiment`` and ``powertrip
curtail``): flags folded into one validated ``local_optimizer`` before the run's configuration
is built. No flag given: no recipe, the workload's plain SGD (results as before).

``--local-clip-norm`` clips each site's gradient; ``--clip-norm`` was already the robust
aggregation's per-update clip (an ``ExperimentConfig`` field, ``model_options``).
"""

from __future__ import annotations

import functools

import click
from pydantic import ValidationError

from powertrip.config.optimizers import optimizer_names
from powertrip.config.recipe import LocalOptimizer
from powertrip.services.cli.common import describe_validation, fail

__all__ = ["optimizer_options"]

#: flag -> LocalOptimizer field
FIELD_FOR_FLAG = {
    "optimizer": "name",
    "lr_schedule": "schedule",
    "warmup_steps": "warmup_steps",
    "total_steps": "total_steps",
    "min_lr_ratio": "min_lr_ratio",
    "weight_decay": "weight_decay",
    "local_clip_norm": "clip_norm",
    "reset_optimizer_state": "keep_state",
}
FLAG_FOR_FIELD = {f: "--" + k.replace("_", "-") for k, f in FIELD_FOR_FLAG.items()}
FLAG_FOR_FIELD["keep_state"] = "--reset-optimizer-state"

_OPTIONS = [
    click.option(
        "--optimizer",
        type=click.Choice(optimizer_names()),
        help="Each site's local optimizer (default: plain SGD at --lr).",
    ),
    click.option(
        "--lr-schedule",
        type=click.Choice(["constant", "cosine", "wsd"]),
        help="Local lr schedule over each site's cumulative steps (cosine/wsd: --total-steps).",
    ),
    click.option("--warmup-steps", type=int, help="Linear lr warm-up, in a site's local steps."),
    click.option("--total-steps", type=int, help="Schedule length, in a site's local steps."),
    click.option("--min-lr-ratio", type=float, help="cosine/wsd: the final lr as a share of lr."),
    click.option(
        "--weight-decay",
        type=float,
        help="AdamW: decoupled; others: L2. Never on 1-D tensors (biases, norms) or *emb* names.",
    ),
    click.option("--local-clip-norm", type=float, help="Clip each site's gradient L2 norm."),
    click.option(
        "--reset-optimizer-state",
        is_flag=True,
        default=None,
        help="Fresh moments every round (default: kept); the schedule runs on all steps.",
    ),
]


def local_optimizer(options: dict[str, object]) -> LocalOptimizer | None:
    """Pop the optimizer flags from ``options``: one validated recipe, or None when none was
    given. A bad value ends the command with a one-line error naming the flag."""
    given = {k: options.pop(k) for k in FIELD_FOR_FLAG if k in options}
    fields = {FIELD_FOR_FLAG[k]: v for k, v in given.items() if v is not None}
    if not fields:
        return None
    if "keep_state" in fields:
        fields["keep_state"] = not fields["keep_state"]
    try:
        return LocalOptimizer.model_validate(fields)
    except ValidationError as exc:
        fail(describe_validation(exc, "local optimizer", FLAG_FOR_FIELD))


def optimizer_options(command):  # noqa: ANN001, ANN201 - a click decorator
    """The local optimizer flags; the command receives ``local_optimizer`` (set only when a
    flag was given, so an unset recipe stays out of the configuration)."""

    @functools.wraps(command)
    def wrapped(**options: object) -> object:
        recipe = local_optimizer(options)
        if recipe is not None:
            options["local_optimizer"] = recipe
        return command(**options)

    for option in reversed(_OPTIONS):
        wrapped = option(wrapped)
    return wrapped
