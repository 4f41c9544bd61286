#!/usr/bin/env bash
# `make compose-check`: the compose stack (compose.yaml) run in real containers to the quick
# preset's target with mutual TLS on, then taken down. Builds the image first when it is missing
# (deploy/build-image.sh, with its BASE_IMAGE / PIP_INDEX_URL / TORCH_INDEX_URL from the
# environment), mints ./certs when they are missing (`make certs`), starts Prometheus and Grafana
# only where their images are already here, waits for the aggregator to reach the target (it
# exits 0: deploy/compose-check.yaml sets POWERTRIP_EXIT_WHEN_DONE=1, and the workers exit 0
# after it) or to fail, prints the log tail and the wall time, and exits non-zero on failure. docs/images.md, "Running with podman", has
# the flags a container runtime may need and how the check was first run without a registry.
set -euo pipefail

usage() {
    cat <<EOF
Usage: deploy/compose-check.sh [--timeout S] [--keep]

  --timeout S   give up after S seconds of waiting for the target (default: \$COMPOSE_CHECK_TIMEOUT_S,
                else 1800)
  --keep        leave the stack up afterwards (default: compose down -v)
  -h, --help    this text

Environment:
  COMPOSE           the compose command, e.g. "podman-compose" or "docker compose" (default:
                    podman-compose when installed, else docker compose)
  POWERTRIP_IMAGE   the image the services run (default: powertrip:dev); built when missing
  BASE_IMAGE, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, DEBIAN_MIRROR,
  TORCH_INDEX_URL   passed to deploy/build-image.sh for that build (docs/images.md)
  CONTAINERS_CONF   podman's configuration; unset, deploy/podman/containers.conf is used when
                    podman cannot start a container with its own defaults (and can with it)
EOF
}

die() {
    echo "compose-check: $*" >&2
    exit 1
}

timeout_s=${COMPOSE_CHECK_TIMEOUT_S:-1800}
keep=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --timeout) [[ $# -ge 2 ]] || die "--timeout needs a value"; timeout_s=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout takes whole seconds, not $timeout_s"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
image=${POWERTRIP_IMAGE:-powertrip:dev}
project=powertrip-compose-check
app_services=(profiler aggregator worker-eu-west worker-us-east worker-ap-south)
monitoring_images=(prom/prometheus:v3.5.0 grafana/grafana:12.1.0)  # as compose.yaml names them

if [[ -n ${COMPOSE:-} ]]; then
    read -r -a compose <<<"$COMPOSE"
elif command -v podman-compose >/dev/null; then
    compose=(podman-compose)
elif docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
else
    die "no compose tool: install podman-compose (or the docker compose plugin), or set COMPOSE"
fi
case ${compose[0]} in
    *podman-compose) runtime=podman ;;
    *) runtime=${CONTAINER_TOOL:-docker} ;;
esac
command -v "$runtime" >/dev/null || die "$runtime not found (the runtime of ${compose[*]})"
if [[ $runtime == podman ]]; then
    # 1.0.3 (Debian 12's) fails on compose.yaml's network aliases (KeyError: "default={...}")
    pc_version=$("${compose[@]}" version 2>&1 | sed -n 's/^podman-composer\{0,1\} version  *//p')
    [[ $pc_version =~ ^(0\.|1\.0\.) ]] && die "podman-compose $pc_version cannot read" \
        "compose.yaml's network aliases; use 1.1 or newer (pip install podman-compose)"
fi

has_image() {
    "$runtime" image inspect "$1" >/dev/null 2>&1
}

# podman's defaults fail on some hosts (docs/images.md): a hard nofile limit below its 1048576
# without CAP_SYS_RESOURCE, crun on a hybrid cgroup layout. Probe once with a local image.
podman_config() {
    [[ $runtime == podman && -z ${CONTAINERS_CONF:-} ]] || return 0
    local probe=$image
    has_image "$probe" || probe=${BASE_IMAGE:-}
    [[ -n $probe ]] && has_image "$probe" || return 0
    local err
    if err=$(podman run --rm --pull=never "$probe" true 2>&1); then
        return 0
    fi
    if CONTAINERS_CONF=$repo/deploy/podman/containers.conf \
        podman run --rm --pull=never "$probe" true >/dev/null 2>&1; then
        echo "== podman's defaults failed here ($err);" \
            "using deploy/podman/containers.conf"
        export CONTAINERS_CONF=$repo/deploy/podman/containers.conf
    else
        die "podman cannot start a container from $probe: $err"
    fi
}

podman_config
if ! has_image "$image"; then
    echo "== $image missing: building it (deploy/build-image.sh)"
    version=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' powertrip/__init__.py)
    extra=()
    if [[ $runtime == podman ]]; then
        # --network host: an index on this machine (127.0.0.1) is reachable from the build;
        # --layers=false: podman 4.3 bind-mounted an empty wheel stage from its layer cache.
        extra=(--network host --layers=false)
    fi
    deploy/build-image.sh --tool "$runtime" --image powertrip --variant cpu -- "${extra[@]}"
    [[ $image == "powertrip:$version-cpu" ]] || "$runtime" tag "powertrip:$version-cpu" "$image"
    podman_config
fi

if [[ ! -s certs/ca.pem || ! -s certs/worker-ap-south.key ]]; then
    echo "== minting ./certs (make certs)"
    # an existing venv as it is: make would reinstall it whenever pyproject.toml is newer
    [[ -x .venv/bin/powertrip ]] && keep_venv=(-o .venv/.installed) || keep_venv=()
    make --no-print-directory "${keep_venv[@]}" certs
fi
[[ -s secrets/grafana-admin-password ]] || make --no-print-directory grafana-secret

services=("${app_services[@]}")
missing=()
for name in "${monitoring_images[@]}"; do
    has_image "$name" || missing+=("$name")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    services+=(prometheus grafana)
else
    echo "== not here, so Prometheus and Grafana do not run: ${missing[*]}" \
        "(pull them to include them)"
fi

export POWERTRIP_IMAGE=$image
run_compose() {  # the override: the aggregator and the workers end with the run
    "${compose[@]}" -p "$project" -f compose.yaml -f deploy/compose-check.yaml "$@"
}
container_of() {
    "$runtime" ps -aq --filter "label=com.docker.compose.project=$project" \
        --filter "label=com.docker.compose.service=$1" | head -n 1
}
# shellcheck disable=SC2317  # called by the EXIT trap
down() {
    if [[ $keep -eq 0 ]]; then
        echo "== compose down -v"
        run_compose down -v >/dev/null 2>&1 || echo "compose-check: compose down failed" >&2
    fi
}

started=$(date +%s)
run_compose down -v >/dev/null 2>&1 || true  # a previous check's leftovers
trap down EXIT
echo "== ${compose[*]} up: ${services[*]} ($image, mutual TLS)"
run_compose up -d --no-build "${services[@]}"

aggregator=$(container_of aggregator)
[[ -n $aggregator ]] || die "no aggregator container (project $project)"
echo "== waiting for the aggregator's run (at most $timeout_s s)"
outcome=""
deadline=$((started + timeout_s))
while [[ -z $outcome ]]; do
    read -r status code restarts < <("$runtime" inspect -f \
        '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' "$aggregator")
    if [[ $restarts -gt 0 ]]; then
        outcome="the aggregator was restarted ($restarts times; its last exit code $code)"
    elif [[ $status == exited ]]; then
        outcome="exit $code"
    elif [[ $(date +%s) -ge $deadline ]]; then
        outcome="timeout: no end after $timeout_s s"
    else
        sleep 5
    fi
done
wall=$(($(date +%s) - started))
log=$("$runtime" logs "$aggregator" 2>&1)
workers=()
for name in "${app_services[@]}"; do
    [[ $name == worker-* ]] && workers+=("$(container_of "$name")")
done
if [[ $outcome == "exit 0" ]]; then  # each worker heard the run end, or is about to
    for _ in $(seq 60); do
        running=$("$runtime" inspect -f '{{.State.Running}}' "${workers[@]}" | grep -c true || true)
        [[ $running -eq 0 ]] && break
        sleep 1
    done
fi

echo "== aggregator log (last 25 lines)"
tail -n 25 <<<"$log"
echo "== containers"
for name in "${services[@]}"; do
    cid=$(container_of "$name")
    printf '%-16s %s\n' "$name" \
        "$("$runtime" inspect -f '{{.State.Status}} exit={{.State.ExitCode}}' "$cid" 2>&1)"
done
size=$("$runtime" image inspect -f '{{.Size}}' "$image")
echo "== image $image: $((size / 1000000)) MB"
echo "== wall time: ${wall} s (up to the aggregator's end)"

reached=$(grep -o 'run done: target .* reached at [0-9.]* s' <<<"$log" | tail -n 1 || true)
for cid in "${workers[@]}"; do
    end=$("$runtime" inspect -f '{{.Name}} {{.State.Status}} {{.State.ExitCode}}' "$cid")
    [[ $end == *" exited 0" ]] || outcome="$outcome; worker ${end% * *} not ended with exit 0"
done
if [[ $outcome == "exit 0" && -n $reached ]]; then
    echo "compose-check: OK: $reached"
    exit 0
fi
echo "compose-check: FAILED: ${outcome}${reached:+; }${reached:-; the target was not reached}" >&2
exit 1
