"""What every study figure does last: label the axes, title, legend, save, close. Both studies'
plot modules end through here, so figures share one look and a closed figure never leaks."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402


def finish_figure(
    fig: plt.Figure,
    ax: plt.Axes,
    path: Path,
    title: str,
    xlabel: str | None = None,
    ylabel: str | None = None,
    legend: bool = True,
) -> Path:
    """Label ``ax``, then save ``fig`` to ``path`` (120 dpi) and close it."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if legend and ax.get_legend_handles_labels()[0]:  # nothing labelled: no empty box
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def save_figure(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
