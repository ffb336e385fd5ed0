# BGP (the lab runs with --bgp): the example peers and pool applied as a user would; a dual-stack
# LoadBalancer Service from the BGP pool becomes one route per family in the router's kernel
# FIB with a next hop per node (ECMP; the IPv6 /128 learnt over the IPv6 sessions), the client
# behind the router is served through both and its connections spread over the nodes;
# externalTrafficPolicy Local moves the routes to the nodes with a ready endpoint, and with the
# endpoints; a deleted Service is withdrawn. Every session reports Established.
NEEDS="bgp"

# hops IP: the router's next hops for IP, sorted, space separated (link-local ones for IPv6).
hops() {
    local family=-4
    [[ $1 == *:* ]] && family=-6
    ip "$family" -j -n "$ROUTER_NS" route show "$1" | python3 -c '
import json, sys
hops = []
for r in json.load(sys.stdin):
    hops += [r["gateway"]] if "gateway" in r else [h["gateway"] for h in r.get("nexthops", [])]
print(" ".join(sorted(hops)))'
}

hop_count() { local h; read -ra h <<<"$(hops "$1")"; echo "${#h[@]}"; }

# sessions_established: how many BGPSessionState records say Established.
sessions_established() {
    kubectl get bgpsessionstates -A \
        -o 'jsonpath={range .items[*]}{.spec.bgpState}{"\n"}{end}' | grep -c '^Established$'
}

journey() {
    local examples=$here/../../examples/bgp
    kubectl apply -f "$examples/ippool-bgp.yaml" -f "$examples/bgppeer.yaml" \
        -f "$examples/bgpadvertisement.yaml" >/dev/null
    mk_pod b1 bgp node1
    mk_pod b2 bgp node2
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata:
  name: bgp-web
  annotations:
    berth.dev/ip-pool: bgp
spec:
  type: LoadBalancer
  loadBalancerClass: berth.dev/l2
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  selector:
    app: bgp
  ports:
  - name: http
    port: 80
    targetPort: 8080
YAML
    wait_for 30 "both LB addresses" eval '[[ $(lb_ips bgp-web) == *" "* ]]'
    local ip4 ip6 all3
    read -r ip4 ip6 <<<"$(lb_ips bgp-web)"
    [[ $ip4 == 198.19.10.* && $ip6 == fd00:19:10::* ]] || { fail "addresses not from the bgp pool: $ip4 $ip6"; return 1; }
    all3="$(node_ip node1) $(node_ip node2) $(node_ip node3)"
    wait_for 30 "six sessions Established" eval '(( $(sessions_established) == 6 ))'
    wait_for 30 "ECMP for $ip4 over the three nodes" eval '[[ $(hops $ip4) == "$all3" ]]'
    wait_for 30 "ECMP for $ip6 over the three nodes" eval '(( $(hop_count $ip6) == 3 ))'
    log "router: $ip4 via $(hops "$ip4"); $ip6 via $(hops "$ip6")"

    # From the client behind the router, through both families; Cluster policy masquerades, so
    # the pods see the node each connection went through: the router spreads them.
    wait_for 30 "an answer through $ip4 from behind the router" get_from "$OUTSIDE_NS" "$ip4" 80
    wait_for 30 "an answer through $ip6 from behind the router" get_from "$OUTSIDE_NS" "$ip6" 80
    log "IPv6: $(get_from "$OUTSIDE_NS" "$ip6" 80)"
    local i nodes
    # A node's address, or its pods' gateway 10.244.<i>.1 when the endpoint is its own.
    nodes=$(for ((i = 0; i < 12; i++)); do
        client_of "$(get_from "$OUTSIDE_NS" "$ip4" 80)" | cut -d: -f1 |
            sed 's/^10\.244\.\([0-9]*\)\.1$/node\1/; s/^198\.18\.0\.1\([0-9]\)$/node\1/'
    done | sort -u | tr '\n' ' ')
    log "12 connections came in through $nodes"
    local seen
    read -ra seen <<<"$nodes"
    ((${#seen[@]} >= 2)) || { fail "all connections went through one node: $nodes"; return 1; }

    # Local policy: only the nodes with an endpoint announce, and the client's address is kept.
    kubectl patch svc bgp-web -p '{"spec":{"externalTrafficPolicy":"Local"}}' >/dev/null
    local two
    two="$(node_ip node1) $(node_ip node2)"
    wait_for 30 "$ip4 only via node1 and node2" eval '[[ $(hops $ip4) == "$two" ]]'
    wait_for 30 "$ip6 only via two nodes" eval '(( $(hop_count $ip6) == 2 ))'
    wait_for 30 "the client's own address through $ip4" \
        eval '[[ $(client_of "$(get_from $OUTSIDE_NS $ip4 80)") == 198.19.20.100:* ]]'
    kubectl delete pod b2 --grace-period=0 >/dev/null
    wait_for 30 "$ip4 only via node1 once b2 is gone" eval '[[ $(hops $ip4) == "$(node_ip node1)" ]]'
    wait_for 30 "$ip6 via one node" eval '(( $(hop_count $ip6) == 1 ))'
    [[ $(pod_of "$(get_from "$OUTSIDE_NS" "$ip4" 80)") == b1 ]] || { fail "b1 does not answer through $ip4"; return 1; }
    log "Local policy: $ip4 via $(hops "$ip4")"

    kubectl delete svc bgp-web >/dev/null
    wait_for 30 "$ip4 withdrawn" eval '[[ -z $(hops $ip4) ]]'
    wait_for 30 "$ip6 withdrawn" eval '[[ -z $(hops $ip6) ]]'
    log "deleted: both routes withdrawn"
    kubectl delete pod b1 --grace-period=0 >/dev/null
    kubectl delete -f "$examples/bgpadvertisement.yaml" -f "$examples/bgppeer.yaml" \
        -f "$examples/ippool-bgp.yaml" >/dev/null
}
