# Deleting a Service: nobody answers ARP for its IP any more.
NEEDS="announcer"

journey() {
    mk_pod e1 arp
    mk_lb_service arp arp
    wait_for 30 "an LB IP" has_lb_ip arp
    local ip
    ip=$(lb_ip arp)
    wait_for 30 "ARP answers for $ip" arp_answers "$CLIENT_NS" "$ip"
    kubectl delete svc arp >/dev/null
    wait_for 30 "ARP answers for $ip to stop" eval '! arp_answers $CLIENT_NS $ip'
    log "no ARP answer for $ip after the delete"
    kubectl delete pod e1 --grace-period=0 >/dev/null
}
