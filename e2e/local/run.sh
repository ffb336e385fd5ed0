#!/usr/bin/env bash
# End-to-end journeys against a lab: starts `berth lab up` (3 nodes), runs every NN-*.sh journey
# in order with the real kubectl, then stops the lab (which removes everything, also when a
# journey fails). Needs root, iproute2, curl and kubectl: without them it skips with a message,
# but fails under CI=true or BERTH_REQUIRE_ROOT=1. Journeys that need the L2 announcer (NEEDS=
# "announcer") are skipped, with a message, while `berth agent` has none. Where FRR is installed
# and a journey to run needs it (NEEDS="bgp"), the lab runs with --bgp (a router on the LAN, FRR
# on every node); where it is not, those journeys are skipped, with a message.
#
#   e2e/local/run.sh [JOURNEY...]     e.g. e2e/local/run.sh 10-pods-follow
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
BERTH_BIN=${BERTH_BIN:-$here/../../target/debug/berth}
strict=0
[[ ${CI:-} == true || ${BERTH_REQUIRE_ROOT:-} == 1 ]] && strict=1

missing=""
[[ $(id -u) -eq 0 ]] || missing="root"
for tool in ip curl kubectl python3; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[[ -x $BERTH_BIN ]] || missing="$missing $BERTH_BIN (cargo build --bin berth)"
if [[ -n $missing ]]; then
    echo "e2e: skipped: needs$missing"
    ((strict)) && { echo "e2e: CI=true or BERTH_REQUIRE_ROOT=1: a skip is a failure" >&2; exit 1; }
    exit 0
fi

announcer=no
"$BERTH_BIN" agent --help | grep -qi 'announc' && announcer=yes
journeys=("$@")
if ((${#journeys[@]} == 0)); then
    for f in "$here"/[0-9][0-9]-*.sh; do journeys+=("$(basename "$f" .sh)"); done
fi

bgp=no bgp_flag=()
if [[ -x /usr/lib/frr/bgpd && -f /usr/lib/frr/frr-reload.py ]] && command -v vtysh >/dev/null 2>&1; then
    bgp=yes
    # FRR on every node and a router add to the lab's start: only when a journey needs them.
    for name in "${journeys[@]}"; do
        if grep -qx 'NEEDS="bgp"' "$here/$name.sh"; then
            bgp_flag=(--bgp)
            break
        fi
    done
fi

LAB=e2e$$
STATE_DIR=$(mktemp -d /tmp/berth-e2e.XXXXXX)
CLIENT_NS=berth-$LAB-client
# With --bgp: the router on the LAN and the client behind it.
ROUTER_NS=berth-$LAB-router
OUTSIDE_NS=berth-$LAB-outside
export KUBECONFIG=$STATE_DIR/kubeconfig
export LAB STATE_DIR CLIENT_NS ROUTER_NS OUTSIDE_NS
up_log=$(mktemp /tmp/berth-e2e-up.XXXXXX)
up_pid=""

stop_lab() {
    if [[ -n $up_pid ]] && kill -0 "$up_pid" 2>/dev/null; then
        kill -INT "$up_pid" 2>/dev/null || true
        wait "$up_pid" 2>/dev/null || true
    fi
    # Also after a lab up that died: removes whatever it recorded and berth-$LAB-*.
    "$BERTH_BIN" lab down --name "$LAB" --state-dir "$STATE_DIR" >/dev/null 2>&1 || true
    rm -rf "$STATE_DIR" "$up_log"
}
trap stop_lab EXIT

echo "e2e: starting lab $LAB (3 nodes${bgp_flag:+, BGP})"
"$BERTH_BIN" lab up --name "$LAB" --state-dir "$STATE_DIR" --nodes 3 "${bgp_flag[@]}" >"$up_log" 2>&1 &
up_pid=$!
deadline=$((SECONDS + 120))
until grep -q "is up" "$up_log"; do
    if ! kill -0 "$up_pid" 2>/dev/null || ((SECONDS >= deadline)); then
        echo "e2e: the lab did not come up:" >&2
        cat "$up_log" >&2
        for f in "$STATE_DIR"/logs/*.log; do [[ -f $f ]] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
        exit 1
    fi
    sleep 0.5
done

# shellcheck source=lib.sh
source "$here/lib.sh"

# The lab's pool and advertisement, as a user would apply them.
kubectl apply -f "$here/../../examples/ippool.yaml" -f "$here/../../examples/l2advertisement.yaml" >/dev/null

passed=0 failed=0 skipped=0
for name in "${journeys[@]}"; do
    NEEDS=""
    # shellcheck disable=SC1090
    source "$here/$name.sh"
    if [[ $NEEDS == announcer && $announcer == no ]]; then
        echo "e2e: $name: SKIPPED (needs the L2 announcer; this berth agent has none)"
        skipped=$((skipped + 1))
        continue
    fi
    if [[ $NEEDS == bgp && $bgp == no ]]; then
        echo "e2e: $name: SKIPPED (needs FRR: Debian packages frr and frr-pythontools)"
        skipped=$((skipped + 1))
        continue
    fi
    echo "e2e: $name"
    start=$SECONDS
    # Not in an `if`: bash ignores `set -e` inside a command whose status is tested.
    set +e
    (
        set -euo pipefail
        journey
    )
    rc=$?
    set -e
    if ((rc == 0)); then
        echo "e2e: $name: ok ($((SECONDS - start)) s)"
        passed=$((passed + 1))
    else
        echo "e2e: $name: FAILED ($((SECONDS - start)) s); lab logs:" >&2
        for f in "$STATE_DIR"/logs/*.log; do echo "--- $f" >&2; tail -15 "$f" >&2; done
        failed=$((failed + 1))
    fi
done
echo "e2e: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
