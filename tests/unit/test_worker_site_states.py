"""A worker keeps each hosted site's local optimizer state between the rounds that pick it, as
the emulator does, so a stateful recipe (AdamW with ``keep_state``) trains the same updates in
the services as in the study; plain SGD keeps nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.config.experiment import build_config
from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.device import row_to_numpy, to_torch
from powertrip.rounds.emulate import site_seed
from powertrip.services.worker.sites_host import SitesHost
from powertrip.services.worker.state_dir import SavedRun, WorkerStateDir

ADAMW = LocalOptimizer(name="adamw", lr=1e-3)


def host(recipe: LocalOptimizer | None, state=None, sites=(0, 1), seed=0) -> SitesHost:
    cfg = build_config("quick", num_sites=4, num_samples=1000, local_optimizer=recipe)
    store = None if state is None else state.store(SavedRun(cfg.model_dump_json(), seed))
    return SitesHost(cfg, run_seed=seed, sites=list(sites), store=store)


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


def test_a_reset_recipe_keeps_only_what_its_schedule_needs():
    constant = host(ADAMW.model_copy(update={"keep_state": False}))
    constant.train(constant.template, 1, [0])
    assert constant.site_states is None  # fresh moments, constant lr: nothing carries over
    cosine = ADAMW.model_copy(
        update={"keep_state": False, "schedule": "cosine", "total_steps": 500}
    )
    worker = host(cosine)
    worker.train(worker.template, 1, [0])
    steps = worker.site_states[0].step
    worker.train(worker.template, 2, [0])
    # the schedule runs on the site's cumulative steps; the moments began this round
    assert worker.site_states[0].step == 2 * steps
    assert worker.site_states[0].moment_step == steps


def same_states(a, b) -> bool:
    return sorted(a) == sorted(b) and all(
        a[s].step == b[s].step
        and all(
            torch.equal(t, b[s].moments[n][k])
            for n, m in a[s].moments.items()
            for k, t in m.items()
        )
        for s in a
    )


def test_a_restarted_worker_with_a_state_dir_resumes_its_sites_bit_identically(tmp_path):
    """Round 1 trains sites 0 and 1, the worker restarts, round 2 picks site 1 again: the
    update equals an uninterrupted worker's bit for bit."""
    state = WorkerStateDir(tmp_path)
    before = host(ADAMW, state)
    params = before.template
    before.train(params, 1, [0, 1])
    after = host(ADAMW, state)  # the restart: a new host from the same directory
    assert same_states(after.site_states, before.site_states)
    resumed, uninterrupted = after.train(params, 2, [1])[0], before.train(params, 2, [1])[0]
    assert all(np.array_equal(resumed.delta[k], uninterrupted.delta[k]) for k in params)


def test_a_site_no_longer_hosted_is_dropped_and_another_runs_states_are_not_resumed(tmp_path):
    state = WorkerStateDir(tmp_path)
    host(ADAMW, state).train(host(None).template, 1, [0, 1])
    assert sorted(host(ADAMW, state, sites=[1]).site_states) == [1]
    assert host(ADAMW, state, seed=1).site_states == {}  # another run: fresh


def trained(state: WorkerStateDir) -> dict[str, np.ndarray]:
    """Sites 0 and 1 trained in round 1 with their states saved; the round's params."""
    worker = host(ADAMW, state)
    worker.train(worker.template, 1, [0, 1])
    return worker.template


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def set_aside(directory, name: str = "site-states.pt") -> list:
    return sorted(directory.glob(f"{name}.bad-*"))


def test_nan_moments_of_a_site_set_the_file_aside_and_that_site_alone_starts_fresh(
    tmp_path, caplog
):
    state = WorkerStateDir(tmp_path)
    params = trained(state)
    path = tmp_path / "site-states.pt"
    raw = torch.load(path, weights_only=True)
    moments = raw["states"][1]["moments"]
    name = next(iter(moments))
    moments[name]["exp_avg"].fill_(float("nan"))
    torch.save(raw, path)
    with caplog.at_level("WARNING"):
        restarted = host(ADAMW, state)
    (aside,) = set_aside(tmp_path)
    assert warnings(caplog) == [
        f"{path} set aside as {aside.name}: non-finite moments (NaN in exp_avg of {name!r}); "
        "site-001 starts fresh, site-000 resumed from round 1"
    ]
    assert sorted(restarted.site_states) == [0]  # written back at once: a second restart too
    assert sorted(host(ADAMW, state).site_states) == [0] and len(set_aside(tmp_path)) == 1
    fresh = host(ADAMW).train(params, 2, [1])[0]
    again = restarted.train(params, 2, [1])[0]  # finite, and exactly a fresh site's update
    assert all(np.array_equal(again.delta[k], fresh.delta[k]) for k in params)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b[: len(b) // 2], "truncated ("),
        (lambda b: b"", "empty (0 bytes)"),
        (lambda b: bytes(reversed(b)), "not a state file ("),
    ],
)
def test_a_damaged_state_file_is_set_aside_and_every_site_starts_fresh(
    tmp_path, caplog, damage, reason
):
    state = WorkerStateDir(tmp_path)
    trained(state)
    path = tmp_path / "site-states.pt"
    path.write_bytes(damage(path.read_bytes()))
    with caplog.at_level("WARNING"):
        assert host(ADAMW, state).site_states == {}
    (aside,) = set_aside(tmp_path)
    (line,) = warnings(caplog)
    assert line.startswith(f"{path} set aside as {aside.name}: {reason}")
    assert line.endswith("; site-000, site-001 start fresh") and "weights_only" not in line
    assert not path.exists()  # nothing to resume: the next round's save writes it anew


def test_a_state_trained_to_nan_is_neither_kept_nor_saved(tmp_path, caplog):
    """Training from NaN parameters gives NaN moments: the site keeps its schedule's place and
    its moments start fresh next round; the file on disk never holds a NaN."""
    state = WorkerStateDir(tmp_path)
    worker = host(ADAMW, state)
    params = worker.template
    poisoned = {k: np.full_like(v, np.nan) for k, v in params.items()}
    with caplog.at_level("WARNING"):
        worker.train(poisoned, 1, [0])
    (line,) = warnings(caplog)
    assert line.startswith("site-000: its optimizer state after round 1 is not kept nor saved (")
    assert "non-finite moments (NaN in " in line
    kept = worker.site_states[0]
    assert kept.moments == {} and kept.moment_step == 0 and kept.step > 0
    assert host(ADAMW, state).site_states[0].moments == {}  # what was saved: no NaN
    update = worker.train(params, 2, [0])[0]
    assert all(np.isfinite(v).all() for v in update.delta.values())


def test_a_damaged_registration_is_set_aside_and_the_run_is_fetched_again(tmp_path, caplog):
    path = tmp_path / "registration.json"
    path.write_text("{not json")
    with caplog.at_level("WARNING"):
        assert WorkerStateDir(tmp_path).saved_run() is None
    (aside,) = set_aside(tmp_path, "registration.json")
    assert aside.read_text() == "{not json"
    assert warnings(caplog) == [
        f"{path} set aside as {aside.name}: not a registration (damaged or cut); this worker "
        "fetches its run from the aggregator"
    ]


class Runner:
    def __init__(self) -> None:
        self.hosts: list[SitesHost | None] = []

    def start(self, host: SitesHost | None) -> None:
        self.hosts.append(host)


def test_a_worker_saved_in_another_run_rejoins_fresh_with_one_warning(tmp_path, caplog):
    """The saved run is not the aggregator's: the sites are withdrawn, the directory cleared,
    the sites rebuilt from the aggregator's run, and the worker registers as ready again."""
    from powertrip.services.worker.config import WorkerConfig
    from powertrip.services.worker.joining import join_run
    from powertrip.v1 import aggregator_pb2

    cfg_json = build_config("quick", num_sites=4, num_samples=1000, local_optimizer=ADAMW)
    cfg = WorkerConfig(
        aggregator_addr="agg:1",
        sites="0-1",
        worker_id="w",
        insecure=True,
        worker_state_dir=tmp_path,
    )
    state = WorkerStateDir(tmp_path / "w")
    old = host(ADAMW, state, seed=7)  # another run's seed
    state.save_run(SavedRun(cfg_json.model_dump_json(), 7))
    old.train(old.template, 1, [0])
    calls: list[bool] = []

    def register(ready: bool) -> aggregator_pb2.RegisterWorkerResponse:
        calls.append(ready)
        return aggregator_pb2.RegisterWorkerResponse(
            run_config_json=cfg_json.model_dump_json(), run_seed=0, mode="powertrip"
        )

    runner = Runner()
    join_run(register, runner, cfg, "cpu", state)  # type: ignore[arg-type]
    assert calls == [True, False, True]
    assert [h is None for h in runner.hosts] == [False, True, False]
    assert runner.hosts[-1].run_seed == 0 and runner.hosts[-1].site_states == {}
    assert state.saved_run() == SavedRun(cfg_json.model_dump_json(), 0)
    assert not (state.directory / "site-states.pt").exists()
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == [
        f"{state.directory} holds another run than the aggregator's: starting fresh"
    ]


def test_a_round_trained_again_starts_from_the_state_before_it_and_gives_the_same_update():
    """The aggregator killed in round 2's fold resumes from round 1's checkpoint and asks for
    round 2 again: the worker must not start it from its own post-round-2 moments."""
    worker = host(ADAMW)
    params = worker.template
    worker.train(params, 1, [0, 1])
    first = {u.site: u for u in worker.train(params, 2, [0, 1])}
    again = {u.site: u for u in worker.train(params, 2, [0, 1])}
    for site in (0, 1):
        for k in first[site].delta:
            assert np.array_equal(again[site].delta[k], first[site].delta[k]), (site, k)


def test_a_redo_further_back_than_the_history_starts_fresh_with_a_warning(caplog):
    worker = host(ADAMW)
    params = worker.template
    for r in (1, 2, 3):
        worker.train(params, r, [0])
    fresh = host(ADAMW).train(params, 1, [0])[0]
    with caplog.at_level("WARNING"):
        redo = worker.train(params, 1, [0])[0]
    assert "older than its kept optimizer states" in caplog.text
    assert all(np.array_equal(redo.delta[k], fresh.delta[k]) for k in fresh.delta)
