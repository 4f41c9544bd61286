"""Readers for the deploy files and for what the service code declares.

The service code is read as source (``ast``), never imported, but for the services' config
classes, which load no torch and no generated stubs: the deploy checks must run without torch,
generated stubs or a cluster.
"""

from __future__ import annotations

import ast
import copy
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
MONITORING = K8S / "components" / "monitoring"
DASHBOARDS = MONITORING / "dashboards"
SHARED_ENV = K8S / "base" / "powertrip.env"
COMPOSE = REPO / "compose.yaml"
# Curtailment mode (opt-in): a component merged over the default variant by an overlay outside
# deploy/k8s (kustomize refuses an overlay inside the root it builds on), and a compose override.
CURTAILMENT_COMPONENT = K8S / "components" / "curtailment"
CURTAILMENT_ENV = CURTAILMENT_COMPONENT / "curtailment.env"
CURTAILMENT_VARIANT = REPO / "deploy" / "variants" / "curtailment"
COMPOSE_CURTAILMENT = REPO / "compose.curtailment.yaml"
# GPU workers (opt-in), the same way: a component applied by an overlay, and a compose override.
GPU_COMPONENT = K8S / "components" / "gpu"
GPU_VARIANT = REPO / "deploy" / "variants" / "gpu"
COMPOSE_GPU = REPO / "compose.gpu.yaml"
# A mounted dataset (opt-in), the same way: read-only at /data in the aggregator and workers.
DATASET_COMPONENT = K8S / "components" / "dataset"
DATASET_ENV = DATASET_COMPONENT / "dataset.env"
DATASET_VARIANT = REPO / "deploy" / "variants" / "dataset"
COMPOSE_DATASET = REPO / "compose.dataset.yaml"
# Mutual TLS is on by default, with certificates from cert-manager (Certificates + csi-driver);
# plaintext only through an explicit variant / override; static Secrets (one StatefulSet per
# worker, so one key per pod) for clusters without cert-manager.
INSECURE_VARIANT = REPO / "deploy" / "variants" / "insecure"
STATIC_TLS_VARIANT = REPO / "deploy" / "variants" / "static-tls"
# The cluster's own Prometheus Operator and Grafana instead of the bundled ones: a ServiceMonitor,
# the dashboards for the Grafana sidecar, and no bundled Prometheus or Grafana.
PROMETHEUS_OPERATOR_COMPONENT = K8S / "components" / "prometheus-operator"
PROMETHEUS_OPERATOR_VARIANT = REPO / "deploy" / "variants" / "prometheus-operator"
COMPOSE_INSECURE = REPO / "compose.insecure.yaml"
#: Every way to deploy: kustomization root, and compose files in ``-f`` order.
K8S_VARIANTS = {
    "default": K8S,
    "curtailment": CURTAILMENT_VARIANT,
    "gpu": GPU_VARIANT,
    "dataset": DATASET_VARIANT,
    "insecure": INSECURE_VARIANT,
    "static-tls": STATIC_TLS_VARIANT,
    "prometheus-operator": PROMETHEUS_OPERATOR_VARIANT,
}
COMPOSE_VARIANTS = {
    "default": (COMPOSE,),
    "curtailment": (COMPOSE, COMPOSE_CURTAILMENT),
    "gpu": (COMPOSE, COMPOSE_GPU),
    "dataset": (COMPOSE, COMPOSE_DATASET),
    "insecure": (COMPOSE, COMPOSE_INSECURE),
}
DOCKERFILE = REPO / "Dockerfile"
#: The image's names (before the tag): the default CPU build and the CUDA build
#: (``--build-arg TORCH_INDEX=cu...``) that the GPU variants run on their workers.
IMAGE, CUDA_IMAGE = "powertrip", "powertrip-cuda"

SERVICES_SRC = REPO / "services"
SERVICES = ("aggregator", "profiler", "worker")
ENV_PREFIX = "POWERTRIP_"
#: A service's mutual-TLS settings: its certificate, its key, the CA (all three or none).
TLS_VARS = ("POWERTRIP_TLS_CERT_PATH", "POWERTRIP_TLS_KEY_PATH", "POWERTRIP_TLS_CA_PATH")
#: Where every deploy mounts a service's TLS files (compose secrets, k8s Secret or csi volume).
TLS_MOUNT = "/run/secrets/powertrip"


def tool(name: str) -> str | None:
    """An executable on PATH or next to this Python (a venv's bin/ need not be on PATH)."""
    return shutil.which(
        name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )


# --------------------------------------------------------------------------------------------
# YAML, env files, kustomize


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_all(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, '#' comments: the subset both compose env_file and kustomize envs read."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not KEY=VALUE: {raw!r}"
            env[key.strip()] = value.strip()
    return env


def strategic_merge(base: Any, patch: Any) -> Any:
    """Enough of a strategic-merge patch for our patches: maps merge (``key: null`` deletes the
    key), lists of named objects (containers, env, volumes) merge by ``name`` (an item with
    ``$patch: delete`` removes that name), anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(base[key], value) if key in base else value
        return out
    named = isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(e, dict) and "name" in e for e in [*base, *patch]):
        out = list(base)
        for item in patch:
            index = {e["name"]: i for i, e in enumerate(out)}
            if item.get("$patch") == "delete":
                out = [e for e in out if e["name"] != item["name"]]
            elif item["name"] in index:
                out[index[item["name"]]] = strategic_merge(out[index[item["name"]]], item)
            else:
                out.append(item)
        return out
    return patch


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """A patch target's ``labelSelector``: comma-separated ``k=v``, ``k`` and ``!k`` terms."""
    for term in filter(None, (s.strip() for s in selector.split(","))):
        key, eq, value = term.partition("=")
        if term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = key in labels and (not eq or labels[key] == value)
        if not ok:
            return False
    return True


def patch_hits(doc: dict[str, Any], target: dict[str, Any]) -> bool:
    group = doc["apiVersion"].rpartition("/")[0]
    return (
        target.get("kind", doc["kind"]) == doc["kind"]
        and target.get("name", doc["metadata"]["name"]) == doc["metadata"]["name"]
        and target.get("group", group) == group
        and label_selector_matches(
            target.get("labelSelector", ""), doc["metadata"].get("labels", {})
        )
    )


def add_labels(doc: dict[str, Any], pairs: dict[str, str], selectors: bool) -> None:
    """kustomize ``labels``: on the object; with includeSelectors, also on a workload's selector
    and pod template."""
    doc["metadata"]["labels"] = {**doc["metadata"].get("labels", {}), **pairs}
    if selectors and doc["kind"] in WORKLOAD_KINDS:
        spec = doc["spec"]
        spec["selector"]["matchLabels"] = {**spec["selector"].get("matchLabels", {}), **pairs}
        template = spec["template"]["metadata"]
        template["labels"] = {**template.get("labels", {}), **pairs}


def render_kustomize_in_python(
    root: Path = K8S, docs: list[dict[str, Any]] | None = None, *, final: bool = True
) -> list[dict[str, Any]]:
    """What ``kustomize build`` emits, minus most transformations (images, namespaces, name
    references, labels other than a selector's).

    Follows resources and components (a component works on what its parent has accumulated),
    runs configMapGenerator (create, merge, replace), nameSuffix, selector labels and
    strategic-merge patches (also ``$patch: delete``) and replacements, and leaves out
    ``config.kubernetes.io/local-config`` resources from the ``final`` output (kustomize keeps
    them while it builds, for the replacements of any level), which is all the structural checks
    need; used when kubectl is absent.
    """
    kustomization = load_yaml(root / "kustomization.yaml")
    docs = [] if docs is None else docs
    own: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = root / entry
        own += (
            render_kustomize_in_python(path, final=False)
            if path.is_dir()
            else load_yaml_all(path.read_text())
        )
    docs += own
    for entry in kustomization.get("components", []):
        docs = render_kustomize_in_python(root / entry, docs, final=False)
    for gen in kustomization.get("configMapGenerator", []):
        data: dict[str, str] = {}
        for env_file in gen.get("envs", []):
            data.update(read_env_file(root / env_file))
        for name in gen.get("files", []):
            data[Path(name).name] = (root / name).read_text()
        behavior = gen.get("behavior", "create")
        if behavior == "create":
            meta = {"name": gen["name"], "labels": dict(gen.get("options", {}).get("labels", {}))}
            docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
        else:
            existing = find(docs, "ConfigMap", gen["name"])
            existing["data"] = {**existing["data"], **data} if behavior == "merge" else data
    for entry in kustomization.get("labels", []):
        if entry.get("includeSelectors"):
            for doc in docs:
                add_labels(doc, entry["pairs"], selectors=True)
    for entry in kustomization.get("patches", []):
        patch = yaml.safe_load(
            entry["patch"] if "patch" in entry else (root / entry["path"]).read_text()
        )
        target = entry.get("target", {"kind": patch["kind"], "name": patch["metadata"]["name"]})
        hits = [i for i, d in enumerate(docs) if patch_hits(d, target)]
        assert hits, f"{root}: patch target {target} not found"
        if patch.get("$patch") == "delete":
            docs = [d for i, d in enumerate(docs) if i not in hits]
            continue
        patch["metadata"].pop("name", None)  # the target names what it patches
        for i in hits:
            docs[i] = strategic_merge(docs[i], patch)
    # After the patches, which name resources as this kustomization loaded them.
    if suffix := kustomization.get("nameSuffix"):
        for doc in docs:
            doc["metadata"]["name"] += suffix
    for entry in kustomization.get("replacements", []):  # kustomize runs them last
        replace(docs, entry)
    if final:  # used by the build (a replacement's source), never part of its output
        docs = [d for d in docs if not is_local_config(d)]
    return docs


def is_local_config(doc: dict[str, Any]) -> bool:
    annotations = doc["metadata"].get("annotations") or {}
    return annotations.get("config.kubernetes.io/local-config") == "true"


def field_path(path: str) -> list[str]:
    """A kustomize fieldPath's segments: ``a.b``, ``[name=x]`` (the list item named x) and
    ``[key.with.dots]`` (a map key)."""
    return [m.group(1) or m.group(2) for m in re.finditer(r"\[([^\]]*)\]|([^.\[\]]+)", path)]


def _step(node: Any, segment: str) -> tuple[Any, Any]:
    """(container, key) of one fieldPath segment below ``node``."""
    if isinstance(node, list):
        key, eq, value = segment.partition("=")
        assert eq, f"list segment {segment!r} must select KEY=VALUE"
        (index,) = [i for i, e in enumerate(node) if str(e.get(key)) == value]
        return node, index
    assert isinstance(node, dict) and segment in node, f"fieldPath segment {segment!r} not found"
    return node, segment


def get_field(doc: dict[str, Any], path: str) -> Any:
    node: Any = doc
    for segment in field_path(path):
        container, key = _step(node, segment)
        node = container[key]
    return node


def set_field(doc: dict[str, Any], path: str, value: Any) -> None:
    """Sets an existing field (kustomize's replacements without ``options.create``)."""
    *parents, last = field_path(path)
    node: Any = doc
    for segment in parents:
        container, key = _step(node, segment)
        node = container[key]
    container, key = _step(node, last)
    container[key] = value


def replace(docs: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    """One kustomize ``replacements`` entry: a source field copied into target fields (the
    subset with kind/name selectors and whole-value copies)."""
    source = entry["source"]
    assert set(source) <= {"kind", "name", "fieldPath"}, f"unmodelled replacement {source}"
    (src,) = [d for d in docs if patch_hits(d, source)]
    value = get_field(src, source.get("fieldPath", "metadata.name"))
    for target in entry["targets"]:
        assert set(target) <= {"select", "fieldPaths"}, f"unmodelled replacement {target}"
        hits = [d for d in docs if patch_hits(d, target["select"])]
        assert hits, f"replacement target {target['select']} not found"
        for doc in hits:
            for path in target["fieldPaths"]:
                set_field(doc, path, copy.deepcopy(value))


@functools.cache
def kubectl_kustomize(root: Path) -> tuple[dict[str, Any], ...] | None:
    """``kubectl kustomize <root>`` output, or None when kubectl is not installed."""
    kubectl = tool("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"kubectl kustomize {root} failed:\n{out.stderr}"
    return tuple(load_yaml_all(out.stdout))


def kustomizations() -> list[Path]:
    return sorted(
        [
            *K8S.rglob("kustomization.yaml"),
            *(REPO / "deploy" / "variants").rglob("kustomization.yaml"),
        ]
    )


def load_compose(*files: Path) -> dict[str, Any]:
    """Compose files merged as ``docker compose -f A -f B`` does, for what we use: services merge
    key by key, ``environment`` maps merge, later ``env_file`` lists replace earlier ones."""
    merged: dict[str, Any] = {}
    for path in files:
        for key, value in load_yaml(path).items():
            if key != "services":
                merged[key] = value if key.startswith("x-") else {**merged.get(key, {}), **value}
                continue
            services = merged.setdefault("services", {})
            for name, spec in value.items():
                base = dict(services.get(name, {}))
                for field_, setting in spec.items():
                    if field_ == "environment":
                        base[field_] = {**base.get(field_, {}), **setting}
                    else:
                        base[field_] = setting
                services[name] = base
    return merged


def compose_env_files(service: dict[str, Any]) -> list[Path]:
    files = service.get("env_file") or []
    return [REPO / f for f in ([files] if isinstance(files, str) else files)]


def compose_service_env(
    service: dict[str, Any], variables: dict[str, str] | None = None
) -> dict[str, str]:
    """A compose service's environment as its container sees it: env files in order (later
    win), then ``environment``, interpolated (``compose_interpolate``)."""
    env: dict[str, str] = {}
    for path in compose_env_files(service):
        env.update(read_env_file(path))
    environment = service.get("environment") or {}
    env.update({k: compose_interpolate(str(v), variables) for k, v in environment.items()})
    return env


def compose_interpolate(text: str, variables: dict[str, str] | None = None) -> str:
    """Compose's variable interpolation (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
    ``$VAR``, ``$$``) with ``variables`` as the shell's environment (default: nothing set, so
    the files' own defaults: the tests do not depend on the shell they run in)."""
    variables = variables or {}

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        op, default = m.group("op"), m.group("default") or ""
        value = variables.get(name)
        if op == ":-":
            return value if value else default
        if op == "-":
            return default if value is None else value
        assert op is None, f"interpolation {m.group(0)!r} not modelled"
        return value or ""

    pattern = r"\$\$|\$\{(?P<braced>\w+)(?:(?P<op>:?-)(?P<default>[^}]*))?\}|\$(?P<bare>\w+)"
    return re.sub(pattern, one, text)


@functools.cache
def _stand_in_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="powertrip-tls-stand-ins-")


@functools.cache
def _stand_in_pki() -> Path:
    """A throw-away CA and one pair it signed (the loaders check that they match, not the
    name): ca.pem, stand-in.pem, stand-in.key."""
    from powertrip.services.cli.certs import issue, new_ca, write_pair

    root = Path(_stand_in_dir().name) / "pki"
    root.mkdir()
    ca = new_ca()
    (root / "ca.pem").write_bytes(ca.pem)
    write_pair(root, "stand-in", *issue(ca, "stand-in"))
    return root


def with_tls_stand_ins(env: dict[str, str]) -> dict[str, str]:
    """``env`` loadable on this machine: the TLS paths (in-container mounts, absent here) point
    at stand-in files, a matching certificate, key and CA, and a ConfigMap's settings alone (TLS
    comes per container) get stand-ins too. A config without TLS is refused unless
    POWERTRIP_INSECURE says otherwise, and the loader checks only that the files are a valid
    set, so settings checks keep working; the deploys' files themselves are checked by
    tests/deploy/test_tls_deploys.py."""
    out = dict(env)
    if not any(out.get(v) for v in TLS_VARS) and out.get("POWERTRIP_INSECURE") not in {"1"}:
        out |= {v: f"{TLS_MOUNT}/{v.lower()}" for v in TLS_VARS}
    pki = _stand_in_pki()
    files = dict(zip(TLS_VARS, ("stand-in.pem", "stand-in.key", "ca.pem"), strict=True))
    for var in TLS_VARS:
        if out.get(var):
            out[var] = str(pki / files[var])
    return out


def config_map_data(docs: list[dict[str, Any]], name: str = "powertrip-config") -> dict[str, str]:
    return find(docs, "ConfigMap", name)["data"]


WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def workloads(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Every workload whose pods are ``name`` (their app.kubernetes.io/name label): one, except
    the workers of deploy/variants/static-tls, one StatefulSet per worker."""
    hits = [
        d
        for d in docs
        if d["kind"] in WORKLOAD_KINDS
        and d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == name
    ]
    assert hits, f"no workload runs {name} pods"
    return sorted(hits, key=lambda d: d["metadata"]["name"])


def pod_names(w: dict[str, Any]) -> list[str]:
    """The names of a StatefulSet's pods (NAME-ordinal)."""
    return [f"{w['metadata']['name']}-{n}" for n in range(w["spec"]["replicas"])]


def expand_k8s_refs(text: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion in env values and args; unknown references stay as they are."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def field_ref(w: dict[str, Any], pod_name: str, path: str) -> str:
    """A downward-API fieldRef for one pod: its name, or a label of its template."""
    if path == "metadata.name":
        return pod_name
    label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    assert label, f"fieldRef {path} not modelled"
    return w["spec"]["template"]["metadata"]["labels"][label.group(1)]


def container_env(w: dict[str, Any], pod_name: str, base: dict[str, str] | None = None) -> dict:
    """The single container's env for one pod, as Kubernetes expands it (fieldRefs, $(VAR))."""
    (c,) = pod_spec(w)["containers"]
    env = dict(base or {})
    for var in c.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = field_ref(w, pod_name, var["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            env[var["name"]] = expand_k8s_refs(var["value"], env)
    return env


def parse_sites(spec: str) -> set[int]:
    """A POWERTRIP_SITES value ("0-3", "0,2,5-6") as site indices."""
    sites: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        sites.update(range(int(lo), int(hi or lo) + 1))
    return sites


def parse_site_owners(value: str) -> dict[str, set[int]]:
    """POWERTRIP_SITE_OWNERS ("w0=0-3;w1=4-7") as worker id -> sites."""
    owners: dict[str, set[int]] = {}
    for entry in filter(None, (e.strip() for e in value.split(";"))):
        worker, sep, sites = entry.partition("=")
        assert sep and worker.strip() not in owners, f"bad POWERTRIP_SITE_OWNERS entry {entry!r}"
        owners[worker.strip()] = parse_sites(sites.strip())
    return owners


#: The Prometheus and Grafana of components/monitoring; the prometheus-operator variant has none.
BUNDLED_MONITORING = ("powertrip-prometheus", "powertrip-grafana")


def bundled_monitoring(docs: list[dict[str, Any]]) -> bool:
    """Does the variant run the bundled Prometheus and Grafana?"""
    names = {
        pod_labels(d).get("app.kubernetes.io/name") for d in docs if d["kind"] in WORKLOAD_KINDS
    }
    return set(BUNDLED_MONITORING) <= names


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` named ``name`` (kustomize may add a hash suffix to ConfigMaps)."""
    hits = [
        d
        for d in docs
        if d["kind"] == kind
        and (d["metadata"]["name"] == name or d["metadata"]["name"].startswith(name + "-"))
    ]
    assert len(hits) == 1, f"expected one {kind} {name}, found {len(hits)}"
    return hits[0]


def service_of_command(command: list[str] | str | None) -> str | None:
    """'aggregator' for the ``powertrip-aggregator`` console script (also inside a shell
    wrapper)."""
    text = " ".join(command) if isinstance(command, list) else command or ""
    match = re.search(r"(?:^|[\s/])powertrip-(aggregator|profiler|worker)\b", text)
    return match.group(1) if match else None


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels + matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------------------------
# Service source: metrics and config fields


METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: frozenset[str]

    def series(self) -> dict[str, frozenset[str]]:
        """Exposed series names -> labels they carry (prometheus-client naming rules)."""
        base = self.name.removesuffix("_total") if self.type == "Counter" else self.name
        labels = self.labels
        return {
            "Counter": {f"{base}_total": labels, f"{base}_created": labels},
            "Gauge": {base: labels},
            "Histogram": {
                f"{base}_bucket": labels | {"le"},
                f"{base}_sum": labels,
                f"{base}_count": labels,
                f"{base}_created": labels,
            },
            "Summary": {
                base: labels | {"quantile"},
                f"{base}_sum": labels,
                f"{base}_count": labels,
                f"{base}_created": labels,
            },
            "Info": {f"{base}_info": labels},
            "Enum": {base: labels | {base}},
        }[self.type]


def metrics_modules() -> list[Path]:
    """services/common/*metrics.py (metrics.py, auth_metrics.py, ...) and each service's."""
    return sorted((SERVICES_SRC / "common").glob("*metrics.py")) + [
        SERVICES_SRC / s / "metrics.py" for s in SERVICES
    ]


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _str_list(node: ast.expr | None) -> list[str]:
    if isinstance(node, ast.List | ast.Tuple):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


@functools.cache
def declared_metrics() -> dict[str, Metric]:
    """Every prometheus-client metric constructed in the services' metrics modules."""
    found: dict[str, Metric] = {}
    for path in metrics_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and _call_name(node) in METRIC_TYPES):
                continue
            if not (node.args and isinstance(node.args[0], ast.Constant)):
                continue
            kwargs = {k.arg: k.value for k in node.keywords}
            labels = node.args[2] if len(node.args) > 2 else kwargs.get("labelnames")
            metric = Metric(node.args[0].value, str(_call_name(node)), frozenset(_str_list(labels)))
            found[metric.name] = metric
    return found


def exposed_series() -> dict[str, frozenset[str]]:
    """Series name -> labels, for every series the services can expose."""
    series: dict[str, frozenset[str]] = {}
    for metric in declared_metrics().values():
        for name, labels in metric.series().items():
            series[name] = series.get(name, frozenset()) | labels
    return series


@dataclass
class ConfigClass:
    name: str
    service: str  # "common" or a service name
    fields: dict[str, bool] = field(default_factory=dict)  # field -> required


@functools.cache
def config_classes() -> tuple[ConfigClass, ...]:
    """``ServiceConfig`` and each service's config with every field it reads. Imported, not
    read as source: most of a service's library settings are derived from the library's
    models (``services/common/settings.py``), which only the classes know; the settings load
    no torch and no generated stubs (tests/unit/test_library_layers.py)."""
    import importlib

    classes = {
        "common": "ServiceConfig",
        "aggregator": "AggregatorConfig",
        "profiler": "ProfilerConfig",
        "worker": "WorkerConfig",
    }
    out = []
    for service, name in classes.items():
        cls = getattr(importlib.import_module(f"powertrip.services.{service}.config"), name)
        fields = {f: info.is_required() for f, info in cls.model_fields.items()}
        out.append(ConfigClass(name, service, fields))
    return tuple(out)


@functools.cache
def env_reads_outside_config() -> frozenset[str]:
    """POWERTRIP_* names read directly with os.environ / os.getenv anywhere in services/."""
    names = set()
    for path in SERVICES_SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            arg = None
            if isinstance(node, ast.Call) and _call_name(node) in {"get", "getenv"} and node.args:
                arg = node.args[0]
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                arg = node.slice
            if isinstance(arg, ast.Constant) and str(arg.value).startswith(ENV_PREFIX):
                names.add(arg.value)
    return frozenset(names)


def env_vars(service: str) -> dict[str, bool]:
    """POWERTRIP_* variable -> required, for one service (config fields + direct reads)."""
    out = dict.fromkeys(env_reads_outside_config(), False)
    for cls in config_classes():
        if cls.service in ("common", service):
            out.update({ENV_PREFIX + f.upper(): req for f, req in cls.fields.items()})
    return out


def all_env_vars() -> set[str]:
    return set().union(*(env_vars(s) for s in SERVICES))


# --------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_user() -> tuple[int, int]:
    """(uid, gid) of the final stage's numeric USER instruction."""
    users = re.findall(r"^USER\s+(\S+)\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert users, "Dockerfile has no USER instruction"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {users[-1]} must be numeric uid:gid"
    return int(uid), int(gid)
