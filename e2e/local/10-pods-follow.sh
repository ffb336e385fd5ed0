# Add and delete pods and flip readiness: the answers through a node port follow.
NEEDS=""

journey() {
    mk_pod b1 follow node1
    mk_pod b2 follow node2
    mk_lb_service follow follow
    wait_for 30 "a node port" has_node_port follow
    local port ip1
    port=$(node_port follow)
    ip1=$(node_ip node1)
    wait_for 30 "b1 and b2 ready" eval '[[ $(ready_pods follow) == "b1 b2 " ]]'
    wait_for 30 "answers from b1 and b2" eval '[[ $(pods_answering $CLIENT_NS $ip1 $port 12) == "b1 b2 " ]]'
    log "b1 and b2 answer through $ip1:$port"

    mk_pod b3 follow
    wait_for 30 "b3 answering" eval '[[ $(pods_answering $CLIENT_NS $ip1 $port 12) == *b3* ]]'
    log "b3 joined"

    kubectl annotate pod b1 lab.berth.dev/ready=false --overwrite >/dev/null
    wait_for 30 "b1 not ready" eval '[[ $(kubectl get pod b1 -o "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}") == False ]]'
    wait_for 30 "b1 out of the endpoints" eval '[[ $(ready_pods follow) == "b2 b3 " ]]'
    wait_for 30 "b1 no longer answering" eval '[[ $(pods_answering $CLIENT_NS $ip1 $port 12) != *b1* ]]'
    log "b1 flipped to not ready: it stops answering"
    kubectl annotate pod b1 lab.berth.dev/ready- >/dev/null
    wait_for 30 "b1 answering again" eval '[[ $(pods_answering $CLIENT_NS $ip1 $port 16) == *b1* ]]'
    log "b1 ready again"

    GRACE=3 mk_pod b4 follow
    wait_for 30 "b4 ready" eval '[[ $(ready_pods follow) == *b4* ]]'
    kubectl delete pod b4 --wait=false >/dev/null
    wait_for 10 "b4 terminating in the slice" eval '[[ $(kubectl get endpointslices -l kubernetes.io/service-name=follow -o "jsonpath={.items[*].endpoints[?(@.targetRef.name==\"b4\")].conditions.terminating}") == true ]]'
    log "b4 deleted: terminating endpoint visible during its grace period"
    wait_for 30 "b4 gone" eval '! kubectl get pod b4'
    kubectl delete pod b2 >/dev/null
    wait_for 30 "b2 gone from the answers" eval '[[ $(pods_answering $CLIENT_NS $ip1 $port 12) == "b1 b3 " ]]'
    log "b2 deleted: b1 and b3 answer"
    kubectl delete svc follow >/dev/null
    kubectl delete pod b1 b3 --grace-period=0 >/dev/null
}
