"""One site trained as a ``torch.distributed`` job over N rank processes, supervised.

``SiteGroup`` spawns the ranks (torch.multiprocessing's *spawn* context; they meet at a
``FileStore`` in the group's temporary directory), keeps them across rounds (each keeps its
model and its optimizer's state) and waits for every round on both the ranks' pipes and their
process sentinels: a rank that dies, fails, or a round past its deadline makes ``train_round``
raise ``RankFailed`` within about a second of it, the remaining ranks are killed, and the next
call starts fresh ranks. After every round the ranks write the optimizer's moments to files
(moments.py) that fresh ranks load, so they carry on where the lost ones stopped, moments, step
count and lr schedule; ``site_state``/``load_state`` move them in and out of the group.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
from torch import nn

from powertrip.config.recipe import LocalOptimizer
from powertrip.config.site_engine import SiteEngineConfig
from powertrip.learning.device import device_name, resolve_device
from powertrip.learning.site_engine.files import (
    TensorFile,
    layout_of,
    memory_dir,
    nbytes,
    save_tokens,
)
from powertrip.learning.site_engine.moments import MomentFiles, export_noted, moment_kinds
from powertrip.learning.site_engine.rank import RankSpec, rank_main
from powertrip.learning.site_engine.result import RankFailed, SiteRoundResult
from powertrip.learning.site_engine.split import check_rows, split_shards
from powertrip.learning.site_optim import SiteState

__all__ = ["RankFailed", "SiteGroup", "SiteRoundResult"]


def _device_type(device: str) -> str:
    """``cpu`` or ``cuda`` for a ``--device`` value (rank r uses ``cuda:r`` whatever index is
    named), checked without creating a CUDA context in the parent, which trains nothing."""
    text = device_name(device)
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text.startswith("cuda") and not torch.cuda.is_available():
        resolve_device(text)  # raises, saying why
    if text == "meta":
        raise ValueError("a site trains on cpu or cuda, not meta")
    return text.split(":")[0]


class SiteGroup:
    """A site's N training ranks, alive across rounds. ``factory()`` builds the model (a
    picklable callable, e.g. ``functools.partial(GPT, vocab, shape, fused_attention=True)``);
    ``x``/``y`` are the site's samples ([n, T] tokens and targets), written once to a
    memory-mapped file every rank reads; ``recipe`` the local optimizer (its lr resolved)."""

    def __init__(
        self,
        factory: Callable[[], nn.Module],
        x: np.ndarray | torch.Tensor,
        y: np.ndarray | torch.Tensor,
        recipe: LocalOptimizer,
        config: SiteEngineConfig | None = None,
        *,
        device: str = "auto",
        site: int | str = 0,
        threads: int | None = None,
        workdir: str | Path | None = None,
        state: SiteState | None = None,
    ) -> None:
        if recipe.lr is None:
            raise ValueError("the recipe's lr must be resolved (LocalOptimizer.with_lr)")
        self.config = config or SiteEngineConfig()
        self.recipe, self.factory, self.site = recipe, factory, str(site)
        self.device_type = _device_type(device)
        ranks = self.config.ranks
        if self.device_type == "cuda" and ranks > torch.cuda.device_count():
            raise ValueError(f"{ranks} ranks need {ranks} GPUs; {torch.cuda.device_count()} seen")
        #: torch threads per rank (the cores shared out: N ranks of all cores each would thrash)
        self.threads = threads or max(1, (os.cpu_count() or 1) // ranks)
        with torch.device("meta"):
            self.layout = layout_of(list(factory().named_parameters()))
        kinds = moment_kinds(recipe) if self.config.keep_moments else ()
        model_bytes = 4 * sum(math.prod(shape) for _, shape in self.layout)
        need = (2 + len(kinds)) * model_bytes + nbytes(x) + nbytes(y)
        where = workdir if workdir is not None else memory_dir(need)
        self._dir = Path(tempfile.mkdtemp(prefix=f"powertrip-site-{self.site}-", dir=where))
        self._cleanup = weakref.finalize(self, _remove, [], self._dir)
        self.num_rows = save_tokens(self._dir, x, y)
        self._global = TensorFile(self._dir / "global.f32", self.layout, create=True)
        self._delta = TensorFile(self._dir / "delta.f32", self.layout, create=True)
        self._moments = MomentFiles(self._dir, self.layout, kinds, create=True)
        self._saved: int | None = None  # the moment files' step count (None: none usable)
        self._moment_step = 0  # steps since the ranks' moments began
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._generation = 0
        self._closed = False
        self._fresh = True  # the ranks' moments are not the site's (none, or replaced)
        self.step = 0  #: the site's cumulative local steps (its schedule's position)
        self.rounds = 0  #: rounds trained (successfully or not)
        if state is not None:
            self.load_state(state)

    # -- the optimizer's state ----------------------------------------------------------------
    @property
    def site_state(self) -> SiteState:
        """The site's optimizer state after its last round (copies of the moment files:
        ``SiteOptimizer``'s kinds and shapes, none for plain sgd or ``keep_moments=False``)."""
        return self._moments.state(self.step, 0 if self._saved is None else self._saved)

    def load_state(self, state: SiteState) -> None:
        """Resume ``state`` (e.g. a saved ``site_state``): the step count now, the moments at the
        next round (the ranks load them from the files; none given: they start afresh)."""
        self.step, self._fresh = int(state.step), True
        self._saved = self._moments.write(state) if self._moments and state.moments else None

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return bool(self._procs)

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids (empty while none runs)."""
        return [p.pid for p in self._procs if p.pid is not None]

    def start(self, timeout_s: float | None = None) -> None:
        """Spawn the ranks and wait until each has built its model and joined the group (done
        by ``train_round`` when needed; call it to pay the start-up before the first round)."""
        if self.running:
            return
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        self._generation += 1
        store = self._dir / f"store.{self._generation}"
        spec = RankSpec(
            self.site,
            self.config.ranks,
            self.factory,
            self.recipe,
            self.config,
            self.device_type,
            str(self._dir),
            str(store),
            self.layout,
            self.threads,
        )
        for rank in range(self.config.ranks):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=rank_main, args=(rank, spec, theirs), name=f"site{self.site}-rank{rank}"
            )
            proc.start()
            theirs.close()
            self._procs.append(proc)
            self._conns.append(mine)
        self._cleanup.detach()
        self._cleanup = weakref.finalize(self, _remove, list(self._procs), self._dir)
        self._fresh = True
        deadline = time.monotonic() + (timeout_s or self.config.timeout_s)
        self._collect("ready", deadline, "starting", self.rounds)

    def close(self) -> None:
        """End the ranks (asked to, then killed if they linger) and remove the group's files."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(("close", None))
        end = time.monotonic() + 10
        for p in self._procs:
            p.join(max(0.1, end - time.monotonic()))
        self._kill()
        self._closed = True
        self._global.close()
        self._delta.close()
        self._moments.close()
        self._cleanup()

    def __enter__(self) -> SiteGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5)
        if export_noted(self._conns):  # a rank began writing the moments before it died
            self._saved = None
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []

    # -- a round ------------------------------------------------------------------------------
    def train_round(
        self,
        global_params: Mapping[str, torch.Tensor],
        rows: np.ndarray,
        state_reset: bool = False,
        *,
        first_step: int | None = None,
        deadline_s: float | None = None,
        round_index: int | None = None,
    ) -> SiteRoundResult:
        """Train the site from ``global_params`` (host tensors, the model's names and shapes)
        over ``rows`` ([steps, B] indices into the site's samples, -1 padding: e.g. a
        ``site_schedule`` mapped through the site's partition). ``state_reset``: fresh
        optimizer moments this round; ``first_step``: the site's cumulative step count to
        resume the schedule at (default: the group's own count, ``self.step``);
        ``deadline_s``: RankFailed when the round (start-up excluded) takes longer."""
        started = time.perf_counter()
        if self._closed:
            raise RuntimeError(f"site {self.site}: the group is closed")
        r = check_rows(rows, self.num_rows)
        index = self.rounds if round_index is None else round_index
        self.rounds += 1
        self._global.write(global_params)
        first = self.step if first_step is None else int(first_step)
        self.start()
        reset = state_reset or not self.recipe.keep_state
        load = self._saved if self._fresh and not reset else None
        fresh = reset or (self._fresh and load is None)
        payload = {"rows": r, "first_step": first, "reset": fresh, "load": load}
        base = 0 if fresh else self._moment_step if load is None else load
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(("round", payload))
            except OSError as exc:  # its end of the pipe is gone: the rank exited or is exiting
                proc = self._procs[rank]
                proc.join(1)
                self._fail(rank, f"exited ({exc}; code {proc.exitcode})", index, "training")
        replies = self._collect("done", deadline, "training", index)
        self._fresh = False
        self.step = first + r.shape[0]
        self._moment_step = base + r.shape[0]
        self._saved = self._moment_step if self._moments else None
        delta = {name: t.clone() for name, t in self._delta.tensors.items()}
        return SiteRoundResult(
            delta=delta,
            loss=float(replies[0]["loss"]),
            steps=int(r.shape[0]),
            num_samples=int(np.unique(r[r >= 0]).size),
            seconds=time.perf_counter() - started,
            shards=split_shards(delta, self.config.ranks),
            fresh_state=fresh,
            first_step=first,
            rank_cpu_seconds=tuple(float(r["cpu_s"]) for r in replies),
        )

    def _collect(self, kind: str, deadline: float | None, doing: str, index: int) -> list:
        """Every rank's ``kind`` reply, watching their pipes and process sentinels."""
        replies: dict[int, object] = {}
        by_obj: dict[object, int] = {c: r for r, c in enumerate(self._conns)}
        by_obj.update((p.sentinel, r) for r, p in enumerate(self._procs))
        while len(replies) < len(self._conns):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._fail(None, "missed the round's deadline", index, doing)
            pending = [c for r, c in enumerate(self._conns) if r not in replies]
            ready = wait(pending + [p.sentinel for p in self._procs], left)
            for obj in sorted(ready, key=lambda o: isinstance(o, int)):  # pipes, then sentinels
                rank = by_obj[obj]
                if not isinstance(obj, int):  # a process sentinel is an int
                    try:
                        got, payload = self._conns[rank].recv()
                    except (EOFError, OSError):
                        continue  # its sentinel says why
                    if got == "error":
                        if (dead := self._died_first(rank)) is not None:
                            self._fail(dead, self._exit_reason(dead), index, doing)
                        last = str(payload).strip().splitlines()[-1]
                        self._fail(rank, f"failed ({last})\n{payload}", index, doing)
                    if got == "exporting":  # the moment files are being overwritten
                        self._saved = None
                    if got == kind:
                        replies[rank] = payload
                else:  # a rank's process ended: the group cannot go on without it
                    self._fail(rank, self._exit_reason(rank), index, doing)
        return [replies[r] for r in range(len(self._conns))]

    def _exit_reason(self, rank: int) -> str:
        proc = self._procs[rank]
        proc.join(1)
        return f"exited with code {proc.exitcode}"

    def _died_first(self, reporter: int, grace_s: float = 1.0) -> int | None:
        """The rank whose death made ``reporter``'s collective fail, if any: a peer that ended
        without reporting an error itself (killed, or exited on its own). A survivor's gloo error
        ("Connection reset by peer") can reach its pipe before the dead rank's sentinel fires, so
        the peers get ``grace_s`` to show their exit before the reporter is blamed."""
        peers = [p for r, p in enumerate(self._procs) if r != reporter]
        wait([p.sentinel for p in peers], grace_s)
        for rank, proc in enumerate(self._procs):
            if rank == reporter or proc.is_alive():
                continue
            conn = self._conns[rank]
            reported = False
            with contextlib.suppress(EOFError, OSError):
                while conn.poll():
                    reported |= conn.recv()[0] == "error"
            if not reported:
                return rank
        return None

    def _fail(self, rank: int | None, reason: str, index: int, doing: str) -> NoReturn:
        self._kill()
        raise RankFailed(self.site, rank, index, reason, starting=doing == "starting")


def _remove(procs: list, directory: Path) -> None:
    """The group's last resort (garbage collection, interpreter exit): kill, then delete."""
    for p in procs:
        with contextlib.suppress(Exception):
            if p.is_alive():
                p.kill()
    shutil.rmtree(directory, ignore_errors=True)
