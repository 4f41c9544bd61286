"""The workers stopped when a Kubernetes run is DONE (``POWERTRIP_STOP_WORKERS``).

The worker pods are StatefulSet pods: a worker that ended by itself would be restarted, and one
that keeps running heartbeats to a gone aggregator. So the aggregator, once its run is DONE and
before it exits (its Job then completes), scales every StatefulSet of its namespace that the
label selector names to 0 replicas; their pods get SIGTERM and stop cleanly. It reads its
service account's token, CA and namespace from the standard paths (deploy/k8s mounts them into
the aggregator container only) and asks the API server at ``KUBERNETES_SERVICE_HOST``; its Role
allows listing StatefulSets and patching their scale, nothing else.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
import urllib.request
from pathlib import Path

#: where Kubernetes mounts a pod's service account credentials
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def api_server() -> str:
    """The in-cluster API server's URL (an IPv6 address in brackets)."""
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def stop_workers(
    selector: str,
    api: str | None = None,
    credentials: Path = SERVICE_ACCOUNT,
    timeout_s: float = 10.0,
) -> list[str]:
    """Scale the StatefulSets matching ``selector`` in this pod's namespace to 0; their names.

    Raises ``OSError`` (``urllib.error.URLError``, ``HTTPError``) when the API refuses or cannot
    be reached, ``KeyError`` outside a cluster."""
    token = (credentials / "token").read_text().strip()
    namespace = (credentials / "namespace").read_text().strip()
    base = api or api_server()
    https = base.startswith("https:")
    context = ssl.create_default_context(cafile=str(credentials / "ca.crt")) if https else None

    def call(method: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
        request = urllib.request.Request(
            base + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "Content-Type": "application/merge-patch+json",
            },
        )
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as reply:
            result: dict[str, object] = json.load(reply)
            return result

    sets = f"/apis/apps/v1/namespaces/{urllib.parse.quote(namespace)}/statefulsets"
    listed = call("GET", f"{sets}?labelSelector={urllib.parse.quote(selector)}")
    items = listed.get("items")
    names = [item["metadata"]["name"] for item in items] if isinstance(items, list) else []
    for name in names:
        call("PATCH", f"{sets}/{urllib.parse.quote(name)}/scale", {"spec": {"replicas": 0}})
    return names
