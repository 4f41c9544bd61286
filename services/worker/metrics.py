"""The worker's Prometheus series."""

from prometheus_client import Counter, Gauge, Histogram

from powertrip.services.common.metrics import UPDATE_BYTES  # noqa: F401 - re-exported: one definition

TRAIN_DURATION = Histogram(
    "powertrip_worker_train_duration_seconds",
    "Local training time per site and round (before power pacing).",
    ["site"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
SAMPLES = Counter("powertrip_worker_samples_total", "Training samples processed.", ["site"])
MODEL_BYTES = Counter("powertrip_worker_model_bytes_total", "Global-model bytes received.")
ROUNDS = Counter("powertrip_worker_rounds_total", "Site-rounds, by outcome.", ["outcome"])
POWER = Gauge("powertrip_worker_site_power_ratio", "Power fraction a site trained at.", ["site"])
