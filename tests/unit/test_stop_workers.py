"""POWERTRIP_STOP_WORKERS: the aggregator of a finished Kubernetes run scales the worker
StatefulSets to 0, through the API server's REST calls a Role of list + scale allows. Checked
against a stand-in API server on a real socket (plain HTTP: the TLS is urllib's own)."""

from __future__ import annotations

import json
import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from powertrip.services.aggregator.stop_workers import api_server, stop_workers


class StandInApi(ThreadingHTTPServer):
    def __init__(self, names: list[str], status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.names, self.status = names, status
        self.calls: list[tuple[str, str, str, object]] = []  # method, path, auth, body


class Handler(BaseHTTPRequestHandler):
    server: StandInApi

    def _answer(self, body: object) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        sent = json.loads(self.rfile.read(length)) if length else None
        self.server.calls.append((self.command, self.path, self.headers["Authorization"], sent))
        data = json.dumps(body).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._answer({"items": [{"metadata": {"name": n}} for n in self.server.names]})

    def do_PATCH(self) -> None:  # noqa: N802
        self._answer({"kind": "Scale", "spec": {"replicas": 0}})

    def log_message(self, *args: object) -> None:
        pass


def serve(api: StandInApi) -> Iterator[str]:
    thread = threading.Thread(target=api.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{api.server_address[1]}"
    finally:
        api.shutdown()
        api.server_close()


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "namespace").write_text("powertrip")
    return tmp_path


def test_every_matching_statefulset_is_scaled_to_zero(credentials):
    api = StandInApi(["powertrip-worker-0", "powertrip-worker-1"])
    for url in serve(api):
        names = stop_workers("app.kubernetes.io/component=worker", url, credentials)
    assert names == ["powertrip-worker-0", "powertrip-worker-1"]
    sets = "/apis/apps/v1/namespaces/powertrip/statefulsets"
    assert api.calls == [
        (
            "GET",
            f"{sets}?labelSelector=app.kubernetes.io/component%3Dworker",
            "Bearer sa-token",
            None,
        ),
        ("PATCH", f"{sets}/powertrip-worker-0/scale", "Bearer sa-token", {"spec": {"replicas": 0}}),
        ("PATCH", f"{sets}/powertrip-worker-1/scale", "Bearer sa-token", {"spec": {"replicas": 0}}),
    ]


def test_nothing_matching_scales_nothing(credentials):
    api = StandInApi([])
    for url in serve(api):
        assert stop_workers("app.kubernetes.io/component=worker", url, credentials) == []
    assert [c[0] for c in api.calls] == ["GET"]


def test_a_refusal_raises_for_the_aggregator_to_log(credentials):
    api = StandInApi(["powertrip-worker"], status=403)  # a Role without the scale verb
    for url in serve(api):
        with pytest.raises(urllib.error.HTTPError, match="403"):
            stop_workers("app.kubernetes.io/component=worker", url, credentials)


def test_the_api_server_comes_from_the_pods_environment(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert api_server() == "https://10.96.0.1:443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert api_server() == "https://[fd00::1]:443"
