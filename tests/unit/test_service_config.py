"""Service configuration: parsed once from POWERTRIP_* variables, errors name the variable."""

from __future__ import annotations

import pytest
import torch

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.common.grpc_options import client_options, server_options
from powertrip.services.worker.config import WorkerConfig

PLAIN = {"POWERTRIP_INSECURE": "1"}  # these tests are about other settings
WORKER = {"POWERTRIP_AGGREGATOR_ADDR": "agg:50051", "POWERTRIP_SITES": "0-3,site-007", **PLAIN}
AGG = {"POWERTRIP_PROFILER_ADDR": "profiler:50052", **PLAIN}


def test_worker_sites_accept_ranges_and_ids():
    cfg = load_config(WorkerConfig, WORKER)
    assert cfg.site_indices == [0, 1, 2, 3, 7]
    assert cfg.grpc_port == 50051 and cfg.metrics_port == 8000


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "POWERTRIP_PROFILER_ADDR is required"),
        ({"POWERTRIP_PROFILER_ADDR": "p:1", "POWERTRIP_GRPC_PORT": "x"}, "POWERTRIP_GRPC_PORT='x'"),
        ({"POWERTRIP_PROFILER_ADDR": "p:1", "POWERTRIP_POLICY": "nope"}, "POWERTRIP_POLICY"),
        ({"POWERTRIP_PROFILER_ADDR": "p:1", "POWERTRIP_CLOCK": "sundial"}, "POWERTRIP_CLOCK"),
        ({"POWERTRIP_PROFILER_ADDR": "p:1", "POWERTRIP_TARGET_ACCURACY": "2"}, "TARGET_ACCURACY"),
        ({**AGG, "POWERTRIP_WORKLOAD": "imagenet"}, "POWERTRIP_WORKLOAD='imagenet'"),
        ({**AGG, "POWERTRIP_PARTITION": "random"}, "POWERTRIP_PARTITION='random'"),
        ({**AGG, "POWERTRIP_MODEL_SIZE": "huge"}, "POWERTRIP_MODEL_SIZE='huge'"),
        ({**AGG, "POWERTRIP_WORKLOAD": "fsdd"}, "WORKLOAD=fsdd needs POWERTRIP_DATASET_PATH"),
        ({**AGG, "POWERTRIP_WORKLOAD": "lm", "POWERTRIP_PARTITION": "natural"}, "PARTITION=iid"),
        ({**AGG, "POWERTRIP_STREAM_WINDOW_MIB": "0"}, "POWERTRIP_STREAM_WINDOW_MIB='0'"),  # a stall
    ],
)
def test_bad_aggregator_settings_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(AggregatorConfig, env)


def test_the_workload_defaults_to_the_presets():
    exp = load_config(AggregatorConfig, AGG).experiment()
    assert exp.workload == "mnist1d" and exp.dataset_path is None and exp.partition == "dirichlet"


def test_a_dataset_missing_at_start_is_named_but_the_config_still_validates(tmp_path):
    gone = tmp_path / "nowhere"
    cfg = load_config(
        AggregatorConfig, {**AGG, "POWERTRIP_WORKLOAD": "fsdd", "POWERTRIP_DATASET_PATH": str(gone)}
    )
    with pytest.raises(ConfigError, match=f"POWERTRIP_DATASET_PATH='{gone}': no such file"):
        cfg.experiment()  # what the service's start checks


def test_the_lm_workload_takes_its_size_and_iid_sites():
    exp = load_config(
        AggregatorConfig, {**AGG, "POWERTRIP_WORKLOAD": "lm", "POWERTRIP_MODEL_SIZE": "small"}
    ).experiment()
    assert (exp.workload, exp.model_size, exp.partition) == ("lm", "small", "iid")


@pytest.mark.real_data("fsdd")
def test_a_mounted_dataset_reaches_the_run_the_workers_get(shared_data):
    fsdd = shared_data / "datasets" / "fsdd"
    env = {
        **AGG,
        "POWERTRIP_WORKLOAD": "fsdd",
        "POWERTRIP_DATASET_PATH": str(fsdd),
        "POWERTRIP_PARTITION": "natural",
    }
    exp = load_config(AggregatorConfig, env).experiment()
    assert (exp.workload, exp.dataset_path, exp.partition) == ("fsdd", fsdd, "natural")
    assert exp.name == "quick"  # the rest is still the preset's


def test_bad_site_lists_name_the_site():
    with pytest.raises(ConfigError, match="POWERTRIP_SITES.*bad site id 'x'"):
        load_config(WorkerConfig, {**WORKER, "POWERTRIP_SITES": "x-3"})


def test_the_site_engine_is_off_by_default_and_built_from_the_site_settings():
    assert load_config(WorkerConfig, WORKER).site_engine is None
    one = {**WORKER, "POWERTRIP_SITES": "site-002", "POWERTRIP_SITE_RANKS": "4"}
    engine = load_config(WorkerConfig, {**one, "POWERTRIP_SITE_SHARDING": "fsdp"}).site_engine
    assert engine is not None and (engine.ranks, engine.sharding) == (4, "fsdp")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POWERTRIP_SITE_RANKS": "2"}, "exactly one site, not 5"),
        ({"POWERTRIP_SITES": "0", "POWERTRIP_SITE_RANKS": "-1"}, "POWERTRIP_SITE_RANKS='-1'"),
        ({"POWERTRIP_SITES": "0", "POWERTRIP_SITE_PRECISION": "fp8"}, "POWERTRIP_SITE_PRECISION"),
        ({"POWERTRIP_SITES": "0", "POWERTRIP_SITE_SHARDING": "zero3"}, "POWERTRIP_SITE_SHARDING"),
    ],
)
def test_bad_site_engine_settings_name_the_problem(env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(WorkerConfig, {**WORKER, **env})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_more_site_ranks_than_gpus_is_refused_at_start_naming_the_variable():
    too_many = str(torch.cuda.device_count() + 1)
    cfg = load_config(
        WorkerConfig,
        {
            **WORKER,
            "POWERTRIP_SITES": "0",
            "POWERTRIP_SITE_RANKS": too_many,
            "POWERTRIP_DEVICE": "cuda",
        },
    )
    with pytest.raises(
        ConfigError, match=f"POWERTRIP_SITE_RANKS={too_many} needs one GPU per rank"
    ):
        cfg.usable_device()


def test_site_ranks_on_the_cpu_are_processes_not_gpus():
    cfg = load_config(
        WorkerConfig,
        {**WORKER, "POWERTRIP_SITES": "0", "POWERTRIP_SITE_RANKS": "8", "POWERTRIP_DEVICE": "cpu"},
    )
    assert cfg.usable_device() == "cpu"


def test_config_is_frozen():
    cfg = load_config(WorkerConfig, WORKER)
    with pytest.raises(ValueError):
        cfg.grpc_port = 1  # type: ignore[misc]


def test_server_accepts_pings_as_often_as_clients_send_them():
    cfg = load_config(WorkerConfig, WORKER)
    client = dict(client_options(cfg))
    server = dict(server_options(cfg))
    assert (
        server["grpc.http2.min_ping_interval_without_data_ms"] <= client["grpc.keepalive_time_ms"]
    )
    assert client["grpc.max_receive_message_length"] == 4 << 20  # chunks, never a raised limit
    assert client["grpc.http2.ping_timeout_ms"] > 0  # a frozen peer is noticed in seconds


@pytest.mark.parametrize(("cls", "env"), [(WorkerConfig, WORKER), (AggregatorConfig, AGG)])
def test_the_device_defaults_to_auto_and_a_bad_one_is_named_at_start(cls, env):
    assert load_config(cls, env).device == "auto"
    assert load_config(cls, {**env, "POWERTRIP_DEVICE": "cpu"}).device == "cpu"
    with pytest.raises(ConfigError, match="POWERTRIP_DEVICE='tpu': device 'tpu': use auto"):
        load_config(cls, {**env, "POWERTRIP_DEVICE": "tpu"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize(("cls", "env"), [(WorkerConfig, WORKER), (AggregatorConfig, AGG)])
def test_a_gpu_config_is_valid_anywhere_but_unusable_without_cuda(cls, env):
    cfg = load_config(cls, {**env, "POWERTRIP_DEVICE": "CUDA:0"})  # a GPU node's config, on CI

    assert cfg.device == "cuda:0"
    with pytest.raises(ConfigError, match="POWERTRIP_DEVICE='cuda:0'.*CUDA is not available"):
        cfg.usable_device()  # what the service's start checks
    assert load_config(cls, env).usable_device() == "auto"
