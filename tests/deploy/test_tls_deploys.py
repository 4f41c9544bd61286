"""The shipped deploys run mutual TLS by default (reliability matrix R25: deploy-config drift).

Every aggregator, profiler and worker container, in every k8s variant and compose variant but
the explicitly insecure ones, reads its certificate, key and CA from files a Secret (or csi
volume, or compose file secret) mounts; each gets only its own key (k8s workers excepted: see
base/worker.yaml); probes and healthchecks use the plaintext health-only port; and the
certificates the documented tools make carry the identities and names the services check.
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
    find,
    kubectl_kustomize,
    load_compose,
    load_yaml_all,
    pod_spec,
    read_env_file,
    render_kustomize_in_python,
    tool,
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
    (w,) = [d for d in docs if d["kind"] in WORKLOAD_KINDS and d["metadata"]["name"] == name]
    return w


def pod_env(w: dict[str, Any], pod_name: str) -> dict[str, str]:
    """The container's literal env values with Kubernetes' $(VAR) expansion, for one pod."""
    (c,) = pod_spec(w)["containers"]
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = pod_name  # the only fieldRef used: metadata.name
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
    return env


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
    w = workload(render(variant), name)
    env = pod_env(w, f"{name}-1")
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
    for name in [*WORKLOADS, WORKER]:
        (c,) = pod_spec(workload(docs, name))["containers"]
        probes = [c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in c]
        assert len(probes) >= 2 and all(p["grpc"]["port"] == HEALTH_PORT for p in probes), name


@pytest.mark.reliability("R25")
@pytest.mark.parametrize("ordinal", [0, 2])
def test_k8s_worker_pod_takes_its_own_pair_and_its_id_from_its_pod_name(ordinal):
    w = workload(render("default"), WORKER)
    pod = f"{WORKER}-{ordinal}"
    env = pod_env(w, pod)
    assert env["POWERTRIP_WORKER_ID"] == pod  # = the certificate's common name
    assert env["POWERTRIP_TLS_CERT_PATH"] == f"{TLS_MOUNT}/{pod}.crt"
    assert env["POWERTRIP_TLS_KEY_PATH"] == f"{TLS_MOUNT}/{pod}.key"
    _, volume = mounted_volume(w, env["POWERTRIP_TLS_KEY_PATH"])
    assert volume["secret"]["secretName"] == "powertrip-tls-workers"


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
    docs = render("cert-manager")
    certificates = {c["spec"]["secretName"]: c for c in docs if c["kind"] == "Certificate"}
    dialled = {
        "aggregator": service_host(docs, "POWERTRIP_AGGREGATOR_ADDR"),
        "profiler": service_host(docs, "POWERTRIP_PROFILER_ADDR"),
    }
    for name, identity in WORKLOADS.items():
        w = workload(docs, name)
        _, volume = mounted_volume(w, pod_env(w, name)["POWERTRIP_TLS_KEY_PATH"])
        spec = certificates[volume["secret"]["secretName"]]["spec"]
        assert spec["commonName"] == identity
        assert dialled[identity] in spec["dnsNames"]  # the name its peers verify
        assert {"server auth", "client auth"} <= set(spec["usages"])
        issuer = find(docs, "Issuer", spec["issuerRef"]["name"])
        assert spec["issuerRef"]["kind"] == "Issuer" and issuer["spec"]["ca"]["secretName"]
    assert certificates["powertrip-tls-operator"]["spec"]["commonName"] == "operator"
    if kubectl_kustomize(K8S_VARIANTS["cert-manager"]) is not None:  # kustomize namespaces them
        assert {d["metadata"]["namespace"] for d in docs if "cert-manager" in d["apiVersion"]} == {
            "powertrip"
        }


@pytest.mark.reliability("R25")
def test_cert_manager_gives_each_worker_pod_its_own_certificate_named_after_the_pod():
    docs = render("cert-manager")
    w = workload(docs, WORKER)
    env = pod_env(w, f"{WORKER}-0")
    assert env["POWERTRIP_TLS_CERT_PATH"] == f"{TLS_MOUNT}/tls.crt"  # one pair per pod
    _, volume = mounted_volume(w, env["POWERTRIP_TLS_KEY_PATH"])
    attributes = volume["csi"]["volumeAttributes"]
    assert "secret" not in volume
    assert attributes["csi.cert-manager.io/common-name"] == "${POD_NAME}"
    assert env["POWERTRIP_WORKER_ID"] == f"{WORKER}-0"  # ... which is the worker id
    advertised = env["POWERTRIP_ADVERTISE_HOST"].replace(f"{WORKER}-0", "${POD_NAME}")
    assert advertised in attributes["csi.cert-manager.io/dns-names"].split(",")
    usages = {u.strip() for u in attributes["csi.cert-manager.io/key-usages"].split(",")}
    assert {"server auth", "client auth"} <= usages
    issuer = find(docs, "Issuer", attributes["csi.cert-manager.io/issuer-name"])
    assert issuer["spec"]["ca"]["secretName"]


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

    from services.cli.certs import certs

    result = CliRunner().invoke(certs, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return {p.stem: cert_of(p.read_bytes()) for p in out.glob("*.pem") if p.stem != "ca"}


@pytest.mark.reliability("R25")
@pytest.mark.skipif(tool("kubectl") is None, reason="kubectl not installed")
def test_documented_dev_secrets_are_the_ones_the_default_variant_mounts(tmp_path):
    readme = (REPO / "deploy" / "README.md").read_text()
    section = readme[readme.index("### Kubernetes, development certificates") :]
    minted = mint(documented_certs_args(section), tmp_path)
    script = REPO / "deploy" / "k8s-tls-secrets.sh"
    assert f"{script.relative_to(REPO)} certs/k8s | kubectl apply -f -" in section
    out = subprocess.run(
        [str(script), str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    secrets = {s["metadata"]["name"]: s for s in load_yaml_all(out.stdout)}
    docs = render("default")
    replicas = workload(docs, WORKER)["spec"]["replicas"]
    pods = {f"{WORKER}-{n}": workload(docs, WORKER) for n in range(replicas)}
    for pod, w in {**{n: workload(docs, n) for n in WORKLOADS}, **pods}.items():
        env = pod_env(w, pod)
        _, volume = mounted_volume(w, env["POWERTRIP_TLS_CERT_PATH"])
        secret = secrets[volume["secret"]["secretName"]]
        assert secret["metadata"]["namespace"] == "powertrip"
        files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
        cert = cert_of(files[Path(env["POWERTRIP_TLS_CERT_PATH"]).name])
        assert Path(env["POWERTRIP_TLS_KEY_PATH"]).name in files
        assert Path(env["POWERTRIP_TLS_CA_PATH"]).name in files
        identity = WORKLOADS.get(pod, env.get("POWERTRIP_WORKER_ID"))
        assert common_name(cert) == identity and identity in minted
        # Peers dial the worker by its advertised name, the aggregator and profiler by Service.
        names = dns_names(cert)
        if pod in pods:
            assert env["POWERTRIP_ADVERTISE_HOST"] in names
        assert service_host(docs, "POWERTRIP_AGGREGATOR_ADDR") in names


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
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
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
    assert {s["file"] for s in insecure["secrets"].values()} == {"/dev/null"}
    # Metrics stay plain HTTP on :8000 whatever the gRPC transport: the scrape is unchanged.
    scrape = (REPO / "deploy/k8s/components/monitoring/prometheus/prometheus.yml").read_text()
    assert "scheme: https" not in scrape and "powertrip-aggregator:8000" in scrape


@pytest.mark.reliability("R25")
@pytest.mark.skipif(tool("make") is None, reason="make not installed")
def test_make_certs_mints_every_identity_compose_mounts_with_the_names_it_dials(tmp_path):
    plan = subprocess.run(
        ["make", "-n", "certs"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    minted = mint(documented_certs_args(plan), tmp_path)
    assert re.search(r"chmod 644 certs/\*\.key", plan), "keys unreadable by the UID 10001"
    compose = load_compose(*COMPOSE_VARIANTS["default"])
    env = compose_service_env(compose["services"]["aggregator"])
    dialled = [
        env[v].rpartition(":")[0] for v in ("POWERTRIP_AGGREGATOR_ADDR", "POWERTRIP_PROFILER_ADDR")
    ]
    for name in COMPOSE_APPS:
        identity = compose_identity(name, compose["services"][name])
        assert common_name(minted[identity]) == identity
        assert set(dialled) <= set(dns_names(minted[identity]))
        if name in COMPOSE_WORKERS:  # the advertised address defaults to the hostname
            assert identity in dns_names(minted[identity])
