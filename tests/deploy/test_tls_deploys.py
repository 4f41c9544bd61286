"""The shipped deploys run mutual TLS by default (reliability matrix R25: deploy-config drift).

Every aggregator, profiler and worker container, in every k8s variant and compose variant but
the explicitly insecure ones, reads its certificate, key and CA from files a Secret (or csi
volume, or compose file secret) mounts; each pod or container gets only its own key (cert-manager's
csi-driver issues each worker pod its own; static-tls runs one StatefulSet per worker, each with
its own Secret); probes and healthchecks use the plaintext health-only port; and the
certificates the documented tools make carry the identities the services check.
"""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    COMPOSE_VARIANTS,
    K8S_VARIANTS,
    REPO,
    SHARED_ENV,
    TLS_MOUNT,
    TLS_VARS,
    WORKLOAD_KINDS,
    compose_service_env,
    config_map_data,
    container_env,
    find,
    kubectl_kustomize,
    load_compose,
    load_yaml_all,
    pod_names,
    pod_spec,
    read_env_file,
    render_kustomize_in_python,
    tool,
    workloads,
)

x509 = pytest.importorskip("cryptography.x509")

WORKLOADS = {"powertrip-aggregator": "aggregator", "powertrip-profiler": "profiler"}
WORKER = "powertrip-worker"
COMPOSE_WORKERS = ("worker-eu-west", "worker-us-east", "worker-ap-south")
COMPOSE_APPS = ("aggregator", "profiler", *COMPOSE_WORKERS)
PLAINTEXT = {"insecure"}  # the only variants without TLS, each named explicitly
HEALTH_PORT = int(read_env_file(SHARED_ENV)["POWERTRIP_HEALTH_PORT"])
CSI_DRIVER = "csi.cert-manager.io"


def render(variant: str) -> list[dict[str, Any]]:
    built = kubectl_kustomize(K8S_VARIANTS[variant])
    return list(built) if built is not None else render_kustomize_in_python(K8S_VARIANTS[variant])


def workload(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The workload of pods ``name`` (the first worker StatefulSet in static-tls)."""
    return workloads(docs, name)[0]


def pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod the variant runs, by pod name, with the workload that makes it."""
    out = {}
    for name in [*WORKLOADS, WORKER]:
        for w in workloads(docs, name):
            names = pod_names(w) if w["kind"] == "StatefulSet" else [f"{name}-0"]
            out |= dict.fromkeys(names, w)
    return out


def identity_of(pod: str, w: dict[str, Any]) -> str:
    return WORKLOADS.get(w["metadata"]["name"]) or pod_env(w, pod)["POWERTRIP_WORKER_ID"]


def pod_env(w: dict[str, Any], pod_name: str) -> dict[str, str]:
    """The container's literal env values with Kubernetes' $(VAR) expansion, for one pod."""
    return container_env(w, pod_name)


def mounted_volume(w: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volumeMount, volume) of the mount that holds file ``path``."""
    (c,) = pod_spec(w)["containers"]
    (mount,) = [m for m in c["volumeMounts"] if Path(path).parent == Path(m["mountPath"])]
    volumes = {v["name"]: v for v in pod_spec(w)["volumes"]}
    return mount, volumes[mount["name"]]


TLS_VARIANTS = sorted(set(K8S_VARIANTS) - PLAINTEXT)


# --------------------------------------------------------------------------------------------
# Kubernetes


@pytest.mark.reliability("R25")
@pytest.mark.parametrize("variant", TLS_VARIANTS)
@pytest.mark.parametrize("name", [*WORKLOADS, WORKER])
def test_k8s_service_reads_its_tls_files_from_a_mounted_secret_volume(variant, name):
    for w in workloads(render(variant), name):
        check_tls_files_mounted(w, pod_env(w, f"{name}-1"), name)


def check_tls_files_mounted(w: dict[str, Any], env: dict[str, str], name: str) -> None:
    assert "POWERTRIP_INSECURE" not in env
    spec = pod_spec(w)
    for var in TLS_VARS:
        assert env.get(var, "").startswith(TLS_MOUNT + "/"), f"{name}: {var}={env.get(var)}"
        mount, volume = mounted_volume(w, env[var])
        assert mount["readOnly"] is True
        if "secret" in volume:
            assert volume["secret"]["defaultMode"] == 0o400
            # kubelet makes the files group-readable for fsGroup: the pod's group must be it.
            assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
        else:  # a per-pod certificate from cert-manager's csi-driver
            attributes = volume["csi"]["volumeAttributes"]
            assert volume["csi"]["driver"] == CSI_DRIVER
            assert attributes["csi.cert-manager.io/fs-group"] == str(
                spec["securityContext"]["runAsGroup"]
            )


@pytest.mark.reliability("R25")
@pytest.mark.parametrize("variant", sorted(K8S_VARIANTS))
def test_k8s_probes_use_the_plaintext_health_port_the_config_sets(variant):
    docs = render(variant)
    assert int(config_map_data(docs)["POWERTRIP_HEALTH_PORT"]) == HEALTH_PORT != 50051
    for w in pods(docs).values():
        (c,) = pod_spec(w)["containers"]
        name = w["metadata"]["name"]
        probes = [c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in c]
        assert len(probes) >= 2 and all(p["grpc"]["port"] == HEALTH_PORT for p in probes), name


def tls_volume(w: dict[str, Any], pod: str) -> dict[str, Any]:
    _, volume = mounted_volume(w, pod_env(w, pod)["POWERTRIP_TLS_KEY_PATH"])
    return volume


@pytest.mark.reliability("R25")
@pytest.mark.parametrize("variant", TLS_VARIANTS)
def test_k8s_no_pod_can_read_another_identitys_key(variant):
    """Each pod's TLS volume holds its own identity's key and nobody else's: a csi-driver volume
    issued to the pod itself, or a Secret named after its identity that no other pod mounts (a
    compromised worker must not be able to impersonate another, nor the aggregator)."""
    docs = render(variant)
    secret_holders: dict[str, set[str]] = {}
    for pod, w in pods(docs).items():
        identity = identity_of(pod, w)
        volume = tls_volume(w, pod)
        if "csi" in volume:  # cert-manager issues the pod's own certificate, named after it
            assert volume["csi"]["driver"] == CSI_DRIVER
            attributes = volume["csi"]["volumeAttributes"]
            assert attributes["csi.cert-manager.io/common-name"] == "${POD_NAME}"
            assert identity == pod, f"{pod}: its certificate would name the pod, not {identity}"
        else:
            name = volume["secret"]["secretName"]
            assert name == f"powertrip-tls-{identity}", f"{pod} mounts {name}"
            assert "items" not in volume["secret"]  # the whole Secret: the pair and the CA
            secret_holders.setdefault(name, set()).add(identity)
        # No other volume of the pod brings a key in either (a projected one may carry the
        # aggregator's service account token, the cluster CA and its namespace: no Secret).
        others = [v for v in pod_spec(w)["volumes"] if v is not volume]
        projected = [src for v in others for src in v.get("projected", {}).get("sources", [])]
        assert not [v for v in others if "secret" in v or "csi" in v], pod
        assert not [src for src in projected if "secret" in src], pod
    assert all(len(ids) == 1 for ids in secret_holders.values()), secret_holders


@pytest.mark.reliability("R25")
def test_k8s_default_workers_get_certificates_from_cert_manager_and_static_tls_from_secrets():
    default = [tls_volume(w, p) for p, w in pods(render("default")).items() if WORKER in p]
    assert default and all("csi" in v for v in default)
    static = pods(render("static-tls"))
    workers = {p: w for p, w in static.items() if p.startswith(WORKER)}
    # One single-replica StatefulSet per worker id: the only way to mount a per-pod Secret.
    assert len({w["metadata"]["name"] for w in workers.values()}) == len(workers) == 3
    assert all(w["spec"]["replicas"] == 1 for w in workers.values())
    assert {identity_of(p, w) for p, w in workers.items()} == {f"{WORKER}-{n}" for n in range(3)}
    assert not [d for d in render("static-tls") if d["apiVersion"].startswith("cert-manager.io")]


def has_insecure(docs: list[dict[str, Any]]) -> bool:
    envs = [pod_env(w, "p-0") for w in docs if w["kind"] in WORKLOAD_KINDS]
    data = [d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"]
    return any("POWERTRIP_INSECURE" in e for e in [*envs, *data])


@pytest.mark.reliability("R25")
def test_k8s_plaintext_only_in_the_insecure_variant_which_mounts_no_tls():
    assert {v for v in K8S_VARIANTS if has_insecure(render(v))} == PLAINTEXT
    docs = render("insecure")
    for name in [*WORKLOADS, WORKER]:
        w = workload(docs, name)
        env = pod_env(w, f"{name}-0")
        assert env["POWERTRIP_INSECURE"] == "1" and not set(TLS_VARS) & set(env)
        volumes = pod_spec(w)["volumes"]
        assert not [v for v in volumes if "secret" in v or "csi" in v], name
    # ... and kustomize's render and the plain-Python one agree on the deletions.
    python = render_kustomize_in_python(K8S_VARIANTS["insecure"])
    assert pod_env(workload(python, WORKER), "p-0") == pod_env(workload(docs, WORKER), "p-0")


def service_host(docs: list[dict[str, Any]], variable: str) -> str:
    return config_map_data(docs)[variable].rpartition(":")[0]


@pytest.mark.reliability("R25")
def test_cert_manager_certificates_fill_the_secrets_the_pods_mount_under_their_identities():
    docs = render("default")
    certificates = {c["spec"]["secretName"]: c for c in docs if c["kind"] == "Certificate"}
    for name, identity in WORKLOADS.items():
        w = workload(docs, name)
        _, volume = mounted_volume(w, pod_env(w, name)["POWERTRIP_TLS_KEY_PATH"])
        spec = certificates[volume["secret"]["secretName"]]["spec"]
        # Clients verify a server by its identity name, so that is the certificate's DNS name.
        assert spec["commonName"] == identity and spec["dnsNames"] == [identity]
        assert {"server auth", "client auth"} <= set(spec["usages"])
        issuer = find(docs, "Issuer", spec["issuerRef"]["name"])
        assert spec["issuerRef"]["kind"] == "Issuer" and issuer["spec"]["ca"]["secretName"]
    operator = certificates["powertrip-tls-operator"]["spec"]
    assert operator["commonName"] == "operator" and operator["dnsNames"] == ["operator"]
    if kubectl_kustomize(K8S_VARIANTS["default"]) is not None:  # kustomize namespaces them
        assert {d["metadata"]["namespace"] for d in docs if "cert-manager" in d["apiVersion"]} == {
            "powertrip"
        }


@pytest.mark.reliability("R29")
def test_cert_manager_bootstraps_the_ca_in_a_secret_no_pod_mounts_and_renews_every_leaf():
    docs = render("default")
    ca_issuer = find(docs, "Issuer", "powertrip-ca")
    ca_secret = ca_issuer["spec"]["ca"]["secretName"]
    (ca,) = [c for c in docs if c["kind"] == "Certificate" and c["spec"].get("isCA")]
    assert ca["spec"]["secretName"] == ca_secret
    assert "selfSigned" in find(docs, "Issuer", ca["spec"]["issuerRef"]["name"])["spec"]
    # The CA key stays in its Secret: no pod mounts it.
    for w in (d for d in docs if d["kind"] in WORKLOAD_KINDS):
        assert ca_secret not in [
            v.get("secret", {}).get("secretName") for v in pod_spec(w)["volumes"]
        ]
    # Leaves renew before they expire (the services reload the renewed files).
    for c in (c for c in docs if c["kind"] == "Certificate" and not c["spec"].get("isCA")):
        assert c["spec"]["renewBefore"] and c["spec"]["duration"], c["metadata"]["name"]
        assert c["spec"]["issuerRef"]["name"] == "powertrip-ca"


@pytest.mark.reliability("R25")
def test_cert_manager_gives_each_worker_pod_its_own_certificate_named_after_the_pod():
    docs = render("default")
    w = workload(docs, WORKER)
    env = pod_env(w, f"{WORKER}-0")
    assert env["POWERTRIP_TLS_CERT_PATH"] == f"{TLS_MOUNT}/tls.crt"  # one pair per pod
    _, volume = mounted_volume(w, env["POWERTRIP_TLS_KEY_PATH"])
    attributes = volume["csi"]["volumeAttributes"]
    assert "secret" not in volume
    assert attributes["csi.cert-manager.io/common-name"] == "${POD_NAME}"
    assert env["POWERTRIP_WORKER_ID"] == f"{WORKER}-0"  # ... which is the worker id
    assert attributes["csi.cert-manager.io/dns-names"] == "${POD_NAME}"  # the identity only
    usages = {u.strip() for u in attributes["csi.cert-manager.io/key-usages"].split(",")}
    assert {"server auth", "client auth"} <= usages
    issuer = find(docs, "Issuer", attributes["csi.cert-manager.io/issuer-name"])
    assert issuer["spec"]["ca"]["secretName"]


SECRETS_SCRIPT = REPO / "deploy" / "k8s-tls-secrets.sh"


def pair_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem, password=None)
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert_of(cert_pem).public_key().public_bytes(*spki) == key.public_key().public_bytes(
        *spki
    )


def cert_of(pem: bytes) -> Any:
    return x509.load_pem_x509_certificate(pem)


def common_name(cert: Any) -> str:
    return cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value


def dns_names(cert: Any) -> list[str]:
    return cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)


def documented_certs_args(text: str) -> list[str]:
    """The arguments of the first ``powertrip certs`` command in ``text`` (continuation lines
    joined), after ``certs``, without ``--out DIR``."""
    joined = re.sub(r"\\\n\s*", " ", text)
    line = re.search(r"powertrip certs (.*)", joined)
    assert line, "no `powertrip certs` command"
    args = shlex.split(line.group(1).split("#")[0])
    out = args.index("--out")
    return args[:out] + args[out + 2 :]


def mint(args: list[str], out: Path) -> dict[str, Any]:
    """Run `powertrip certs ARGS --out OUT` (the click command itself: no torch import) and
    return name -> certificate for every NAME.pem written."""
    from click.testing import CliRunner

    from powertrip.services.cli.certs import certs

    result = CliRunner().invoke(certs, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return {p.stem: cert_of(p.read_bytes()) for p in out.glob("*.pem") if p.stem != "ca"}


def run_secrets_script(certs_dir: Path) -> dict[str, dict[str, bytes]]:
    """deploy/k8s-tls-secrets.sh's output: Secret name -> file name -> content."""
    out = subprocess.run(
        [str(SECRETS_SCRIPT), str(certs_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    secrets = {}
    for s in load_yaml_all(out.stdout):
        assert s["kind"] == "Secret" and s["metadata"]["namespace"] == "powertrip"
        assert s["type"] == "kubernetes.io/tls"
        secrets[s["metadata"]["name"]] = {k: base64.b64decode(v) for k, v in s["data"].items()}
    return secrets


@pytest.mark.reliability("R25")
@pytest.mark.skipif(tool("kubectl") is None, reason="kubectl not installed")
def test_documented_static_secrets_are_one_per_identity_and_the_ones_static_tls_mounts(tmp_path):
    readme = (REPO / "deploy" / "README.md").read_text()
    section = readme[readme.index("### Kubernetes without cert-manager") :]
    minted = mint(documented_certs_args(section), tmp_path)
    assert f"{SECRETS_SCRIPT.relative_to(REPO)} certs/k8s | kubectl apply -f -" in section
    secrets = run_secrets_script(tmp_path)
    ca_pem = (tmp_path / "ca.pem").read_bytes()
    docs = render("static-tls")
    mounted = set()
    for pod, w in pods(docs).items():
        env = pod_env(w, pod)
        identity = identity_of(pod, w)
        files = secrets[tls_volume(w, pod)["secret"]["secretName"]]
        mounted.add(tls_volume(w, pod)["secret"]["secretName"])
        assert (
            set(files) == {Path(env[v]).name for v in TLS_VARS} == {"tls.crt", "tls.key", "ca.crt"}
        )
        cert = cert_of(files["tls.crt"])
        assert common_name(cert) == identity and identity in minted
        assert identity in dns_names(cert)  # peers verify it by its identity name
        assert files["ca.crt"] == ca_pem
    # One Secret per identity that runs in the cluster, and none for anything else (the
    # operator's pair stays with the CLI).
    assert set(secrets) == mounted


@pytest.mark.reliability("R29")
@pytest.mark.skipif(tool("kubectl") is None, reason="kubectl not installed")
def test_static_secrets_hold_each_identitys_own_pair_and_never_the_ca_key(tmp_path):
    mint(["--workers", "powertrip-worker-0,powertrip-worker-1"], tmp_path)
    secrets = run_secrets_script(tmp_path)
    assert set(secrets) == {
        "powertrip-tls-aggregator",
        "powertrip-tls-profiler",
        "powertrip-tls-powertrip-worker-0",
        "powertrip-tls-powertrip-worker-1",
    }
    ca_key = tmp_path / "ca.key"  # kept by `powertrip certs` for --renew: never in a Secret
    for name, files in secrets.items():
        assert set(files) == {"tls.crt", "tls.key", "ca.crt"}, name
        identity = name.removeprefix("powertrip-tls-")
        assert files["tls.key"] == (tmp_path / f"{identity}.key").read_bytes(), name
        assert pair_matches(files["tls.crt"], files["tls.key"]), name
        if ca_key.exists():
            assert ca_key.read_bytes() not in files.values(), name


# --------------------------------------------------------------------------------------------
# compose


def compose_identity(service_name: str, service: dict[str, Any]) -> str:
    """The certificate name a compose service must hold: its worker id (the hostname) or its
    service name."""
    return service.get("hostname", service_name)


@pytest.mark.reliability("R25")
@pytest.mark.parametrize("variant", sorted(set(COMPOSE_VARIANTS) - PLAINTEXT))
def test_compose_service_gets_only_its_own_key_through_file_secrets(variant):
    compose = load_compose(*COMPOSE_VARIANTS[variant])
    top = compose["secrets"]
    holders: dict[str, list[str]] = {}
    for name in COMPOSE_APPS:
        service = compose["services"][name]
        env = compose_service_env(service)
        assert "POWERTRIP_INSECURE" not in env
        mounted = {f"/run/secrets/{s['target']}": s["source"] for s in service["secrets"]}
        identity = compose_identity(name, service)
        expected = {
            "POWERTRIP_TLS_CERT_PATH": f"./certs/{identity}.pem",
            "POWERTRIP_TLS_KEY_PATH": f"./certs/{identity}.key",
            "POWERTRIP_TLS_CA_PATH": "./certs/ca.pem",
        }
        for var, host_file in expected.items():
            assert env[var].startswith(TLS_MOUNT + "/")
            assert top[mounted[env[var]]]["file"] == host_file, f"{name}: {var}"
        for source in mounted.values():
            holders.setdefault(top[source]["file"], []).append(name)
    keys = {f: names for f, names in holders.items() if f.endswith(".key")}
    assert len(keys) == len(COMPOSE_APPS) and all(len(n) == 1 for n in keys.values()), keys


def compose_config(*files: Path) -> dict[str, Any]:
    command = [tool("docker-compose")] if tool("docker-compose") else None
    if command is None:
        pytest.skip("docker-compose not installed")
    out = subprocess.run(
        [*command, *(a for f in files for a in ("-f", str(f))), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


@pytest.mark.reliability("R25")
def test_docker_compose_renders_tls_by_default_and_plaintext_only_with_the_insecure_overlay():
    default = compose_config(*COMPOSE_VARIANTS["default"])
    insecure = compose_config(*COMPOSE_VARIANTS["insecure"])
    for name in COMPOSE_APPS:
        env, service = default["services"][name]["environment"], default["services"][name]
        assert all(env[v].startswith(TLS_MOUNT) for v in TLS_VARS), name
        assert "POWERTRIP_INSECURE" not in env
        assert len(service["secrets"]) == 3
        test = " ".join(service["healthcheck"]["test"])
        assert f"localhost:{HEALTH_PORT}" in test and "insecure_channel" in test
        env = insecure["services"][name]["environment"]
        assert env["POWERTRIP_INSECURE"] == "1" and not any(env[v] for v in TLS_VARS), name
    # Nothing from ./certs is needed (or read) in plaintext.
    tls_files = {s["file"] for s in insecure["secrets"].values() if "grafana" not in s["file"]}
    assert tls_files == {"/dev/null"}
    # Metrics stay plain HTTP on :8000 whatever the gRPC transport: the scrape is unchanged.
    scrape = (REPO / "deploy/k8s/components/monitoring/prometheus/prometheus.yml").read_text()
    assert "scheme: https" not in scrape and "powertrip-aggregator:8000" in scrape


@pytest.mark.reliability("R25")
@pytest.mark.skipif(tool("make") is None, reason="make not installed")
def test_make_certs_mints_every_identity_compose_mounts_named_after_it(tmp_path):
    plan = subprocess.run(
        ["make", "-n", "certs"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    minted = mint(documented_certs_args(plan), tmp_path)
    assert re.search(r"chmod 644 certs/\*\.key", plan), "keys unreadable by the UID 10001"
    compose = load_compose(*COMPOSE_VARIANTS["default"])
    for name in COMPOSE_APPS:
        identity = compose_identity(name, compose["services"][name])
        # Clients verify a server by the identity they expect, whatever address they dial.
        assert common_name(minted[identity]) == identity
        assert identity in dns_names(minted[identity])
