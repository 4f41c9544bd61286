"""Every overlay under deploy/variants is one of the variants every manifest check runs on (the
strict schema check included), and the static-tls Secrets are the kubernetes.io/tls Secrets
cert-manager writes, valid against the Kubernetes schema."""

from __future__ import annotations

import subprocess

import pytest

from tests.deploy.support import K8S_VARIANTS, REPO, TLS_MOUNT, load_yaml_all, pod_spec, tool
from tests.deploy.test_tls_deploys import SECRETS_SCRIPT, mint

K8S_VERSION = "1.32.0"


def test_every_overlay_in_deploy_variants_is_a_checked_variant():
    overlays = {p.parent for p in (REPO / "deploy" / "variants").glob("*/kustomization.yaml")}
    assert overlays == set(K8S_VARIANTS.values()) - {REPO / "deploy" / "k8s"}


@pytest.mark.skipif(tool("kubectl") is None, reason="kubectl not installed")
def test_static_tls_secrets_are_strictly_valid_tls_secrets(tmp_path):
    validator = pytest.importorskip("kubernetes_validate")
    mint(["--workers", "powertrip-worker-0"], tmp_path)
    out = subprocess.run(
        [str(SECRETS_SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    secrets = load_yaml_all(out.stdout)
    assert secrets
    for secret in secrets:
        validator.validate(secret, K8S_VERSION, strict=True)
        # The type the API server checks for tls.crt and tls.key, as cert-manager's Secrets.
        assert secret["type"] == "kubernetes.io/tls"
        assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}


def test_every_tls_file_path_is_a_key_of_the_secret_or_csi_volume(k8s):
    # Whatever fills the volume (cert-manager Secret, csi-driver, the script's Secret), the pods
    # read tls.crt, tls.key and ca.crt from TLS_MOUNT: the keys of a kubernetes.io/tls Secret.
    for w in (d for d in k8s if d["kind"] in {"Deployment", "StatefulSet", "Job"}):
        for c in pod_spec(w)["containers"]:
            paths = {e["value"] for e in c.get("env", []) if e["name"].startswith("POWERTRIP_TLS_")}
            if paths:
                assert paths == {f"{TLS_MOUNT}/{k}" for k in ("tls.crt", "tls.key", "ca.crt")}
