"""The outer step is torch's Nesterov SGD on the averaged pseudo-gradient, bit for bit, in
either mode; FedAvg stays the default and takes no outer step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.aggregation.fold_inputs import UpdateRejected
from powertrip.aggregation.outer_step import NesterovOuter, make_outer

SHAPES = {"conv.weight": (8, 1, 5), "conv.bias": (8,), "fc.weight": (10, 64), "scale": ()}


def random_model(rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {k: (scale * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}


def sgd_reference(start, averages, lr: float, momentum: float) -> list[dict[str, np.ndarray]]:
    """Each round's model from a plain torch.optim.SGD(nesterov=True), grad = w - w_avg(w)."""
    params = {k: torch.tensor(v) for k, v in start.items()}
    opt = torch.optim.SGD(list(params.values()), lr=lr, momentum=momentum, nesterov=True)
    models = []
    for local in averages:
        for k, p in params.items():
            p.grad = p.detach().clone() - torch.tensor(local(k, p.detach().clone().numpy()))
        opt.step()
        models.append({k: p.detach().clone().numpy() for k, p in params.items()})
    return models


def old_numpy_outer(previous, averaged, m, lr: float, mu: float):
    """The numpy formula the outer step had before it became torch's SGD."""
    m = (
        {k: mu * m[k] + (previous[k] - averaged[k]) for k in previous}
        if m
        else {k: previous[k] - averaged[k] for k in previous}
    )
    out = {k: previous[k] - lr * (mu * m[k] + (previous[k] - averaged[k])) for k in previous}
    return out, m


@pytest.mark.parametrize(("lr", "mu"), [(0.7, 0.9), (1.0, 0.5), (0.3, 0.99)])
def test_the_outer_step_equals_torch_nesterov_sgd_bit_for_bit_over_rounds(lr, mu):
    rng = np.random.default_rng(7)
    start = random_model(rng)
    noise = [random_model(rng, 0.01) for _ in range(6)]

    def averaged_after(r):  # the round's FedAvg result: the model plus a round's update
        return lambda k, w: w + noise[r][k]

    expected = sgd_reference(start, [averaged_after(r) for r in range(6)], lr, mu)
    outer, model = NesterovOuter(lr, mu), start
    for r in range(6):
        model = outer.step(model, {k: averaged_after(r)(k, w) for k, w in model.items()})
        for k in SHAPES:
            assert model[k].dtype == np.float32 and model[k].shape == SHAPES[k]
            assert np.array_equal(model[k], expected[r][k]), (r, k)


def test_the_outer_step_matches_the_former_numpy_formula_within_float32_rounding():
    rng = np.random.default_rng(3)
    model = old = random_model(rng)
    outer, m = NesterovOuter(0.7, 0.9), None
    for _ in range(5):
        update = random_model(rng, 0.01)
        model = outer.step(model, {k: model[k] + update[k] for k in model})
        old, m = old_numpy_outer(old, {k: old[k] + update[k] for k in old}, m, 0.7, 0.9)
        for k in model:
            np.testing.assert_allclose(model[k], old[k], rtol=1e-5, atol=1e-6)


def test_a_restored_momentum_continues_exactly_as_an_unbroken_run():
    rng = np.random.default_rng(11)
    start, avgs = random_model(rng), [random_model(rng) for _ in range(4)]
    unbroken = NesterovOuter(0.7, 0.9)
    for avg in avgs:
        final = unbroken.step(start, avg)
    first = NesterovOuter(0.7, 0.9)
    for avg in avgs[:2]:
        first.step(start, avg)
    saved = {k: v.copy() for k, v in first.state.items()}  # what a checkpoint writes
    resumed = NesterovOuter(0.7, 0.9)
    resumed.restore(saved)
    for avg in avgs[2:]:
        after = resumed.step(start, avg)
    assert all(np.array_equal(after[k], final[k]) for k in final)


def test_a_step_never_writes_into_the_momentum_it_handed_out():
    outer = NesterovOuter(0.7, 0.9)
    prev = {"w": np.ones(3, np.float32)}
    outer.step(prev, {"w": np.zeros(3, np.float32)})
    handed_out = outer.state
    kept = handed_out["w"].copy()
    outer.step(prev, {"w": np.zeros(3, np.float32)})
    assert np.array_equal(handed_out["w"], kept)
    assert not np.array_equal(outer.state["w"], kept)


def test_zero_momentum_is_a_plain_scaled_fedavg_step():
    outer = NesterovOuter(lr=0.5, momentum=0.0)
    new = outer.step({"w": np.array([2.0], np.float32)}, {"w": np.array([1.0], np.float32)})
    assert new["w"][0] == np.float32(1.5) and outer.state is None


def test_fedavg_has_no_outer_optimizer_and_nesterov_gets_its_settings():
    assert make_outer("fedavg", 0.7, 0.9) is None
    outer = make_outer("nesterov", 0.5, 0.8)
    assert isinstance(outer, NesterovOuter) and (outer.lr, outer.momentum) == (0.5, 0.8)
    with pytest.raises(ValueError, match="outer"):
        make_outer("adam", 0.7, 0.9)  # type: ignore[arg-type]


def test_a_refused_first_step_leaves_no_momentum_behind():
    outer = NesterovOuter(lr=0.7, momentum=0.9)
    with pytest.raises(UpdateRejected):
        outer.step({"w": np.zeros(2, np.float32)}, {"w": np.full(2, -3e38, np.float32)})
    assert outer.state is None
