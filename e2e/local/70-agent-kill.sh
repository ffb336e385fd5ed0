# Kill the announcing node's agent: another node takes the IP over and traffic resumes. Runs
# last: the lab keeps that node without an agent.
NEEDS="announcer"

journey() {
    mk_pod f1 failover node1
    mk_pod f2 failover node2
    mk_pod f3 failover node3
    mk_lb_service failover failover
    wait_for 30 "an LB IP" has_lb_ip failover
    wait_for 30 "an announcing node" eval '[[ -n $(announcer failover) ]]'
    local ip owner pid
    ip=$(lb_ip failover)
    owner=$(announcer failover)
    wait_for 30 "answers through $ip" get_from "$CLIENT_NS" "$ip" 80
    pid=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(next(p["pid"] for p in s["components"] if p["name"]==sys.argv[2]))' "$STATE_DIR/lab.json" "agent-$owner")
    kill -9 "$pid"
    log "killed the agent of $owner (pid $pid)"
    wait_for 30 "another node announcing" eval '[[ -n $(announcer failover) && $(announcer failover) != $owner ]]'
    wait_for 30 "answers through $ip again" get_from "$CLIENT_NS" "$ip" 80
    log "$(announcer failover) took over; traffic resumed"
}
