#!/usr/bin/env bash
# berth on a real cluster: kind without kube-proxy, the image built from this checkout, the chart
# installed with its default (l2) values, then the lab's user journey: a LoadBalancer Service gets
# an address from the pool, a node announces it, and a client on the kind network reaches the pods
# through it; a ClusterIP answers from inside the cluster.
#
#   e2e/kind/run.sh            (needs docker, kind, kubectl and helm; `make e2e-kind`)
#   KEEP=1 e2e/kind/run.sh     leaves the cluster for inspection
#
# Not part of `make test`: it needs a container runtime.
set -euo pipefail

cd "$(dirname "$0")/../.."
CLUSTER=${CLUSTER:-berth-e2e}
IMAGE=ghcr.io/berth-dev/berth:e2e
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is required" >&2; exit 1; }
done

cleanup() { [[ -n "${KEEP:-}" ]] || kind delete cluster --name "$CLUSTER"; }
trap cleanup EXIT

docker build -t "$IMAGE" .
kind create cluster --name "$CLUSTER" --config e2e/kind/cluster.yaml --wait 5m
kind load docker-image --name "$CLUSTER" "$IMAGE"

# The API server's address on the kind network (no kube-proxy: nothing else programs the
# `kubernetes` Service), and a pool at the top of that network, away from the nodes.
API_HOST=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$CLUSTER-control-plane")
SUBNET=$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' | tr ' ' '\n' | grep -m1 '\.')
PREFIX=${SUBNET%.*.*}
POOL="$PREFIX.255.200-$PREFIX.255.250"

helm install berth charts/berth --namespace berth-system --create-namespace --wait --timeout 5m \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --set apiServer.host="$API_HOST" --set apiServer.port=6443 \
  --set agent.config.clusterCidr=10.244.0.0/16 \
  --set ipPool.create=true --set "ipPool.addresses={$POOL}" \
  --set l2Advertisement.create=true

kubectl apply -f e2e/kind/echo.yaml
kubectl rollout status deployment/echo --timeout=3m

echo "e2e-kind: waiting for a LoadBalancer address"
for _ in $(seq 60); do
  IP=$(kubectl get service echo -o jsonpath='{.status.loadBalancer.ingress[0].ip}')
  [[ -n "$IP" ]] && break
  sleep 2
done
[[ -n "${IP:-}" ]] || { echo "e2e-kind: no address assigned" >&2; exit 1; }
echo "e2e-kind: echo got $IP"

# From a container on the kind network, as a client on the LAN: ARP, then the node's rules.
docker run --rm --network kind curlimages/curl:8.11.1 -sf --retry 10 --retry-all-errors \
  --retry-delay 2 "http://$IP/hostname"
echo
# A ClusterIP from inside the cluster.
kubectl run e2e-client --rm -i --restart=Never --image=curlimages/curl:8.11.1 -- \
  -sf --retry 10 --retry-all-errors "http://echo.default.svc/hostname"
echo
echo "e2e-kind: passed"
