"""A model's parameters as numpy arrays: the form FedAvg folds, checkpoints store and the wire
carries. Torch-free, so the aggregation checks and the services' error mapping load no torch."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["NumpyParams"]

#: A model as numpy arrays by parameter name: what FedAvg folds and what travels on the wire
#: (``TorchParams`` in ``powertrip.learning.device`` is the same model as torch tensors).
NumpyParams = dict[str, NDArray[np.floating]]
