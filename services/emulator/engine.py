"""One emulated training run: a policy picks sites, they train, FedAvg, evaluate, the clock moves.

Training is a deterministic function of the sequence of selected site sets (every site's batch
order is seeded by run seed, round and site id), so runs of different policies that pick the same
sets share their training through a ``TrajectoryCache``: select-all, static-100 and the two
centralized baselines train once, and the first rounds of policies that start alike are reused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from services.aggregator.fedavg import StreamingFedAvg
from services.aggregator.selection import RoundContext, RoundFeedback, SelectionPolicy
from services.common.clock import EmulatedClock
from services.common.sites import LinkSource, PowerSource, SiteSet, profile_at
from services.common.timing import RoundTimeModel, centralized_round_time_s, round_time_s
from services.worker.trainer import SiteTrainer


@dataclass(frozen=True)
class Federation:
    """The learning side of a run: data partitioned over sites, a model and its trainer."""

    trainer: SiteTrainer
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    partitions: list[np.ndarray]
    initial_params: dict[str, torch.Tensor]


@dataclass(frozen=True)
class TimeModel:
    ideal_compute_s: float  # tau, local training at 100% power
    update_bytes: float
    ground_truth: RoundTimeModel = RoundTimeModel.PER_SITE_MAX
    round_trip: bool = False


@dataclass(frozen=True)
class RoundRecord:
    round: int
    time_s: float  # clock at the end of the round
    duration_s: float
    sites: int
    accuracy: float
    loss: float


@dataclass
class RunResult:
    policy: str
    seed: int
    target_accuracy: float | None
    rounds: list[RoundRecord] = field(default_factory=list)
    initial_accuracy: float = 0.0

    def time_to(self, target: float) -> float | None:
        """Emulated seconds until the first round whose accuracy reaches ``target``."""
        for r in self.rounds:
            if r.accuracy >= target:
                return r.time_s
        return None

    def rounds_to(self, target: float) -> int | None:
        for r in self.rounds:
            if r.accuracy >= target:
                return r.round
        return None


@dataclass(frozen=True)
class _TrainedRound:
    params: dict[str, torch.Tensor]
    accuracy: float
    loss: float
    dispersion: tuple[float, float, float]
    half_loss: float | None
    half_sites: float | None


class TrajectoryCache:
    """Memo of (selection history -> trained round), valid for one federation and seed.

    Bounded by entries and by bytes of stored parameters, so a large model (EMNIST's CNN is
    26 MB a copy) stops filling it instead of exhausting memory; a full cache only costs speed.
    """

    def __init__(self, max_entries: int = 20_000, max_bytes: int = 512 * 2**20) -> None:
        self._entries: dict[bytes, _TrainedRound] = {}
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> _TrainedRound | None:
        hit = self._entries.get(key)
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def put(self, key: bytes, value: _TrainedRound) -> None:
        size = sum(t.numel() * t.element_size() for t in value.params.values())
        if len(self._entries) < self.max_entries and self.bytes + size <= self.max_bytes:
            self._entries[key] = value
            self.bytes += size


def _chain(key: bytes, selected: np.ndarray) -> bytes:
    return hashlib.blake2b(
        key + np.sort(selected).astype(np.int64).tobytes(), digest_size=16
    ).digest()


def site_seed(run_seed: int, round_index: int, site: int) -> int:
    """A site's local batch order depends only on (run, round, site), never on its peers."""
    return int(np.random.SeedSequence([run_seed, round_index, site]).generate_state(1)[0])


class Emulator:
    def __init__(
        self,
        federation: Federation,
        sites: SiteSet,
        power: PowerSource,
        links: LinkSource,
        time_model: TimeModel,
        seed: int,
        cache: TrajectoryCache | None = None,
    ) -> None:
        self.fed = federation
        self.sites = sites
        self.power = power
        self.links = links
        self.time = time_model
        self.seed = seed
        self.cache = cache if cache is not None else TrajectoryCache()
        self._initial: tuple[float, float] | None = None

    def _train_round(
        self, params: dict[str, torch.Tensor], selected: np.ndarray, round_index: int
    ) -> _TrainedRound:
        fed = self.fed
        updates = fed.trainer.train(
            params,
            fed.x_train,
            fed.y_train,
            [fed.partitions[i] for i in selected],
            [site_seed(self.seed, round_index, int(i)) for i in selected],
        )
        template = {k: v.numpy() for k, v in params.items()}
        agg = StreamingFedAvg(template)
        half = StreamingFedAvg(template)  # every other site: the split-half averaging probe
        for j in range(len(selected)):
            delta = {k: v[j].numpy() for k, v in updates.deltas.items()}
            agg.add(delta, float(updates.num_samples[j]))
            if j % 2 == 0:
                half.add(delta, float(updates.num_samples[j]))
        new = {k: torch.from_numpy(v) for k, v in agg.apply(template).items()}
        acc, loss = fed.trainer.evaluate(new, fed.x_test, fed.y_test)
        half_loss, half_sites = None, None
        if len(selected) >= 2:
            half_model = {k: torch.from_numpy(v) for k, v in half.apply(template).items()}
            half_loss = fed.trainer.evaluate(half_model, fed.x_test, fed.y_test)[1]
            half_sites = half.dispersion()[2]
        return _TrainedRound(new, acc, loss, agg.dispersion(), half_loss, half_sites)

    def run(
        self,
        policy: SelectionPolicy,
        target_accuracy: float | None,
        max_rounds: int,
        on_round: Callable[[RoundRecord], None] | None = None,
    ) -> RunResult:
        """Run until the target accuracy (if any) or the round budget."""
        clock = EmulatedClock()
        rng = np.random.default_rng([self.seed, int.from_bytes(policy.name.encode()[:8], "big")])
        params = self.fed.initial_params
        if self._initial is None:
            self._initial = self.fed.trainer.evaluate(params, self.fed.x_test, self.fed.y_test)
        accuracy, loss = self._initial
        result = RunResult(policy.name, self.seed, target_accuracy, initial_accuracy=accuracy)
        key = b"root"
        for r in range(1, max_rounds + 1):
            profile = profile_at(
                self.sites,
                self.power,
                self.links,
                clock.now(),
                self.time.update_bytes,
                self.time.round_trip,
            )
            ctx = RoundContext(
                r, clock.now(), profile, self.time.ideal_compute_s, self.time.update_bytes, rng
            )
            selected = np.asarray(policy.select(ctx), dtype=np.int64)
            if selected.size == 0:
                raise RuntimeError(f"policy {policy.name} selected no site in round {r}")
            key = _chain(key, selected)
            trained = self.cache.get(key)
            if trained is None:
                trained = self._train_round(params, selected, r)
                self.cache.put(key, trained)
            if policy.centralized_power is not None:
                duration = centralized_round_time_s(
                    self.time.ideal_compute_s, policy.centralized_power
                )
            else:
                duration = round_time_s(
                    self.time.ground_truth,
                    self.time.ideal_compute_s,
                    profile.power[selected],
                    profile.comm_s[selected],
                    total_sites=profile.size,
                )
            clock.advance(duration)
            mean_sq, sq_mean, k_eff = trained.dispersion
            policy.observe(
                RoundFeedback(
                    r,
                    selected,
                    duration,
                    trained.accuracy,
                    accuracy,
                    mean_sq_norm=mean_sq,
                    sq_norm_of_mean=sq_mean,
                    effective_sites=k_eff,
                    loss=trained.loss,
                    previous_loss=loss,
                    half_loss=trained.half_loss,
                    half_sites=trained.half_sites,
                )
            )
            record = RoundRecord(
                r, clock.now(), duration, int(selected.size), trained.accuracy, trained.loss
            )
            result.rounds.append(record)
            if on_round is not None:
                on_round(record)
            params, accuracy, loss = trained.params, trained.accuracy, trained.loss
            if target_accuracy is not None and accuracy >= target_accuracy:
                break
        return result
