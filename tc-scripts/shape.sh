#!/usr/bin/env bash
# Shape one interface's egress with tc: delay/jitter/loss with netem, rate with tbf (or htb).
#
# Usage: shape.sh apply <iface> [--profile FILE] [--allow-no-netem]
#        shape.sh clear <iface>
#        shape.sh show <iface>
#
# apply reads DELAY, JITTER, LOSS, RATE (tc syntax: 40ms, 5ms, 0.1%, 50mbit) and RATE_QDISC
# (tbf|htb, default tbf) from the environment; keys in --profile FILE (KEY=VALUE lines, the
# compose env_file format) take precedence. Empty or zero values mean "not shaped". Layouts:
#   rate only          root tbf            (or root htb 1: + class 1:10 with RATE_QDISC=htb)
#   delay/jitter/loss  root netem
#   both               root htb 1: + class 1:10 (rate) + leaf netem 10: (delay/jitter/loss)
# Re-running apply converges on the requested layout, so it is safe to repeat.
#
# Without sch_netem (as on kernels built without it) delay/jitter/loss cannot be applied: apply
# fails with exit 3 and names the application-level fallback (powertrip.services.netem.delay_relay).
# --allow-no-netem applies the rate alone and says on stderr what it skipped.
#
# Exit codes: 0 ok, 1 tc or interface error, 2 usage error, 3 netem unavailable.
set -euo pipefail

readonly PROG=${0##*/}
readonly E_FAIL=1 E_USAGE=2 E_NO_NETEM=3
# Queue bound for tbf: deep enough for TCP to fill the link, shallow enough to add little delay.
readonly TBF_LATENCY=50ms
readonly HTB_CLASS=1:10 NETEM_HANDLE=10:

die() {  # die CODE MESSAGE...
    local code=$1
    shift
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$code"
}

usage() {
    sed -n '4,6s/^# //p' "$0" >&2
    exit "$E_USAGE"
}

# "", "0", "0ms", "0.0%" all mean "leave this knob alone".
is_set() {
    [[ -n $1 && ! $1 =~ ^(0+(\.0*)?|\.0+)[A-Za-z%]*$ ]]
}

require_iface() {
    ip link show dev "$1" >/dev/null 2>&1 ||
        die "$E_FAIL" "no such interface '$1' in this network namespace (list them: ip -br link)"
}

load_profile() {
    local file=$1 line key value n=0
    [[ -f $file && -r $file ]] || die "$E_USAGE" "cannot read profile '$file'"
    while IFS= read -r line || [[ -n $line ]]; do
        n=$((n + 1))
        line=${line%$'\r'}
        [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
        [[ $line =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] ||
            die "$E_USAGE" "$file:$n: expected KEY=VALUE, got '$line'"
        key=${BASH_REMATCH[2]}
        value=${BASH_REMATCH[3]}
        value=${value#[\"\']}
        value=${value%[\"\']}
        # Other keys (POWERTRIP_SITE_ID, ...) are for the worker that shares the env_file.
        case $key in
            DELAY | JITTER | LOSS | RATE | RATE_QDISC) printf -v "$key" '%s' "$value" ;;
        esac
    done <"$file"
}

# tc rate -> bit/s. A unit is required: "bps" means bytes/s to tc, an easy slip.
rate_bps() {
    awk -v r="$1" 'BEGIN {
        if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
        n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
        m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
        m["kibit"] = 1024; m["mibit"] = 1048576; m["gibit"] = 1073741824
        m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
        if (!(u in m) || n * m[u] <= 0) exit 1
        printf "%.0f\n", n * m[u]
    }'
}

# Bucket of 4 ms of traffic, at least 32 KiB: with high-resolution timers the bucket only has to
# hold a few full-size packets, and a small one keeps the measured rate close to the set rate.
burst_bytes() {
    awk -v bps="$1" 'BEGIN { b = bps / 8 * 0.004; if (b < 32768) b = 32768; printf "%.0f\n", b }'
}

# Whether the kernel can run netem. The probe runs in a throwaway network namespace so no real
# interface is touched (the namespace dies with the probe). Prints yes, no, or unknown when the
# probe itself cannot run (no unshare, or only CAP_NET_ADMIN as in a container).
netem_probe() {
    local err
    if err=$(unshare --net tc qdisc add dev lo root netem delay 1ms 2>&1); then
        echo yes
    elif [[ $err == *"kind is unknown"* ]]; then
        echo no
    else
        echo unknown
    fi
}

# Fallback probe on the interface itself: a replace that fails leaves the interface as it was,
# and one that succeeds is overwritten by the layout apply builds next.
netem_probe_on() {
    local iface=$1 err
    shift
    if err=$(tc qdisc replace dev "$iface" root netem "$@" 2>&1); then
        echo yes
    elif [[ $err == *"kind is unknown"* ]]; then
        echo no
    else
        die "$E_FAIL" "tc qdisc replace dev $iface root netem $*: $err"
    fi
}

no_netem_error() {
    local iface=$1 wanted=$2
    printf '%s: error: netem is unavailable on this kernel (no sch_netem), so %s cannot be applied on %s.\n' \
        "$PROG" "$wanted" "$iface" >&2
    printf '%s: emulate latency in the application instead: python -m powertrip.services.netem.delay_relay --listen HOST:PORT --target HOST:PORT --delay-ms MS\n' \
        "$PROG" >&2
    printf '%s: or pass --allow-no-netem to apply RATE alone.\n' "$PROG" >&2
    exit "$E_NO_NETEM"
}

root_kind() {  # prints "<kind> <handle>" of the root qdisc
    tc qdisc show dev "$1" root | awk '$1 == "qdisc" { print $2, $3; exit }'
}

clear_root() {
    local err
    if ! err=$(tc qdisc del dev "$1" root 2>&1); then
        # The kernel's default qdisc has handle 0 and cannot be deleted: already clear.
        [[ $err == *"handle of zero"* ]] || die "$E_FAIL" "tc qdisc del dev $1 root: $err"
    fi
}

# htb has no in-place change for its qdisc, so reuse our 1: root when present, else rebuild.
ensure_htb_root() {
    local iface=$1
    if [[ $(root_kind "$iface") != "htb 1:" ]]; then
        clear_root "$iface"
        tc qdisc add dev "$iface" root handle 1: htb default 10
    fi
}

show() {
    local iface=$1
    require_iface "$iface"
    tc qdisc show dev "$iface"
    if [[ $(root_kind "$iface") == htb* ]]; then
        tc class show dev "$iface"
    fi
}

apply() {
    local iface=$1 allow_no_netem=$2
    require_iface "$iface"
    : "${DELAY:=}" "${JITTER:=}" "${LOSS:=}" "${RATE:=}" "${RATE_QDISC:=tbf}"

    local -a netem_args=()
    local -a wanted=()
    if is_set "$DELAY"; then
        netem_args+=(delay "$DELAY")
        wanted+=("DELAY=$DELAY")
        if is_set "$JITTER"; then
            netem_args+=("$JITTER")
            wanted+=("JITTER=$JITTER")
        fi
    elif is_set "$JITTER"; then
        die "$E_USAGE" "JITTER=$JITTER needs a DELAY to vary around"
    fi
    if is_set "$LOSS"; then
        netem_args+=(loss "$LOSS")
        wanted+=("LOSS=$LOSS")
    fi
    local rate=""
    is_set "$RATE" && rate=$RATE
    case $RATE_QDISC in tbf | htb) ;; *) die "$E_USAGE" "RATE_QDISC must be tbf or htb, got '$RATE_QDISC'" ;; esac
    if [[ -z $rate && ${#netem_args[@]} -eq 0 ]]; then
        die "$E_USAGE" "nothing to shape on $iface: set RATE and/or DELAY, JITTER, LOSS (or use: $PROG clear $iface)"
    fi

    local bps burst
    if [[ -n $rate ]]; then
        bps=$(rate_bps "$rate") || die "$E_USAGE" "RATE='$rate' is not a tc rate (e.g. 50mbit, 1gbit)"
        burst=$(burst_bytes "$bps")
    fi

    if [[ ${#netem_args[@]} -gt 0 ]]; then
        local netem
        netem=$(netem_probe)
        if [[ $netem == unknown ]]; then
            netem=$(netem_probe_on "$iface" "${netem_args[@]}")
        fi
        if [[ $netem == no ]]; then
            [[ $allow_no_netem == 1 ]] || no_netem_error "$iface" "${wanted[*]}"
            local kept="RATE=$rate"
            [[ -n $rate ]] || kept="nothing (the interface is cleared)"
            printf '%s: WARNING: netem is unavailable on this kernel: SKIPPED %s on %s; applying %s.\n' \
                "$PROG" "${wanted[*]}" "$iface" "$kept" >&2
            printf '%s: WARNING: emulate that latency with python -m powertrip.services.netem.delay_relay.\n' \
                "$PROG" >&2
            netem_args=()
        fi
    fi

    if [[ -z $rate ]]; then
        if [[ ${#netem_args[@]} -eq 0 ]]; then
            clear_root "$iface"
        else
            tc qdisc replace dev "$iface" root netem "${netem_args[@]}"
        fi
    elif [[ ${#netem_args[@]} -eq 0 && $RATE_QDISC == tbf ]]; then
        # Without a handle, replace changes a tbf root in place and grafts over anything else.
        tc qdisc replace dev "$iface" root tbf rate "$rate" burst "$burst" latency "$TBF_LATENCY"
    else
        # netem under a rate class (not netem's own rate option) keeps the rate exact under loss.
        ensure_htb_root "$iface"
        tc class replace dev "$iface" parent 1: classid "$HTB_CLASS" htb rate "$rate" ceil "$rate" \
            burst "$burst" cburst "$burst" quantum 1514
        if [[ ${#netem_args[@]} -gt 0 ]]; then
            tc qdisc replace dev "$iface" parent "$HTB_CLASS" handle "$NETEM_HANDLE" \
                netem "${netem_args[@]}"
        else
            tc qdisc del dev "$iface" parent "$HTB_CLASS" handle "$NETEM_HANDLE" 2>/dev/null || true
        fi
    fi
    show "$iface"
}

main() {
    [[ $# -ge 2 ]] || usage
    local cmd=$1 iface=$2 allow_no_netem=0
    shift 2
    while [[ $# -gt 0 ]]; do
        case $1 in
            --profile)
                [[ $# -ge 2 ]] || usage
                load_profile "$2"
                shift 2
                ;;
            --allow-no-netem)
                allow_no_netem=1
                shift
                ;;
            *) usage ;;
        esac
    done
    [[ -n $iface && $iface != -* ]] || usage
    case $cmd in
        apply) apply "$iface" "$allow_no_netem" ;;
        clear)
            require_iface "$iface"
            clear_root "$iface"
            show "$iface"
            ;;
        show) show "$iface" ;;
        *) usage ;;
    esac
}

main "$@"
