# `berth explain service` against the lab, compared with what real packets do: the announcer
# it names is the node that answers ARP (the Service's annotation), its endpoints are the pods,
# every pod that answers a real request from the client is one of the DNAT targets it traced
# through the kernel's ruleset, masquerading is what the pod sees, and a Service without
# endpoints is traced to REJECT where curl is refused. On the lab's default backend (nftables:
# the agent's netlink dump of berth's table, decoded) and, with BERTH_BACKEND=iptables
# e2e/local/run.sh, on iptables (iptables-save); the hops are checked to be in that backend's
# words.
NEEDS="announcer"

# explain ARGS...: berth explain service against the lab, from the API alone.
explain() { "$BERTH_BIN" explain service --kubeconfig "$KUBECONFIG" "$@"; }
# explain_on_lan ARGS...: the same from the client namespace, where the agents' admin ports
# are reachable (as from a host on the node network), through the API server's LAN address.
explain_on_lan() {
    ip netns exec "$CLIENT_NS" "$BERTH_BIN" explain service --kubeconfig "$STATE_DIR/kubeconfig.lan" "$@"
}

# dnat_targets TEXT: the sorted endpoint addresses the traced paths DNAT to.
dnat_targets() { sed -n 's/.*=> DNAT to \([0-9.:]*\),.*/\1/p' <<<"$1" | sort -u | tr '\n' ' '; }

# answering_addresses N IP: the sorted pod addresses (ip:8080) that answer N requests.
answering_addresses() {
    local pods pod
    pods=$(pods_answering "$CLIENT_NS" "$2" 80 "$1")
    for pod in $pods; do
        echo "$(kubectl get pod "$pod" -o 'jsonpath={.status.podIP}'):8080"
    done | sort -u | tr '\n' ' '
}

journey() {
    mk_pod x1 explained node1
    mk_pod x2 explained node2
    mk_lb_service explained explained
    wait_for 30 "an LB IP" has_lb_ip explained
    wait_for 30 "x1 and x2 ready" eval '[[ $(ready_pods explained) == "x1 x2 " ]]'
    wait_for 30 "an announcer" eval '[[ -n $(announcer explained) ]]'
    local ip node out
    ip=$(lb_ip explained)
    node=$(announcer explained)
    wait_for 30 "answers through $ip" get_from "$CLIENT_NS" "$ip" 80
    out=$(explain default/explained)
    grep -q "LoadBalancer  $ip" <<<"$out" || { fail "no LoadBalancer line: $out"; return 1; }
    grep -q "$node announces it" <<<"$out" || { fail "explain does not name $node: $out"; return 1; }
    grep -Eq "node1 +[0-9.]+:8080 +x1 +ready" <<<"$out" || { fail "x1 missing: $out"; return 1; }
    log "explain names $node as the announcer of $ip, as the Service does"

    out=$(explain_on_lan default/explained --from 198.18.0.100)
    # Hops in the backend's own words: nft chains (nat-PREROUTING, in its nat shard:
    # berth-<n> nat-PREROUTING) or iptables' (nat/PREROUTING).
    local first_hop="(berth-[0-9]+ )?nat-PREROUTING:"
    [[ ${BERTH_BACKEND:-} == iptables ]] && first_hop=nat/PREROUTING:
    grep -Eq "^    $first_hop" <<<"$out" || { fail "no $first_hop hop: $out"; return 1; }
    local traced answered
    traced=$(dnat_targets "$out")
    answered=$(answering_addresses 20 "$ip")
    [[ -n $traced && $answered == "$traced" ]] || { fail "traced [$traced], answered [$answered]: $out"; return 1; }
    grep -q "DNAT to .*, masqueraded" <<<"$out" || { fail "Cluster policy not masqueraded: $out"; return 1; }
    [[ $(client_of "$(get_from "$CLIENT_NS" "$ip" 80)") != 198.18.0.100:* ]] || { fail "the pod saw the client"; return 1; }
    log "traced on $node: DNAT to $traced masqueraded; real requests reached $answered without the client's address"

    kubectl patch svc explained -p '{"spec":{"externalTrafficPolicy":"Local"}}' >/dev/null
    wait_for 30 "the client address preserved" eval '[[ $(client_of "$(get_from $CLIENT_NS $ip 80)") == 198.18.0.100:* ]]'
    # The address moves at once; the announcer's record follows once the move has held for a
    # second (at most five), and explain traces on the node the record names.
    wait_for 30 "a record naming a node with an endpoint" eval '[[ $(announcer explained) == node[12] ]]'
    node=$(announcer explained)
    out=$(explain_on_lan default/explained --from 198.18.0.100)
    grep -q "DNAT to .*, not masqueraded" <<<"$out" || { fail "Local policy masqueraded: $out"; return 1; }
    traced=$(dnat_targets "$out")
    answered=$(answering_addresses 10 "$ip")
    [[ $answered == "$traced" ]] || { fail "Local: traced [$traced], answered [$answered]"; return 1; }
    log "Local policy on $node: DNAT to $traced only, not masqueraded, as the pod saw"

    kubectl delete pod x1 x2 --grace-period=0 >/dev/null
    wait_for 30 "no endpoints" eval '[[ -z $(ready_pods explained) ]]'
    local port
    port=$(node_port explained)
    out=$(explain_on_lan default/explained --from 198.18.0.100 --node node3)
    grep -Eq "=> (REJECTED|DROPPED)" <<<"$out" || { fail "no endpoints, yet: $out"; return 1; }
    ! get_from "$CLIENT_NS" "$(node_ip node3)" "$port" || { fail "node3 answered without endpoints"; return 1; }
    log "without endpoints node3's path ends in $(grep -Eo '=> (REJECTED|DROPPED)' <<<"$out" | head -1 | cut -c4-), and a request to it fails"
    kubectl delete svc explained >/dev/null
    kubectl delete pod x1 x2 --grace-period=0 --ignore-not-found >/dev/null
}
