"""Turns a real worker process hostile, for the robustness tests (reliability R33, R36).

Put this folder on a worker's PYTHONPATH and set ``HOSTILE_ATTACK`` to a comma-separated list
of attacks; round r sends attack ``(r - 1) mod len``. The worker trains honestly, then its
uploader sends instead:

- ``raw:V``: every value of the update replaced by V (finite: 1e30, 1e6);
- ``int8-scales:V``: the run's int8 codec payload (coded by the host: ``ErrorFeedback.encode``)
  with every block scale set to V;
- ``loss:V``: the honest update with a claimed training loss V.

The process is otherwise the real worker: its certificate, its registration, its streams.
"""

from __future__ import annotations

import os

ATTACKS = [a for a in os.environ.get("HOSTILE_ATTACK", "").split(",") if a]

if ATTACKS:
    from dataclasses import replace

    import numpy as np

    from powertrip import codecs
    from powertrip.services.worker import uploader

    def _attack(round_index: int) -> tuple[str, float]:
        kind, value = ATTACKS[(round_index - 1) % len(ATTACKS)].split(":")
        return kind, float(value)

    honest_call = uploader.GrpcUploader.__call__
    honest_encode = codecs.ErrorFeedback.encode
    current = {"attack": ("", 0.0)}

    def hostile_call(self, round_index, update, timeout_s, shard=None):  # noqa: ANN001, ANN202
        kind, value = current["attack"] = _attack(round_index)
        if kind == "raw":
            update = replace(
                update, delta={k: np.full_like(a, value) for k, a in update.delta.items()}
            )
        elif kind == "loss":
            update = replace(update, loss=value)
        return honest_call(self, round_index, update, timeout_s, shard)

    def hostile_encode(self, site, delta, key=None):  # noqa: ANN001, ANN202
        parts = honest_encode(self, site, delta, key)
        kind, value = _attack(key[0]) if key is not None else current["attack"]
        if kind == "int8-scales":
            for name, a in parts.items():
                if name.endswith("scales"):
                    parts[name] = np.full_like(a, value)
        return parts

    uploader.GrpcUploader.__call__ = hostile_call  # type: ignore[method-assign]
    codecs.ErrorFeedback.encode = hostile_encode  # type: ignore[method-assign]
