"""One emulated training run: a policy picks sites, they train, FedAvg, evaluate, the clock moves.

Training is a deterministic function of the sequence of selected site sets (every site's batch
order is seeded by run seed, round and site id), so runs of different policies that pick the same
sets share their training through a ``TrajectoryCache``: select-all, static-100 and the two
centralized baselines train once, and the first rounds of policies that start alike are reused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from powertrip.aggregation.fedavg import delta_sketch, sketch_stride
from powertrip.aggregation.outer_step import NesterovOuter, outer_for
from powertrip.aggregation.robust import Aggregation
from powertrip.aggregation.robust_fedavg import AdaptiveBound
from powertrip.codecs import ErrorFeedback, get_codec
from powertrip.config.hostile import HostileSettings
from powertrip.config.outer import OuterSettings
from powertrip.learning.batch_orders import site_seeds
from powertrip.learning.device import TorchParams, to_numpy, to_torch
from powertrip.learning.params import NumpyParams
from powertrip.learning.site_params import running_statistics
from powertrip.learning.state_book import SiteStateBook, round_key
from powertrip.learning.trainer import SiteTrainer
from powertrip.rounds.clock import EmulatedClock
from powertrip.rounds.hostile import hostile_sites, poison
from powertrip.rounds.loop import (
    RoundOutcome,
    RoundRecord,
    RunResult,
    TimeModel,
    run_rounds,
)
from powertrip.rounds.outcome import evaluate_half_model, round_outcome
from powertrip.rounds.trajectory_cache import TrajectoryCache, chain_key
from powertrip.selection.base import SelectionPolicy
from powertrip.sites.forecast import Forecaster
from powertrip.sites.profiles import LinkSource, PowerSource, SiteProfile, SiteSet, profile_at

__all__ = ["EmulatedRun", "Emulator", "Federation", "RoundRecord", "RunResult", "TimeModel"]
__all__ += ["TrajectoryCache"]


@dataclass(frozen=True)
class Federation:
    """The learning side of a run: data partitioned over sites, a model and its trainer."""

    trainer: SiteTrainer
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    partitions: list[np.ndarray]
    initial_params: TorchParams


@dataclass
class EmulatedRun(RunResult):
    """A run of the emulator, with ``model``: the final global model as the workload model's
    ``state_dict`` (CPU copies), for ``model.load_state_dict(run.model)``. Entries FedAvg does
    not average (integer buffers: BatchNorm's ``num_batches_tracked``) keep their initial
    values. A study keeps it only when asked (``run_study(..., keep_models=...)``)."""

    model: dict[str, torch.Tensor] | None = None


def _compressed(
    stacked: NumpyParams, sites: list[int], feedback: ErrorFeedback, round_index: int
) -> NumpyParams:
    """Each site's row of ``stacked`` as the server decodes it (rows in ``sites``' order)."""
    out = {name: np.empty_like(d) for name, d in stacked.items()}
    key = round_key(round_index)
    for row, site in enumerate(sites):
        decoded = feedback.apply(site, {name: d[row] for name, d in stacked.items()}, key)
        for name, d in decoded.items():
            out[name][row] = d
    return out


def site_seed(run_seed: int, round_index: int, site: int) -> int:
    """A site's local batch order depends only on (run, round, site), never on its peers."""
    return int(np.random.SeedSequence([run_seed, round_index, site]).generate_state(1)[0])


class Emulator:
    """The in-process executor: all selected sites train in one batched call, then FedAvg.

    Rounds are memoised by selection history (``TrajectoryCache``), so policies that pick the
    same site sets share their training.
    """

    def __init__(
        self,
        federation: Federation,
        sites: SiteSet,
        power: PowerSource,
        links: LinkSource,
        time_model: TimeModel,
        seed: int,
        cache: TrajectoryCache | None = None,
        aggregation: Aggregation | None = None,
        outer: OuterSettings | None = None,
        forecast: Forecaster | None = None,
        codec: str = "none",
        error_feedback: bool = True,
        hostile: HostileSettings | None = None,
    ) -> None:
        self.fed = federation
        self.sites = sites
        self.power = power
        self.links = links
        self.time = time_model
        self.seed = seed
        self.cache = cache if cache is not None else TrajectoryCache()
        # robust unless the run asks otherwise; the model's running statistics never clipped
        statistics = running_statistics(federation.trainer.model)
        self.aggregation = replace(aggregation or Aggregation(), statistics=statistics)
        # sites that send poisoned updates (a robustness study; none by default)
        self.hostile = hostile or HostileSettings()
        fraction = self.hostile.hostile_fraction
        self.hostile_sites = hostile_sites(len(federation.partitions), fraction)
        self.outer = outer or OuterSettings()  # no outer step unless the run asks for one
        self.forecast = forecast  # each RoundContext's, when the run asks for one
        self._initial: tuple[float, float] | None = None
        recipe = federation.trainer.config.recipe
        # A site that resumes its local optimizer's state (AdamW's or momentum's moments unless
        # reset every round, always a schedule's step count) trains differently each time it is
        # picked: its rounds depend on more than the selection history, so they are not shared
        # through the cache.
        self.keeps_site_state = recipe.carries_over
        # the update codec (None: fp32 as is); the time model already prices its wire size.
        # With error feedback a site's sent update depends on its residual, i.e. on every
        # round it took part in, so like resumed optimizer state it rules out sharing rounds.
        self.codec = None if codec == "none" else get_codec(codec)
        self.error_feedback = error_feedback
        self.codec_keeps_state = self.codec is not None and error_feedback
        # what the final state_dict takes from the initial model: entries FedAvg does not average
        own, averaged = federation.trainer.model.state_dict(), federation.initial_params
        self._unaveraged = {n: t.to("cpu", copy=True) for n, t in own.items() if n not in averaged}

    def _train_round(
        self,
        params: TorchParams,
        selected: np.ndarray,
        round_index: int,
        direction: NumpyParams | None = None,
        evaluate_half: bool = True,
        outer: NesterovOuter | None = None,
        site_states: SiteStateBook | None = None,
        feedback: ErrorFeedback | None = None,
        bound: AdaptiveBound | None = None,
    ) -> RoundOutcome | None:
        """One round; ``site_states`` (each site's optimizer state) is read and updated, and so
        are ``feedback``'s residuals (each site's update goes through the codec before FedAvg).
        ``bound``: the robust rule's state from the earlier rounds. None when the rule kept no
        update (every one dropped): the model is unchanged, as for a failed service round."""
        fed = self.fed
        sites = [int(i) for i in selected]
        key = round_key(round_index)
        updates = fed.trainer.train(
            params,
            fed.x_train,
            fed.y_train,
            [fed.partitions[i] for i in sites],
            site_seeds(self.seed, round_index, sites),  # site_seed of each, in one call
            None if site_states is None else [site_states.for_round(i, key) for i in sites],
        )
        if site_states is not None and updates.opt_state is not None:
            for site, state in zip(sites, updates.opt_state, strict=True):
                site_states.update(site, key, state=state)
        template = to_numpy(params)
        agg = self.aggregation.make(template, direction=direction, bound=bound)
        half = self.aggregation.make(template, bound=bound)  # every other site: split-half probe
        stacked, weights = to_numpy(updates.deltas), updates.num_samples.astype(np.float64)
        if feedback is not None:
            stacked = _compressed(stacked, sites, feedback, round_index)
        stacked = self._poisoned(stacked, sites)
        sq = agg.add_rows(stacked, weights)  # in selection order, as the aggregator folds
        if agg.count == 0:
            return None
        # the probe's rows were checked (and their norms taken) by the fold above
        halves = {name: d[::2] for name, d in stacked.items()}
        half.add_rows(halves, weights[::2], None if sq is None else sq[::2])
        outcome = round_outcome(
            agg,
            template,
            self._evaluate,
            selected=len(selected),
            half=half,
            evaluate_half=evaluate_half,
            outer=outer,
        )
        return replace(
            outcome,
            params=to_torch(outcome.params),
            site_loss=np.asarray(updates.loss, dtype=np.float64).copy(),
            site_samples=weights.copy(),
        )

    def _poisoned(self, stacked: NumpyParams, sites: list[int]) -> NumpyParams:
        """``stacked`` with each hostile site's row replaced by what it sends instead."""
        rows = [j for j, site in enumerate(sites) if site in self.hostile_sites]
        if not rows:
            return stacked
        out = {name: d.copy() for name, d in stacked.items()}
        h = self.hostile
        for j in rows:
            sent = poison(
                {name: d[j] for name, d in out.items()}, h.hostile_attack, h.hostile_scale
            )
            for name, d in sent.items():
                out[name][j] = d
        return out

    def _evaluate(self, params: NumpyParams) -> tuple[float, float]:
        fed = self.fed
        return fed.trainer.evaluate(to_torch(params), fed.x_test, fed.y_test)

    def run(
        self,
        policy: SelectionPolicy,
        target_accuracy: float | None,
        max_rounds: int,
        on_round: Callable[[RoundRecord], None] | None = None,
    ) -> EmulatedRun:
        """Run until the target accuracy (if any) or the round budget; the result carries the
        final global model (``EmulatedRun.model``), the same whether its rounds were trained
        or served from the trajectory cache."""
        executor = _CachedExecutor(self)
        run = run_rounds(
            policy,
            executor,
            lambda t: profile_at(
                self.sites,
                self.power,
                self.links,
                t,
                self.time.update_bytes,
                self.time.round_trip,
            ),
            self.time,
            EmulatedClock(),
            self.seed,
            target_accuracy,
            max_rounds,
            on_round=on_round,
            forecast=self.forecast,
        )
        return EmulatedRun(**vars(run), model=self.state_dict(executor.params))

    def state_dict(self, params: TorchParams) -> dict[str, torch.Tensor]:
        """``params`` (a global model as the emulator keeps it) as the workload model's full
        ``state_dict``: in its order, copied to the CPU, a tied tensor under each of its names."""
        own = self.fed.trainer.model.state_dict(keep_vars=True)
        averaged = {id(t): name for name, t in own.items() if name in params}
        out = {}
        for name, t in own.items():
            source = averaged.get(id(t), name)  # a tied tensor: its twin's averaged value
            value = params[source] if source in params else self._unaveraged[name]
            out[name] = value.detach().to("cpu", copy=True)
        return out


class _CachedExecutor:
    """One run's view of an Emulator: current params plus the selection-history cache key.

    Always computes the split-half probe and the projection on the previous global delta (both
    follow from the selection history, which the cache key already fixes) so a cached round
    serves every policy; the probe's model is evaluated only once a policy asks for it
    (``wants_split_half``), which most do not.
    """

    def __init__(self, emulator: Emulator) -> None:
        self.em = emulator
        self.params = emulator.fed.initial_params
        self.previous: TorchParams | None = None
        # the run's own outer optimizer; its settings root the cache key, as they shape the model
        self.outer = outer_for(emulator.outer)
        outer = self.outer
        self.key = b"root" if outer is None else f"root{outer.lr!r},{outer.momentum!r}".encode()
        #: each site's local optimizer state (on the trainer's device: AdamW keeps two model
        #: copies per site that has trained) and its codec residual
        recipe = emulator.fed.trainer.config.recipe
        self.book = SiteStateBook(recipe)
        #: the book's optimizer states, or None when sites keep none across rounds
        self.site_states = self.book if emulator.keeps_site_state else None
        #: the update codec over the book's residuals (and its byte count); None: no codec
        codec, feedback = emulator.codec, emulator.error_feedback
        self.feedback = None if codec is None else ErrorFeedback(codec, feedback, self.book)
        #: the robust rule's bound (a function of the selection history, like the model, so a
        #: cached round brings the bound it ended with), or None for a rule without one
        self.bound = AdaptiveBound() if emulator.aggregation.adaptive else None

    def evaluate_initial(self) -> tuple[float, float]:
        em = self.em
        if em._initial is None:
            em._initial = em.fed.trainer.evaluate(self.params, em.fed.x_test, em.fed.y_test)
        return em._initial

    def execute(
        self, round_index: int, selected: np.ndarray, profile: SiteProfile, split_half: bool
    ) -> RoundOutcome | None:
        self.key = chain_key(self.key, selected)
        stateful = self.site_states is not None or self.em.codec_keeps_state
        trained = None if stateful else self.em.cache.get(self.key)
        if trained is None:
            direction = None
            if self.previous is not None:
                new, old = to_numpy(self.params), to_numpy(self.previous)
                direction = delta_sketch(new, old, sketch_stride(new))
            trained = self.em._train_round(
                self.params,
                selected,
                round_index,
                direction,
                split_half,
                self.outer,
                self.site_states,
                self.feedback,
                self.bound,
            )
            if trained is None:  # every update dropped: nothing to keep or share
                return None
            if not stateful:
                self.em.cache.put(self.key, trained)
        elif split_half and trained.half_params is not None:
            trained = evaluate_half_model(trained, self.em._evaluate)
            self.em.cache.put(self.key, trained)
        self.previous, self.params = self.params, trained.params
        if self.outer is not None:  # a cached round brings the momentum it ended with
            self.outer.restore(trained.outer_state)
        if trained.aggregation_state is not None:
            self.bound = trained.aggregation_state
        return trained
