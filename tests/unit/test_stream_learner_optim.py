"""The curtailment learner runs any local optimizer recipe: a lone site's checkpoint chunks
carry its optimizer state (the same trajectory as one uninterrupted pass), and its state
outlives the round only with ``keep_state``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.curtailment.learner import StreamLearner
from powertrip.curtailment.run_model import Checkpoints, SiteWork
from powertrip.learning.models import build_model
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params

BATCH = 8


def _learner(recipe: LocalOptimizer) -> StreamLearner:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 1, 40, generator=g)
    y = torch.randint(0, 10, (200,), generator=g)
    torch.manual_seed(0)
    model = build_model("cnn1d", num_classes=10, in_shape=(1, 40))
    cfg = LocalTrainingConfig(lr=0.01, batch_size=BATCH, shuffle=False, optimizer=recipe)
    order = np.random.default_rng(1).permutation(200)
    return StreamLearner(SiteTrainer(model, cfg), x, y, x[:50], y[:50], order, get_params(model))


def _work(site: int, first: int, steps: int) -> SiteWork:
    return SiteWork(site, steps, np.arange(first, first + steps * BATCH), 0.0, 1.0, False)


@pytest.mark.parametrize("keep_state", [True, False])
def test_checkpoint_chunks_of_a_lone_adamw_site_follow_the_uninterrupted_trajectory(keep_state):
    recipe = LocalOptimizer(name="adamw", weight_decay=0.1, keep_state=keep_state)
    plain, checked = _learner(recipe), _learner(recipe)
    plain.train_round([_work(0, 0, 9)], None)
    out = checked.train_round([_work(0, 0, 9)], Checkpoints(0, (3, 6)))
    assert len(out.checkpoints) == 2
    assert checked.site_states[0].step == 9
    for k in plain.params:
        torch.testing.assert_close(plain.params[k], checked.params[k], rtol=1e-5, atol=1e-6)


def test_a_site_resumes_its_moments_only_with_keep_state_and_its_step_count_always():
    kept, fresh = (_learner(LocalOptimizer(name="momentum", keep_state=k)) for k in (True, False))
    for learner in (kept, fresh):
        learner.train_round([_work(0, 0, 4), _work(1, 32, 2)], None)
        learner.train_round([_work(1, 64, 3)], None)
    assert {s: st.step for s, st in kept.site_states.items()} == {0: 4, 1: 5}
    assert {s: st.step for s, st in fresh.site_states.items()} == {0: 4, 1: 5}
    assert kept.site_states[1].moment_step is None  # moments as old as the step count
    assert fresh.site_states[1].moment_step == 3  # moments began with this round
    assert any(not torch.equal(kept.params[k], fresh.params[k]) for k in kept.params)
