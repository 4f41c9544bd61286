"""What a checkpoint must be for this run to resume from it, checked before use.

A checkpoint whose checksums verify can still be another run's (another configuration or seed:
refused as ``checkpoint.OtherRun``, one line naming both digests), or carry a state that does
not fit (a buggy writer, or someone with write access re-signing it): each component's state is
loaded into a throwaway object built from this run's configuration inside the loader's
``validate``, so such a checkpoint is rejected (``malformed``: TypeError; ``incompatible``:
ValueError) with one line naming the field, and the previous good one loads, instead of the
resume crashing the aggregator at every restart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from powertrip.learning.params import NumpyParams
from powertrip.services.aggregator import checkpoint
from powertrip.state_dict import fields, number

#: the keys of a checkpoint's state (format 4)
STATE_KEYS = {"run", "clock_s", "accuracy", "policy", "components"}


def run_digest(config: Mapping[str, Any]) -> str:
    """The run's identity: the SHA-256 of its configuration (experiment, seed, policy, clock)
    as canonical JSON; a checkpoint written under another digest is another run's."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def fits_run(
    template: NumpyParams,
    run: str,
    restore: Callable[[Mapping[str, Any]], None],
    momentum: bool = False,
) -> Callable[[checkpoint.Checkpoint], None]:
    """A checkpoint's check: written by this run (``run``, its digest: ``OtherRun`` otherwise),
    the model arrays of this run (names, shapes, dtypes), the outer momentum if and only if the
    run keeps one (``momentum``: an outer step with momentum; its arrays shaped as the model's),
    and components that ``restore`` (loading them into throwaway objects) accepts; TypeError or
    ValueError naming what does not fit."""

    def check(ckpt: checkpoint.Checkpoint) -> None:
        state = fields(ckpt.state, "state", STATE_KEYS)
        if state["run"] != run:
            raise checkpoint.OtherRun(
                f"written by another run (configuration digest {str(state['run'])[:12]}, "
                f"this run's {run[:12]})"
            )
        for key in ("clock_s", "accuracy"):
            number(state[key], f"state.{key}")
        if not isinstance(state["policy"], str):
            raise TypeError("state.policy is not a string")
        _same_arrays("model arrays", ckpt.params, template)
        if momentum and ckpt.round > 0 and ckpt.momentum is None:
            raise ValueError("no outer momentum: written by a run without the outer step")
        if not momentum and ckpt.momentum is not None:
            raise ValueError("an outer momentum, but this run takes no outer step with momentum")
        if ckpt.momentum is not None:
            _same_arrays("outer momentum arrays", ckpt.momentum, template)
        if not isinstance(state["components"], dict):
            raise TypeError("state.components is not a mapping")
        restore(state["components"])

    return check


def _same_arrays(what: str, got: NumpyParams, template: NumpyParams) -> None:
    """ValueError unless ``got`` has ``template``'s names, shapes and dtypes."""
    if got.keys() != template.keys():
        raise ValueError(f"{what} {sorted(got)} are not this run's {sorted(template)}")
    for k, want in template.items():
        if (got[k].shape, got[k].dtype) != (want.shape, want.dtype):
            have = got[k]
            raise ValueError(
                f"array {k!r} is {have.dtype}{list(have.shape)}, not {want.dtype}{list(want.shape)}"
            )
