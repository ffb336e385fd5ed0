# Helpers for the lab journeys: sourced by run.sh. Every journey talks to the lab only through
# kubectl (KUBECONFIG is the lab's) and sends traffic only from the lab's namespaces.

# The lab's names, set by run.sh: LAB (its name), CLIENT_NS, NODE_NS_PREFIX.

log() { printf '    %s\n' "$*"; }

fail() {
    printf '    FAIL: %s\n' "$*" >&2
    return 1
}

# wait_for SECONDS DESCRIPTION COMMAND...: runs COMMAND every 0.3 s until it succeeds.
wait_for() {
    local limit=$1 what=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            fail "timed out after ${limit}s waiting for $what"
            return 1
        fi
        sleep 0.3
    done
}

# url IP PORT: the URL of / there; an IPv6 address goes in brackets.
url() {
    if [[ $1 == *:* ]]; then echo "http://[$1]:$2/"; else echo "http://$1:$2/"; fi
}

# get_from NETNS IP PORT: one HTTP request from inside the namespace; prints the echo line.
get_from() {
    ip netns exec "$1" curl -s --max-time 2 "$(url "$2" "$3")"
}

# pod_of LINE: the pod named in an echo answer.
pod_of() { sed -n 's/.*"pod":"\([^"]*\)".*/\1/p' <<<"$1"; }
# client_of LINE: the client address the pod saw.
client_of() { sed -n 's/.*"client":"\([^"]*\)".*/\1/p' <<<"$1"; }

# pods_answering NETNS IP PORT N: the sorted set of pods among N answers.
pods_answering() {
    local i line
    for ((i = 0; i < $4; i++)); do
        line=$(get_from "$1" "$2" "$3") || continue
        pod_of "$line"
    done | sort -u | tr '\n' ' '
}

svc_field() { kubectl get svc "$1" -o "jsonpath=$2"; }

node_port() { svc_field "$1" '{.spec.ports[0].nodePort}'; }
lb_ip() { svc_field "$1" '{.status.loadBalancer.ingress[0].ip}'; }
# lb_ips SVC: every LoadBalancer address, space separated.
lb_ips() { svc_field "$1" '{.status.loadBalancer.ingress[*].ip}'; }
# announcer SVC: the nodes whose agents record that they announce the Service's addresses (one,
# unless an address is changing hands).
announcer() {
    kubectl get servicel2statuses -A -l "berth.dev/service-name=$1,berth.dev/service-namespace=default" \
        -o 'jsonpath={.items[*].spec.node}'
}

has_lb_ip() { [[ -n $(lb_ip "$1") ]]; }
has_node_port() { [[ -n $(node_port "$1") ]]; }

# ready_pods SVC: the pods in the Service's EndpointSlices with ready=true, sorted.
ready_pods() {
    kubectl get endpointslices -l "kubernetes.io/service-name=$1" \
        -o 'jsonpath={range .items[*].endpoints[?(@.conditions.ready==true)]}{.targetRef.name}{"\n"}{end}' |
        sort | tr '\n' ' '
}

# mk_pod NAME APP [NODE]: an echo pod labelled app=APP, on NODE when given.
mk_pod() {
    local node_line=""
    [[ -n ${3:-} ]] && node_line="  nodeName: $3"
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels:
    app: $2
spec:
$node_line
  terminationGracePeriodSeconds: ${GRACE:-2}
  containers:
  - name: echo
    image: berth.dev/lab-echo
    ports:
    - name: http
      containerPort: 8080
    readinessProbe:
      httpGet:
        path: /healthz
        port: http
YAML
}

# mk_lb_service NAME APP [POLICY]: a LoadBalancer Service of berth's L2 class in front of app=APP.
mk_lb_service() {
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata:
  name: $1
spec:
  type: LoadBalancer
  loadBalancerClass: berth.dev/l2
  externalTrafficPolicy: ${3:-Cluster}
  selector:
    app: $2
  ports:
  - name: http
    port: 80
    targetPort: 8080
YAML
}

# node_ips NODE: the node's LAN addresses (its InternalIPs, primary family first).
node_ips() {
    kubectl get node "$1" -o 'jsonpath={.status.addresses[?(@.type=="InternalIP")].address}'
}

# node_ip NODE: the node's LAN address of the cluster's primary family.
node_ip() {
    local ips
    read -ra ips <<<"$(node_ips "$1")"
    echo "${ips[0]}"
}

# arp_answers NETNS IP: whether anyone on the LAN answers ARP for IP (a neighbour entry that
# reaches REACHABLE/STALE/DELAY after a probe).
arp_answers() {
    ip -n "$1" neigh del "$2" dev eth0 2>/dev/null || true
    ip netns exec "$1" curl -s --max-time 1 "http://$2:80/" >/dev/null 2>&1 || true
    ip -n "$1" neigh show "$2" dev eth0 | grep -Eq 'REACHABLE|STALE|DELAY'
}
