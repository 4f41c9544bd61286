"""`make compose-check` (deploy/compose-check.sh): compose.yaml run in real containers to the quick
preset's target with mutual TLS on. The run itself needs a container runtime, a compose tool
that reads compose.yaml and the image already built: where one is missing the test skips and
says which (it never builds the image, which takes minutes). The script's own checks run
everywhere."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest

from tests.deploy.support import REPO, tool

SCRIPT = REPO / "deploy" / "compose-check.sh"
IMAGE = os.environ.get("POWERTRIP_IMAGE", "powertrip:dev")


def compose_command() -> tuple[list[str] | None, str]:
    """The compose tool the script would use (its own choice, $COMPOSE first), or why none."""
    if os.environ.get("COMPOSE"):
        return shlex.split(os.environ["COMPOSE"]), ""
    podman_compose = tool("podman-compose")
    if podman_compose:
        out = subprocess.run(
            [podman_compose, "version"], capture_output=True, text=True, timeout=60
        ).stdout
        found = re.search(r"podman-composer? version\s+(\S+)", out)
        version = found.group(1) if found else "?"
        if re.match(r"(0\.|1\.0\.)", version):
            return None, (
                f"podman-compose {version} cannot read compose.yaml's network aliases "
                "(pip install podman-compose, or set COMPOSE)"
            )
        return [podman_compose], ""
    docker = tool("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        return [docker, "compose"], ""
    return None, "no container runtime with a compose tool (podman + podman-compose, or docker)"


def run_script(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )


def test_compose_check_is_a_make_target_outside_make_test():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\.PHONY: compose-check$", makefile, re.M)
    assert re.search(r"^compose-check:.*\n\tdeploy/compose-check\.sh$", makefile, re.M)
    test_recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert test_recipe and "compose" not in test_recipe.group(1)


def test_compose_check_says_how_to_use_it():
    out = run_script("--help")
    assert out.returncode == 0, out.stderr
    for name in ("--timeout", "--keep", "COMPOSE", "POWERTRIP_IMAGE", "CONTAINERS_CONF"):
        assert name in out.stdout


def test_compose_check_refuses_a_timeout_that_is_not_whole_seconds():
    out = run_script("--timeout", "10m")
    assert out.returncode != 0
    assert out.stderr.strip() == "compose-check: --timeout takes whole seconds, not 10m"


def test_compose_check_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed")
    out = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


@pytest.mark.slow
def test_compose_stack_reaches_the_quick_target_in_containers():
    command, why = compose_command()
    if command is None:
        pytest.skip(why)
    runtime = "podman" if command[0].endswith("podman-compose") else "docker"
    if tool(runtime) is None:
        pytest.skip(f"{runtime} not installed (the runtime of {' '.join(command)})")
    has_image = subprocess.run(
        [runtime, "image", "inspect", IMAGE], capture_output=True, timeout=60
    ).returncode
    if has_image != 0:
        pytest.skip(f"image {IMAGE} not built (make compose-check builds it; docs/images.md)")
    env = {**os.environ, "COMPOSE": shlex.join(command)}
    out = subprocess.run(
        [str(SCRIPT), "--timeout", "1500"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(out.stdout[-6000:])
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"compose-check: OK: run done: target [\d.]+ reached", out.stdout)
    # every application container ended or ran cleanly: the workers heard the run end
    for worker in ("worker-eu-west", "worker-us-east", "worker-ap-south"):
        assert re.search(rf"^{worker} +exited exit=0$", out.stdout, re.M), worker
