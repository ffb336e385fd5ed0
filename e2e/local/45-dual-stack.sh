# A dual-stack LoadBalancer Service, IPv6 first: both families of ClusterIP, node port and
# LoadBalancer address answer; the client finds the IPv4 address by ARP and the IPv6 one by NDP,
# and the endpoints controller writes one EndpointSlice per family.
NEEDS="announcer"

has_two_lb_ips() { local ips; read -ra ips <<<"$(lb_ips "$1")"; ((${#ips[@]} == 2)); }

# ready_by_family SVC FAMILY: the ready pods in the Service's slices of that addressType.
ready_by_family() {
    kubectl get endpointslices -l "kubernetes.io/service-name=$1" \
        -o "jsonpath={range .items[?(@.addressType==\"$2\")].endpoints[?(@.conditions.ready==true)]}{.targetRef.name}{\"\\n\"}{end}" |
        sort | tr '\n' ' '
}

# ndp_answers NETNS IP6: whether a neighbour entry for IP6 was learnt on the client's LAN
# interface (after a request), as an NDP answer makes one.
ndp_answers() {
    ip -n "$1" -6 neigh show "$2" dev eth0 | grep -Eq 'lladdr .*(REACHABLE|STALE|DELAY)'
}

journey() {
    mk_pod d1 dual
    mk_pod d2 dual
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata:
  name: dual
spec:
  type: LoadBalancer
  loadBalancerClass: berth.dev/l2
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  selector:
    app: dual
  ports:
  - name: http
    port: 80
    targetPort: 8080
YAML
    wait_for 30 "both LB addresses" has_two_lb_ips dual
    [[ $(svc_field dual '{.spec.ipFamilies[*]}') == "IPv6 IPv4" ]] ||
        { fail "ipFamilies: $(svc_field dual '{.spec.ipFamilies[*]}')"; return 1; }
    local cluster_ips lbs node_ports
    read -ra cluster_ips <<<"$(svc_field dual '{.spec.clusterIPs[*]}')"
    read -ra lbs <<<"$(lb_ips dual)"
    ((${#cluster_ips[@]} == 2)) || { fail "clusterIPs: ${cluster_ips[*]}"; return 1; }
    [[ ${cluster_ips[0]} == *:* && ${cluster_ips[1]} != *:* ]] ||
        { fail "clusterIPs not IPv6 first: ${cluster_ips[*]}"; return 1; }
    wait_for 30 "d1 and d2 ready in the IPv4 slice" eval '[[ $(ready_by_family dual IPv4) == "d1 d2 " ]]'
    wait_for 30 "d1 and d2 ready in the IPv6 slice" eval '[[ $(ready_by_family dual IPv6) == "d1 d2 " ]]'
    wait_for 30 "an announcing node" eval '[[ -n $(announcer dual) ]]'
    local ip answer
    for ip in "${lbs[@]}"; do
        wait_for 30 "an answer through $ip" get_from "$CLIENT_NS" "$ip" 80
        answer=$(get_from "$CLIENT_NS" "$ip" 80)
        log "LoadBalancer $ip: $answer"
        if [[ $ip == *:* ]]; then
            ndp_answers "$CLIENT_NS" "$ip" || { fail "no NDP answer for $ip"; return 1; }
        else
            ip -n "$CLIENT_NS" neigh show "$ip" dev eth0 | grep -q lladdr || { fail "no ARP answer for $ip"; return 1; }
        fi
    done
    local port node
    port=$(node_port dual)
    for node in $(node_ips node1); do
        wait_for 30 "node port $node:$port" get_from "$CLIENT_NS" "$node" "$port"
        log "NodePort $node:$port: $(get_from "$CLIENT_NS" "$node" "$port")"
    done
    [[ $(node_ips node1) == *:* ]] || { fail "node1 has no IPv6 InternalIP: $(node_ips node1)"; return 1; }
    for ip in "${cluster_ips[@]}"; do
        wait_for 30 "ClusterIP $ip from node1" get_from "berth-$LAB-node1" "$ip" 80
        log "ClusterIP $ip from node1: $(get_from "berth-$LAB-node1" "$ip" 80)"
    done
}
