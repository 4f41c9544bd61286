"""A worker keeps each hosted site's local optimizer state between the rounds that pick it, as
the emulator does, so a stateful recipe (AdamW with ``keep_state``) trains the same updates in
the services as in the study; plain SGD keeps nothing."""

from __future__ import annotations

import numpy as np

from powertrip.emulate import site_seed
from powertrip.experiment import build_config
from powertrip.learning.device import row_to_numpy, to_torch
from powertrip.learning.local_optim import LocalOptimizer
from services.worker.sites_host import SitesHost

ADAMW = LocalOptimizer(name="adamw", lr=1e-3)


def host(recipe: LocalOptimizer | None) -> SitesHost:
    cfg = build_config("quick", num_sites=4, num_samples=1000, local_optimizer=recipe)
    return SitesHost(cfg, run_seed=0, sites=[0, 1])


def test_a_site_picked_again_resumes_its_adamw_moments_as_the_library_trainer_does():
    worker = host(ADAMW)
    params = worker.template
    worker.train(params, 1, [0, 1])
    assert worker.site_states is not None and sorted(worker.site_states) == [0, 1]
    again = worker.train(params, 2, [1])[0]
    # the reference: the library trainer given site 1's state from round 1 by hand
    reference = host(ADAMW)
    fed = reference._fed
    first = fed.trainer.train(
        to_torch(params), fed.x_train, fed.y_train, [fed.partitions[1]], [site_seed(0, 1, 1)]
    )
    second = fed.trainer.train(
        to_torch(params),
        fed.x_train,
        fed.y_train,
        [fed.partitions[1]],
        [site_seed(0, 2, 1)],
        first.opt_state,
    )
    want = row_to_numpy(second.deltas, 0)
    assert all(np.allclose(again.delta[k], want[k], rtol=1e-5, atol=1e-7) for k in want)
    fresh = reference.train(params, 2, [1])[0]  # the same round without the kept moments
    assert not all(np.allclose(again.delta[k], fresh.delta[k]) for k in want)


def test_plain_sgd_keeps_no_state():
    worker = host(None)
    worker.train(worker.template, 1, [0])
    assert worker.site_states is None
