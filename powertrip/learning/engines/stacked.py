"""The stacked engine: one local step of many sites as one plain model, for layer chains.

``vmap(grad(loss))`` batches a site model by turning each convolution into a grouped
convolution over the stacked sites, and on the CPU a grouped convolution with 100 groups of 24
channels is slow (it is most of the vmapped step for the MNIST-1D CNN). Here every layer is a
batched matrix product over the site axis instead: a convolution is an im2col gather and one
``baddbmm`` per layer ([S, C_out, C_in*k] @ [S, C_in*k, B*L_out]), a linear layer one
``baddbmm``, and the backward pass is written out by hand (two ``bmm`` per layer, a strided
col2im add, the ReLU/tanh mask), which skips autograd's bookkeeping and its slow
``unfold_backward``. Sites never mix: every product is per site, so a site's gradient is the
gradient of its own masked mean loss, whichever sites share the step. About 1.5-2x the vmap
engine for the CNN1D (benchmarks/bench_site_training.py); the same update within float32
rounding.

Supported: any model whose forward is a straight chain of ``Conv1d`` (groups 1, no dilation,
zero padding), ``Linear``, ReLU, tanh and a flatten (read from the forward itself with
``torch.fx``: the built-in ``CNN1D``, an ``nn.Sequential`` or a user's own class;
stacked_layers.py), with cross-entropy over one class label per sample (``stacked_chain``
returns None for anything else, and ``"auto"`` takes the vmap engine). A round whose data does
not fit the chain (labels per position) takes vmap's step. Device-agnostic: only tensor ops,
so it runs wherever the parameters are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from powertrip.learning.device import TorchParams
from powertrip.learning.engines.base import EngineSpec, register_engine
from powertrip.learning.engines.batched import BatchedEngine, BatchedStep, why_not_batched
from powertrip.learning.engines.stacked_layers import (
    Activation,
    Conv1dLayer,
    Layer,
    LinearLayer,
    chain_layers,
)
from powertrip.learning.engines.vmap import VmapStep

__all__ = ["StackedChain", "StackedStep", "stacked_chain", "stacked_engine"]

logger = logging.getLogger(__name__)

# Activation layouts: "cl" = [S, B, L, C] (channels last: a convolution's natural output, and
# its im2col windows are contiguous rows), "bf" = [S, B, F].


class _Workspace:
    """Buffers kept from step to step. A fresh multi-megabyte tensor per op costs page faults
    (the allocator hands large blocks back to the OS): ~40 % of a one-step round. A buffer
    serves any smaller site count as a prefix view, and a padded input's zero border is
    written once."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, like: torch.Tensor, *shape: int, zero: bool = False):
        full = (key, shape[1:], like.dtype, like.device)
        buf = self._bufs.get(full)
        if buf is None or buf.shape[0] < shape[0]:
            buf = (torch.zeros if zero else torch.empty)(
                shape, dtype=like.dtype, device=like.device
            )
            self._bufs[full] = buf
        return buf[: shape[0]]


class StackedChain(BatchedStep):
    """A model's forward as a chain of layers, trained for S sites at once."""

    def __init__(self, layers: Sequence[Layer], label: str) -> None:
        self.layers = tuple(layers)
        self.label = label  # said in the trainer's log line
        self._ws = _Workspace()

    def accepts(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether a batch of this shape fits the chain: one label per sample, and per-sample
        inputs [C, L] before a convolution, [F] before a linear layer without a flatten."""
        if y.dim() != 1:
            return False
        first = next((f for f in self.layers if not isinstance(f, Activation)), None)
        if isinstance(first, Conv1dLayer):
            return x.dim() == 3
        if isinstance(first, LinearLayer):
            return x.dim() == 2
        return True

    def grads_and_loss(
        self, params: TorchParams, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor
    ) -> tuple[TorchParams, torch.Tensor]:
        """Each site's gradient of its masked mean cross-entropy (in the workspace: valid until
        the next call), and that loss: ``params`` [S, ...], ``x`` [S, B, ...], ``y``/``m``
        [S, B]."""
        s, b = y.shape
        h, layout = x.reshape(s, b, *x.shape[2:]), "bf"
        if isinstance(self.layers[0], Conv1dLayer):
            h, layout = h.transpose(2, 3), "cl"  # [S, B, L, C]
        saved: list[tuple[torch.Tensor, ...]] = []
        for i, layer in enumerate(self.layers):
            h, layout, ctx = _forward(layer, params, h, layout, self._ws, i)
            saved.append(ctx)
        logits = h  # [S, B, classes]
        logp = torch.log_softmax(logits, -1)
        per_sample = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        count = m.sum(1, keepdim=True).clamp_min(1.0)  # the masked mean, as site_loss has it
        loss = (per_sample * m).sum(1) / count.squeeze(1)
        weight = m / count  # d loss / d sample
        dh = logp.exp_()  # softmax - onehot, scaled by each sample's weight
        dh.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(logp[..., :1], -1.0))
        dh.mul_(weight.unsqueeze(-1))
        grads: TorchParams = {}
        for i in range(len(self.layers) - 1, -1, -1):
            dh = _backward(self.layers[i], params, saved[i], dh, grads, self._ws, i)
        return grads, loss


def _taps(layer: Conv1dLayer, length: int, l_out: int) -> list[tuple[int, int, int, int]]:
    """Per kernel tap t: the output positions [j0, j1) that read real input (output j reads
    input j*stride + t - pad), and the input range [i0, i1) they read with step stride."""
    out = []
    for t in range(layer.k):
        j0 = min(l_out, max(0, -(-(layer.pad - t) // layer.stride)))
        j1 = max(j0, min(l_out, (length - 1 - t + layer.pad) // layer.stride + 1))
        i0 = j0 * layer.stride + t - layer.pad
        out.append((j0, j1, i0, i0 + (j1 - j0 - 1) * layer.stride + 1 if j1 > j0 else i0))
    return out


def _col2im_plan(layer: Conv1dLayer, length: int, l_out: int) -> list[tuple[int, bool, tuple]]:
    """(tap, whether it can be a copy, its ranges): widest taps first, copies before adds."""
    taps = _taps(layer, length, l_out)
    order = sorted(range(layer.k), key=lambda t: taps[t][1] - taps[t][0], reverse=True)
    plan: list[tuple[int, bool, tuple]] = []
    covered: set[int] = set()
    for t in order:
        span = set(range(taps[t][2], taps[t][3], layer.stride))
        plan.append((t, not span & covered, taps[t]))
        covered |= span
    return sorted(plan, key=lambda p: not p[1])


def _forward(
    layer: Layer, p: TorchParams, h: torch.Tensor, layout: str, ws: _Workspace, i: int
) -> tuple:
    """(output, its layout, what the backward pass needs) of layer ``i``."""
    if isinstance(layer, Conv1dLayer):
        w, bias = p[f"{layer.name}.weight"], p[f"{layer.name}.bias"]
        s, c_out, c_in, k = w.shape
        b, length = h.shape[1], h.shape[2]
        hp = h
        if layer.pad:  # the border is zero from the buffer's creation on
            hp = ws.get(("pad", i), h, s, b, length + 2 * layer.pad, c_in, zero=True)
            hp[:, :, layer.pad : layer.pad + length].copy_(h)
        # im2col, channels last: each window of k positions x C_in channels is one row
        windows = hp.unfold(2, k, layer.stride).transpose(3, 4)  # [S, B, L_out, k, C_in]
        l_out = windows.shape[2]
        cols = ws.get(("cols", i), h, s, b * l_out, k * c_in)
        cols.view(s, b, l_out, k, c_in).copy_(windows)
        w_k = w.permute(0, 3, 2, 1).reshape(s, k * c_in, c_out)  # rows ordered (tap, channel)
        out = ws.get(("out", i), h, s, b * l_out, c_out)
        torch.baddbmm(bias.unsqueeze(1), cols, w_k, out=out)  # [S, B*L_out, C_out]
        return out.view(s, b, l_out, c_out), "cl", (cols, length)
    if isinstance(layer, LinearLayer):
        w, bias = p[f"{layer.name}.weight"], p[f"{layer.name}.bias"]
        return torch.baddbmm(bias.unsqueeze(1), h, w.transpose(1, 2)), "bf", (h,)
    if isinstance(layer, Activation):
        out = torch.relu_(h) if layer.kind == "relu" else torch.tanh_(h)  # h is ours
        return out, layout, (out,)
    if layout == "cl":  # FlattenLayer: [S, B, L, C] -> [S, B, C*L], the per-sample flatten order
        return h.transpose(2, 3).reshape(h.shape[0], h.shape[1], -1), "bf", (layout, h.shape)
    return h.reshape(h.shape[0], h.shape[1], -1), "bf", (layout, h.shape)


def _backward(
    layer: Layer,
    p: TorchParams,
    ctx: tuple,
    dout: torch.Tensor,
    grads: TorchParams,
    ws: _Workspace,
    i: int,
) -> torch.Tensor:
    """The gradient w.r.t. layer ``i``'s input; its parameters' gradients go into ``grads``."""
    need_input = i > 0
    if isinstance(layer, Conv1dLayer):
        cols, length = ctx
        w = p[f"{layer.name}.weight"]
        s, c_out, c_in, k = w.shape
        b, l_out = dout.shape[1], dout.shape[2]
        d2 = dout.reshape(s, b * l_out, c_out)
        dw = torch.bmm(d2.transpose(1, 2), cols, out=ws.get(("dw", i), w, s, c_out, k * c_in))
        grads[f"{layer.name}.weight"] = dw.view(s, c_out, k, c_in).transpose(2, 3)
        grads[f"{layer.name}.bias"] = d2.sum(1)
        if not need_input:
            return dout
        w_t = w.transpose(2, 3).reshape(s, c_out, k * c_in)  # a copy: bmm is slow on views
        dcols = ws.get(("dcols", i), w, s, b * l_out, k * c_in)
        dcols = torch.bmm(d2, w_t, out=dcols).view(s, b, l_out, k, c_in)
        # col2im: every tap adds back to the positions it read. Widest taps first, a tap whose
        # positions no earlier tap wrote is a copy; when the copies cover every position, the
        # buffer needs no zeroing (stride 2, kernel 3: two of three taps are copies).
        plan = _col2im_plan(layer, length, l_out)
        copied = sum(len(range(r[2], r[3], layer.stride)) for _, copy, r in plan if copy)
        dh = ws.get(("dh", i), dout, s, b, length, c_in)
        if copied < length:
            dh.zero_()
        for t, copy, (j0, j1, i0, i1) in plan:
            target, source = dh[:, :, i0 : i1 : layer.stride], dcols[:, :, j0:j1, t]
            if copy and copied == length:
                target.copy_(source)
            else:
                target += source
        return dh
    if isinstance(layer, LinearLayer):
        (h,) = ctx
        w = p[f"{layer.name}.weight"]
        grads[f"{layer.name}.weight"] = torch.bmm(dout.transpose(1, 2).contiguous(), h)
        grads[f"{layer.name}.bias"] = dout.sum(1)
        return torch.bmm(dout, w) if need_input else dout
    if isinstance(layer, Activation):
        (out,) = ctx
        if layer.kind == "relu":
            grad_in = ws.get(("drelu", i), out, *out.shape)  # autograd's fused ReLU backward
            return torch.ops.aten.threshold_backward.grad_input(dout, out, 0.0, grad_input=grad_in)
        return dout.mul_(1.0 - out * out)
    layout, shape = ctx  # FlattenLayer
    if layout == "cl":
        return dout.view(shape[0], shape[1], shape[3], shape[2]).transpose(2, 3).contiguous()
    return dout.reshape(shape)


def stacked_chain(model: nn.Module) -> StackedChain | None:
    """The stacked form of ``model``, or None when its forward is not a supported chain."""
    layers = chain_layers(model)
    if layers is None:
        return None
    return StackedChain(layers, type(model).__name__)


class StackedStep(BatchedStep):
    """The chain's step, or vmap's for a batch whose shape the chain does not take."""

    def __init__(self, spec: EngineSpec, chain: StackedChain) -> None:
        self.spec, self.chain = spec, chain
        self._vmap: VmapStep | None = None

    def grads_and_loss(
        self, params: TorchParams, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> tuple[TorchParams, torch.Tensor]:
        if self.chain.accepts(x[0], y[0]):  # one site's batch: [B, ...] and [B]
            return self.chain.grads_and_loss(params, x, y, mask)
        self._vmap = self._vmap or VmapStep(self.spec)
        return self._vmap.grads_and_loss(params, x, y, mask)


def why_not_stacked(spec: EngineSpec) -> str | None:
    """Why the stacked engine cannot train ``spec`` (None: it can)."""
    why = why_not_batched(spec)
    if why is None and spec.loss is not None:
        why = "its backward pass is cross-entropy's, and the workload brings its own loss"
    if why is None and chain_layers(spec.model) is None:
        why = (
            f"{type(spec.model).__name__} is not a chain it knows (a forward of Conv1d, Linear, "
            "ReLU, tanh and a flatten, one after another)"
        )
    return why


def stacked_engine(spec: EngineSpec) -> BatchedEngine:
    chain = stacked_chain(spec.model)
    if chain is None:
        raise ValueError(f"the stacked engine cannot train {type(spec.model).__name__}")
    logger.info("training %s sites stacked (batched matmuls, no vmap)", chain.label)
    return BatchedEngine("stacked", spec, StackedStep(spec, chain))


register_engine("stacked", stacked_engine, why_not_stacked, auto_rank=10)
