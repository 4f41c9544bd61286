"""The profiler's Prometheus series."""

from prometheus_client import Counter, Gauge

SITE_POWER = Gauge("powertrip_site_power_ratio", "Available power fraction per site.", ["site"])
SITE_RTT = Gauge("powertrip_site_rtt_seconds", "Smoothed measured round-trip time.", ["site"])
SITE_BANDWIDTH = Gauge(
    "powertrip_site_bandwidth_bytes_per_second", "Smoothed measured bandwidth.", ["site"]
)
PROBE_BYTES = Counter("powertrip_probe_bytes_total", "Bytes moved by link probes.")
PROBES = Counter("powertrip_probes_total", "Link probes, by outcome.", ["outcome"])
TRACKED_WORKERS = Gauge("powertrip_tracked_workers", "Workers the profiler probes.")
