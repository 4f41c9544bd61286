"""The study's figures: TTA bars (paper Fig. 9), the static-k valley (Fig. 8), sites selected over
time (Fig. 10) and accuracy over emulated time."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from powertrip.study.figures import finish_figure, save_figure
from powertrip.study.powertrip import StudyResult
from powertrip.study.results import policy_table, sweep_table

HOURS = 3600.0


def _title(result: StudyResult, what: str) -> str:
    c = result.config
    data = f"{c.workload}{' (synthetic)' if c.workload == 'mnist1d' else ''}"
    return (
        f"{what}\n{data}, {c.partition}, {c.num_sites} sites, {c.update_gb:g} GB, "
        f"target {result.target_accuracy:.3f}, {c.repeats} repeat(s)"
    )


def plot_tta_bars(result: StudyResult, path: Path) -> Path:
    fig, ax = draw_tta_bars(result)
    return save_figure(fig, path)


def draw_tta_bars(result: StudyResult) -> tuple[plt.Figure, plt.Axes]:
    """Paper Fig. 9: mean time to accuracy per policy, its ratio to static-optimal on the bar,
    ± std only when there are repeats to take it over, and a policy that never reached the
    target marked so instead of drawn as a zero-height win."""
    rows = policy_table(result)
    repeats = result.config.repeats
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [r.policy for r in rows]
    means = [(r.tta_mean_s or 0) / HOURS for r in rows]
    stds = [(r.tta_std_s or 0) / HOURS for r in rows] if repeats > 1 else None
    colors = ["tab:green" if n.startswith("powertrip") else "tab:gray" for n in names]
    bars = ax.bar(names, means, yerr=stds, capsize=3, color=colors)
    for bar, row in zip(bars, rows, strict=True):
        label = _bar_label(row.reached, row.repeats, row.ratio_to_static_optimal)
        x = bar.get_x() + bar.get_width() / 2
        ax.annotate(label, (x, bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("time to accuracy (emulated hours)")
    spread = "mean ± std" if repeats > 1 else "one repeat, no error bars"
    ax.set_title(_title(result, f"Time to accuracy by policy ({spread})"), fontsize=9)
    ax.tick_params(axis="x", rotation=30)
    return fig, ax


def _bar_label(reached: int, repeats: int, ratio: float | None) -> str:
    if reached == 0:
        return "did not reach\nthe target"
    parts = [] if ratio is None else [f"{ratio:.2f}× static-opt."]
    if reached < repeats:
        parts.append(f"{reached}/{repeats} reached")
    return "\n".join(parts)


def plot_static_sweep(result: StudyResult, path: Path) -> Path | None:
    drawn = draw_static_sweep(result)
    return None if drawn is None else save_figure(drawn[0], path)


def draw_static_sweep(result: StudyResult) -> tuple[plt.Figure, plt.Axes] | None:
    """Paper Fig. 8's valley: every swept k, the ones that never reached the target drawn as
    such at the top (dropping them would hide where the valley's walls are)."""
    sweep = sweep_table(result)
    if not sweep:
        return None
    # mean and std are both set (some repeat reached the target) or both None
    reached = [(k, m, s) for k, m, s, *_ in sweep if m is not None and s is not None]
    missed = [k for k, mean, *_ in sweep if mean is None]
    fig, ax = plt.subplots(figsize=(6, 4))
    if reached:
        ax.errorbar(
            [k for k, _, _ in reached],
            [m / HOURS for _, m, _ in reached],
            yerr=[s / HOURS for _, _, s in reached] if result.config.repeats > 1 else None,
            marker="o",
            capsize=3,
            label="time to target",
        )
    if missed:
        top = max((m for _, m, _ in reached), default=HOURS) / HOURS * 1.1
        ax.scatter(
            missed,
            [top] * len(missed),
            marker="x",
            color="tab:red",
            zorder=3,
            label="did not reach the target",
        )
    if result.k_star is not None:
        ax.axvline(result.k_star, ls="--", color="tab:red", label=f"k* = {result.k_star}")
    ax.legend(fontsize=7)
    ax.set_xlabel("sites per round (static top-k, Eq. 8 ranking)")
    ax.set_ylabel("time to accuracy (emulated hours)")
    ax.set_title(_title(result, "Static-k sweep"), fontsize=9)
    return fig, ax


def _first_repeat_runs(result: StudyResult):
    wanted = set(result.config.policies) | {"static-optimal"}
    k_star_name = f"static-{result.k_star}" if result.k_star is not None else None
    for rep, run in result.runs:
        if rep != 0:
            continue
        if run.policy == k_star_name and "static-optimal" in result.config.policies:
            yield "static-optimal", run
        elif run.policy in wanted:
            yield run.policy, run


def plot_sites_over_time(result: StudyResult, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in _first_repeat_runs(result):
        if name.startswith("centralized"):
            continue
        t = [0.0] + [r.time_s / HOURS for r in run.rounds]
        k = [r.sites for r in run.rounds]
        ax.step(t[:-1], k, where="post", label=name, lw=2 if name.startswith("powertrip") else 1)
    return _save_time_plot(
        fig, ax, path, "sites selected", _title(result, "Sites selected per round (repeat 1)")
    )


def plot_accuracy_over_time(result: StudyResult, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in _first_repeat_runs(result):
        t = [0.0] + [r.time_s / HOURS for r in run.rounds]
        a = [run.initial_accuracy] + [r.accuracy for r in run.rounds]
        ax.plot(t, a, label=name, lw=2 if name.startswith("powertrip") else 1)
    ax.axhline(result.target_accuracy, ls="--", color="k", lw=0.8, label="target")
    return _save_time_plot(
        fig, ax, path, "held-out accuracy", _title(result, "Accuracy over emulated time (repeat 1)")
    )


def _save_time_plot(fig, ax, path: Path, ylabel: str, title: str) -> Path:  # noqa: ANN001
    return finish_figure(fig, ax, path, title, xlabel="emulated time (hours)", ylabel=ylabel)


def write_plots(result: StudyResult, out_dir: Path | str) -> list[Path]:
    """Draw a study's figures as PNG files in ``out_dir`` (created if missing) and return the
    paths written, in this order: ``tta_bars.png`` (mean time to accuracy per policy, paper
    Fig. 9), ``static_sweep.png`` (time to accuracy per swept k, Fig. 8; only when the study
    ran a static sweep), ``sites_over_time.png`` (sites per round, Fig. 10) and
    ``accuracy_over_time.png`` (held-out accuracy), both over emulated time for repeat 1's runs.
    ``result``: what ``run_study`` returned. Files of those names are replaced. ``powertrip
    experiment`` writes its figures with this function."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [
        plot_tta_bars(result, out_dir / "tta_bars.png"),
        plot_static_sweep(result, out_dir / "static_sweep.png"),
        plot_sites_over_time(result, out_dir / "sites_over_time.png"),
        plot_accuracy_over_time(result, out_dir / "accuracy_over_time.png"),
    ]
    return [p for p in made if p is not None]
