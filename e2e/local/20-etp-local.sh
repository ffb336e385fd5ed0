# externalTrafficPolicy Local: the pod sees the client's own address; a node without a local
# endpoint drops the traffic instead of forwarding it.
NEEDS=""

journey() {
    mk_pod c1 local node2
    mk_lb_service local local
    wait_for 30 "a node port" has_node_port local
    wait_for 30 "c1 ready" eval '[[ $(ready_pods local) == "c1 " ]]'
    local port ip1 ip2 line
    port=$(node_port local)
    ip1=$(node_ip node1)
    ip2=$(node_ip node2)
    wait_for 30 "c1 answering on node2" get_from "$CLIENT_NS" "$ip2" "$port"
    line=$(get_from "$CLIENT_NS" "$ip2" "$port")
    log "Cluster policy: c1 saw $(client_of "$line")"

    kubectl patch svc local -p '{"spec":{"externalTrafficPolicy":"Local"}}' >/dev/null
    wait_for 30 "the client address preserved" eval '[[ $(client_of "$(get_from $CLIENT_NS $ip2 $port)") == 198.18.0.100:* ]]'
    log "Local policy: c1 sees the client itself ($(client_of "$(get_from "$CLIENT_NS" "$ip2" "$port")"))"
    wait_for 30 "node1 dropping" eval '! get_from $CLIENT_NS $ip1 $port'
    log "node1 has no local endpoint: no answer there"
    kubectl delete svc local >/dev/null
    kubectl delete pod c1 --grace-period=0 >/dev/null
}
