"""One book of what each site carries from one of its rounds to the next.

Per site: its local optimizer's state (``SiteState``: the moments and the step count, which
places it in the recipe's schedule) and its error-feedback residual (what the update codec has
not sent yet, added to its next update). The emulator, the curtailment learner and every
worker host keep their sites' state here, so what a site resumes is decided in one place
(``for_round``: the whole state, or only the step count when the recipe resets its moments
every round) and what is read back from a file or a checkpoint is checked in one place
(``site_state_io.read_entry``: finite, the model's shapes, a step count in range, the moment
kinds the recipe's rule plans for each tensor).

Rounds are keyed ``(round, sub-round)``: a partitioned round is ``(r, 0)``; a curtailment
round trains its sites in sub-rounds ``(r, s)``, and a site trained earlier in the same round
carries its state on as it is. A worker is asked to train a round again when the aggregator
resumed from a checkpoint taken before it (it was killed mid-round): the redo must start from
what the site had before the round, not after it, so a worker's book keeps the site's last
``depth`` rounds (the emulator's needs only the newest).

On disk the book is ``site_state_io``'s file (one entry per site, the residual beside the
moments); the rank engine's moment files (``site_engine.moments``) are the ranks' own form of a
site's state: their zero moments of the kinds a tensor does not keep are dropped where a state
leaves the book (``state_dict``, ``save``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.optimizers.registry import rule_for
from powertrip.learning.site_optim import SiteState
from powertrip.learning.site_state_io import (
    Kinds,
    LoadedStates,
    Residual,
    entry_payload,
    load_site_states,
    read_entry,
    save_site_states,
    set_aside,
)
from powertrip.sites.profiles import site_id

__all__ = ["LOADED", "RoundKey", "SiteEntry", "SiteStateBook", "aside", "round_key"]

logger = logging.getLogger(__name__)

#: (round, sub-round): when a site's entry was written
RoundKey = tuple[int, int]
#: the key of what was read from a file: before any round this process trains
LOADED: RoundKey = (-1, -1)


def round_key(round_index: int, sub_round: int = 0) -> RoundKey:
    return (int(round_index), int(sub_round))


@dataclass(frozen=True)
class SiteEntry:
    """A site's state after one of its rounds: its optimizer state (None: the recipe keeps
    none) and its error-feedback residual (None: none yet)."""

    state: SiteState | None = None
    residual: Residual | None = None

    @property
    def step(self) -> int:
        """The site's cumulative local steps (0 while its recipe counts none)."""
        return 0 if self.state is None else int(self.state.step)


class _Keep(Enum):
    KEEP = "keep"


_KEEP = _Keep.KEEP  # ``update``'s default: the field as it was


class SiteStateBook:
    """Every site's ``SiteEntry`` over its last ``depth`` rounds. ``recipe``: the local
    optimizer the states are of (None: no optimizer state, residuals only); ``shapes``: the
    model's tensors, by which a loaded entry is checked."""

    def __init__(
        self,
        recipe: LocalOptimizer | None = None,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        *,
        depth: int = 1,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.recipe = recipe
        self.shapes = None if shapes is None else {n: tuple(s) for n, s in shapes.items()}
        self.depth = depth
        self._log: dict[int, list[tuple[RoundKey, SiteEntry]]] = {}
        self._warned: set[tuple[int, RoundKey]] = set()

    # -- reading ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._log)

    def __contains__(self, site: object) -> bool:
        return site in self._log

    def entry(self, site: int, key: RoundKey | None = None) -> tuple[RoundKey, SiteEntry] | None:
        """``site``'s newest entry written before round ``key`` (None: its newest) and its key;
        None when it has none, or (one warning line) when ``key`` is older than its history."""
        log = self._log.get(site, [])
        if key is None:
            return log[-1] if log else None
        before = [(k, e) for k, e in log if k < key]
        if before:
            return before[-1]
        if len(log) == self.depth and (site, key) not in self._warned:
            self._warned.add((site, key))
            logger.warning(
                "%s: round %d is older than its kept optimizer states (rounds %s); it starts "
                "this round fresh",
                site_id(site),
                key[0],
                [k[0] for k, _ in log],
            )
        return None

    def for_round(self, site: int, key: RoundKey | None = None) -> SiteState | None:
        """The optimizer state ``site`` starts round ``key`` from (None: its next round): its
        newest from before it, as it is when from the same round (a curtailment sub-round),
        else what the recipe carries into a new round (``SiteState.for_round``). The one
        place a state is resumed. None: a fresh start."""
        found = self.entry(site, key)
        if found is None or found[1].state is None:
            return None
        written, e = found
        assert e.state is not None
        if (key is not None and written[0] == key[0]) or self.recipe is None:
            return e.state
        return e.state.for_round(self.recipe)

    def residual(self, site: int, key: RoundKey | None = None) -> Residual | None:
        """The residual ``site``'s update in round ``key`` adds (None: none)."""
        found = self.entry(site, key)
        return None if found is None else found[1].residual

    def step(self, site: int) -> int:
        """``site``'s cumulative local steps (0: never trained or none counted)."""
        found = self.entry(site)
        return 0 if found is None else found[1].step

    def latest(self) -> dict[int, SiteEntry]:
        """Each site's newest entry."""
        return {site: log[-1][1] for site, log in self._log.items()}

    def states(self) -> dict[int, SiteState]:
        """Each site's newest optimizer state (sites with none left out)."""
        return {s: e.state for s, e in self.latest().items() if e.state is not None}

    # -- writing ------------------------------------------------------------------------------
    def update(
        self,
        site: int,
        key: RoundKey | None = None,
        *,
        state: SiteState | None | _Keep = _KEEP,
        residual: Residual | None | _Keep = _KEEP,
    ) -> None:
        """``site``'s state after round ``key`` (None: its newest entry's round): the fields
        given replace those of its entry of that round, or of the newest before it. It
        supersedes the site's entries from that round on (a round redone) and its earlier
        sub-rounds of the same round."""
        log = self._log.get(site, [])
        if key is None:
            key = log[-1][0] if log else round_key(0)
        same = next((e for k, e in log if k == key), None)
        before = [e for k, e in log if k < key]
        base = same or (before[-1] if before else SiteEntry())
        new = SiteEntry(
            base.state if isinstance(state, _Keep) else state,
            base.residual if isinstance(residual, _Keep) else residual,
        )
        kept = [(k, e) for k, e in log if k < key and k[0] != key[0]]
        self._log[site] = [*kept, (key, new)][-self.depth :]

    def record_trained(
        self, sites: Sequence[int], key: RoundKey, states: Sequence[SiteState]
    ) -> list[SiteState]:
        """Each site's freshly trained state after round ``key``, checked as a loaded one is:
        a state that cannot be kept (non-finite moments: every update trained from it would be
        NaN, round after round) is replaced by fresh moments at the same step count (one line
        says so) and is never saved. The states kept, in ``sites``' order."""
        kept = []
        for site, state in zip(sites, states, strict=True):
            why = state.problem()
            if why is not None:
                logger.warning(
                    "%s: its optimizer state after round %d is not kept nor saved (%s); its "
                    "moments start fresh in its next round",
                    site_id(site),
                    key[0],
                    why,
                )
                state = state.fresh_moments()
            self.update(site, key, state=state)
            kept.append(state)
        return kept

    # -- checkpoints and files ----------------------------------------------------------------
    def state_dict(self) -> dict[int, dict[str, Any]]:
        """Each site's newest entry as ``site_state_io`` saves it (host tensors)."""
        return {
            site: entry_payload(self._conformed(e.state), e.residual)
            for site, e in sorted(self.latest().items())
        }

    def load_state_dict(
        self, entries: Mapping[int, object], device: torch.device | str = "cpu"
    ) -> None:
        """Resume ``state_dict()``'s value (each entry checked as a file's is); ValueError
        naming the site and why when one cannot be resumed (the book is left unchanged)."""
        if self.shapes is None:
            raise ValueError("a book without the model's shapes cannot check what it loads")
        read: dict[int, SiteEntry] = {}
        for site, raw in entries.items():
            got = read_entry(raw, self.shapes, self._kinds())
            if isinstance(got, str):
                raise ValueError(f"site state of {site_id(int(site))}: {got}")
            state, residual = got
            read[int(site)] = SiteEntry(_to(state, device), residual)
        self._log = {site: [(LOADED, e)] for site, e in read.items()}

    def save(self, path: Path, identity: str, round_index: int) -> None:
        """Every site's newest entry to ``path`` (``site_state_io``'s file, replaced
        atomically) under the run's ``identity``, as saved after ``round_index``."""
        latest = self.latest()
        states = {s: self._conformed(e.state) for s, e in latest.items()}
        residuals = {s: e.residual for s, e in latest.items() if e.residual}
        save_site_states(path, states, identity, round_index, residuals)

    def load(
        self,
        path: Path,
        identity: str,
        hosted: Collection[int],
        device: torch.device | str = "cpu",
    ) -> LoadedStates:
        """Resume the ``hosted`` sites' entries saved at ``path`` for this run, each checked
        (``read_entry``). Never raises for what the file holds: a file or entry that cannot be
        trusted is set aside (renamed ``<name>.bad-<UTC time>``) with one warning line saying
        which file, why and which sites start fresh; the entries it did not spoil are resumed
        and written back at once, so a second restart before the next round still finds them."""
        if self.shapes is None:
            raise ValueError("a book without the model's shapes cannot check what it loads")
        loaded = load_site_states(path, identity, self.shapes, hosted, device, self._kinds())
        for site, state in loaded.states.items():
            entry = SiteEntry(state, loaded.residuals.get(site))
            self._log[site] = [(LOADED, entry)]  # from before this process: any round's start
        if not loaded.trusted:
            logger.warning(_set_aside_line(path, loaded, hosted))
            if loaded.states and loaded.round is not None:
                try:
                    save_site_states(path, loaded.states, identity, loaded.round, loaded.residuals)
                except OSError as exc:  # the next round's save tries again
                    logger.warning("%s: the resumed states not written back: %s", path, exc)
        elif loaded.round is not None:
            logger.info(
                "resumed %d sites' optimizer states saved after round %d from %s",
                len(loaded.states),
                loaded.round,
                path,
            )
        if loaded.dropped:
            logger.info("dropped the states of sites %s: no longer hosted", list(loaded.dropped))
        return loaded

    # -- the recipe's plan --------------------------------------------------------------------
    def _kinds(self) -> Kinds | None:
        """The moment kinds each tensor keeps under the recipe (None: no recipe)."""
        if self.recipe is None or self.shapes is None:
            return None
        plan = rule_for(self.recipe).moments(self.recipe, self.shapes)
        return {n: tuple(k.name for k in kinds) for n, kinds in plan.items()}

    def _conformed(self, state: SiteState | None) -> SiteState | None:
        """``state`` with only the moments the recipe's rule keeps for each tensor: the rank
        engine's files hold every kind for every tensor (zero where a tensor keeps none)."""
        kinds = self._kinds()
        if state is None or kinds is None:
            return state
        moments = {
            n: {k: t for k, t in m.items() if k in kinds.get(n, ())}
            for n, m in state.moments.items()
        }
        if all(len(moments[n]) == len(m) for n, m in state.moments.items()):
            return state
        return SiteState(state.step, moments, state.moment_step)


def _to(state: SiteState, device: torch.device | str) -> SiteState:
    moments = {n: {k: t.to(device) for k, t in m.items()} for n, m in state.moments.items()}
    return SiteState(int(state.step), moments, state.moment_step)


def _set_aside_line(path: Path, loaded: LoadedStates, hosted: Collection[int]) -> str:
    """Set the file aside; the one line that says so, why, and what starts fresh."""
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
    line = f"{aside(path, why)}; {_names(fresh)} {verb} fresh"
    if loaded.states:
        line += f", {_names(sorted(loaded.states))} resumed from round {loaded.round}"
    return line


def aside(path: Path, why: str) -> str:
    """Set ``path`` aside; the start of the line saying so."""
    try:
        return f"{path} set aside as {set_aside(path).name}: {why}"
    except OSError as exc:  # not renamed: it is overwritten by the next save, never read again
        return f"{path} ({why}) could not be set aside ({exc.strerror or exc}); it is ignored"


def _names(sites: list[int]) -> str:
    return ", ".join(site_id(s) for s in sites) if sites else "no sites"
