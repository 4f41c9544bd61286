#!/bin/sh
# The TLS Secrets the default k8s variant mounts, made from a `powertrip certs` directory and
# printed as YAML for `kubectl apply -f -` (nothing is sent to a cluster; apply again after
# re-minting to rotate). Worker pairs are picked up by name: powertrip-worker-N.pem/.key.
#
#   powertrip certs --out certs/k8s --workers powertrip-worker-0,powertrip-worker-1,... \
#     --host powertrip-aggregator --host powertrip-profiler \
#     --host powertrip-worker-0.powertrip-worker --host powertrip-worker-1.powertrip-worker ...
#   deploy/k8s-tls-secrets.sh certs/k8s | kubectl apply -f -
#
# Secrets (namespace $NAMESPACE, default powertrip), each file 0400 in the pod:
#   powertrip-tls-aggregator, powertrip-tls-profiler: tls.crt, tls.key, ca.crt
#   powertrip-tls-workers: powertrip-worker-N.crt and .key for every N, ca.crt
set -eu
dir=${1:?usage: $0 CERTS_DIR (written by powertrip certs)}
ns=${NAMESPACE:-powertrip}

secret() {  # NAME FROM-FILE-ARGS...
    name=$1
    shift
    kubectl create secret generic "$name" --namespace "$ns" --dry-run=client -o yaml "$@"
    echo ---
}

for f in ca.pem aggregator.pem aggregator.key profiler.pem profiler.key; do
    [ -f "$dir/$f" ] || { echo "$0: $dir/$f missing: run powertrip certs first" >&2; exit 1; }
done
for name in aggregator profiler; do
    secret "powertrip-tls-$name" --from-file="tls.crt=$dir/$name.pem" \
        --from-file="tls.key=$dir/$name.key" --from-file="ca.crt=$dir/ca.pem"
done

set -- --from-file="ca.crt=$dir/ca.pem"
found=0
for cert in "$dir"/powertrip-worker-*.pem; do
    [ -f "$cert" ] || continue
    id=$(basename "$cert" .pem)
    set -- "$@" --from-file="$id.crt=$cert" --from-file="$id.key=$dir/$id.key"
    found=$((found + 1))
done
[ "$found" -gt 0 ] || { echo "$0: no powertrip-worker-N.pem in $dir (--workers)" >&2; exit 1; }
secret powertrip-tls-workers "$@"
