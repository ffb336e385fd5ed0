# trafficDistribution (docs/upstream-parity.md): with zone-labelled nodes, the endpoints controller
# hints every endpoint for its node's zone, and each node's agent sends ClusterIP traffic only to
# its zone's endpoints, falling back to every endpoint when its zone has none.
NEEDS=""

# hinted_zones SVC: the zones the Service's slices hint, sorted.
hinted_zones() {
    kubectl get endpointslices -l "kubernetes.io/service-name=$1" \
        -o 'jsonpath={range .items[*].endpoints[*]}{.hints.forZones[0].name}{"\n"}{end}' |
        sort -u | tr '\n' ' '
}

node_ns() {
    local ns="berth-$LAB-$1"
    ip netns list | awk '{print $1}' | grep -qx "$ns" || { fail "no namespace $ns"; return 1; }
    echo "$ns"
}

journey() {
    kubectl label node node1 topology.kubernetes.io/zone=zone-a --overwrite >/dev/null
    kubectl label node node2 topology.kubernetes.io/zone=zone-b --overwrite >/dev/null
    kubectl label node node3 topology.kubernetes.io/zone=zone-b --overwrite >/dev/null
    mk_pod za zonal node1
    mk_pod zb zonal node2
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata:
  name: zonal
spec:
  trafficDistribution: PreferSameZone
  selector:
    app: zonal
  ports:
  - name: http
    port: 80
    targetPort: 8080
YAML
    wait_for 30 "za and zb ready" eval '[[ $(ready_pods zonal) == "za zb " ]]'
    wait_for 30 "zone hints" eval '[[ $(hinted_zones zonal) == "zone-a zone-b " ]]'
    local ip ns1 ns3 seen
    ip=$(svc_field zonal '{.spec.clusterIP}')
    ns1=$(node_ns node1)
    ns3=$(node_ns node3)
    wait_for 30 "node1 reaching za" get_from "$ns1" "$ip" 80
    seen=$(pods_answering "$ns1" "$ip" 80 16)
    [[ $seen == "za " ]] || fail "node1 (zone-a) reached: $seen"
    seen=$(pods_answering "$ns3" "$ip" 80 16)
    [[ $seen == "zb " ]] || fail "node3 (zone-b) reached: $seen"
    log "zone-a's node reaches za only, zone-b's node (without an endpoint of its own) zb only"

    # node3 moves to a zone without endpoints: every endpoint again.
    kubectl label node node3 topology.kubernetes.io/zone=zone-c --overwrite >/dev/null
    wait_for 30 "node3 reaching both" eval '[[ $(pods_answering '"$ns3 $ip"' 80 16) == "za zb " ]]'
    log "zone-c's node, with no endpoint hinted for it, reaches both"

    kubectl delete svc zonal >/dev/null
    kubectl delete pod za zb --grace-period=0 >/dev/null
    for node in node1 node2 node3; do
        kubectl label node "$node" topology.kubernetes.io/zone- >/dev/null
    done
}
