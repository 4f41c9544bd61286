"""The image from any mirror: the Dockerfile's base image and package indexes are build arguments
that every stage and every pip call honour, and deploy/build-image.sh builds and tags each torch
variant with them (docs/images.md)."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shlex
import subprocess
import threading
from pathlib import Path

import pytest

from tests.deploy.support import DOCKERFILE, REPO, tool
from tests.deploy.test_image import instructions

SCRIPT = REPO / "deploy" / "build-image.sh"
VARIANTS = ("cpu", "cu126", "cu130")
PIP_ARGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST")
#: The only index option a pip call may carry: torch's own index, itself a build argument.
TORCH_INDEX_OPTION = '${TORCH_INDEX_URL:+--index-url "${TORCH_INDEX_URL}"}'
#: Build arguments the script passes on from its environment.
PASSED = ("BASE_IMAGE", *PIP_ARGS, "DEBIAN_MIRROR", "TORCH_INDEX_URL")


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for op, rest in instructions():
        if op == "FROM":
            out.append([])
        if out:
            out[-1].append((op, rest))
    return out


def version() -> str:
    text = (REPO / "powertrip" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"$', text, re.M).group(1)


def test_every_pip_call_runs_with_the_pip_index_build_args():
    # ARG values are in the environment of the RUNs after them (pip reads PIP_* from there);
    # nothing may set them for good (ENV), nor bypass them on the command line.
    calls = 0
    for stage in stages():
        declared: set[str] = set()
        for op, rest in stage:
            if op == "ARG":
                declared.add(rest.split("=")[0])
            if op == "ENV":
                assert not any(f"{name}=" in rest for name in PIP_ARGS), rest
            if op == "RUN" and re.search(r"\bpip\b", rest):
                calls += 1
                assert set(PIP_ARGS) <= declared, f"{rest!r} runs before ARG {PIP_ARGS}"
                bare = rest.replace(TORCH_INDEX_OPTION, "")
                for option in (
                    "--index-url",
                    "-i ",
                    "--extra-index-url",
                    "--trusted-host",
                    "--no-index",
                    "--find-links",
                    "PIP_INDEX_URL=",
                ):
                    assert option not in bare, f"{option} overrides the build args: {rest!r}"
    assert calls >= 3  # the wheel, torch, the wheel's install


def test_pip_index_build_args_have_no_default():
    # Unset stays unset (pip's default, or a pip.conf of the base image); an empty default
    # would hand pip an empty index URL.
    for op, rest in instructions():
        if op == "ARG" and rest.split("=")[0] in PIP_ARGS:
            assert "=" not in rest, rest


def test_torch_index_url_is_the_only_index_given_on_a_command_line():
    text = " ".join(rest for _, rest in instructions())  # comments left out
    assert text.count("--index-url") == 1 and TORCH_INDEX_OPTION in text


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in PASSED}
    base.pop("POWERTRIP_IMAGE_NAME", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def builds(out: str) -> list[list[str]]:
    return [shlex.split(line) for line in out.splitlines() if " build " in line]


def build_args(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1] for i, word in enumerate(command) if word == "--build-arg"]
    return dict(p.split("=", 1) for p in pairs)


def tags(command: list[str]) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == "--tag"]


def test_build_script_help():
    out = run_script("--help")
    assert out.returncode == 0, out.stderr
    for word in ("--image", "--variant", "--all", "--push", "--dry-run", "--tool", *PASSED):
        assert word in out.stdout, word


def test_build_script_tags_each_variant_with_the_version():
    image = "ghcr.io/example/powertrip"
    out = run_script("--all", "--push", "--dry-run", "--tool", "docker", "--image", image)
    assert out.returncode == 0, out.stderr
    commands = builds(out.stdout)
    assert [tags(c) for c in commands] == [[f"{image}:{version()}-{v}"] for v in VARIANTS]
    assert [build_args(c) for c in commands] == [{"TORCH_INDEX": v} for v in VARIANTS]
    assert all(c[0] == "docker" and c[-1] == str(REPO) for c in commands)
    assert f"--file {DOCKERFILE}" in out.stdout
    pushes = [line for line in out.stdout.splitlines() if " push " in line]
    assert pushes == [f"docker push {image}:{version()}-{v}" for v in VARIANTS]


def test_build_script_defaults_to_the_cpu_variant_and_pushes_nothing():
    out = run_script("--dry-run", "--tool", "podman")
    assert out.returncode == 0, out.stderr
    (command,) = builds(out.stdout)
    assert command[0] == "podman" and tags(command) == [f"powertrip:{version()}-cpu"]
    assert " push " not in out.stdout


def test_build_script_passes_the_mirror_settings_from_its_environment():
    env = {
        "BASE_IMAGE": "mirror.example/library/python:3.11-slim-bookworm",
        "PIP_INDEX_URL": "https://pypi.mirror.example/simple",
        "PIP_TRUSTED_HOST": "pypi.mirror.example",
        "DEBIAN_MIRROR": "http://deb.mirror.example",
        "TORCH_INDEX_URL": "https://torch.mirror.example/whl/{variant}",
    }
    out = run_script("--variant", "cu126", "--variant", "cpu", "--dry-run", env=env)
    assert out.returncode == 0, out.stderr
    first, second = (build_args(c) for c in builds(out.stdout))
    url = env["TORCH_INDEX_URL"]
    assert first == {**env, "TORCH_INDEX": "cu126", "TORCH_INDEX_URL": url.format(variant="cu126")}
    assert second["TORCH_INDEX_URL"] == url.format(variant="cpu")
    assert "PIP_EXTRA_INDEX_URL" not in first  # unset: not passed at all
    out = run_script("--dry-run", env={"PIP_INDEX_URL": "", "BASE_IMAGE": ""})
    (command,) = builds(out.stdout)
    assert build_args(command) == {"TORCH_INDEX": "cpu"}  # empty: not passed either


def test_build_script_passes_an_empty_torch_index_url():
    # Set but empty: torch from PIP_INDEX_URL (the Dockerfile then gives pip no --index-url).
    out = run_script("--dry-run", env={"TORCH_INDEX_URL": ""})
    (command,) = builds(out.stdout)
    assert build_args(command)["TORCH_INDEX_URL"] == ""


@pytest.mark.parametrize(
    "args", [("--variant", "cu999"), ("--image", "ghcr.io/example/powertrip:1.0"), ("--bogus",)]
)
def test_build_script_refuses_bad_arguments(args):
    out = run_script(*args, "--dry-run")
    assert out.returncode == 2 and "build-image.sh:" in out.stderr and not out.stdout


def test_build_script_passes_shellcheck():
    shellcheck = tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (Debian: apt-get install shellcheck)")
    out = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------------------------
# A real build up to the first pip call, against an index on this machine


@functools.cache
def builder() -> str | None:
    """podman, or docker with a daemon that answers."""
    for name in ("podman", "docker"):
        path = tool(name)
        if path and subprocess.run([path, "info"], capture_output=True, timeout=60).returncode == 0:
            return path
    return None


@pytest.mark.slow
def test_build_takes_packages_from_the_index_it_is_given(tmp_path: Path):
    # The wheel stage's pip (its build backend) must ask the index of PIP_INDEX_URL: here an
    # empty one served on this machine, so the build stops there, after the request is logged.
    # Needs a base image with python and pip that the builder has without a registry:
    # POWERTRIP_TEST_BASE_IMAGE (docs/images.md shows one made with debootstrap), and
    # POWERTRIP_TEST_BUILD_OPTS for anything the machine's builder needs besides.
    base = os.environ.get("POWERTRIP_TEST_BASE_IMAGE")
    if not base:
        pytest.skip("POWERTRIP_TEST_BASE_IMAGE not set (a local image with python and pip)")
    if builder() is None:
        pytest.skip("neither podman nor a running docker daemon")
    (tmp_path / "simple").mkdir()
    (tmp_path / "simple" / "index.html").write_text("<html></html>\n")
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        out = subprocess.run(
            [
                builder(),
                "build",
                "--network",
                "host",
                "--target",
                "wheel",
                "--build-arg",
                f"BASE_IMAGE={base}",
                "--build-arg",
                f"PIP_INDEX_URL={index}",
                *shlex.split(os.environ.get("POWERTRIP_TEST_BUILD_OPTS", "")),
                "--file",
                str(DOCKERFILE),
                str(REPO),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.shutdown()
    log = out.stdout + out.stderr
    assert f"Looking in indexes: {index}" in log, log[-3000:]
    assert "/simple/hatchling/" in requests, (requests, log[-3000:])
    assert out.returncode != 0  # nothing to install from an empty index
