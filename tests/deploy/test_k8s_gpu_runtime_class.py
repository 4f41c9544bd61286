"""The GPU variant's optional runtimeClassName: the commented block in
deploy/variants/gpu/kustomization.yaml, once uncommented, renders a valid variant whose worker
pods, and only those, name the RuntimeClass."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml

from tests.deploy.support import GPU_VARIANT, load_yaml_all, pod_spec, tool, workloads

K8S_VERSION = "1.32.0"
BLOCK = re.compile(r"^# runtimeClassName:begin\n(.*?)^# runtimeClassName:end$", re.S | re.M)


def uncommented_block() -> dict:
    text = (GPU_VARIANT / "kustomization.yaml").read_text()
    match = BLOCK.search(text)
    assert match, "no runtimeClassName block in deploy/variants/gpu/kustomization.yaml"
    lines = match.group(1).splitlines()
    assert all(line.startswith("#") for line in lines), "the block ships commented out"
    return yaml.safe_load("\n".join(re.sub(r"^# ?", "", line) for line in lines))


def test_no_variant_ships_a_runtime_class(k8s):
    for w in (d for d in k8s if d["kind"] in {"StatefulSet", "Deployment", "Job"}):
        assert "runtimeClassName" not in pod_spec(w), w["metadata"]["name"]


@pytest.mark.skipif(tool("kubectl") is None, reason="kubectl not installed")
def test_the_uncommented_runtime_class_reaches_the_workers_only(tmp_path):
    block = uncommented_block()
    (patch,) = block["patches"]
    (op,) = yaml.safe_load(patch["patch"])
    assert op["path"] == "/spec/template/spec/runtimeClassName" and op["value"] == "nvidia"
    # Uncommented in place, the block must not repeat a key the variant already has.
    assert not set(block) & set(yaml.safe_load((GPU_VARIANT / "kustomization.yaml").read_text()))
    overlay = {"resources": [os.path.relpath(GPU_VARIANT, tmp_path)], **block}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    out = subprocess.run(
        [str(tool("kubectl")), "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    docs = load_yaml_all(out.stdout)
    for w in workloads(docs, "powertrip-worker"):
        assert pod_spec(w)["runtimeClassName"] == "nvidia"
    for name in ("powertrip-aggregator", "powertrip-profiler"):
        assert "runtimeClassName" not in pod_spec(workloads(docs, name)[0])
    validator = pytest.importorskip("kubernetes_validate")
    for w in workloads(docs, "powertrip-worker"):
        validator.validate(w, K8S_VERSION, strict=True)
