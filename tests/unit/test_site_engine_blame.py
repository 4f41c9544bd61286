"""Which rank a failed round blames when one rank's death makes its peer's collective fail.

Under load, a survivor's gloo error ("Connection reset by peer") can be read from its pipe before
the dead rank's process sentinel is: the round must still name the rank that died and how, not
the survivor. Real processes stand in for the ranks, and the test fixes the order of the two
events (the error in the pipe, then the death) rather than leaving it to the scheduler."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

from powertrip.learning.site_engine import RankFailed, SiteGroup

CTX = mp.get_context("fork")  # the stand-ins import nothing: no need to pay for a spawn


def _survivor(conn, go) -> None:
    """On ``go``, reports a failed collective as a rank does, then waits to be ended."""
    go.wait()
    conn.send(("error", "Traceback ...\nRuntimeError: Connection reset by peer"))
    signal.pause()


def _victim(conn, go, code: int) -> None:
    """On ``go``, exits with ``code`` without a word; or waits to be killed."""
    go.wait()
    os._exit(code)


def _group(*ranks) -> tuple[SiteGroup, list]:
    """A SiteGroup holding only the ranks' processes and pipes: enough for its failure path."""
    group = object.__new__(SiteGroup)
    group.site, group._saved = "3", None
    group._procs, group._conns = [], []
    events = []
    for target, *args in ranks:
        parent, child = CTX.Pipe()
        go = CTX.Event()
        proc = CTX.Process(target=target, args=(child, go, *args), daemon=True)
        proc.start()
        group._procs.append(proc)
        group._conns.append(parent)
        events.append(go)
    return group, events


@pytest.mark.parametrize("code", [-9, 3])
def test_a_peers_error_read_before_the_dead_ranks_exit_blames_the_dead_rank(code):
    group, (survivor_go, victim_go) = _group((_survivor,), (_victim, 3))
    survivor_go.set()
    assert group._conns[0].poll(60)  # the survivor's error is waiting in its pipe ...
    if code == -9:
        os.kill(group._procs[1].pid, signal.SIGKILL)
    else:
        victim_go.set()
    group._procs[1].join(60)  # ... and the victim is gone: both are ready at once
    with pytest.raises(RankFailed) as failed:
        group._collect("done", None, "training", 7)
    assert failed.value.rank == 1
    assert str(failed.value) == f"site 3: rank 1 exited with code {code} during round 7"


def test_a_rank_that_fails_while_its_peers_live_on_is_the_one_blamed():
    group, (survivor_go, _) = _group((_survivor,), (_victim, 3))
    survivor_go.set()
    with pytest.raises(RankFailed, match=r"^site 3: rank 0 failed \(RuntimeError: Connection"):
        group._collect("done", None, "training", 7)
    assert all(not p.is_alive() for p in group._procs) or not group._procs  # the peers ended
