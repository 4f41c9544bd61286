#!/bin/sh
# The TLS Secrets of deploy/variants/static-tls (certificates without cert-manager), made from a
# `powertrip certs` directory and printed as YAML for `kubectl apply -f -` (nothing is sent to a
# cluster). One Secret per identity that runs in the cluster, each holding that identity's pair
# and the CA certificate only, so every pod mounts its own key and nobody else's:
#
#   powertrip certs --out certs/k8s --workers powertrip-worker-0,powertrip-worker-1,powertrip-worker-2
#   deploy/k8s-tls-secrets.sh certs/k8s | kubectl apply -f -
#
# Secrets (namespace $NAMESPACE, default powertrip; type kubernetes.io/tls, as cert-manager's):
#   powertrip-tls-aggregator, powertrip-tls-profiler, powertrip-tls-ID for each worker ID.pem
#   keys: tls.crt (ID.pem), tls.key (ID.key), ca.crt (ca.pem)
# Never ca.key, the CA's private key that `powertrip certs --renew` signs with: it stays on the
# machine that mints. Nor operator.pem/.key: `powertrip status` uses them where it runs.
#
# Renew: `powertrip certs --renew --out certs/k8s`, then run this again and apply: the Secrets
# are updated in place, kubelet refreshes the mounted files and the services reload them.
set -eu
dir=${1:?usage: $0 CERTS_DIR (written by powertrip certs)}
ns=${NAMESPACE:-powertrip}

[ -f "$dir/ca.pem" ] || { echo "$0: $dir/ca.pem missing: run powertrip certs first" >&2; exit 1; }
found=0
for cert in "$dir"/*.pem; do
    id=$(basename "$cert" .pem)
    case $id in ca | operator) continue ;; esac
    [ -f "$dir/$id.key" ] || { echo "$0: $dir/$id.key missing" >&2; exit 1; }
    kubectl create secret generic "powertrip-tls-$id" --namespace "$ns" \
        --type kubernetes.io/tls --dry-run=client -o yaml \
        --from-file="tls.crt=$cert" --from-file="tls.key=$dir/$id.key" \
        --from-file="ca.crt=$dir/ca.pem"
    echo ---
    found=$((found + 1))
done
for id in aggregator profiler; do
    [ -f "$dir/$id.pem" ] || { echo "$0: $dir/$id.pem missing: run powertrip certs" >&2; exit 1; }
done
[ "$found" -gt 2 ] || { echo "$0: no worker certificate in $dir (--workers)" >&2; exit 1; }
