"""Gain models for Algorithm 1 line 13: the projected accuracy gain of each candidate site count.

Algorithm 1 moves towards the count k' with the best projected gain per second. The gain is the
measured accuracy trend rescaled by how much k' sites help relative to the current k; the models
differ only in that rescaling, so each is one small class that owns the statistics it learns from
round feedback (``observe``) and projects from them (``project``):

- ``LogGain``: the paper's log(1 + k') / log(1 + k);
- ``KappaHeadroomGain``: the log ratio weighted by how far the trend is below its best round;
- ``NoiseScaleGain``: averaging k' updates keeps k'/(k'+B) of the noise-free progress, with the
  noise scale B = tr(Sigma)/|G|^2 measured from the dispersion of the site updates;
- ``DirectionalNoiseGain``: the same B measured along the direction the model moves
  (docs/reproduction.md §5.1, the project's default);
- ``SplitHalfGain`` / ``SplitHalfAccuracyGain``: a second model averaged from half of the sites
  fits L(m) = L_inf + c/m on the validation loss / error.

``GainModel`` names them for configuration; ``build_gain`` is the one place a name becomes a model.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.selection.base import RoundFeedback


class GainModel(StrEnum):
    """The configured names of the gain models (``GreedyConfig.gain``)."""

    LOG = "log"
    KAPPA_HEADROOM = "kappa-headroom"
    NOISE_SCALE = "noise-scale"
    NOISE_DIRECTIONAL = "noise-directional"
    SPLIT_HALF = "split-half"
    SPLIT_HALF_ACCURACY = "split-half-accuracy"


class ProjectedGain(ABC):
    """Delta A_hat(k') of Algorithm 1 line 13, learnt from each round's feedback.

    The class attributes declare which extra measurements the executor must put in the feedback,
    so a policy never has to be probed for them.
    """

    #: needs the split-half probe (a second FedAvg over every other selected site)
    wants_split_half: ClassVar[bool] = False
    #: needs the updates' projections on the previous round's global delta
    wants_direction: ClassVar[bool] = False

    def observe(self, feedback: RoundFeedback) -> None:  # noqa: B027 - optional hook
        """Default: a fixed-shape gain learns nothing beyond the trend."""

    #: the ``SmoothedPair`` attributes a model learns (its whole state, with ``_numbers``)
    _pairs: ClassVar[tuple[str, ...]] = ()
    #: the float attributes a model learns
    _numbers: ClassVar[tuple[str, ...]] = ()

    def state_dict(self) -> dict[str, Any]:
        """What the model learnt (``SelectionPolicy.state_dict``'s shape)."""
        state: dict[str, Any] = {k: float(getattr(self, k)) for k in self._numbers}
        for k in self._pairs:
            value = getattr(self, k).value
            state[k] = None if value is None else [float(value[0]), float(value[1])]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        where = f"gain {type(self).__name__} state"
        d = sd.fields(state, where, {*self._numbers, *self._pairs})
        numbers = {k: sd.number(d[k], f"{where}.{k}") for k in self._numbers}
        pairs = {k: sd.pair(d[k], f"{where}.{k}") for k in self._pairs}
        for k, v in numbers.items():
            setattr(self, k, v)
        for k, p in pairs.items():
            getattr(self, k).value = p

    @abstractmethod
    def project(self, trend: float, candidates: NDArray[np.int64], k: int) -> NDArray[np.float64]:
        """The gain of each candidate count, relative to the current count k (whose gain is the
        trend, Algorithm 1 line 9)."""


class LogGain(ProjectedGain):
    """The paper's gain: each site adds accuracy in proportion to log(1 + k)."""

    def project(self, trend: float, candidates: NDArray[np.int64], k: int) -> NDArray[np.float64]:
        return trend * np.log1p(candidates.astype(np.float64)) / math.log1p(k)


class KappaHeadroomGain(ProjectedGain):
    """trend * (1 + kappa * h * log((1+k')/(1+k))), h = 1 - trend / best single-round gain.

    While rounds gain as much as they ever did, more sites project nothing extra; as the gains
    flatten, the headroom h lets extra sites promise more.
    """

    _numbers = ("best_gain",)

    def __init__(self, kappa: float) -> None:
        self.kappa = kappa
        self.best_gain = 0.0

    def observe(self, feedback: RoundFeedback) -> None:
        self.best_gain = max(self.best_gain, feedback.accuracy - feedback.previous_accuracy)

    def headroom(self, trend: float) -> float:
        headroom = 1.0 - trend / self.best_gain if self.best_gain > 0 else 0.0
        return min(max(headroom, 0.0), 1.0)

    def project(self, trend: float, candidates: NDArray[np.int64], k: int) -> NDArray[np.float64]:
        kc = candidates.astype(np.float64)
        return trend * (1.0 + self.kappa * self.headroom(trend) * np.log((1 + kc) / (1 + k)))


@dataclass
class SmoothedPair:
    """An EMA of two statistics measured together; the first measurement seeds both."""

    history_weight: float
    value: tuple[float, float] | None = None

    def update(self, first: float, second: float) -> None:
        if self.value is None:
            self.value = (first, second)
            return
        a = self.history_weight
        self.value = (a * self.value[0] + (1 - a) * first, a * self.value[1] + (1 - a) * second)


def measured_dispersion(fb: RoundFeedback) -> tuple[float, float, float] | None:
    """(mean |d_i|^2, |mean d|^2, k_eff) of a round whose update dispersion is observable:
    None without the statistics or from a single site, which shows no variance."""
    if fb.mean_sq_norm is None or fb.sq_norm_of_mean is None or not fb.effective_sites:
        return None
    if fb.effective_sites <= 1.0 + 1e-9:
        return None
    return fb.mean_sq_norm, fb.sq_norm_of_mean, fb.effective_sites


def noise_estimate(mean_sq: float, sq_of_mean: float, k_eff: float) -> tuple[float, float]:
    """Unbiased (noise, signal) from one round's k_eff weighted updates.

    E[mean |d_i|^2] = |G|^2 + tr(S);  E[|mean d|^2] = |G|^2 + tr(S)/k_eff. The same holds for
    the scalar projections p_i = d_i.u with u'Su and (G.u)^2.
    """
    noise = max(mean_sq - sq_of_mean, 0.0) / (1.0 - 1.0 / k_eff)
    return noise, max(sq_of_mean - noise / k_eff, 0.0)


def noise_scale_of(pair: SmoothedPair) -> float:
    """noise / signal of a smoothed (noise, signal) pair; 0 (a flat gain) before any round."""
    if pair.value is None:
        return 0.0
    noise, signal = pair.value
    return noise / max(signal, 1e-12 * max(noise, 1e-30))


class NoiseScaleGain(ProjectedGain):
    """trend * (k'/(k'+B)) / (k/(k+B)): averaging k updates keeps k/(k+B) of the noise-free
    progress (the gradient-noise-scale model of large-batch training), B = tr(Sigma)/|G|^2."""

    _pairs: ClassVar[tuple[str, ...]] = ("isotropic",)

    def __init__(self, smoothing: float) -> None:
        self.isotropic = SmoothedPair(smoothing)  # (tr(Sigma), |G|^2) of the site updates

    def observe(self, feedback: RoundFeedback) -> None:
        if (measured := measured_dispersion(feedback)) is not None:
            self.isotropic.update(*noise_estimate(*measured))

    def noise_scale(self) -> float:
        """B in units of sites; 0 (a flat gain) until a round has measured dispersion."""
        return noise_scale_of(self.isotropic)

    def project(self, trend: float, candidates: NDArray[np.int64], k: int) -> NDArray[np.float64]:
        b = self.noise_scale()
        kc = candidates.astype(np.float64)
        return trend * (kc / (kc + b)) / (k / (k + b))


class DirectionalNoiseGain(NoiseScaleGain):
    """B_par = u'Sigma u / (G.u)^2 along the last global delta u: the noise the loss feels when
    the curvature is concentrated along the direction of travel (B_crit = tr(H Sigma) / G'HG with
    H ~ lambda u u'). Falls back to the isotropic B before the first projection."""

    wants_direction = True
    _pairs = ("isotropic", "along_direction")

    def __init__(self, smoothing: float) -> None:
        super().__init__(smoothing)
        self.along_direction = SmoothedPair(smoothing)  # (u'Sigma u, (G.u)^2)

    def observe(self, feedback: RoundFeedback) -> None:
        super().observe(feedback)
        measured = measured_dispersion(feedback)
        mean_p, mean_p2 = feedback.mean_proj, feedback.mean_sq_proj
        if measured is None or mean_p is None or mean_p2 is None:
            return  # round 1 has no previous global delta to project on
        self.along_direction.update(*noise_estimate(mean_p2, mean_p**2, measured[2]))

    def noise_scale(self) -> float:
        if self.along_direction.value is None:
            return super().noise_scale()
        return noise_scale_of(self.along_direction)


def _averaged_progress(sites: NDArray[np.int64], scale: float) -> NDArray[np.float64]:
    """Loss decrease of a round averaging m sites, relative to infinitely many: 1 - b/m."""
    return np.maximum(1.0 - scale / np.asarray(sites, dtype=np.float64), 1e-2)


class SplitHalfGain(ProjectedGain):
    """Fit L(m) = L_inf + c/m through the full and half averages of each round's updates.

    Averaging m sites then keeps a fraction 1 - b/m of the noise-free loss decrease, with the
    averaging scale b = c / (noise-free progress); the gain is the trend times that fraction
    at k' relative to k.
    """

    wants_split_half = True
    _pairs = ("fit",)

    def __init__(self, smoothing: float) -> None:
        self.fit = SmoothedPair(smoothing)  # (c, noise-free progress per round)

    def measured(self, fb: RoundFeedback) -> tuple[float, float, float] | None:
        """(full, previous, half) of the fitted quantity: here the validation loss."""
        if fb.loss is None or fb.previous_loss is None or fb.half_loss is None:
            return None
        return fb.loss, fb.previous_loss, fb.half_loss

    def observe(self, feedback: RoundFeedback) -> None:
        values = self.measured(feedback)
        if values is None or feedback.half_sites is None or feedback.effective_sites is None:
            return
        full, previous, half = values
        m_full, m_half = float(feedback.effective_sites), float(feedback.half_sites)
        if m_half >= m_full - 1e-9:
            return
        penalty = max((half - full) / (1.0 / m_half - 1.0 / m_full), 0.0)
        self.fit.update(penalty, previous - (full - penalty / m_full))

    def averaging_scale(self) -> float:
        """b = c / (noise-free progress); 0 until fitted, inf when only the noise moved."""
        if self.fit.value is None:
            return 0.0
        penalty, progress = self.fit.value
        if progress <= 0:
            return math.inf if penalty > 0 else 0.0
        return penalty / progress

    def project(self, trend: float, candidates: NDArray[np.int64], k: int) -> NDArray[np.float64]:
        b = self.averaging_scale()
        return trend * _averaged_progress(candidates, b) / _averaged_progress(np.array(k), b)


class SplitHalfAccuracyGain(SplitHalfGain):
    """The split-half fit on the validation error 1 - accuracy, the quantity time-to-accuracy
    measures, instead of the loss."""

    def measured(self, fb: RoundFeedback) -> tuple[float, float, float] | None:
        if fb.half_accuracy is None:
            return None
        return 1.0 - fb.accuracy, 1.0 - fb.previous_accuracy, 1.0 - fb.half_accuracy


#: Each configured name -> its model, from (kappa, EMA weight on history of measured statistics).
GAINS: dict[GainModel, Callable[[float, float], ProjectedGain]] = {
    GainModel.LOG: lambda kappa, smoothing: LogGain(),
    GainModel.KAPPA_HEADROOM: lambda kappa, smoothing: KappaHeadroomGain(kappa),
    GainModel.NOISE_SCALE: lambda kappa, smoothing: NoiseScaleGain(smoothing),
    GainModel.NOISE_DIRECTIONAL: lambda kappa, smoothing: DirectionalNoiseGain(smoothing),
    GainModel.SPLIT_HALF: lambda kappa, smoothing: SplitHalfGain(smoothing),
    GainModel.SPLIT_HALF_ACCURACY: lambda kappa, smoothing: SplitHalfAccuracyGain(smoothing),
}


def build_gain(model: GainModel | str, *, kappa: float, smoothing: float) -> ProjectedGain:
    """A fresh gain model (models keep per-run state, so never share one across policies)."""
    return GAINS[GainModel(model)](kappa, smoothing)
