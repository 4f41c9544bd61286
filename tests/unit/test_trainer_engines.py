"""Local training goes through one seam: engines are chosen once, by name, from an open
registry; ``"auto"`` takes the first that can train the model; a name that is unknown or
cannot train the model is refused saying why; and every engine trains the same update."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from powertrip.learning.engines import (
    EngineSpec,
    LocalRound,
    SiteUpdates,
    base,
    build_engine,
    engine_names,
    register_engine,
)
from powertrip.learning.models import CNN1D
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params

CFG = LocalTrainingConfig(lr=0.2, batch_size=4, local_epochs=2)
SITES = [np.arange(0, 9), np.arange(9, 30), np.arange(30, 35)]  # uneven: sites finish early
SEEDS = [3, 4, 5]


class OwnNet(nn.Module):
    """A user's own class whose forward is a chain of layers the stacked engine knows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 3, 3, stride=2, padding=1)
        self.hidden = nn.Linear(3 * 6, 5)
        self.out = nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(F.relu(self.conv(x)), 1)
        return self.out(torch.tanh(self.hidden(h)))


class SkipNet(OwnNet):
    """The same layers with a skip connection: not a chain, but batchable."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(3 * 6, 3 * 6)
        self.out = nn.Linear(3 * 6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x)).flatten(1)
        return self.out(h + self.hidden(h).relu())


def _data(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 12, generator=g), torch.randint(0, 4, (n,), generator=g)


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "cnn1d":
        return CNN1D(num_classes=4, in_channels=1, length=12, channels=3)
    if kind == "own":
        return OwnNet()
    if kind == "skip":
        return SkipNet()
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.BatchNorm1d(6), nn.Linear(6, 4))


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
    return 0.0


@pytest.mark.parametrize(
    ("kind", "extra", "engine"),
    [
        ("cnn1d", {}, "stacked"),
        ("cnn1d", {"loss": lambda logits, y: F.cross_entropy(logits, y, reduction="none")}, "vmap"),
        ("own", {}, "stacked"),
        ("skip", {}, "vmap"),
        ("norm", {}, "in-turn"),
        ("cnn1d", {"train_step": _step}, "in-turn"),
    ],
    ids=["chain", "chain-own-loss", "own-chain", "own-skip", "batch-norm", "own-step"],
)
def test_auto_takes_the_first_engine_that_can_train_the_model(kind, extra, engine):
    assert SiteTrainer(_model(kind), CFG, "cpu", **extra).engine.name == engine


def test_the_built_in_engines_in_autos_order():
    assert engine_names()[:3] == ("stacked", "vmap", "in-turn")


@pytest.mark.parametrize(
    ("kind", "engine", "why"),
    [
        ("skip", "stacked", "SkipNet is not a chain it knows"),
        ("norm", "vmap", "BatchNorm1d: batch normalisation updates buffers in place"),
        ("norm", "stacked", "BatchNorm1d"),
        ("cnn1d", "compiled", "unknown local engine 'compiled': known engines are auto, stacked"),
    ],
)
def test_an_engine_that_cannot_train_the_model_is_refused_saying_why(kind, engine, why):
    with pytest.raises(ValueError, match="engine") as info:
        SiteTrainer(_model(kind), CFG, "cpu", engine=engine)
    assert why in str(info.value)


@pytest.mark.parametrize("kind", ["cnn1d", "own", "skip"])
def test_every_engine_that_can_train_a_model_gives_the_same_updates(kind):
    x, y = _data()
    names = ["vmap", "in-turn"] + (["stacked"] if kind != "skip" else [])
    trainers = {n: SiteTrainer(_model(kind), CFG, "cpu", engine=n) for n in names}
    start = get_params(trainers["vmap"].model)
    got = {n: t.train(start, x, y, SITES, SEEDS) for n, t in trainers.items()}
    want = got.pop("vmap")
    for name, upd in got.items():
        np.testing.assert_array_equal(upd.steps, want.steps)
        np.testing.assert_allclose(upd.loss, want.loss, rtol=1e-5, err_msg=name)
        for t, d in want.deltas.items():
            torch.testing.assert_close(upd.deltas[t], d, rtol=1e-4, atol=1e-6, msg=name)


def test_the_stacked_engine_takes_vmaps_step_for_labels_per_position():
    """A linear chain on [T, F] inputs with one label per position: not the chain's shape."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(30, 5, 8, generator=g), torch.randint(0, 3, (30, 5), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 3))
    stacked = SiteTrainer(model, CFG, "cpu", engine="stacked")
    start = get_params(model)
    got = stacked.train(start, x, y, SITES[:2], SEEDS[:2])
    want = SiteTrainer(model, CFG, "cpu", engine="vmap").train(start, x, y, SITES[:2], SEEDS[:2])
    for t, d in want.deltas.items():
        torch.testing.assert_close(got.deltas[t], d, rtol=1e-5, atol=1e-7)


class HalfStep:
    """An engine of its own: every site moves half its vmap update (what the seam hands it
    and what it gives back are all the trainer needs)."""

    name = "half"

    def __init__(self, spec: EngineSpec) -> None:
        self.inner = build_engine("vmap", spec)

    def train(self, sites: LocalRound, out=None) -> SiteUpdates:
        done = self.inner.train(sites, out)
        for d in done.deltas.values():
            d.mul_(0.5)
        return done


def test_a_registered_engine_is_built_by_name_and_never_by_auto_unless_ranked(monkeypatch):
    monkeypatch.setattr(base, "_ENGINES", dict(base._ENGINES))
    register_engine("half", HalfStep)
    x, y = _data()
    model = _model("skip")
    start = get_params(model)
    assert SiteTrainer(model, CFG, "cpu").engine.name == "vmap"
    half = SiteTrainer(model, CFG, "cpu", engine="half").train(start, x, y, SITES, SEEDS)
    full = SiteTrainer(model, CFG, "cpu", engine="vmap").train(start, x, y, SITES, SEEDS)
    for t, d in full.deltas.items():
        torch.testing.assert_close(half.deltas[t], d * 0.5)
    register_engine("half", HalfStep, auto_rank=0)  # now auto's first choice
    assert SiteTrainer(model, CFG, "cpu").engine.name == "half"


def test_the_learning_package_has_no_file_level_import_circle():
    """No two files of ``powertrip.learning`` (a package: its ``__init__``) import each other,
    directly or through others; every import counts, a function's own or one under
    TYPE_CHECKING too (it is still a dependency: ../shared/tools/room_cycles.py's rule)."""
    root = Path(__file__).resolve().parents[2] / "powertrip" / "learning"
    mods = {
        ".".join(("powertrip", *p.relative_to(root.parent).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): p
        for p in root.rglob("*.py")
    }
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in mods and t != name}
        edges[name] = found
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges[node]):
            assert seen.get(nxt) != 1, f"import circle: {' -> '.join([*path, nxt])}"
            if nxt not in seen:
                visit(nxt, [*path, nxt])
        seen[node] = 2

    for name in sorted(mods):
        if name not in seen:
            visit(name, [name])
