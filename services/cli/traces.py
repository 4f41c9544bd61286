"""``powertrip traces``: what a power or carbon trace file holds, before an experiment relies on
it. A file the readers reject ends the command with one line naming file and line (exit 2)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from powertrip.config.carbon import HOLD_S, THRESHOLD
from powertrip.services.cli.common import err, fail, out

if TYPE_CHECKING:  # the readers (numpy) load when a file is read, not for --help
    from powertrip.traces.carbon import CarbonTrace
    from powertrip.traces.power import PowerTrace

HOURS = 3600.0
DAYS = 86_400.0


def sniff_kind(path: Path) -> str:
    """Power or carbon, from the header of the file (or of a directory's first trace file)."""
    from powertrip.traces.carbon import carbon_format
    from powertrip.traces.io import TraceError, read_header
    from powertrip.traces.power import is_power_header

    if path.is_dir():
        files = sorted(q for q in path.iterdir() if q.name.endswith((".csv", ".csv.gz")))
        if not files:
            raise TraceError(path, "directory holds no .csv or .csv.gz file")
        path = files[0]
    header = read_header(path)
    if is_power_header(header):
        return "power"
    if carbon_format(header) is not None:
        return "carbon"
    raise TraceError(path, "neither a power nor a carbon-intensity header; give --kind", 1)


def power_summary(trace: PowerTrace) -> dict[str, object]:
    return {
        "kind": "power",
        "label": trace.label,
        "column": trace.column,
        "source": trace.source,
        "notes": trace.notes,
        "series": [
            {
                "name": s.name,
                "rows": s.rows,
                "flagged": s.flagged,
                "days": round(s.span_s(trace.slot_s) / DAYS, 3),
                "mean_spare": round(float(s.spare.mean()), 4),
                "min_spare": round(float(s.spare.min()), 4),
                "max_spare": round(float(s.spare.max()), 4),
            }
            for s in trace.series
        ],
    }


def carbon_summary(trace: CarbonTrace, threshold: float, hold_s: float) -> dict[str, object]:
    from powertrip.traces.carbon import curtailment_windows

    windows = curtailment_windows(trace, threshold, hold_s)
    regions = []
    for i, name in enumerate(trace.regions):
        v = trace.intensity[i]
        win = windows[name]
        regions.append(
            {
                "name": name,
                "rows": int(v.size),
                "flagged": trace.flagged[i],
                "mean": round(float(v.mean()), 2),
                "min": round(float(v.min()), 2),
                "max": round(float(v.max()), 2),
                "below_threshold_share": round(float((v < threshold).mean()), 4),
                "curtailed_hours": round(sum(b - a for a, b in win) / HOURS, 3),
                "windows": [[round(a, 1), round(b, 1)] for a, b in win],
            }
        )
    return {
        "kind": "carbon",
        "label": trace.label,
        "source": trace.source,
        "start_utc": trace.start.isoformat(),
        "step_s": trace.step_s,
        "hours": round(trace.end_s / HOURS, 3),
        "threshold": threshold,
        "hold_s": hold_s,
        "regions": regions,
    }


#: the columns holding text, left-aligned (the rest are numbers)
_TEXT_COLUMNS = ("series", "region", "windows (h)")


def _print_table(title: str, cols: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """One trace file's table: its text columns (names, windows) left-aligned, numbers right."""
    table = Table(title=title, title_justify="left")
    for col in cols:
        table.add_column(col, justify="left" if col in _TEXT_COLUMNS else "right")
    for row in rows:
        table.add_row(*row)
    out.print(table)


def _counted(series: dict) -> tuple[str, str, str]:
    """The cells every trace table starts a series with: its name, rows and flagged rows."""
    return series["name"], str(series["rows"]), str(series["flagged"])


def _print_power(summary: dict) -> None:
    title = (
        f"power trace — {summary['label']}, spare = 1 - {summary['column']}\n{summary['source']}"
    )
    cols = ("series", "rows", "flagged", "days", "mean spare", "min", "max")
    spare = ("mean_spare", "min_spare", "max_spare")
    rows = (
        (*_counted(s), f"{s['days']:g}", *(f"{s[k]:.3f}" for k in spare)) for s in summary["series"]
    )
    _print_table(title, cols, rows)


def _fmt_windows(windows: list[list[float]], most: int = 4) -> str:
    shown = ", ".join(f"{a / HOURS:.2f}–{b / HOURS:.2f}" for a, b in windows[:most])
    more = f" (+{len(windows) - most} more)" if len(windows) > most else ""
    return (shown + more) if windows else "—"


def _print_carbon(summary: dict) -> None:
    title = (
        f"carbon trace — {summary['label']}, {summary['hours']:g} h from "
        f"{summary['start_utc']} every {summary['step_s']:g} s\ncurtailed while < "
        f"{summary['threshold']:g} g/kWh, exit after {summary['hold_s']:g} s above\n"
        f"{summary['source']}"
    )
    cols = ("region", "rows", "flagged", "mean", "min", "max", "< θ", "curtailed h", "windows (h)")
    rows = (
        (
            *_counted(r),
            *(f"{r[k]:.1f}" for k in ("mean", "min", "max")),
            f"{100 * r['below_threshold_share']:.1f}%",
            f"{r['curtailed_hours']:.2f}",
            f"{len(r['windows'])}: {_fmt_windows(r['windows'])}",
        )
        for r in summary["regions"]
    )
    _print_table(title, cols, rows)


def plot_power(trace: PowerTrace, path: Path, most: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")  # headless: plots are files, never windows
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for s in trace.series[:most]:
        ax.plot((s.time_s - s.time_s[0]) / DAYS, s.spare, lw=0.7, label=s.name)
    extra = f" (first {most} of {len(trace.series)})" if len(trace.series) > most else ""
    ax.set(
        xlabel="days from trace start",
        ylabel=f"spare power (1 - {trace.column})",
        title=f"{trace.label}{extra}",
    )
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_carbon(traces: list[CarbonTrace], path: Path, threshold: float, hold_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from powertrip.traces.carbon import curtailment_windows

    rows = sum(len(t.regions) for t in traces)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 1.8 * rows + 0.6), sharex=False, squeeze=False)
    ax_iter = iter(axes[:, 0])
    for trace in traces:
        windows = curtailment_windows(trace, threshold, hold_s)
        for i, region in enumerate(trace.regions):
            ax = next(ax_iter)
            ax.step(trace.time_s / HOURS, trace.intensity[i], where="post", lw=0.8)
            ax.axhline(threshold, color="tab:red", lw=0.8, ls="--")
            for a, b in windows[region]:
                ax.axvspan(a / HOURS, b / HOURS, color="tab:green", alpha=0.2, lw=0)
            ax.set_ylabel(f"{region}\ng/kWh", fontsize="small")
    axes[-1, 0].set_xlabel("hours from trace start (green: curtailment windows)")
    axes[0, 0].set_title(", ".join(sorted({t.label for t in traces})))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command("traces")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--kind",
    type=click.Choice(["auto", "power", "carbon"]),
    default="auto",
    show_default=True,
    help="What the files hold; auto reads the header.",
)
@click.option(
    "--column",
    type=click.Choice(["production", "measured"]),
    help="Power: utilisation column (default production where present, else measured).",
)
@click.option(
    "--basis",
    type=click.Choice(["direct", "lca"]),
    default="direct",
    show_default=True,
    help="Electricity Maps: which intensity column.",
)
@click.option(
    "--threshold",
    type=float,
    default=THRESHOLD,
    show_default=True,
    help="Carbon: curtailed while intensity < this (g/kWh).",
)
@click.option(
    "--hold",
    "hold_s",
    type=click.FloatRange(min=0),
    default=HOLD_S,
    show_default=True,
    help="Carbon: seconds above the threshold before a window closes.",
)
@click.option("--synthetic", is_flag=True, help="Summarise the embedded synthetic trace instead.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --synthetic.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG figure here.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def traces(
    paths: tuple[Path, ...],
    kind: str,
    column: str | None,
    basis: str,
    threshold: float,
    hold_s: float,
    synthetic: bool,
    seed: int,
    plot: Path | None,
    as_json: bool,
) -> None:
    """Summarise power or carbon trace files: per series mean/min/max, flagged rows, windows.

    PATHS are power files or directories of them (Google powerdata_2019 CSV or .csv.gz, or its
    reduced exports), or carbon-intensity files (WattTime-style or Electricity Maps CSV).
    """
    from powertrip.traces.carbon import read_carbon_trace, synthetic_carbon_trace
    from powertrip.traces.io import TraceError
    from powertrip.traces.power import read_power_trace
    from powertrip.traces.synthetic import synthetic_power_trace

    if synthetic == bool(paths):
        fail("give trace files, or --synthetic for the embedded trace (not both)")
    try:
        if synthetic:
            kind = "carbon" if kind == "carbon" else "power"
        elif kind == "auto":
            kinds = {sniff_kind(p) for p in paths}
            if len(kinds) > 1:
                fail("the files mix power and carbon traces; give one kind at a time")
            kind = kinds.pop()
        if kind == "power":
            trace = (
                synthetic_power_trace(seed=seed) if synthetic else read_power_trace(paths, column)
            )
            summaries = [power_summary(trace)]
        else:
            carbon = (
                [synthetic_carbon_trace(seed=seed)]
                if synthetic
                else [read_carbon_trace(p, basis) for p in paths]
            )
            summaries = [carbon_summary(c, threshold, hold_s) for c in carbon]
    except (TraceError, ValueError) as exc:
        fail(str(exc))

    if as_json:
        doc = summaries[0] if len(summaries) == 1 else {"kind": kind, "files": summaries}
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        for s in summaries:
            (_print_power if kind == "power" else _print_carbon)(s)
    if plot is not None:
        try:
            if kind == "power":
                plot_power(trace, plot)
            else:
                plot_carbon(carbon, plot, threshold, hold_s)
        except (OSError, ValueError) as exc:
            fail(f"cannot write plot {plot}: {exc}")
        (err if as_json else out).print(f"plot: {plot}", highlight=False)
