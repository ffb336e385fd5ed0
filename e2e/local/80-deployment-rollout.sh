# The tutorial path: `kubectl create deployment` (and `kubectl scale`), `kubectl expose --type
# LoadBalancer`, curl from the client, then a rolling update (`kubectl rollout restart`) while a
# client loop sends requests through the LoadBalancer IP and counts the failed ones, once per
# externalTrafficPolicy. The counts are printed (`disruption: ...`) and are what
# docs/deployments.md reports; the journey fails when the Deployment does not roll out, when the
# address stops answering for good, or when more than MAX_FAILED_PERCENT of the requests fail.
NEEDS="announcer"

# Requests sent during one rollout at most, one every 50 ms.
ROLLOUT_REQUESTS_MAX=${ROLLOUT_REQUESTS_MAX:-1200}
MAX_FAILED_PERCENT=${MAX_FAILED_PERCENT:-5}

# client_loop IP STOPFILE OUTFILE: one request every 50 ms until STOPFILE exists (bounded by
# ROLLOUT_REQUESTS_MAX); writes "sent failed" to OUTFILE.
client_loop() {
    local sent=0 failed=0
    while [[ ! -e $2 ]] && ((sent < ROLLOUT_REQUESTS_MAX)); do
        sent=$((sent + 1))
        ip netns exec "$CLIENT_NS" curl -s -o /dev/null --max-time 1 "http://$1:80/" || failed=$((failed + 1))
        sleep 0.05
    done
    echo "$sent $failed" >"$3"
}

# rollout_under_load POLICY IP: restarts the Deployment while the client loop runs.
rollout_under_load() {
    local policy=$1 ip=$2 stop out sent failed
    stop=$(mktemp -u /tmp/berth-e2e-stop.XXXXXX)
    out=$(mktemp /tmp/berth-e2e-loop.XXXXXX)
    client_loop "$ip" "$stop" "$out" &
    local loop=$!
    sleep 1
    kubectl rollout restart deployment/web >/dev/null
    kubectl rollout status deployment/web --timeout=90s >/dev/null || {
        touch "$stop"
        wait "$loop"
        rm -f "$stop" "$out"
        fail "the rollout did not complete"
        return 1
    }
    # Old pods keep serving while they terminate; keep counting until they are gone.
    wait_for 60 "old pods gone" eval '[[ $(kubectl get pods -l app=web --no-headers | wc -l) -eq 3 ]]'
    sleep 1
    touch "$stop"
    wait "$loop"
    read -r sent failed <"$out"
    rm -f "$stop" "$out"
    echo "    disruption: externalTrafficPolicy=$policy: $failed of $sent requests failed during a rollout of 3 replicas"
    ((sent > 0)) || { fail "no request was sent"; return 1; }
    ((failed * 100 <= sent * MAX_FAILED_PERCENT)) || { fail "$failed of $sent requests failed"; return 1; }
}

journey() {
    # Created without replicas, so that every pod has the short grace period: pods made before
    # the patch would keep the default 30 s, and the first rollout's loop would wait for them.
    kubectl create deployment web --image=berth.dev/lab-echo --replicas=0 --port=8080 >/dev/null
    # A short grace period keeps the journey short; old pods still serve while they terminate.
    kubectl patch deployment web --type=strategic \
        -p '{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":3}}}}' >/dev/null
    kubectl scale deployment/web --replicas=3 >/dev/null
    kubectl rollout status deployment/web --timeout=60s >/dev/null
    log "$(kubectl get deployment web --no-headers | awk '{print "deployment web: " $2 " ready, " $3 " up to date"}')"
    kubectl expose deployment web --type LoadBalancer --port 80 --target-port 8080 >/dev/null
    wait_for 30 "an LB IP" has_lb_ip web
    local ip
    ip=$(lb_ip web)
    wait_for 30 "web answering through $ip" get_from "$CLIENT_NS" "$ip" 80
    log "$ip answered: pod $(pod_of "$(get_from "$CLIENT_NS" "$ip" 80)")"
    rollout_under_load Cluster "$ip"
    kubectl patch svc web -p '{"spec":{"externalTrafficPolicy":"Local"}}' >/dev/null
    wait_for 30 "the client address preserved" eval '[[ $(client_of "$(get_from $CLIENT_NS $ip 80)") == 198.18.0.100:* ]]'
    rollout_under_load Local "$ip"
    # Created, the grace-period patch, two restarts: four revisions.
    [[ $(kubectl get rs -l app=web --no-headers | wc -l) -eq 4 ]] || { fail "expected four ReplicaSets"; return 1; }
    kubectl delete svc web >/dev/null
    kubectl delete deployment web >/dev/null
    wait_for 60 "pods collected" eval '[[ -z $(kubectl get pods -l app=web -o name) ]]'
}
