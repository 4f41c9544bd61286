"""Which aggregation rule a run uses, and the settings each rule accepts, checked together
(``powertrip.aggregation.robust`` builds the rule)."""

from __future__ import annotations

import math

RULES: tuple[str, ...] = ("robust", "fedavg", "trimmed-mean", "median")


def check_settings(rule: str, clip_norm: float | None, trim_beta: float | None) -> None:
    """ValueError naming the setting when the combination is unusable. Settings a rule would
    silently ignore are refused too, so a run never looks defended when it is not."""
    if rule not in RULES:
        raise ValueError(f"aggregation must be one of {', '.join(RULES)}, got {rule!r}")
    if clip_norm is not None and not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    if trim_beta is not None:
        check_trim_beta(trim_beta)
        if rule != "trimmed-mean":
            raise ValueError(
                "trim_beta (--trim-beta, POWERTRIP_TRIM_BETA) applies to aggregation "
                f"trimmed-mean only, not {rule!r}"
            )
    if clip_norm is not None and rule in ("fedavg", "robust"):
        raise ValueError(
            "clip_norm (--clip-norm, POWERTRIP_CLIP_NORM) is a fixed clip for trimmed-mean or "
            f"median; {rule!r} "
            + ("clips adaptively already" if rule == "robust" else "never clips (plain mean)")
        )


def check_trim_beta(beta: float | None) -> float | None:
    """beta in [0, 0.5) makes 2*floor(beta*n) < n for every n, so some values always remain."""
    if beta is not None and not 0 <= beta < 0.5:
        raise ValueError(f"must be in [0, 0.5) so that 2*floor(beta*n) < n, got {beta}")
    return beta
