#!/usr/bin/env bash
# Runs the datapath benchmarks in one go — rule planning and sync (both dispatch modes), first-packet
# latency through the real kernel in network namespaces (iptables tree and linear, nftables), sync on
# the real kernel per backend (iptables-legacy, iptables-nft, nftables, with kube-proxy-shaped
# anchors) at 1k, 10k and 30k Services x 10 endpoints, and the agent's memory per backend — and ends
# with the one-line summary `datapath: ...` built from their own result lines.
#
# Bounds of the per-backend sync bench (about 20 minutes in all on 2 cores):
# - BERTH_SYNC_SIZES (default 1000,10000,30000): its Service counts;
# - BERTH_SYNC_BUDGET_S (default 150): seconds per (size, case); a case past it is stopped (its own
#   processes killed), reported as `stopped`, and not tried at larger sizes;
# - BERTH_SYNC_ANCHOR_MAX (default 10000): the kube-proxy-shaped anchors run up to this many
#   Services (at 30,000 they take many minutes each); above it their rows say `skipped`.
#
# The first-packet benchmark needs root (it creates network namespaces named berth-*); without root
# it is skipped and its ratios are reported as `na`.
set -euo pipefail

cargo=${CARGO:-cargo}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

run() {
    local name=$1
    shift
    "$@" 2>&1 | tee "$logs/$name.log"
}

# value <log> <key>: the value of the last `key=...` the log printed.
value() {
    grep -oE "(^| )$2=[^ ]+" "$logs/$1.log" | tail -n 1 | sed -E "s/^ ?$2=//" || true
}

run plan "$cargo" bench -p berth-datapath --bench datapath_plan_table
if [[ $(id -u) -eq 0 ]]; then
    run first_packet "$cargo" bench -p berth-datapath --bench first_packet
    # With the allocator set as `berth`'s main sets it, so the restart's memory is the agent's.
    MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-2} MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-131072} \
        run sync "$cargo" bench -p berth-datapath --bench sync_backends -- --sizes "${BERTH_SYNC_SIZES:-1000,10000,30000}"
else
    echo "first-packet: skipped (needs root to create network namespaces)" | tee "$logs/first_packet.log"
    echo "sync backends: skipped (needs root to create network namespaces)" | tee "$logs/sync.log"
fi
run rss "$cargo" bench -p berth-agent --bench agent_rss

tree_ms=$(value plan change_10k_tree_ms)
linear_ms=$(value plan change_10k_linear_ms)
fp_tree=$(value first_packet tree_30k_vs_100)
fp_linear=$(value first_packet linear_30k_vs_100)
fp_nft=$(value first_packet nftables_30k_vs_100)
rss=$(value rss agent_rss_mb)
rss_iptables=$(value rss agent_rss_mb_iptables)
rss_nftables=$(value rss agent_rss_mb_nftables)
backend_default=$(value rss backend_default)
full_10k=$(value sync full_sync_10k_s)
full_30k=$(value sync full_sync_30k_s)
change_10k=$(value sync change_10k_real_ms)
add_10k=$(value sync add_10k_real_ms)
text_full_10k=$(value sync nft_text_full_sync_10k_s)
text_change_10k=$(value sync nft_text_change_10k_real_ms)
restart_peak_10k=$(value sync restart_peak_10k_mb)

echo "datapath: change_10k_tree_ms=${tree_ms:-na} change_10k_linear_ms=${linear_ms:-na}" \
    "first_packet_30k_vs_100_tree=${fp_tree:-na} first_packet_30k_vs_100_linear=${fp_linear:-na}" \
    "agent_rss_mb=${rss:-na} agent_rss_mb_iptables=${rss_iptables:-na} agent_rss_mb_nftables=${rss_nftables:-na}" \
    "full_sync_10k_s=${full_10k:-na} change_10k_real_ms=${change_10k:-na}" \
    "add_10k_real_ms=${add_10k:-na} full_sync_30k_s=${full_30k:-na}" \
    "nft_text_full_sync_10k_s=${text_full_10k:-na} nft_text_change_10k_real_ms=${text_change_10k:-na}" \
    "restart_peak_10k_mb=${restart_peak_10k:-na}" \
    "nft_first_packet_30k_vs_100=${fp_nft:-na} backend_default=${backend_default:-na}"
