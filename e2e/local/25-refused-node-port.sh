# A node port the allocation refuses is never programmed (docs/upstream-parity.md): the lab API
# server stores nodePort 40123 (outside 30000-32767) as written, the controller answers with a
# Warning, and the agents keep the port they last programmed. On update the old port keeps
# answering and 40123 does not; on create 40124 never answers.
NEEDS=""

# mk_node_port_service NAME APP [NODE_PORT]
mk_node_port_service() {
    local node_port_line=""
    [[ -n ${3:-} ]] && node_port_line="    nodePort: $3"
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata:
  name: $1
spec:
  type: NodePort
  selector:
    app: $2
  ports:
  - name: http
    port: 80
    targetPort: 8080
$node_port_line
YAML
}

warned_about() { kubectl get events -o 'jsonpath={.items[*].message}' | grep -q "$1: provided port is not in the valid range"; }

# never_answers NETNS IP PORT: no answer over about three seconds (ten tries).
never_answers() {
    local i
    for ((i = 0; i < 10; i++)); do
        if get_from "$1" "$2" "$3" >/dev/null; then
            fail "$2:$3 answered"
            return 1
        fi
        sleep 0.3
    done
}

journey() {
    mk_pod np1 refused node1
    mk_node_port_service refused refused
    wait_for 30 "a node port" has_node_port refused
    local port ip
    port=$(node_port refused)
    ip=$(node_ip node2)
    wait_for 30 "the node port answering" get_from "$CLIENT_NS" "$ip" "$port"

    kubectl patch svc refused --type=json \
        -p '[{"op":"replace","path":"/spec/ports/0/nodePort","value":40123}]' >/dev/null
    wait_for 30 "the controller's Warning" warned_about 40123
    never_answers "$CLIENT_NS" "$ip" 40123
    get_from "$CLIENT_NS" "$ip" "$port" >/dev/null || fail "the old node port $port stopped answering"
    log "update to 40123: refused, $port keeps answering"

    mk_node_port_service refused-new refused 40124
    wait_for 30 "the controller's Warning" warned_about 40124
    never_answers "$CLIENT_NS" "$ip" 40124
    log "create with 40124: never programmed"
    kubectl delete svc refused refused-new >/dev/null
    kubectl delete pod np1 --grace-period=0 >/dev/null
}
