"""Which models the stacked engine (``engines.stacked``) can run, as layer chains.

A chain is a list of layer specs in forward order: convolutions (channels-last activations),
then a flatten, then linear layers, with ReLU or tanh between them. Models are recognised by
exact class (a subclass may override ``forward``): ``CNN1D`` and ``nn.Sequential`` of those layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

__all__ = ["Activation", "Conv1dLayer", "FlattenLayer", "Layer", "LinearLayer", "chain_layers"]


@dataclass(frozen=True)
class Conv1dLayer:
    name: str
    k: int
    stride: int
    pad: int


@dataclass(frozen=True)
class LinearLayer:
    name: str


@dataclass(frozen=True)
class Activation:
    kind: str  # "relu" | "tanh"


@dataclass(frozen=True)
class FlattenLayer:
    pass


Layer = Conv1dLayer | LinearLayer | Activation | FlattenLayer


def _conv1d(name: str, conv: nn.Module) -> Conv1dLayer | None:
    if not isinstance(conv, nn.Conv1d) or not isinstance(conv.padding, tuple):
        return None
    if conv.groups != 1 or conv.dilation != (1,) or conv.padding_mode != "zeros":
        return None
    if conv.bias is None:
        return None
    return Conv1dLayer(name, conv.kernel_size[0], conv.stride[0], conv.padding[0])


def _sequential(model: nn.Module) -> list[Layer] | None:
    layers: list[Layer] = []
    for name, child in model.named_children():
        if isinstance(child, nn.Conv1d):
            conv = _conv1d(name, child)
            if conv is None:
                return None
            layers.append(conv)
        elif isinstance(child, nn.Linear) and child.bias is not None:
            layers.append(LinearLayer(name))
        elif isinstance(child, nn.ReLU | nn.Tanh):
            layers.append(Activation("relu" if isinstance(child, nn.ReLU) else "tanh"))
        elif isinstance(child, nn.Flatten) and child.start_dim == 1 and child.end_dim == -1:
            layers.append(FlattenLayer())
        else:
            return None
    return layers


def _cnn1d(model: nn.Module) -> list[Layer] | None:
    convs = [_conv1d(n, getattr(model, n)) for n in ("conv1", "conv2", "conv3")]
    layers: list[Layer] = []
    for conv in convs:
        if conv is None:
            return None
        layers += [conv, Activation("relu")]
    return [*layers, FlattenLayer(), LinearLayer("head")]


def _chains(layers: Sequence[Layer]) -> bool:
    """Whether each layer gets the layout it needs: convolutions first, then a flatten, then
    linear layers (a linear layer on a convolution's [C, L] output would act on L alone)."""
    layout = "cl" if isinstance(layers[0], Conv1dLayer) else "bf"
    for layer in layers:
        if isinstance(layer, Conv1dLayer) and layout != "cl":
            return False
        if isinstance(layer, LinearLayer) and layout != "bf":
            return False
        if isinstance(layer, FlattenLayer):
            layout = "bf"
    return True


def _registry() -> dict[type[nn.Module], Callable[[nn.Module], list[Layer] | None]]:
    from powertrip.learning.models import CNN1D  # models imports the experiment definitions

    return {CNN1D: _cnn1d, nn.Sequential: _sequential}


def chain_layers(model: nn.Module) -> list[Layer] | None:
    """``model`` as a chain ending in a linear layer whose specs name exactly its parameters,
    or None (then it trains with ``vmap``)."""
    build = _registry().get(type(model))
    layers = build(model) if build is not None else None
    if not layers or not isinstance(layers[-1], LinearLayer):
        return None
    kinds = ("weight", "bias")
    used = {
        f"{f.name}.{t}" for f in layers if isinstance(f, Conv1dLayer | LinearLayer) for t in kinds
    }
    names = {n for n, _ in model.named_parameters()}
    if used != names or any(True for _ in model.buffers()) or not _chains(layers):
        return None
    return layers
