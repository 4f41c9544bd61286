"""The profiler's Prometheus series."""

from prometheus_client import Counter, Gauge

SITE_POWER = Gauge("powertrip_site_power_ratio", "Available power fraction per site.", ["site"])
SITE_RTT = Gauge("powertrip_site_rtt_seconds", "Smoothed measured round-trip time.", ["site"])
SITE_BANDWIDTH = Gauge(
    "powertrip_site_bandwidth_bytes_per_second", "Smoothed measured bandwidth.", ["site"]
)
PROBE_BYTES = Counter("powertrip_probe_bytes_total", "Bytes moved by link probes.")
PROBES = Counter("powertrip_probes_total", "Link probes, by outcome.", ["outcome"])
TRACE_FILES_REJECTED = Counter(
    "powertrip_trace_files_rejected_total",
    "Power trace files skipped at start because they failed validation (the rest are served).",
)
TRACKED_WORKERS = Gauge("powertrip_tracked_workers", "Workers the profiler probes.")
