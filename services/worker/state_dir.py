"""The worker's state directory (POWERTRIP_WORKER_STATE_DIR): what a restart needs to rejoin
the run exactly where it left it.

Two files, each replaced atomically:

- ``registration.json``: the run configuration and seed the aggregator handed out at
  registration (PowerTrip mode). A restarted worker rebuilds its sites from it *before* it
  reaches the aggregator, so it can train the next round the moment it is dispatched, and it
  registers as ready at once instead of first withdrawing its sites (a not-ready registration
  would take them out of the next selection and change the run).
- ``site-states.pt``: the hosted sites' ``SiteStateBook`` (their local optimizer states and
  their codec residuals), rewritten after each round's local training, before any update
  leaves, under the run's identity (``powertrip.learning.site_state_io``'s file).

Both are data, not trust: a file that is damaged, empty, not ours or another run's, and a site
whose saved state is wrong (a bad step count, another model's shapes, non-finite moments), is
set aside (renamed ``<name>.bad-<UTC time>``) with one line saying which file and why; what it
held starts fresh and the worker keeps serving. Refusing to start would only have a restart
policy start it again onto the same file. A freshly trained state that is not finite is never
kept nor saved (``SiteStateBook.record_trained``).

Every host keeps its sites' state through one ``WorkerBook``: the book, the run's codec over
its residuals, and this file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from powertrip.codecs import ErrorFeedback, get_codec
from powertrip.config.codecs import CodecSettings
from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.site_optim import SiteState
from powertrip.learning.site_state_io import run_identity, write_atomically
from powertrip.learning.state_book import RoundKey, SiteStateBook, aside
from powertrip.services.worker.site_host import SiteUpdate

__all__ = ["ROUNDS_KEPT", "SavedRun", "SiteStateStore", "WorkerBook", "WorkerStateDir"]
logger = logging.getLogger(__name__)

#: rounds of history kept per site: the one a resumed aggregator may redo (its checkpoint of
#: round r is written while round r+1 trains, and a crash in that write redoes round r after
#: r+1), the one before it, and the newest
ROUNDS_KEPT = 3

REGISTRATION = "registration.json"
STATES = "site-states.pt"


@dataclass(frozen=True)
class SavedRun:
    """The run a worker was registered in: what its sites are built from."""

    run_config_json: str
    run_seed: int

    @property
    def identity(self) -> str:
        return run_identity(self.run_config_json, self.run_seed)


class WorkerStateDir:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    # -- the registration ------------------------------------------------------------------
    def saved_run(self) -> SavedRun | None:
        """The run this worker last registered in; None when none was saved, or when the file
        cannot be used: it is set aside with one line saying why, and the worker fetches the
        run from the aggregator as a fresh one does."""
        path = self.directory / REGISTRATION
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            run = SavedRun(str(raw["run_config_json"]), int(raw["run_seed"]))
        except OSError as exc:
            why = f"cannot be read ({exc.strerror or exc})"
        except (ValueError, KeyError, TypeError, AttributeError):
            why = "empty" if path.stat().st_size == 0 else "not a registration (damaged or cut)"
        else:
            if run.run_seed >= 0 and run.run_config_json:
                return run
            why = "an empty run configuration or a negative seed"
        logger.warning("%s; this worker fetches its run from the aggregator", aside(path, why))
        return None

    def save_run(self, run: SavedRun) -> None:
        body = {"run_config_json": run.run_config_json, "run_seed": run.run_seed}
        write_atomically(self.directory / REGISTRATION, json.dumps(body).encode())

    def forget(self) -> None:
        """Drop everything saved (another run: nothing here applies to it)."""
        for name in (REGISTRATION, STATES):
            (self.directory / name).unlink(missing_ok=True)

    # -- the sites' optimizer states -------------------------------------------------------
    def store(self, run: SavedRun) -> SiteStateStore:
        return SiteStateStore(self.directory / STATES, run.identity)


class SiteStateStore:
    """One run's site-state file: a host's book is loaded from it once when the sites are
    built, and saved to it after each round's local training."""

    def __init__(self, path: Path, identity: str) -> None:
        self.path = path
        self.identity = identity

    def load(self, book: SiteStateBook, hosted: Sequence[int], device: torch.device | str) -> None:
        """The saved entries of ``hosted`` sites that can be trusted, into ``book`` (what
        cannot is set aside with one warning line: ``SiteStateBook.load``)."""
        book.load(self.path, self.identity, hosted, device)

    def save(self, book: SiteStateBook, round_index: int) -> None:
        book.save(self.path, self.identity, round_index)


class WorkerBook:
    """A host's sites' state: their ``SiteStateBook`` (``ROUNDS_KEPT`` rounds each, so a round
    redone starts from what the site had before it), the run's codec over their residuals,
    and the state file (``store``) it is saved to after every round and resumed from.

    ``keeps``: whether the sites' optimizer states are kept (the host's rule for its recipe);
    the file is used when they are, or when the codec keeps residuals."""

    def __init__(
        self,
        recipe: LocalOptimizer,
        shapes: Mapping[str, tuple[int, ...]],
        keeps: bool,
        codec: str = "none",
        error_feedback: bool = True,
        store: SiteStateStore | None = None,
        hosted: Sequence[int] = (),
        device: torch.device | str = "cpu",
    ) -> None:
        self.book = SiteStateBook(recipe, shapes, depth=ROUNDS_KEPT)
        self.keeps = keeps
        self.codec = None if codec == "none" else get_codec(codec)
        self.feedback = (
            None if self.codec is None else ErrorFeedback(self.codec, error_feedback, self.book)
        )
        carried = keeps or (self.feedback is not None and error_feedback)
        self.store = store if carried else None
        if self.store is not None:
            self.store.load(self.book, hosted, device)

    @classmethod
    def for_sites(
        cls,
        recipe: LocalOptimizer,
        params: Mapping[str, Any],
        keeps: bool,
        run: CodecSettings,
        store: SiteStateStore | None,
        hosted: Sequence[int],
    ) -> WorkerBook:
        """The book of the ``hosted`` sites of a model with ``params``' shapes, on their device
        (a host's numpy template: the CPU), under ``run``'s codec."""
        first = next(iter(params.values()))
        return cls(
            recipe,
            {k: tuple(v.shape) for k, v in params.items()},
            keeps,
            run.codec,
            run.error_feedback,
            store,
            hosted,
            first.device if isinstance(first, torch.Tensor) else "cpu",
        )

    @property
    def site_states(self) -> dict[int, SiteState] | None:
        """Each site's newest optimizer state (None: the host keeps none)."""
        return self.book.states() if self.keeps else None

    def resumed(self, sites: Sequence[int], key: RoundKey) -> list[SiteState | None] | None:
        """The states ``sites`` start round ``key`` from (None: the host keeps none)."""
        return [self.book.for_round(s, key) for s in sites] if self.keeps else None

    def trained(
        self, sites: Sequence[int], key: RoundKey, states: Sequence[SiteState] | None
    ) -> list[SiteState] | None:
        """Record the states ``sites`` trained to in round ``key``: those kept (a non-finite
        one replaced by fresh moments), or None when the host keeps none."""
        if not self.keeps or states is None:
            return None
        return self.book.record_trained(sites, key, states)

    def leaving(
        self, updates: Sequence[SiteUpdate], key: RoundKey, round_index: int
    ) -> list[SiteUpdate]:
        """``updates`` as they leave: coded with the run's codec and each site's residual (a
        site trained over ranks, each of its shards on its own), after which the book is
        saved: before any update leaves, so a commit implies it."""
        out = list(updates)
        if self.feedback is not None and self.codec is not None:
            feedback, name = self.feedback, self.codec.name
            out = [
                replace(
                    u,
                    delta={},
                    shards=feedback.encode_shards(u.site, u.delta, len(u.shards), key),
                    codec=name,
                )
                if u.shards
                else replace(u, delta=feedback.encode(u.site, u.delta, key), codec=name)
                for u in out
            ]
        if self.store is not None:
            self.store.save(self.book, round_index)
        return out
