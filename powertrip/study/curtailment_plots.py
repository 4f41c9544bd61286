"""Figures of a curtailment study: when each site was available (and trained), which mode the
curtailed runs were in, emissions accumulating per run, and accuracy over emulated time."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from powertrip.study.curtailment import CurtailmentStudy
from powertrip.study.figures import finish_figure, save_figure

HOURS = 3600.0
MODE_COLOURS = {"pause": "lightgray", "solo": "tab:orange", "federated": "tab:green"}


def _subtitle(study: CurtailmentStudy) -> str:
    c = study.config
    data = f"{c.workload}{' (synthetic)' if c.workload == 'mnist1d' else ''}"
    return f"carbon: {study.trace.label}; θ = {c.threshold:g}; {data}"


def plot_availability(study: CurtailmentStudy, path: Path) -> Path:
    """Top: each region's intensity and θ. Bottom: per site, provisioning (idle), ready, and
    the spans the curtailment run actually trained."""
    c = study.config
    end_h = c.hours
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 5.5), sharex=True, gridspec_kw={"height_ratios": [1, 1.2]}
    )
    t = study.trace.time_s / HOURS
    for region in dict.fromkeys(s.region for s in study.sites):
        top.step(t, study.trace.series(region), where="post", label=region, lw=1)
    top.axhline(c.threshold, color="k", ls="--", lw=0.8, label=f"θ = {c.threshold:g}")
    top.set_ylabel("marginal intensity\n(gCO2/kWh)")
    top.legend(fontsize=7, ncol=4)
    top.set_title(f"Availability per site\n{_subtitle(study)}", fontsize=9)
    trained = study.results.get("curtailment") or study.results.get("combined")
    for y, avail in enumerate(study.availability):
        for e in avail.episodes:
            a, r, b = e.provisioned_s / HOURS, e.ready_s / HOURS, min(e.end_s / HOURS, end_h)
            bottom.barh(y, min(r, b) - a, left=a, height=0.6, color="tab:orange")
            if r < b:
                bottom.barh(y, b - r, left=r, height=0.6, color="lightsteelblue")
        if trained is not None:
            for a, b in trained.run.power_logs[y].training:
                bottom.barh(y, (b - a) / HOURS, left=a / HOURS, height=0.3, color="tab:blue")
    bottom.set_yticks(range(len(study.sites)), [s.name for s in study.sites], fontsize=8)
    bottom.set_xlabel("hours from trace start")
    handles = [
        plt.Rectangle((0, 0), 1, 1, color="tab:orange"),
        plt.Rectangle((0, 0), 1, 1, color="lightsteelblue"),
        plt.Rectangle((0, 0), 1, 1, color="tab:blue"),
    ]
    run_name = trained.name if trained else "-"
    labels = ["provisioning (idle power)", "ready", f"training ({run_name})"]
    bottom.legend(handles, labels, fontsize=7, loc="upper right")
    bottom.set_xlim(0, end_h)
    return save_figure(fig, path)


def plot_modes(study: CurtailmentStudy, path: Path) -> Path:
    names = list(study.results)
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(names) + 1.4))
    for y, name in enumerate(names):
        for a, b, mode in study.results[name].run.mode_segments():
            ax.barh(y, (b - a) / HOURS, left=a / HOURS, color=MODE_COLOURS[mode], height=0.7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in MODE_COLOURS.values()]
    ax.legend(handles, list(MODE_COLOURS), fontsize=7, ncol=3, loc="lower right")
    ax.set_xlabel("hours from trace start")
    ax.set_title(f"Execution mode over time\n{_subtitle(study)}", fontsize=9)
    return save_figure(fig, path)


def plot_cumulative_emissions(study: CurtailmentStudy, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, res in study.results.items():
        if name == "single-site":
            continue
        e = res.energy
        lw = 2 if res.availability == "curtailed" else 1
        ax.plot(np.r_[0, e.time_s] / HOURS, np.r_[0, e.cumulative_kg], label=name, lw=lw)
    for region, e in study.single_site.items():
        ax.plot(
            np.r_[0, e.time_s] / HOURS,
            np.r_[0, e.cumulative_kg],
            ls="--",
            lw=1,
            label=f"single site, {region}",
        )
    return finish_figure(
        fig,
        ax,
        path,
        f"Emissions per run\n{_subtitle(study)}",
        xlabel="hours from trace start",
        ylabel="cumulative emissions (kg CO2)",
    )


def plot_accuracy(study: CurtailmentStudy, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, res in study.results.items():
        ev = np.asarray(res.run.evaluations)
        ax.plot(ev[:, 0] / HOURS, ev[:, 1], label=name, lw=1.5 if name != "single-site" else 1)
    ax.axhline(study.target_accuracy, color="k", ls="--", lw=0.8, label="target")
    return finish_figure(
        fig,
        ax,
        path,
        f"Accuracy over emulated time\n{_subtitle(study)}",
        xlabel="hours from trace start",
        ylabel="held-out accuracy",
    )


def write_curtailment_plots(study: CurtailmentStudy, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_availability(study, out_dir / "availability_timeline.png"),
        plot_modes(study, out_dir / "mode_over_time.png"),
        plot_cumulative_emissions(study, out_dir / "cumulative_emissions.png"),
        plot_accuracy(study, out_dir / "accuracy_over_time.png"),
    ]
