# Create a LoadBalancer Service and reach it from the client through its IP (ARP and iptables).
NEEDS="announcer"

journey() {
    mk_pod a1 lb
    mk_pod a2 lb
    mk_lb_service lb lb
    wait_for 30 "an LB IP" has_lb_ip lb
    wait_for 30 "a1 and a2 ready" eval '[[ $(ready_pods lb) == "a1 a2 " ]]'
    local ip
    ip=$(lb_ip lb)
    wait_for 30 "an announcing node" eval '[[ -n $(announcer lb) ]]'
    wait_for 30 "an answer through $ip" get_from "$CLIENT_NS" "$ip" 80
    log "$ip (announced by $(announcer lb)): $(get_from "$CLIENT_NS" "$ip" 80)"
}
