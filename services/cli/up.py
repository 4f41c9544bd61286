"""``powertrip up``: run the real services locally and train to the target."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args

import click
from rich.table import Table

from powertrip.config.curtailment import CURTAIL_PRESETS
from powertrip.config.experiment import needs_dataset_path
from powertrip.config.presets import PRESETS
from powertrip.selection.registry import known_policy_names, validate_policy_name
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.cli.common import (
    OutputDir,
    RegisteredName,
    device_option,
    err,
    fail,
    out,
    preset_option,
)
from powertrip.services.cli.export import require_tensorboard, tensorboard_option, write_tensorboard
from powertrip.services.cli.launcher import ClusterPlan, LaunchError, LocalCluster
from powertrip.services.cli.up_options import service_env, up_options
from powertrip.services.cli.up_outputs import (
    RoundsProgress,
    write_rounds_csv,
    write_scrape_config,
)
from powertrip.v1 import aggregator_pb2

AT_LEAST_1 = click.IntRange(min=1)
#: each local worker is a process holding torch (~0.3 GB): beyond this a laptop or CI box swaps
#: long before the run starts, and minting a certificate per worker would take minutes first
MAX_LOCAL_WORKERS = 256
Command = TypeVar("Command", bound=Callable[..., Any])
POSITIVE = click.FloatRange(0, min_open=True)


def _aggregator_option(
    flag: str, help: str, kind: click.ParamType | None = None
) -> Callable[[Command], Command]:
    """``flag``: the aggregator's own setting of that name, whose choices (a ``Literal``'s) and
    default it declares, once (``AggregatorConfig``); ``help`` says what it means to ``up``."""
    info = AggregatorConfig.model_fields[flag.removeprefix("--")]
    kind = kind or click.Choice(get_args(info.annotation))
    return click.option(flag, type=kind, default=info.default, show_default=True, help=help)


@click.command()
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_LOCAL_WORKERS),
    default=3,
    show_default=True,
    help=f"Worker processes on this machine (at most {MAX_LOCAL_WORKERS}: each is a Python "
    "process with its own torch; checked before any certificate is minted).",
)
@click.option(
    "--sites", type=AT_LEAST_1, default=12, show_default=True, help="Sites, split over workers."
)
@click.option(
    "--policy",
    type=RegisteredName(known_policy_names, validate_policy_name),
    metavar="NAME",
    default="powertrip",
    show_default=True,
    help=f"Selection policy. Known: {', '.join(known_policy_names())}.",
)
@_aggregator_option(
    "--clock",
    "emulated: the emulator's time model while the bytes really move; wall: real time, with "
    "each site's update released at compute time / power.",
)
@_aggregator_option(
    "--pace",
    "Emulated clock: run-clock seconds per wall second, so a Prometheus (OUTPUT/prometheus.yml) "
    "sees the run unfold; 0 = as fast as possible. Results are the same.",
    click.FloatRange(min=0),
)
@preset_option(PRESETS, "quick")
@_aggregator_option(
    "--mode",
    "curtailment: sites train only in their grid's curtailment windows (arXiv 2602.22760), one "
    "site per region of --curtail-preset's carbon trace (use --sites 3 for its three regions).",
)
@preset_option(CURTAIL_PRESETS, "curtailment", "--curtail-preset")
@click.option("--k-star", type=AT_LEAST_1, help="k for static-optimal / random policies.")
@click.option(
    "--deadline", type=POSITIVE, default=60.0, show_default=True, help="Round deadline, wall s."
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Plaintext gRPC (no identities checked). Default: mutual TLS with a throw-away CA "
    "and certificates minted into OUTPUT/tls.",
)
@click.option("--tls", is_flag=True, hidden=True, help="The default; kept as a no-op alias.")
@click.option(
    "--timeout", type=POSITIVE, default=1800.0, show_default=True, help="Give up after (s)."
)
@click.option(
    "--netns-profile",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Root only: run each worker in its own network namespace behind a tc-shaped link to "
    "a hub namespace (tc-scripts/topology.sh); one 'name rate delay' row per worker. Use with "
    "--clock wall so the profiler's measured links drive the ranking.",
)
@click.option(
    "--output",
    type=OutputDir(),
    default=Path("results/up"),
    show_default=True,
    help="Logs, checkpoints and rounds.csv go here.",
)
@click.option(
    "--linger",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Keep the services (and their /metrics) up this many seconds after the run ends, for "
    "a Prometheus to scrape (OUTPUT/prometheus.yml lists them); Ctrl-C stops early.",
)
@click.option(
    "--site-ranks",
    type=click.IntRange(0, 64),
    default=0,
    show_default=True,
    help="Each worker trains its one site as a torch.distributed job over N rank processes "
    "(gloo on the CPU, one GPU each on CUDA; docs/site-engine.md); needs --sites equal to "
    "--workers. 0: sites train in the worker's process.",
)
@device_option
@tensorboard_option
@up_options
def up(
    workers: int,
    sites: int,
    policy: str,
    clock: str,
    pace: float,
    preset: str,
    mode: str,
    curtail_preset: str,
    k_star: int | None,
    deadline: float,
    insecure: bool,
    tls: bool,
    timeout: float,
    netns_profile: Path | None,
    output: Path,
    tensorboard: Path | None,
    linger: float,
    site_ranks: int,
    device: str,
    **options: object,
) -> None:
    """Start the profiler, the aggregator and W workers on loopback, train to the target,
    print the summary and the metrics endpoints, then stop exactly those processes.

    The run's settings (the workload, its optimizer, the codec, the aggregation, the
    curtailment run's, the site engine's ...) are the services' own, one flag each; unset,
    the preset's."""
    workload = options.get("workload")
    workload = workload if isinstance(workload, str) else None
    try:
        validate_policy_name(policy)
        require_tensorboard(tensorboard)
        if needs_dataset_path(workload) and options.get("dataset_path") is None:
            raise ValueError(f"--workload {workload} needs --dataset-path")
        if pace > 0 and clock != "emulated":
            raise ValueError("--pace paces the emulated clock; a --clock wall run is real time")
        if site_ranks and (sites != workers or mode == "curtailment"):
            raise ValueError(
                f"--site-ranks trains one site per worker over its ranks: use --sites {workers} "
                "(as many as --workers), in the powertrip mode"
            )
        own: dict[str, object] = {"mode": mode, "preset": preset, "curtail_preset": curtail_preset}
        own |= {"policy": policy, "k_star": k_star, "clock": clock, "pace": pace or None}
        own |= {"sites": sites, "site_ranks": site_ranks}
        extra_env = service_env(options, own)
        if k_star:
            extra_env["POWERTRIP_K_STAR"] = str(k_star)
        if site_ranks:
            extra_env["POWERTRIP_SITE_RANKS"] = str(site_ranks)
        plan = ClusterPlan(
            workers=workers,
            sites=sites,
            policy=policy,
            clock=clock,
            pace=pace,
            preset=preset,
            mode=mode,
            curtail_preset=curtail_preset,
            round_deadline_s=deadline,
            log_dir=output / "logs",
            checkpoint_dir=output / "checkpoints",
            extra_env=extra_env,
            netns_profile=netns_profile,
            tls_dir=None if insecure else output / "tls",
            insecure=insecure,
            device=device,
        )
        plan.site_ranges()
        if insecure and tls:
            raise ValueError("--insecure and --tls contradict each other")
    except ValueError as exc:
        fail(str(exc))
    output.mkdir(parents=True, exist_ok=True)
    rounds = options.get("max_rounds") or PRESETS[preset].get("max_rounds")  # the bar's total
    budget = rounds if isinstance(rounds, int) and mode != "curtailment" else None

    # SIGTERM (a supervisor, `kill`, a test) ends the run like Ctrl-C: through the cluster's
    # exit, which stops every process it started, instead of orphaning them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with LocalCluster(plan) as cluster:
        try:
            cluster.start(
                lambda s: err.print(
                    f"started {s.name} (pid {s.process.pid}) at {s.grpc_addr}, "
                    f"metrics {s.metrics_url}",
                    highlight=False,
                )
            )
            scrape = write_scrape_config(output / "prometheus.yml", cluster.services)
            err.print(f"Prometheus scrape config: {scrape}", highlight=False)
            err.print(
                f"training: policy={policy} clock={clock} workers={workers} sites={sites}"
                + (f" pace={pace:g}" if pace else "")
                + (f" tls={plan.tls_path}" if plan.tls_path else " PLAINTEXT (--insecure)")
            )
            with RoundsProgress(err, budget) as show:  # a bar, or a line every few seconds
                st = cluster.wait_done(timeout, show)
        except LaunchError as exc:
            err.print(f"[bold red]error:[/] {exc} (logs: {plan.log_dir})", highlight=False)
            sys.exit(1)
        except KeyboardInterrupt:
            err.print("interrupted; stopping the services")
            sys.exit(130)
        write_rounds_csv(output / "rounds.csv", policy, list(st.rounds))
        write_tensorboard(output, tensorboard)  # no-op without --tensorboard
        table = Table(title=f"powertrip up: {st.message}")
        for col in ("policy", "clock", "rounds", "final accuracy", "target", "time to accuracy"):
            table.add_column(col)
        tta = f"{st.time_to_accuracy_seconds:.1f} s" if st.time_to_accuracy_seconds else "—"
        table.add_row(
            st.policy or policy,
            clock,
            str(st.round),
            f"{st.accuracy:.4f}",
            f"{st.target_accuracy:.2f}",
            tta,
        )
        out.print(table)
        if mode == "curtailment":
            out.print(
                f"curtailment ({st.policy}): {st.energy_kwh:.2f} kWh, {st.emissions_kg:.3f} kg CO2",
                highlight=False,
            )
        for s in cluster.services:
            out.print(f"  {s.name:<11} grpc {s.grpc_addr:<22} metrics {s.metrics_url}")
        out.print(f"rounds: {output / 'rounds.csv'}  logs: {plan.log_dir}")
        if linger > 0:
            err.print(f"services stay up {linger:g} s for scraping (Ctrl-C stops them)")
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(linger)
        err.print("stopping the services")
    if st.state != aggregator_pb2.RUN_STATE_DONE:
        sys.exit(1)
