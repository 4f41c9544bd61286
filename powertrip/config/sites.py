"""The emulated world's choices: how site distances are drawn, what a round's duration is, and
where each site's power comes from."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class DistanceMode(StrEnum):
    # The default keeps the paper's "22 sites within 1000 mi"; plain uniform gives about 9.
    STRATIFIED = "stratified"  # 22% in [100, 1000) mi, 78% in [1000, 10000]
    UNIFORM = "uniform"  # plain U(100, 10000) sensitivity variant


class RoundTimeModel(StrEnum):
    """Ground truth for a synchronous round's duration: the paper's emulator (default) or Eq. 7."""

    PER_SITE_MAX = "per-site-max"  # max_i(T_ideal/P_i + C_i): the paper's emulator (§5.1)
    AGGREGATE = "aggregate"  # Eq. 7: W / sum_i P_i + max_i C_i, with W = N * T_ideal


#: The paper's uniform model (static U(0.1, 1) draws), the embedded synthetic trace, or Google
#: trace files
PowerModel = Literal["uniform", "synthetic-trace", "google-trace"]
