"""The PowerTrip paper's models (§5.1, Table 2: a CNN for EMNIST, a two-layer LSTM for
Shakespeare) plus a small 1-D CNN for MNIST-1D, written so many site copies can train at once;
the transformers live in their own modules (``gpt``: the LM, ``kwt``: keyword spotting).

The trainer stacks the parameters of all sites along a leading axis and runs
``vmap(grad(loss))`` over ``torch.func.functional_call``. That rules out BatchNorm (buffers
updated in place), dropout (random state), in-place ops, ``.item()`` and data-dependent
control flow, and it rules out ``nn.LSTM`` (no vmap rule), so the LSTM recurrence is written
out with ``nn.Linear`` layers. No model has buffers: its state is exactly its parameters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from powertrip.learning.gpt import GPT, GPTShape, gpt_shape
from powertrip.learning.kwt import KWT, KWTShape

__all__ = ["MODEL_NAMES", "CNN1D", "CNN2D", "CharLSTM", "build_model", "num_parameters"]

#: each built-in workload names its model in its declaration (``powertrip.learning.workloads``)
MODEL_NAMES = ("cnn1d", "cnn2d", "lstm", "gpt", "kwt")


def _conv_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


class CNN1D(nn.Module):
    """Small 1-D CNN for MNIST-1D (6,058 parameters): three convolutions, then a linear head.

    Small on purpose: the emulator trains ~100 site copies per round on two CPU cores. Trained
    centrally (SGD lr 0.2, batch 20, 20k samples) it reaches 90-95% test accuracy after three
    epochs and ~95% after five; 16 channels (3.3k parameters) needs about four epochs for 85%.
    """

    def __init__(
        self, num_classes: int = 10, in_channels: int = 1, length: int = 40, channels: int = 24
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=5, padding=2)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, kernel_size=3, stride=2, padding=1)
        out_len = _conv_out(_conv_out(length, 3, 2, 1), 3, 2, 1)
        self.head = nn.Linear(channels * out_len, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.head(x.flatten(1))


class CNN2D(nn.Module):
    """LEAF's FEMNIST CNN: conv5x5-32, maxpool, conv5x5-64, maxpool, FC-2048, FC-classes.

    `width` scales every hidden size (1.0 = the paper's 6.6 M-parameter model for EMNIST), so
    tests and quick emulations can use a small copy of the same architecture.
    """

    def __init__(
        self,
        num_classes: int = 62,
        in_channels: int = 1,
        in_hw: tuple[int, int] = (28, 28),
        width: float = 1.0,
    ) -> None:
        super().__init__()
        c1, c2, hidden = (max(1, round(n * width)) for n in (32, 64, 2048))
        self.conv1 = nn.Conv2d(in_channels, c1, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5, padding=2)
        h, w = (s // 2 // 2 for s in in_hw)
        self.fc1 = nn.Linear(c2 * h * w, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class CharLSTM(nn.Module):
    """Next-character model from FedProx/LEAF: 8-d embedding, stacked LSTM, logits of the last
    position only.

    The recurrence is unrolled by hand (gates i, f, g, o as in ``nn.LSTM``) because ``nn.LSTM``
    cannot run under vmap. Each layer has an input projection with bias and a recurrent one
    without (``nn.LSTM``'s two biases are one sum), initialised U(-1/sqrt(H), 1/sqrt(H)) like
    ``nn.LSTM``.
    """

    def __init__(
        self, vocab_size: int, embed_dim: int = 8, hidden_size: int = 100, num_layers: int = 2
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.embed = nn.Embedding(vocab_size, embed_dim)
        sizes = [embed_dim] + [hidden_size] * (num_layers - 1)
        self.input_proj = nn.ModuleList(nn.Linear(n, 4 * hidden_size) for n in sizes)
        self.hidden_proj = nn.ModuleList(
            nn.Linear(hidden_size, 4 * hidden_size, bias=False) for _ in sizes
        )
        self.head = nn.Linear(hidden_size, vocab_size)
        bound = 1.0 / math.sqrt(hidden_size)
        for layer in [*self.input_proj, *self.hidden_proj]:
            for p in layer.parameters():
                nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = self.embed(x)  # [B, T, E]
        for inp, rec in zip(self.input_proj, self.hidden_proj, strict=True):
            gates_x = inp(seq)  # all time steps at once; only h @ W_h stays in the loop
            h = gates_x.new_zeros(gates_x.shape[0], self.hidden_size)
            c = h
            outputs = []
            for gx in gates_x.unbind(1):  # unbind, not [:, t]: its backward is one stack
                i, f, g, o = (gx + rec(h)).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            seq = torch.stack(outputs, dim=1)
        return self.head(seq[:, -1])


def num_parameters(model: nn.Module) -> int:
    """Number of trainable scalars (what a site ships per update)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(
    name: str,
    num_classes: int,
    in_shape: tuple[int, ...],
    vocab_size: int | None = None,
    *,
    width: float = 1.0,
    hidden_size: int = 100,
    gpt: GPTShape | None = None,
    kwt: KWTShape | None = None,
) -> nn.Module:
    """Build a model by name for inputs of per-sample shape `in_shape`.

    "cnn1d": in_shape (C, L); "cnn2d": in_shape (C, H, W), `width` scales it; "lstm": in_shape
    (seq_len,), `vocab_size` defaults to num_classes (next-char predicts a character); "gpt":
    in_shape (context,), vocabulary num_classes, `gpt` its shape (default: tiny at that context);
    "kwt": in_shape (frames, n_mels), `kwt` its depth/width/heads (default: ``kwt_shape()``).
    """
    if name == "cnn1d":
        if len(in_shape) != 2:
            raise ValueError(f"cnn1d needs in_shape (channels, length), got {in_shape}")
        return CNN1D(num_classes, in_channels=in_shape[0], length=in_shape[1])
    if name == "cnn2d":
        if len(in_shape) != 3:
            raise ValueError(f"cnn2d needs in_shape (channels, height, width), got {in_shape}")
        return CNN2D(num_classes, in_channels=in_shape[0], in_hw=in_shape[1:], width=width)
    if name == "lstm":
        return CharLSTM(vocab_size or num_classes, hidden_size=hidden_size)
    if name == "gpt":
        return GPT(num_classes, gpt or gpt_shape(context_length=in_shape[-1]))
    if name == "kwt":
        if len(in_shape) != 2:
            raise ValueError(f"kwt needs in_shape (frames, n_mels), got {in_shape}")
        return KWT(num_classes, frames=in_shape[0], n_mels=in_shape[1], shape=kwt)
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}")
