"""Your own CNN on your own arrays, spread over sites by your own partitioner.

The model has batch normalisation and dropout, which the batched trainer cannot vmap: PowerTrip
trains its sites one at a time instead (and says so in its log). The data is a stand-in made
here with numpy, 10 classes of noisy, shifted 16x16 glyphs; pass ``--npz FILE`` (arrays ``x_train``,
``y_train`` and optionally ``x_test``, ``y_test``) to use yours.

With ``--save FILE`` it keeps PowerTrip's final global model (``keep_models``) and writes it as
a ``state_dict``; ``--label-smoothing`` trains with the workload's own loss instead of plain
cross-entropy (one value per sample, as ``CustomWorkload.loss`` must return).

    python examples/own_cnn_on_arrays.py                  # ~1 minute on two CPU cores
    python examples/own_cnn_on_arrays.py --npz mine.npz --sites 20 --save cnn.pt
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

import powertrip as pt


def glyphs(n: int, seed: int = 0, noise: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """n noisy, shifted copies of 10 random 16x16 class templates: [n, 1, 16, 16], [n]."""
    rng = np.random.default_rng(seed)
    templates = (rng.random((10, 16, 16)) < 0.3).astype(np.float32)
    y = rng.integers(0, 10, n)
    shifts = rng.integers(-2, 3, (n, 2))
    x = np.stack(
        [np.roll(templates[c], tuple(s), axis=(0, 1)) for c, s in zip(y, shifts, strict=True)]
    )
    x = x + rng.normal(0.0, noise, x.shape).astype(np.float32)
    return x[:, None].astype(np.float32), y


class SmallCNN(nn.Module):
    """Conv -> BatchNorm -> ReLU twice, dropout, a linear head."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 16, num_classes))

    def forward(self, x):
        return self.head(self.features(x))


def label_shards(shards_per_site: int):
    """McMahan et al.'s non-IID split: sort by label, cut into shards, deal each site
    ``shards_per_site`` of them (so a site sees about that many classes)."""

    def split(labels: np.ndarray, num_sites: int, rng: np.random.Generator) -> list[np.ndarray]:
        order = np.argsort(labels, kind="stable")
        shards = np.array_split(order, shards_per_site * num_sites)
        deal = rng.permutation(len(shards)).reshape(num_sites, shards_per_site)
        return [np.concatenate([shards[i] for i in row]) for row in deal]

    return split


def smoothed_cross_entropy(smoothing: float):
    """Label-smoothed cross-entropy, one value per sample (``reduction="none"``)."""

    def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing)

    return loss


def load_arrays(npz: Path | None) -> pt.Dataset:
    if npz is None:
        x, y = glyphs(4000)
        return pt.dataset_from_arrays(x, y, test_fraction=0.2, name="glyphs")
    f = np.load(npz)
    test = (f["x_test"], f["y_test"]) if "x_test" in f else (None, None)
    return pt.dataset_from_arrays(f["x_train"], f["y_train"], *test, name=npz.stem)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npz", type=Path, help="arrays x_train, y_train[, x_test, y_test]")
    ap.add_argument("--sites", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--shards", type=int, default=4, help="label shards (~classes) per site")
    ap.add_argument("--label-smoothing", type=float, default=0.0, help="own loss when > 0")
    ap.add_argument("--save", type=Path, help="write powertrip's final model (a state_dict) here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    data = load_arrays(args.npz)
    workload = pt.CustomWorkload(
        name="own-cnn",
        model=lambda d: SmallCNN(d.in_shape[0], d.num_classes),
        data=data,
        partitioner=label_shards(args.shards),
        lr=0.1,
        batch_size=32,
        loss=smoothed_cross_entropy(args.label_smoothing) if args.label_smoothing > 0 else None,
    )
    config = pt.build_config(
        workload=pt.register_workload(workload),
        num_sites=args.sites,
        policies=("powertrip", "select-all"),
        static_sweep=(),
        target_accuracy=args.target,
        max_rounds=args.rounds,
        update_gb=0.1,
    )
    result = pt.run_study(config, keep_models={"powertrip"} if args.save else False)
    for row in pt.policy_table(result):
        tta = "not reached" if row.tta_mean_s is None else f"{row.tta_mean_s / 3600:.2f} h"
        print(f"{row.policy:12s} time to {args.target:.0%}: {tta:12s} {row.mean_sites:.1f} sites")
    for _, run in result.runs:
        print(f"{run.policy:12s} final test accuracy {run.rounds[-1].accuracy:.3f}")
    if args.save:
        state = result.model("powertrip")
        SmallCNN(data.in_shape[0], data.num_classes).load_state_dict(state)  # it fits the model
        torch.save(state, args.save)
        print(f"saved powertrip's final model to {args.save}")


if __name__ == "__main__":
    main()
