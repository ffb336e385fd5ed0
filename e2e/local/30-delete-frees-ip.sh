# Deleting a Service frees its LoadBalancer IP at once: another Service asking for it gets it.
NEEDS=""

journey() {
    mk_lb_service gone nothing
    wait_for 30 "an LB IP" has_lb_ip gone
    local ip
    ip=$(lb_ip gone)
    log "gone has $ip"
    kubectl delete svc gone >/dev/null
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata:
  name: taker
  annotations:
    berth.dev/load-balancer-ips: "$ip"
spec:
  type: LoadBalancer
  loadBalancerClass: berth.dev/l2
  selector:
    app: nothing
  ports:
  - port: 80
    targetPort: 8080
YAML
    wait_for 30 "taker to get $ip" eval '[[ $(lb_ip taker) == $ip ]]'
    log "taker got $ip"
    kubectl delete svc taker >/dev/null
}
