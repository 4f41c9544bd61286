"""The policy registry is open: a policy registers itself by name (its module at import, a user
from their own code), one ``build_policy(name, context)`` builds it for either kind of run, and
the names are listed without loading torch."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from numpy.typing import NDArray

import powertrip as pt
from powertrip.config.curtailment import CurtailmentConfig
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.selection.base import RoundContext, SelectAll, SelectionPolicy
from powertrip.selection.carbon_greedy import CarbonRanking, WallClockGreedy
from powertrip.selection.greedy import PowerTripGreedy
from powertrip.selection.registry import (
    PolicyContext,
    PolicyMode,
    build_policy,
    known_policy_names,
    register_policy,
    unregister_policy,
    validate_policy_name,
)


class NearestK(SelectionPolicy):
    """A user's policy: the k sites nearest the aggregator, every round."""

    def __init__(self, k: int, name: str) -> None:
        self.k, self.name = k, name

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        return np.sort(np.argsort(ctx.profile.distance_mi, kind="stable")[: self.k])


@pytest.fixture
def nearest() -> Iterator[None]:
    register_policy(
        "nearest-<k>", lambda name, ctx: NearestK(int(name.removeprefix("nearest-")), name)
    )
    yield
    unregister_policy("nearest-<k>")


def test_a_users_policy_runs_by_name_in_a_study(nearest):
    small = {"num_sites": 6, "num_samples": 600, "max_rounds": 3, "ideal_compute_s": 10.0}
    policies = ("nearest-2", "select-all")
    cfg = pt.build_config(None, **small, target_accuracy=0.99, static_sweep=(), policies=policies)

    result = pt.run_study(cfg)

    runs = {run.policy: run for _, run in result.runs}
    assert set(runs) == {"nearest-2", "select-all"}
    nearest_two = tuple(sorted(np.argsort(result.sites.distance_mi, kind="stable")[:2]))
    assert [r.selected for r in runs["nearest-2"].rounds] == [nearest_two] * 3
    assert "nearest-<k>" in known_policy_names()


def test_a_pattern_answers_to_every_positive_whole_number_and_nothing_else(nearest):
    assert build_policy("nearest-12").k == 12
    for name in ("nearest-0", "nearest-", "nearest-x", "nearest-<k>"):
        with pytest.raises(ValueError, match=f"unknown policy {name!r}"):
            validate_policy_name(name)


def test_a_name_taken_in_a_mode_is_refused_unless_replaced(nearest):
    with pytest.raises(ValueError, match="'powertrip' is already registered for rounds runs"):
        register_policy("powertrip", lambda name, ctx: SelectAll())
    register_policy("nearest-<k>", lambda name, ctx: NearestK(1, "one"), replace=True)
    assert build_policy("nearest-5").name == "one"


def test_an_exact_name_wins_over_a_pattern_that_matches_it(nearest):
    register_policy("nearest-3", lambda name, ctx: SelectAll())
    try:
        assert isinstance(build_policy("nearest-3"), SelectAll)
        assert isinstance(build_policy("nearest-4"), NearestK)
    finally:
        unregister_policy("nearest-3")


@pytest.mark.parametrize(
    ("name", "modes", "message"),
    [
        ("two words", ("rounds",), "no spaces"),
        ("", ("rounds",), "no spaces"),
        ("mine", ("sometimes",), "modes must be among curtailment, rounds"),
        ("mine", (), "modes must be among"),
    ],
)
def test_a_bad_registration_is_refused_in_one_line(name, modes, message):
    with pytest.raises(ValueError, match=message):
        register_policy(name, lambda asked, ctx: SelectAll(), modes=modes)
    assert "mine" not in known_policy_names()


def test_a_factory_that_returns_no_policy_is_refused_naming_it():
    register_policy("not-a-policy", lambda name, ctx: "select-all")
    try:
        with pytest.raises(TypeError, match="'not-a-policy': its factory returned a str"):
            build_policy("not-a-policy")
    finally:
        unregister_policy("not-a-policy")


def test_one_name_means_each_modes_own_policy():
    rounds = WallClockRounds(step_s=64.08)
    cfg = CurtailmentConfig(carbon_weight=0.3)
    curtailment = PolicyContext.for_curtailment(cfg, rounds)

    assert known_policy_names(PolicyMode.CURTAILMENT) == ["curtailment", "powertrip", "combined"]
    assert type(build_policy("powertrip")) is PowerTripGreedy
    eq8 = build_policy("powertrip", curtailment)
    combined = build_policy("combined", curtailment)
    assert isinstance(eq8, WallClockGreedy) and eq8.rounds is rounds
    assert isinstance(combined, WallClockGreedy) and combined.name == "combined"
    assert combined.config.ranking == CarbonRanking(0.3)  # the run's carbon weight γ
    assert eq8.config.ranking == CarbonRanking(0.0)
    assert type(build_policy("curtailment", curtailment)) is SelectAll
    with pytest.raises(ValueError, match="unknown policy 'combined'; known policies: static"):
        build_policy("combined")  # a rounds run
    with pytest.raises(ValueError, match="unknown policy 'oort'; known policies: curtailment"):
        build_policy("oort", curtailment)


def test_a_curtailment_policy_without_the_runs_wall_clock_names_what_it_needs():
    bare = PolicyContext(mode=PolicyMode.CURTAILMENT)
    with pytest.raises(ValueError, match="'combined' needs a curtailment run's settings"):
        build_policy("combined", bare)


def test_listing_and_building_policies_loads_no_torch():
    code = (
        "import sys\n"
        "from powertrip.selection.registry import build_policy, known_policy_names\n"
        "names = known_policy_names()\n"
        "build_policy('powertrip-joint'), build_policy('fedzero')\n"
        "print(len(names), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(known_policy_names())), "False"]
