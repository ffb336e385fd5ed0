#!/usr/bin/env bash
# Where a one-endpoint change's time goes inside the kernel (docs/benchmarks.md, "The kernel's
# commit"). Loads a berth-shaped nftables table of N Services x 10 endpoints (default 10,000) into a
# network namespace of its own, then times the batch `sendmsg` of small transactions with strace:
# nfnetlink runs the whole transaction, commit included, inside that call, so its duration is the
# kernel's part without `nft`'s own parsing and cache.
#
# Two layouts:
# - `jump` (today's): per Service a chain whose first rule jumps to the mark chain and whose other
#   rules DNAT through `numgen random mod k` (k = endpoints left), reached from a verdict map;
# - `datamap` (a prototype): the same chain, but one DNAT rule whose endpoint comes from a per-Service
#   interval data map keyed by `numgen random mod 65536`; an endpoint change rewrites that map's
#   elements only and adds no rule.
#
# - `shards`: today's `jump` layout split into K tables `ip berth<k>` (each with its own
#   `service-ips` map, mark chain and nat base chains at the same hooks; Service s in table s mod K),
#   for each K of SHARDS (default "1 16 32 64"): the kernel validates a transaction per table, so a
#   change to one Service chain walks 1/K of the Service chains.
#
# `traffic` sends 60 HTTP requests through a one-Service `datamap` table from a client namespace to
# three endpoints in a server namespace (veth, 10.244.9.0/24, ClusterIP 10.96.0.10), then removes
# one endpoint by rewriting the map's elements and sends 60 more: the counts per endpoint show the
# layout forwards and spreads. Needs curl too.
#
# Usage (root): scripts/nft-commit-probe.sh [jump|datamap|both|shards|traffic] [services]. Needs nft,
# strace, python3. With `perf` installed, PERF=1 records the `jump` case's kernel stacks and prints
# the top of the report.
set -euo pipefail

layout=${1:-both}
services=${2:-10000}
work=$(mktemp -d)
ns=berth-commit-probe-$$
client=berth-probe-cli-$$
server=berth-probe-srv-$$
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for n in "$ns" "$client" "$server"; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

if [[ $layout == traffic ]]; then
    ip netns add "$client"
    ip netns add "$server"
    ip link add berth-probe-c netns "$client" type veth peer name berth-probe-s netns "$server"
    ip -n "$client" addr add 10.244.9.1/24 dev berth-probe-c
    ip -n "$client" link set berth-probe-c up
    ip -n "$client" route add 10.96.0.0/16 dev berth-probe-c
    for n in 11 12 13; do ip -n "$server" addr add "10.244.9.$n/24" dev berth-probe-s; done
    ip -n "$server" link set berth-probe-s up
    for n in 11 12 13; do
        ip netns exec "$server" python3 -c "
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'10.244.9.$n')
    def log_message(self, *a): pass
http.server.HTTPServer(('10.244.9.$n', 8080), H).serve_forever()" &
        pids+=($!)
    done
    sleep 1
    ip netns exec "$client" nft -f - <<'NFT'
add table ip berth
add map ip berth service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map ip berth eps-X { typeof numgen random mod 65536 : ip daddr . tcp dport ; flags interval ; }
add chain ip berth nat-BERTH-SVC-X
add chain ip berth nat-BERTH-SERVICES
add chain ip berth nat-OUTPUT { type nat hook output priority -100 ; policy accept ; }
add rule ip berth nat-BERTH-SERVICES ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip berth nat-OUTPUT jump nat-BERTH-SERVICES
add rule ip berth nat-BERTH-SVC-X meta l4proto tcp dnat ip to numgen random mod 65536 map @eps-X
add element ip berth eps-X { 0-21844 : 10.244.9.11 . 8080, 21845-43689 : 10.244.9.12 . 8080, 43690-65535 : 10.244.9.13 . 8080 }
add element ip berth service-ips { 10.96.0.10 . tcp . 80 : jump nat-BERTH-SVC-X }
NFT
    ask() {
        for _ in $(seq 60); do
            ip netns exec "$client" curl -s -m 2 http://10.96.0.10/ || echo -n failed
            echo
        done | sort | uniq -c | tr -s ' \n' ' '
        echo
    }
    echo "three endpoints: $(ask)"
    ip netns exec "$client" nft -f - <<'NFT'
delete element ip berth eps-X { 0-21844, 21845-43689, 43690-65535 }
add element ip berth eps-X { 0-32767 : 10.244.9.11 . 8080, 32768-65535 : 10.244.9.13 . 8080 }
NFT
    echo "10.244.9.12 removed (elements only): $(ask)"
    exit 0
fi

cat >"$work/shards.py" <<'PY'
import sys
n, K, eps = int(sys.argv[1]), int(sys.argv[2]), 10
out = []; a = out.append
chain = lambda s: f"nat-BERTH-SVC-{s:016d}"
cluster_ip = lambda s: f"10.96.{s // 250}.{s % 250 + 1}"
pod = lambda k: f"10.{128 + k // 60000}.{k // 250 % 240}.{k % 250 + 1}"
for k in range(K):
    t = f"ip berth{k}"
    a(f"add table {t}")
    a(f"add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}")
    a(f"add chain {t} nat-BERTH-MARK-MASQ")
    a(f"add chain {t} nat-BERTH-SERVICES")
    a(f"add chain {t} nat-PREROUTING {{ type nat hook prerouting priority dstnat ; policy accept ; }}")
    a(f"add chain {t} nat-OUTPUT {{ type nat hook output priority -100 ; policy accept ; }}")
    a(f"add rule {t} nat-BERTH-MARK-MASQ meta mark set meta mark | 0x4000")
    a(f"add rule {t} nat-BERTH-SERVICES ip daddr . meta l4proto . th dport vmap @service-ips")
    a(f"add rule {t} nat-OUTPUT jump nat-BERTH-SERVICES")
    a(f"add rule {t} nat-PREROUTING jump nat-BERTH-SERVICES")
    mine = [s for s in range(n) if s % K == k]
    for s in mine: a(f"add chain {t} {chain(s)}")
    for s in mine:
        a(f'add rule {t} {chain(s)} meta l4proto tcp ip daddr {cluster_ip(s)} th dport 80 ip saddr != 10.244.0.0/16 jump nat-BERTH-MARK-MASQ comment "ns/svc{s}:p80 cluster IP"')
        for e in range(eps):
            pick = f"numgen random mod {eps - e} == 0 " if eps - e > 1 else ""
            a(f"add rule {t} {chain(s)} {pick}meta l4proto tcp dnat to {pod(s * eps + e)}:8080")
    if mine:
        a(f"add element {t} service-ips {{ " + ", ".join(f"{cluster_ip(s)} . tcp . 80 : jump {chain(s)}" for s in mine) + " }")
print("\n".join(out))
PY

cat >"$work/gen.py" <<'PY'
import sys
layout, n, eps, slots = sys.argv[1], int(sys.argv[2]), 10, 65536
out = []
a = out.append
a("add table ip berth")
a("add map ip berth service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }")
a("add chain ip berth nat-BERTH-MARK-MASQ")
a("add chain ip berth nat-BERTH-SERVICES")
a("add chain ip berth nat-PREROUTING { type nat hook prerouting priority dstnat ; policy accept ; }")
a("add chain ip berth nat-OUTPUT { type nat hook output priority -100 ; policy accept ; }")
chain = lambda s: f"nat-BERTH-SVC-{s:016d}"
cluster_ip = lambda s: f"10.96.{s // 250}.{s % 250 + 1}"
pod = lambda k: f"10.{128 + k // 60000}.{k // 250 % 240}.{k % 250 + 1}"
for s in range(n):
    a(f"add chain ip berth {chain(s)}")
    if layout == "datamap":
        a(f"add map ip berth eps-{s:016d} {{ typeof numgen random mod {slots} : ip daddr . tcp dport ; flags interval ; }}")
a("add rule ip berth nat-BERTH-MARK-MASQ meta mark set meta mark | 0x4000")
a("add rule ip berth nat-BERTH-SERVICES ip daddr . meta l4proto . th dport vmap @service-ips")
a("add rule ip berth nat-OUTPUT jump nat-BERTH-SERVICES")
a("add rule ip berth nat-PREROUTING jump nat-BERTH-SERVICES")
for s in range(n):
    a(f'add rule ip berth {chain(s)} meta l4proto tcp ip daddr {cluster_ip(s)} th dport 80 '
      f'ip saddr != 10.244.0.0/16 jump nat-BERTH-MARK-MASQ comment "ns/svc{s}:p80 cluster IP"')
    if layout == "datamap":
        a(f"add rule ip berth {chain(s)} meta l4proto tcp dnat ip to numgen random mod {slots} map @eps-{s:016d}")
        ranges = ", ".join(f"{slots * e // eps}-{slots * (e + 1) // eps - 1} : {pod(s * eps + e)} . 8080" for e in range(eps))
        a(f"add element ip berth eps-{s:016d} {{ {ranges} }}")
    else:
        for e in range(eps):
            pick = f"numgen random mod {eps - e} == 0 " if eps - e > 1 else ""
            a(f"add rule ip berth {chain(s)} {pick}meta l4proto tcp dnat to {pod(s * eps + e)}:8080")
a("add element ip berth service-ips { " + ", ".join(
    f"{cluster_ip(s)} . tcp . 80 : jump {chain(s)}" for s in range(n)) + " }")
print("\n".join(out))
PY

# kernel_ms <file>: the batch sendmsg's duration of `nft -f <file>` in the namespace, in ms.
kernel_ms() {
    ip netns exec "$ns" strace -f -T -e trace=sendmsg nft -f "$1" 2>&1 >/dev/null |
        sed -nE 's/^.*sendmsg\(.*<([0-9.]+)>$/\1/p' | sort -n | tail -n 1 |
        awk '{ printf "%.1f", $1 * 1000 }'
}

# probe <name> <do> <undo>: five rounds of a transaction and the one that takes it back.
probe() {
    local name=$1 do=$2 undo=$3 times=()
    for _ in 1 2 3 4 5; do
        times+=("$(kernel_ms "$do")")
        ip netns exec "$ns" nft -f "$undo"
    done
    echo "$layout_now $services: $name: kernel ms ${times[*]}"
}

svc=$(printf '%016d' $((services / 2)))
if [[ $layout == shards ]]; then
    layout_now=shards
    for k in ${SHARDS:-1 16 32 64}; do
        python3 "$work/shards.py" "$services" "$k" >"$work/full.nft"
        ip netns add "$ns"
        start=$(date +%s%N)
        ip netns exec "$ns" nft -f "$work/full.nft"
        echo "shards K=$k $services: cold load with nft -f: $((($(date +%s%N) - start) / 1000000)) ms"
        table="ip berth$((services / 2 % k))"
        chain=nat-BERTH-SVC-$svc
        grep -E "^add rule $table $chain " "$work/full.nft" >"$work/rules"
        { echo "flush chain $table $chain"; cat "$work/rules"; } >"$work/rewrite.nft"
        probe "K=$k: rewrite one Service chain" "$work/rewrite.nft" "$work/rewrite.nft"
        echo "add rule $table $chain meta l4proto tcp dnat to 10.250.0.1:8080" >"$work/add.nft"
        probe "K=$k: add one dnat rule" "$work/add.nft" "$work/rewrite.nft"
        ip netns del "$ns"
    done
    exit 0
fi
for layout_now in jump datamap; do
    [[ $layout == both || $layout == "$layout_now" ]] || continue
    python3 "$work/gen.py" "$layout_now" "$services" >"$work/full.nft"
    ip netns add "$ns"
    start=$(date +%s%N)
    ip netns exec "$ns" nft -f "$work/full.nft"
    echo "$layout_now $services: cold load with nft -f: $((($(date +%s%N) - start) / 1000000)) ms"
    chain=nat-BERTH-SVC-$svc
    if [[ $layout_now == jump ]]; then
        grep -E "^add rule ip berth $chain " "$work/full.nft" >"$work/rules"
        { echo "flush chain ip berth $chain"; cat "$work/rules"; } >"$work/rewrite.nft"
        probe "rewrite one Service chain (berth's change today)" "$work/rewrite.nft" "$work/rewrite.nft"
        for kind in "counter:counter" "dnat:meta l4proto tcp dnat to 10.250.0.1:8080" \
            "jump:jump nat-BERTH-MARK-MASQ"; do
            echo "add rule ip berth $chain ${kind#*:}" >"$work/add.nft"
            { echo "flush chain ip berth $chain"; cat "$work/rules"; } >"$work/undo.nft"
            probe "add one ${kind%%:*} rule" "$work/add.nft" "$work/undo.nft"
        done
        ip netns exec "$ns" nft add chain ip berth nat-BERTH-SVC-NEW
        echo 'add element ip berth service-ips { 10.97.0.1 . tcp . 80 : jump nat-BERTH-SVC-NEW }' >"$work/add.nft"
        echo 'delete element ip berth service-ips { 10.97.0.1 . tcp . 80 }' >"$work/undo.nft"
        probe "add one verdict-map element (jump)" "$work/add.nft" "$work/undo.nft"
        ip netns exec "$ns" nft add map ip berth plain '{ type ipv4_addr : ipv4_addr . inet_service ; }'
        echo 'add element ip berth plain { 10.1.0.1 : 10.244.0.1 . 8080 }' >"$work/add.nft"
        echo 'delete element ip berth plain { 10.1.0.1 }' >"$work/undo.nft"
        probe "add one data-map element" "$work/add.nft" "$work/undo.nft"
        if [[ ${PERF:-0} == 1 ]]; then
            echo "add rule ip berth $chain meta l4proto tcp dnat to 10.250.0.1:8080" >"$work/add.nft"
            perf record -q -o "$work/perf.data" -a -g -- \
                ip netns exec "$ns" nft -f "$work/add.nft" 2>/dev/null
            perf report -i "$work/perf.data" --comm nft --children --sort sym --stdio -g none \
                2>/dev/null | grep -E '^ +[0-9]' | head -n 14 || true
        fi
    else
        map=eps-$svc
        python3 - "$services" >"$work/eleven.txt" <<'PY'
import sys
s, slots = int(sys.argv[1]) // 2, 65536
pod = lambda k: f"10.{128 + k // 60000}.{k // 250 % 240}.{k % 250 + 1}"
ips = [pod(s * 10 + e) for e in range(10)] + ["10.250.0.1"]
print(", ".join(f"{slots * e // 11}-{slots * (e + 1) // 11 - 1} : {ip} . 8080" for e, ip in enumerate(ips)))
print(", ".join(f"{slots * e // 11}-{slots * (e + 1) // 11 - 1}" for e in range(11)))
print(", ".join(f"{slots * e // 10}-{slots * (e + 1) // 10 - 1}" for e in range(10)))
PY
        ten=$(grep -E "^add element ip berth $map " "$work/full.nft" | sed -E 's/.*\{ (.*) \}$/\1/')
        printf 'delete element ip berth %s { %s }\nadd element ip berth %s { %s }\n' \
            "$map" "$(sed -n 3p "$work/eleven.txt")" "$map" "$(sed -n 1p "$work/eleven.txt")" >"$work/up.nft"
        printf 'delete element ip berth %s { %s }\nadd element ip berth %s { %s }\n' \
            "$map" "$(sed -n 2p "$work/eleven.txt")" "$map" "$ten" >"$work/down.nft"
        probe "one endpoint more: the map's elements rewritten, no rule" "$work/up.nft" "$work/down.nft"
    fi
    ip netns del "$ns"
done
