"""Which models the stacked engine (``engines.stacked``) can run, as layer chains.

A chain is a list of layer specs in forward order: convolutions (channels-last activations),
then a flatten, then linear layers, with ReLU or tanh between them. The model's own ``forward``
is read with ``torch.fx`` (a symbolic trace), so any class qualifies, the built-in ``CNN1D``,
an ``nn.Sequential`` and a user's own module alike, when its forward is such a chain: each step
takes the previous step's output alone, through ``nn.Conv1d`` (groups 1, no dilation, zero
padding, a bias), ``nn.Linear`` (a bias), ``nn.ReLU``/``F.relu``/``torch.relu``/``.relu()``,
their tanh counterparts, or a flatten from dim 1 (``nn.Flatten()``, ``torch.flatten(x, 1)``,
``x.flatten(1)``), each module used once, and every parameter used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

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

#: the leaf modules a chain may hold (anything else: not a chain, and no trace is tried)
_LEAVES = (nn.Conv1d, nn.Linear, nn.ReLU, nn.Tanh, nn.Flatten)
_ACTIVATIONS: dict[Any, str] = {F.relu: "relu", torch.relu: "relu", "relu": "relu"}
_ACTIVATIONS.update({F.tanh: "tanh", torch.tanh: "tanh", "tanh": "tanh"})


def _conv1d(name: str, conv: nn.Module) -> Conv1dLayer | None:
    if not isinstance(conv, nn.Conv1d) or not isinstance(conv.padding, tuple):
        return None
    if conv.groups != 1 or conv.dilation != (1,) or conv.padding_mode != "zeros":
        return None
    if conv.bias is None:
        return None
    return Conv1dLayer(name, conv.kernel_size[0], conv.stride[0], conv.padding[0])


def _module_layer(name: str, module: nn.Module) -> Layer | None:
    if isinstance(module, nn.Conv1d):
        return _conv1d(name, module)
    if isinstance(module, nn.Linear):
        return LinearLayer(name) if module.bias is not None else None
    if isinstance(module, nn.ReLU | nn.Tanh):
        return Activation("relu" if isinstance(module, nn.ReLU) else "tanh")
    if isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1:
        return FlattenLayer()
    return None


def _flattens_from_1(args: tuple, kwargs: dict) -> bool:
    """Whether ``flatten``'s arguments after the input are start_dim 1 and end_dim -1."""
    if len(args) > 2:
        return False
    given = dict(zip(("start_dim", "end_dim"), args, strict=False)) | kwargs
    start, end = given.pop("start_dim", 0), given.pop("end_dim", -1)
    return not given and (start, end) == (1, -1)


def _node_layer(model: nn.Module, node: fx.Node, prev: fx.Node) -> Layer | None:
    """The layer ``node`` is, when it takes ``prev`` (the previous step's output) alone."""
    if not node.args or node.args[0] is not prev:
        return None
    rest, kwargs = node.args[1:], dict(node.kwargs)
    if node.op == "call_module" and not rest and not kwargs:
        return _module_layer(str(node.target), model.get_submodule(str(node.target)))
    if node.op not in ("call_function", "call_method"):
        return None
    kwargs.pop("inplace", None)  # in place or not, the same values
    kind = _ACTIVATIONS.get(node.target) if not rest and not kwargs else None
    if kind is not None:
        return Activation(kind)
    if node.target in (torch.flatten, "flatten") and _flattens_from_1(rest, kwargs):
        return FlattenLayer()
    return None


def _traced(model: nn.Module) -> list[Layer] | None:
    """``model``'s forward as layers, or None when it is not one straight chain of them."""
    if any(not isinstance(m, _LEAVES) for m in model.modules() if not list(m.children())):
        return None
    try:
        graph = fx.symbolic_trace(model).graph
    except Exception:  # data-dependent control flow, untraceable calls: not a chain
        return None
    layers: list[Layer] = []
    prev: fx.Node | None = None
    for node in graph.nodes:
        if node.op == "placeholder":
            if prev is not None:
                return None  # more than one input
            prev = node
        elif node.op == "output":
            return layers if prev is not None and node.args == (prev,) else None
        elif prev is None or len(node.users) != 1:
            return None  # an output used twice (a skip connection) or not at all
        else:
            layer = _node_layer(model, node, prev)
            if layer is None:
                return None
            layers.append(layer)
            prev = node
    return None


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


def chain_layers(model: nn.Module) -> list[Layer] | None:
    """``model`` as a chain ending in a linear layer whose specs name exactly its parameters,
    each once, or None (then the stacked engine cannot train it)."""
    if any(True for _ in model.buffers()):
        return None
    layers = _traced(model)
    if not layers or not isinstance(layers[-1], LinearLayer):
        return None
    named = [f.name for f in layers if isinstance(f, Conv1dLayer | LinearLayer)]
    used = {f"{n}.{t}" for n in named for t in ("weight", "bias")}
    names = {n for n, _ in model.named_parameters()}
    if len(set(named)) != len(named) or used != names or not _chains(layers):
        return None
    return layers
