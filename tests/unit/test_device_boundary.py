"""Every tensor <-> numpy crossing goes through ``powertrip.learning.device``.

A stray ``tensor.numpy()`` passes on a CPU-only CI and crashes on a GPU, so the scan below
fails on any such call outside the boundary module, naming file:line; the behavioural tests pin
what the boundary promises (values, dtypes and shapes survive, copies do not alias, no copy on
the CPU unless asked).
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from powertrip.learning.device import (
    array,
    resolve_device,
    row_to_numpy,
    tensor,
    to_host,
    to_numpy,
    to_torch,
)

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("powertrip", "services")
EXEMPT = (ROOT / "powertrip" / "v1", ROOT / "powertrip" / "learning" / "device.py")
#: methods that move data between a device and host memory or numpy
CROSSINGS = frozenset({"numpy", "cpu", "from_numpy"})


def find_crossings(source: str) -> list[tuple[int, str]]:
    """(line, call) of every call of a crossing method in ``source``."""
    return sorted(
        (node.lineno, f".{node.func.attr}()")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CROSSINGS
    )


def scanned_files() -> list[Path]:
    files = (p for top in SCANNED for p in sorted((ROOT / top).rglob("*.py")))
    return [p for p in files if not any(p == e or e in p.parents for e in EXEMPT)]


# ------------------------------------------------------------------------------------ the scan


def test_the_scanner_finds_each_kind_of_crossing_and_nothing_else():
    source = "a = t.numpy()\nb = t.detach().cpu()\nc = torch.from_numpy(x)\nd = np.asarray(x)\n"

    assert find_crossings(source) == [(1, ".numpy()"), (2, ".cpu()"), (3, ".from_numpy()")]


def test_the_scan_covers_the_library_and_the_services():
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files()}

    assert "powertrip/learning/trainer.py" in files
    assert "services/worker/sites_host.py" in files
    assert "powertrip/learning/device.py" not in files
    assert not any(f.startswith("powertrip/v1/") for f in files)


def test_no_code_outside_the_boundary_crosses_between_device_and_host():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {call}"
        for path in scanned_files()
        for line, call in find_crossings(path.read_text(encoding="utf-8"))
    ]

    assert not found, "use powertrip.learning.device instead of:\n" + "\n".join(found)


# ---------------------------------------------------------------------------- the boundary


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8, np.bool_])
def test_a_round_trip_keeps_dtype_shape_and_values(dtype):
    params = {"w": np.arange(24).reshape(2, 3, 4).astype(dtype), "b": np.ones(3, dtype=dtype)}

    back = to_numpy(to_torch(params))

    assert list(back) == ["w", "b"]
    for k, v in params.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(back[k], v)


def test_on_the_cpu_nothing_is_copied_unless_asked():
    host = np.zeros(4, dtype=np.float32)
    t = tensor(host)
    view = array(t)

    host[0] = 1.0
    t[1] = 2.0

    assert t[0] == 1.0 and view[1] == 2.0
    assert np.shares_memory(array(to_host(t)), host)


def test_a_copy_does_not_alias_the_tensor():
    t = torch.zeros(3)
    copied, one = to_numpy({"w": t}, copy=True)["w"], array(t, copy=True)

    copied[0] = 5.0
    one[1] = 7.0

    assert torch.equal(t, torch.zeros(3))


def test_a_tensor_that_requires_grad_crosses_detached():
    w = torch.ones(2, requires_grad=True)

    np.testing.assert_array_equal(array(w), [1.0, 1.0])
    assert not to_host(w).requires_grad


def test_row_to_numpy_is_one_sites_slice_of_a_stacked_result():
    stacked = {"w": torch.arange(6.0).reshape(3, 2), "b": torch.tensor([10.0, 20.0, 30.0])}

    row = row_to_numpy(stacked, 1)

    np.testing.assert_array_equal(row["w"], [2.0, 3.0])
    assert row["b"] == 20.0 and isinstance(row["b"], np.ndarray)


def test_to_torch_places_tensors_on_the_given_device_with_their_shapes():
    params = {"w": np.zeros((2, 3), dtype=np.float32), "n": np.arange(4)}

    on_meta = to_torch(params, "meta")

    assert all(t.device.type == "meta" for t in on_meta.values())
    assert on_meta["w"].shape == (2, 3) and on_meta["w"].dtype == torch.float32
    assert on_meta["n"].dtype == torch.int64


def test_a_tensor_without_host_data_is_refused_not_invented():
    with pytest.raises((NotImplementedError, RuntimeError)):
        array(torch.zeros(2, device="meta"))


def test_resolve_device_prefers_cuda_only_when_there_is_one():
    expected = "cuda" if torch.cuda.is_available() else "cpu"

    assert resolve_device().type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("meta").type == "meta"


@pytest.mark.parametrize("bad", ["gpu", "mps", "cuda:x", "cuda0", ""])
def test_resolve_device_refuses_what_it_cannot_train_on_naming_the_choices(bad):
    with pytest.raises(ValueError, match="use auto, cpu, cuda or cuda:N"):
        resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("asked", ["cuda", "cuda:0", "CUDA:1"])
def test_resolve_device_refuses_cuda_on_a_machine_without_it(asked):
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device(asked)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_resolves_to_an_indexed_device_so_tensor_devices_compare_equal():
    assert resolve_device("cuda") == torch.zeros(1, device="cuda").device
    assert resolve_device("auto").type == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_round_trip_through_the_gpu_keeps_values_and_copies_once():
    params = {"w": np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)}

    on_gpu = to_torch(params, "cuda")
    back = to_numpy(on_gpu)
    rows = row_to_numpy(on_gpu, 2)

    assert on_gpu["w"].device.type == "cuda" and to_host(on_gpu["w"]).device.type == "cpu"
    np.testing.assert_array_equal(back["w"], params["w"])
    np.testing.assert_array_equal(rows["w"], params["w"][2])
    assert not np.shares_memory(back["w"], params["w"])
