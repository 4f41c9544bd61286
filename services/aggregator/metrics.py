"""The aggregator's Prometheus series: Prometheus's naming conventions, and no round or request
labels, so the number of series stays bounded however long a run lasts."""

from prometheus_client import Counter, Gauge, Histogram

from powertrip.services.common.metrics import UPDATE_BYTES  # noqa: F401 - re-exported: one definition

ROUND_DURATION = Histogram(
    "powertrip_round_duration_seconds",
    "Round length on the run's clock (emulated or wall).",
    ["strategy"],
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200),
)
ROUND_WALL = Histogram(
    "powertrip_round_wall_duration_seconds",
    "Wall time the aggregator spent on a round (broadcast, training, upload, fold, evaluate).",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
ROUNDS = Counter("powertrip_rounds_total", "Rounds finished, by outcome.", ["outcome"])
ROUND_CURRENT = Gauge("powertrip_round_current", "The round in progress or last finished.")
SITES_SELECTED = Gauge("powertrip_round_sites_selected", "Sites selected in the current round.")
SITE_SELECTED = Counter("powertrip_site_selected_total", "Rounds each site was selected.", ["site"])
ACCURACY = Gauge("powertrip_model_accuracy_ratio", "Held-out accuracy of the global model.")
LOSS = Gauge("powertrip_model_loss", "Held-out loss of the global model.")
TARGET = Gauge("powertrip_target_accuracy_ratio", "The run's target accuracy.")
TIME_TO_ACCURACY = Gauge(
    "powertrip_time_to_accuracy_seconds",
    "Clock seconds until the target accuracy was first reached (NaN until then).",
)
CLOCK = Gauge("powertrip_clock_seconds", "The run's clock (emulated or wall) after the last round.")
BROADCAST_BYTES = Counter(
    "powertrip_model_broadcast_bytes_total", "Global-model bytes sent to workers.", ["worker"]
)
UPDATES = Counter(
    "powertrip_updates_total", "Updates received, by outcome (accepted or reason).", ["outcome"]
)
REPORTED_REFUSED = Counter(
    "powertrip_reported_values_refused_total",
    "Numbers workers reported that no policy saw as reported (powertrip.rounds.reported): a loss "
    "replaced by the round's median, a sample count rounded; by field and reason.",
    ["field", "reason"],
)
REGISTERED_SITES = Gauge("powertrip_registered_sites", "Sites hosted by registered workers.")
CHECKPOINT_ROUND = Gauge("powertrip_checkpoint_round", "Round of the last checkpoint written.")
CHECKPOINT_LOADED_ROUND = Gauge(
    "powertrip_checkpoint_loaded_round", "Round of the checkpoint resumed at start (0: none)."
)
CHECKPOINT_WRITE_FAILURES = Counter(
    "powertrip_checkpoint_write_failures_total",
    "Checkpoints not written (disk full, fsync failing): the run went on without them.",
)
CHECKPOINT_REJECTED = Counter(
    "powertrip_checkpoint_rejected_total",
    "Checkpoints rejected at load (checksum, format, or not fitting the run), by reason.",
    ["reason"],
)
JOURNAL_DAMAGED = Counter(
    "powertrip_journal_damaged_total",
    "Round journals found damaged at start (the history quarantined from the damaged record "
    "on; no checkpoint is affected), by reason: missing, cut, edited, unreadable.",
    ["reason"],
)
JOURNAL_WRITE_FAILURES = Counter(
    "powertrip_journal_write_failures_total",
    "Journal appends the disk refused (the checkpoint was still written; retried next round).",
)

# Curtailment mode: priced by powertrip.curtailment.emissions, as `powertrip curtail` does;
# PowerTrip mode: by powertrip.footprint on the reported power (footprint_metrics.py).
ENERGY = Counter(
    "powertrip_energy_joules_total", "Energy drawn by each site (J; 3.6e6 J = 1 kWh).", ["site"]
)
#: joules per kWh: ENERGY counts in Prometheus' base unit, the study reports kWh
JOULES_PER_KWH = 3.6e6
EMISSIONS = Counter(
    "powertrip_emissions_grams_total", "Operational emissions of each site (gCO2).", ["site"]
)
COST = Counter(
    "powertrip_electricity_cost_dollars_total",
    "Electricity cost of each site at its grid's price (USD; PowerTrip mode only).",
    ["site"],
)
MODE = Gauge("powertrip_mode", "Training mode now: 0 pause, 1 single site, 2 federated.")
ACTIVE_SITES = Gauge("powertrip_active_sites", "Sites training in the current round.")

# Liveness (docs/liveness.md): worker leases, quorum, the profiler's circuit breaker.
WORKERS_ALIVE = Gauge(
    "powertrip_workers_alive", "Registered workers whose heartbeat lease has not run out."
)
WORKER_OFFLINE = Counter(
    "powertrip_worker_offline_total",
    "Times a worker's lease ran out (it missed POWERTRIP_HEARTBEAT_PATIENCE heartbeats).",
    ["worker"],
)
ROUND_FAILURES = Counter(
    "powertrip_round_failures_total",
    "Failed rounds (model unchanged), by reason: no_site_alive, no_update, quorum.",
    ["reason"],
)
UPDATE_STREAMS_OPEN = Gauge(
    "powertrip_update_streams_open",
    "Update streams being received or waiting to be folded (each holds a receive spool).",
)
PROFILER_DEGRADED = Gauge(
    "powertrip_profiler_degraded",
    "1 while rounds use a cached profile because the profiler did not answer, else 0.",
)
PROFILE_AGE = Gauge(
    "powertrip_profile_age_seconds", "Wall seconds since the profiler last answered."
)
# the default robust aggregation (powertrip.aggregation.robust): its bound for the next round, in
# units of
# the global model's norm, and what it did to each update
AGGREGATION_BOUND = Gauge(
    "powertrip_aggregation_bound_ratio",
    "Robust aggregation's bound for the next round, relative to the global model's norm: "
    "clip (updates are shortened to it) and zeroing (updates above it are dropped).",
    ["bound"],
)
UPDATES_DROPPED = Counter(
    "powertrip_updates_dropped_total",
    "Updates robust aggregation dropped as extreme (norm above the zeroing bound).",
)
UPDATES_CLIPPED = Counter(
    "powertrip_updates_clipped_total",
    "Updates robust aggregation shortened to the clip norm.",
)
