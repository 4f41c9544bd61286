"""``powertrip flower run``'s parts that need no Flower: stopping a SuperLink stops everything
it started, and bad input ends in one line. The whole command runs in
tests/integration/test_flower_example.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from powertrip.services.cli import flower
from tests.needs import extra_reason

#: A stand-in SuperLink, as the real one behaves: a child in its process group, and a child in a
#: session of its own (Flower's SuperExec, Ray's daemons) that ignores SIGTERM.
FAKE_SUPERLINK = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    stubborn = [sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print(flush=True); time.sleep(600)"]
    same_group = subprocess.Popen(sleeper)
    own_session = subprocess.Popen(stubborn, start_new_session=True, stdout=subprocess.PIPE)
    own_session.stdout.readline()  # its SIGTERM handler is set
    print(same_group.pid, own_session.pid, flush=True)
    time.sleep(600)
    """
)


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the processes through /proc")
def test_stopping_the_superlink_stops_its_group_and_its_own_session_children():
    link = subprocess.Popen(
        [sys.executable, "-c", FAKE_SUPERLINK], stdout=subprocess.PIPE, start_new_session=True
    )
    assert link.stdout is not None
    children = [int(p) for p in link.stdout.readline().split()]
    assert flower.descendants(link.pid).keys() >= set(children)
    assert os.getsid(children[1]) != os.getsid(link.pid)  # out of reach of the group's signal

    flower.stop_superlink(link, grace_s=1.0)

    assert link.returncode == -signal.SIGTERM
    assert [pid for pid in children if running(pid)] == []


def test_a_folder_that_is_not_a_flower_app_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(flower.flower, ["run", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output == f"error: {tmp_path}: no pyproject.toml, not a Flower app\n"


def test_a_missing_flower_program_names_the_extra_to_install():
    with pytest.raises(flower.FlowerRunError, match=r"pip install 'powertrip\[flower\]'"):
        flower.flower_program("flower-no-such-program")


def test_the_connection_points_flwr_at_the_superlink_this_command_starts(tmp_path):
    flower.write_connection(tmp_path, 40123)
    config = tomllib.loads((tmp_path / "config.toml").read_text())
    assert config["superlink"]["default"] == flower.CONNECTION
    assert config["superlink"][flower.CONNECTION] == {
        "address": "127.0.0.1:40123",
        "insecure": True,
    }


def test_a_superlink_that_cannot_start_fails_the_command_in_one_line_naming_its_log(tmp_path):
    pytest.importorskip("flwr", reason=extra_reason("flower", "flwr"))
    app = tmp_path / "app"
    app.mkdir()
    with socket.socket() as taken:  # the port is taken: the SuperLink cannot listen there
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(flower.FlowerRunError) as failure:
            flower.run_app(app, port=port)
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith(
        f"flower-superlink exited with code 1 before it answered on port {port}"
    )
    assert "address already in use" in message.lower()
