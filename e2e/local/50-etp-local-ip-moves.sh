# externalTrafficPolicy Local: the IP is announced from a node with an endpoint, and the pod
# sees the client's own address through it.
NEEDS="announcer"

journey() {
    mk_pod d1 moves node3
    mk_lb_service moves moves Local
    wait_for 30 "an LB IP" has_lb_ip moves
    wait_for 30 "announced from node3" eval '[[ $(announcer moves) == node3 ]]'
    local ip
    ip=$(lb_ip moves)
    wait_for 30 "the client address preserved through $ip" eval '[[ $(client_of "$(get_from $CLIENT_NS $ip 80)") == 198.18.0.100:* ]]'
    kubectl delete pod d1 --grace-period=0 >/dev/null
    mk_pod d2 moves node1
    wait_for 30 "announced from node1" eval '[[ $(announcer moves) == node1 ]]'
    wait_for 30 "d2 answering through $ip" eval '[[ $(pod_of "$(get_from $CLIENT_NS $ip 80)") == d2 ]]'
    log "the IP moved to node1 with the endpoint"
    kubectl delete svc moves >/dev/null
    kubectl delete pod d2 --grace-period=0 >/dev/null
}
