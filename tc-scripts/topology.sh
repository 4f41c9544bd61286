#!/usr/bin/env bash
# Emulated multi-site topology: one network namespace for the aggregator and profiler (the hub),
# one per site, each site joined to the hub by its own veth pair with a shaped link.
#
# Usage: topology.sh up [--profile FILE | --sites N [--seed S] [--rate-scale F]] [--allow-no-netem]
#                       [--mgmt] [--prefix P] [--subnet A.B.C] [--state-dir DIR]
#        topology.sh down   [--prefix P] [--state-dir DIR]
#        topology.sh status [--prefix P] [--state-dir DIR]
#
# Names: namespaces <P>-hub and <P>-site-<i> (i = 0, 1, ... in profile order); veth <P>h<i> in
# the hub, <P>s<i> in site i. Addresses: one /30 per link in A.B.C.0/24, hub A.B.C.(4i+1), site
# A.B.C.(4i+2), so at most 63 sites. Defaults: P=pt, A.B.C=10.77.0, DIR=/run/powertrip.
#
# Each link is shaped with shape.sh on both ends (rate and one-way delay each way, so the RTT is
# twice the delay). The profile is a whitespace-, tab- or comma-separated table "name rate delay"
# (# comments allowed), or is generated from the site model with --sites (see
# services/netem/topology_profile.py, run with $PYTHON or python3). Without netem, up fails unless --allow-no-netem, which
# shapes the rate only and status reports the delay as not applied.
#
# --mgmt adds an unshaped management link from the caller's namespace to the hub (caller
# A.B.C.253, hub A.B.C.254, veth <P>m / <P>mh), so a launcher outside can reach the aggregator;
# it goes away with the hub namespace.
#
# up records every namespace right after creating it in DIR/P.topology; down deletes exactly
# those, then the state file. up never reuses a namespace that already exists, so down cannot
# remove one it did not create. A failed up rolls back what it made.
set -euo pipefail

readonly PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
readonly SHAPE=$HERE/shape.sh
readonly MAX_SITES=63

prefix=pt
subnet=10.77.0
state_dir=/run/powertrip
profile=""
sites=""
seed=0
rate_scale=1
allow_no_netem=0
mgmt=0
state=""
up_complete=0

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

usage() {
    sed -n '5,8s/^# //p' "$0" >&2
    exit 2
}

need_value() {
    [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"
}

parse_args() {
    while [[ $# -gt 0 ]]; do
        case $1 in
            --profile | --sites | --seed | --rate-scale | --prefix | --subnet | --state-dir)
                need_value "$@"
                case $1 in
                    --profile) profile=$2 ;;
                    --sites) sites=$2 ;;
                    --seed) seed=$2 ;;
                    --rate-scale) rate_scale=$2 ;;
                    --prefix) prefix=$2 ;;
                    --subnet) subnet=$2 ;;
                    --state-dir) state_dir=$2 ;;
                esac
                shift 2
                ;;
            --allow-no-netem)
                allow_no_netem=1
                shift
                ;;
            --mgmt)
                mgmt=1
                shift
                ;;
            *) usage ;;
        esac
    done
    # veth names must fit IFNAMSIZ (15): prefix + "h" + two digits.
    [[ $prefix =~ ^[a-z][a-z0-9]{0,9}$ ]] ||
        die "--prefix must be 1-10 lowercase letters/digits starting with a letter, got '$prefix'"
    [[ $subnet =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
        die "--subnet must be the first three octets of a /24, e.g. 10.77.0, got '$subnet'"
    state=$state_dir/$prefix.topology
}

# Profile rows on stdout as "name rate delay", from the file or the site model.
read_profile() {
    if [[ -n $profile && -n $sites ]]; then
        die "give --profile or --sites, not both"
    elif [[ -n $profile ]]; then
        [[ -r $profile ]] || die "cannot read profile '$profile'"
        cat -- "$profile"
    elif [[ -n $sites ]]; then
        # the folder that holds services/: the repo in a checkout, site-packages when installed
        # (the scripts then live in services/netem/tc-scripts)
        local root="$HERE/.."
        [[ -d $root/services ]] || root="$HERE/../../.."
        PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" \
            -m powertrip.services.netem.topology_profile --sites "$sites" --seed "$seed" \
            --rate-scale "$rate_scale"
    else
        die "up needs --profile FILE or --sites N"
    fi
}

record() {
    printf '%s\n' "$*" >>"$state"
}

new_netns() {
    ip netns add "$1" || die "cannot create namespace '$1' (it may already exist; not touching it)"
    record netns "$1"
    ip -n "$1" link set lo up
}

shape_end() {  # shape_end NETNS IFACE RATE DELAY
    local -a flags=()
    [[ $allow_no_netem == 1 ]] && flags+=(--allow-no-netem)
    RATE=$3 DELAY=$4 JITTER="" LOSS="" ip netns exec "$1" "$SHAPE" apply "$2" "${flags[@]}" >/dev/null
}

# Delete the namespaces named in the state file (veths die with them), newest first.
teardown() {
    local -a made=()
    local kind name pids live
    while read -r kind name _; do
        [[ $kind == netns ]] && made=("$name" "${made[@]}")
        # Our end of the management link: deleted now rather than with the hub, which the
        # kernel tears down asynchronously.
        if [[ $kind == mgmt ]] && ip link show "$name" &>/dev/null; then
            ip link del "$name"
        fi
    done <"$state"
    live=$(ip netns list | awk '{ print $1 }')
    for name in "${made[@]}"; do
        grep -qxF -- "$name" <<<"$live" || continue
        pids=$(ip netns pids "$name" | tr '\n' ' ')
        [[ -z $pids ]] ||
            printf '%s: warning: processes %sstill run in %s and keep its links alive\n' \
                "$PROG" "$pids" "$name" >&2
        ip netns del "$name"
    done
    rm -f -- "$state"
}

on_exit() {
    local rc=$?
    if [[ $up_complete == 0 && -f $state ]]; then
        printf '%s: up failed; removing what it created\n' "$PROG" >&2
        teardown
    fi
    exit "$rc"
}

up() {
    [[ ! -e $state ]] || die "topology '$prefix' is already up ($state); run: $PROG down --prefix $prefix"
    local rows
    rows=$(read_profile)
    local -a names=() rates=() delays=()
    local name rate delay extra n=0
    while IFS=$' \t,' read -r name rate delay extra; do
        n=$((n + 1))
        [[ -z $name || $name == \#* || $name == name ]] && continue
        [[ -n $rate && -n $delay && -z $extra ]] ||
            die "profile line $n: expected 'name rate delay', got '$name $rate $delay $extra'"
        [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "profile line $n: bad site name '$name'"
        names+=("$name")
        rates+=("$rate")
        delays+=("$delay")
    done <<<"$rows"
    [[ ${#names[@]} -ge 1 ]] || die "the profile has no sites"
    [[ ${#names[@]} -le $MAX_SITES ]] || die "at most $MAX_SITES sites fit one /24 of /30 links"

    mkdir -p -- "$state_dir"
    : >"$state"
    trap on_exit EXIT
    local hub=$prefix-hub
    new_netns "$hub"
    local i site hub_if site_if hub_ip site_ip applied
    for i in "${!names[@]}"; do
        site=$prefix-site-$i
        hub_if=${prefix}h$i
        site_if=${prefix}s$i
        hub_ip=$subnet.$((4 * i + 1))
        site_ip=$subnet.$((4 * i + 2))
        new_netns "$site"
        # Both ends are born inside their namespaces: nothing appears in the caller's namespace.
        ip link add "$hub_if" netns "$hub" type veth peer name "$site_if" netns "$site"
        ip -n "$hub" addr add "$hub_ip/30" dev "$hub_if"
        ip -n "$site" addr add "$site_ip/30" dev "$site_if"
        ip -n "$hub" link set "$hub_if" up
        ip -n "$site" link set "$site_if" up
        shape_end "$hub" "$hub_if" "${rates[i]}" "${delays[i]}"
        shape_end "$site" "$site_if" "${rates[i]}" "${delays[i]}"
        applied=no
        [[ $(tc -n "$site" qdisc show dev "$site_if") == *netem* ]] && applied=yes
        record site "$i" "${names[i]}" "$site" "$site_if" "$site_ip" "$hub_if" "$hub_ip" \
            "${rates[i]}" "${delays[i]}" "$applied"
    done
    if [[ $mgmt == 1 ]]; then
        # The caller's end lives here; deleting the hub namespace deletes the pair.
        ip link add "${prefix}m" type veth peer name "${prefix}mh" netns "$hub"
        ip addr add "$subnet.253/30" dev "${prefix}m"
        ip -n "$hub" addr add "$subnet.254/30" dev "${prefix}mh"
        ip link set "${prefix}m" up
        ip -n "$hub" link set "${prefix}mh" up
        record mgmt "${prefix}m" "$subnet.253" "$subnet.254"
    fi
    up_complete=1
    status
}

status() {
    [[ -f $state ]] || {
        echo "topology '$prefix': down (no $state)"
        return 0
    }
    local live
    live=$(ip netns list | awk '{ print $1 }')
    echo "topology '$prefix' ($state); hub namespace $prefix-hub (aggregator, profiler):"
    local mgmt_line
    mgmt_line=$(awk '$1 == "mgmt" { print "management link " $2 ": here " $3 ", hub " $4 }' "$state")
    [[ -z $mgmt_line ]] || echo "$mgmt_line"
    printf '%-12s %-16s %-10s %-14s %-14s %-14s %s\n' \
        SITE NAMESPACE IFACE ADDRESS HUB-ADDRESS RATE DELAY
    local kind i name ns site_if site_ip hub_if hub_ip rate delay applied note
    while read -r kind i name ns site_if site_ip hub_if hub_ip rate delay applied; do
        [[ $kind == site ]] || continue
        note=""
        [[ $applied == yes ]] || note=" (NOT applied: no netem; use powertrip.services.netem.delay_relay)"
        grep -qxF -- "$ns" <<<"$live" || note+=" [namespace missing]"
        printf '%-12s %-16s %-10s %-14s %-14s %-14s %s\n' \
            "$name" "$ns" "$site_if" "$site_ip" "$hub_ip" "$rate" "$delay$note"
    done <"$state"
}

main() {
    [[ $# -ge 1 ]] || usage
    local cmd=$1
    shift
    parse_args "$@"
    case $cmd in
        up) up ;;
        down)
            [[ -f $state ]] || {
                echo "topology '$prefix': nothing to remove (no $state)"
                return 0
            }
            teardown
            echo "topology '$prefix': down"
            ;;
        status) status ;;
        *) usage ;;
    esac
}

main "$@"
