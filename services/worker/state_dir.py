"""The worker's state directory (POWERTRIP_WORKER_STATE_DIR): what a restart needs to rejoin
the run exactly where it left it.

Two files, each replaced atomically:

- ``registration.json``: the run configuration and seed the aggregator handed out at
  registration (PowerTrip mode). A restarted worker rebuilds its sites from it *before* it
  reaches the aggregator, so it can train the next round the moment it is dispatched, and it
  registers as ready at once instead of first withdrawing its sites (a not-ready registration
  would take them out of the next selection and change the run).
- ``site-states.pt``: the hosted sites' local optimizer states (``SiteState``), rewritten after
  each round's local training, before any update leaves, under the run's identity
  (``powertrip.learning.site_state_io``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from powertrip.learning.site_optim import SiteState
from powertrip.learning.site_state_io import (
    SiteStateFileError,
    load_site_states,
    run_identity,
    save_site_states,
    write_atomically,
)

__all__ = ["SavedRun", "SiteStateFileError", "SiteStateStore", "WorkerStateDir"]
logger = logging.getLogger(__name__)

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
        """The run this worker last registered in; None when none was saved. A file that is
        not ours raises ``SiteStateFileError`` naming it (the worker refuses to start)."""
        path = self.directory / REGISTRATION
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            run = SavedRun(str(raw["run_config_json"]), int(raw["run_seed"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SiteStateFileError(f"{path}: unreadable registration ({exc})") from None
        if run.run_seed < 0 or not run.run_config_json:
            raise SiteStateFileError(f"{path}: empty run configuration or negative seed")
        return run

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
    """One run's site-state file: loaded once when the sites are built, saved after each
    round's local training."""

    def __init__(self, path: Path, identity: str) -> None:
        self.path = path
        self.identity = identity

    def load(
        self, shapes: Mapping[str, tuple[int, ...]], hosted: list[int], device: object
    ) -> dict[int, SiteState]:
        """The saved states of ``hosted`` sites; empty (one line logged) for another run's
        file; ``SiteStateFileError`` for a corrupt one."""
        loaded = load_site_states(self.path, self.identity, shapes, hosted, device)  # type: ignore[arg-type]
        if loaded.fresh_because:
            logger.warning(loaded.fresh_because)
        elif loaded.round is not None:
            logger.info(
                "resumed %d sites' optimizer states saved after round %d from %s",
                len(loaded.states),
                loaded.round,
                self.path,
            )
        if loaded.dropped:
            logger.info("dropped the states of sites %s: no longer hosted", list(loaded.dropped))
        return loaded.states

    def save(self, states: Mapping[int, SiteState], round_index: int) -> None:
        save_site_states(self.path, states, self.identity, round_index)
