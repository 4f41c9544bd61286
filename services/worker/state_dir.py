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

Both are data, not trust: a file that is damaged, empty, not ours or another run's, and a site
whose saved state is wrong (a bad step count, another model's shapes, non-finite moments), is
set aside (renamed ``<name>.bad-<UTC time>``) with one line saying which file and why; what it
held starts fresh and the worker keeps serving. Refusing to start would only have a restart
policy start it again onto the same file. A freshly trained state that is not finite is never
kept nor saved (``kept_after_training``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from powertrip.learning.site_optim import SiteState
from powertrip.learning.site_state_io import (
    LoadedStates,
    load_site_states,
    run_identity,
    save_site_states,
    set_aside,
    write_atomically,
)
from powertrip.sites.profiles import site_id

if TYPE_CHECKING:
    import torch

__all__ = ["SavedRun", "SiteStateStore", "WorkerStateDir", "kept_after_training"]
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
        logger.warning("%s; this worker fetches its run from the aggregator", _aside(path, why))
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
    """One run's site-state file: loaded once when the sites are built, saved after each
    round's local training."""

    def __init__(self, path: Path, identity: str) -> None:
        self.path = path
        self.identity = identity

    def load(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        hosted: list[int],
        device: torch.device | str,
    ) -> dict[int, SiteState]:
        """The saved states of ``hosted`` sites that can be trusted. A file or entry that
        cannot is set aside with one warning line (which file, why, which sites start fresh);
        the sites it did not spoil are resumed and written back at once, so a second restart
        before the next round still finds them."""
        loaded = load_site_states(self.path, self.identity, shapes, hosted, device)
        if not loaded.trusted:
            logger.warning(self._set_aside(loaded, hosted))
            if loaded.states and loaded.round is not None:
                try:
                    self.save(loaded.states, loaded.round)
                except OSError as exc:  # the next round's save tries again
                    logger.warning("%s: the resumed states not written back: %s", self.path, exc)
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

    def _set_aside(self, loaded: LoadedStates, hosted: list[int]) -> str:
        """Rename the file aside; the one line that says so, why, and what starts fresh."""
        if loaded.unusable is not None:
            why, fresh = loaded.unusable, sorted(hosted)
        else:
            fresh = sorted(loaded.refused)
            reasons = set(loaded.refused.values())
            if len(reasons) == 1:  # the sites are named once, below
                why = reasons.pop()
            else:
                why = "; ".join(f"{site_id(s)}: {r}" for s, r in sorted(loaded.refused.items()))
        verb = "start" if len(fresh) > 1 else "starts"
        line = f"{_aside(self.path, why)}; {_names(fresh)} {verb} fresh"
        if loaded.states:
            line += f", {_names(sorted(loaded.states))} resumed from round {loaded.round}"
        return line

    def save(self, states: Mapping[int, SiteState], round_index: int) -> None:
        save_site_states(self.path, states, self.identity, round_index)


def kept_after_training(site: int, round_index: int, state: SiteState) -> SiteState:
    """``state`` when it can be kept; a state that cannot (non-finite moments: every update
    trained from it would be NaN, round after round) is neither kept nor saved: the site keeps
    its schedule's position and its moments start fresh next round, and one line says so."""
    why = state.problem()
    if why is None:
        return state
    logger.warning(
        "%s: its optimizer state after round %d is not kept nor saved (%s); its moments start "
        "fresh in its next round",
        site_id(site),
        round_index,
        why,
    )
    return state.fresh_moments()


def _aside(path: Path, why: str) -> str:
    """Set ``path`` aside; the start of the line saying so."""
    try:
        return f"{path} set aside as {set_aside(path).name}: {why}"
    except OSError as exc:  # not renamed: it is overwritten by the next save, never read again
        return f"{path} ({why}) could not be set aside ({exc.strerror or exc}); it is ignored"


def _names(sites: list[int]) -> str:
    return ", ".join(site_id(s) for s in sites) if sites else "no sites"
