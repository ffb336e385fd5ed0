#!/usr/bin/env bash
# `make image`: builds the berth image on a machine that reaches Debian's archive but no
# container registry, then runs it. Root, Debian or Ubuntu.
#
#   1. the runtime root filesystem: Debian trixie with the tools the agent runs (iptables,
#      nftables, conntrack), FRR for the BGP speaker (frr, frr-pythontools; its users with the
#      fixed ids 950/951 the chart's agent.frr.vtyGroup relies on) and CA certificates, made by
#      mmdebstrap from Debian's archive — what the Dockerfile's runtime stage installs into
#      debian:trixie-slim;
#   2. the release binary, built on this machine and stripped of its debug sections;
#   3. podman build of a FROM scratch Containerfile (the rootfs, the binary, user 65532), never
#      pulling anything;
#   4. runs, every container with --network none, so anything they program lives in their own
#      namespace and goes away with it: `berth --help`; the lab API server; `berth controller`
#      as user 65532 with a read-only root filesystem; `berth agent` as the chart runs it (root,
#      only NET_ADMIN and NET_RAW, read-only root, a tmpfs at /run for the xtables lock) with the
#      default backend, `auto`, whose probe must choose nftables; then a Service created through
#      the API must get a ClusterIP from the controller and appear in the agent's nftables table.
#
# Podman on such a machine may need settings the host does not give it: runc (crun refuses a
# cgroup v1/v2 hybrid), and nofile/nproc limits no higher than the hard limits root may set. They
# go into a containers.conf of our own (CONTAINERS_CONF); the host's /etc/containers is untouched.
#
# Environment: BERTH_IMAGE (tag, default localhost/berth:dev), BERTH_IMAGE_DIR (work directory,
# default target/image), BERTH_APT_MIRROR (default http://deb.debian.org/debian), CARGO,
# CARGO_TARGET_DIR. The rootfs tar is kept in the work directory and reused; delete it to rebuild.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
tag=${BERTH_IMAGE:-localhost/berth:dev}
out=${BERTH_IMAGE_DIR:-target/image}
mirror=${BERTH_APT_MIRROR:-http://deb.debian.org/debian}
suite=trixie
cargo=${CARGO:-cargo}
target_dir=${CARGO_TARGET_DIR:-target}
# The runtime packages: the same list as the Dockerfile's runtime stage.
packages=iptables,nftables,conntrack,ca-certificates,frr,frr-pythontools
# FRR's users, made before the package's postinst (which keeps existing ones), as the
# Dockerfile's groupadd/useradd do; the passwd package's postinst adds their shadow entries.
frr_users='printf "frr:x:950:\nfrrvty:x:951:frr\n" >>"$1/etc/group"; printf "frr:x:950:950:Frr routing suite:/nonexistent:/usr/sbin/nologin\n" >>"$1/etc/passwd"'
run_id="berth-image-$$"

say() { printf 'image: %s\n' "$*"; }
fail() { printf 'image: FAILED: %s\n' "$*" >&2; exit 1; }
seconds() { local start=$1; echo $(( $(date +%s) - start )); }

[[ $(id -u) -eq 0 ]] || fail "needs root (mmdebstrap and podman run as root here)"

missing=()
for tool in mmdebstrap:mmdebstrap podman:podman runc:runc objcopy:binutils kubectl:kubernetes-client; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)

# 1. The root filesystem. Reproducible for a given archive state (SOURCE_DATE_EPOCH).
# The cached tar is named after what goes into it, so a changed package list or user hook
# never reuses a root filesystem made from the old one.
rootfs=$out/rootfs-$suite-$(printf '%s\n%s\n%s\n' "$packages" "$frr_users" "$mirror" | sha256sum | cut -c1-12).tar
if [[ ! -s $rootfs ]]; then
    start=$(date +%s)
    say "root filesystem: Debian $suite with $packages from $mirror"
    SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1747699200} mmdebstrap --quiet --mode=root --variant=apt --format=tar \
        --include="$packages" --essential-hook="$frr_users" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
        "$suite" "$out/partial-rootfs.tar" \
        "deb $mirror $suite main" "deb $mirror $suite-updates main" \
        "deb ${mirror%/debian}/debian-security $suite-security main"
    mv "$out/partial-rootfs.tar" "$rootfs"
    say "root filesystem: $(du -m "$rootfs" | cut -f1) MB in $(seconds "$start") s"
fi

# 2. The binary. Line tables make the release binary ~5x larger; the image carries symbols
#    (function names in backtraces) but no debug sections.
start=$(date +%s)
"$cargo" build --release --locked --bin berth
say "cargo build --release: $(seconds "$start") s"
context=$out/context
rm -rf "$context" && mkdir -p "$context"
ln "$rootfs" "$context/rootfs.tar" 2>/dev/null || cp "$rootfs" "$context/rootfs.tar"
objcopy --strip-debug "$target_dir/release/berth" "$context/berth"
chmod 0755 "$context/berth"
say "binary: $(du -m "$target_dir/release/berth" | cut -f1) MB, $(du -m "$context/berth" | cut -f1) MB stripped"
cat >"$context/Containerfile" <<'EOF'
FROM scratch
ADD rootfs.tar /
COPY berth /usr/local/bin/berth
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/berth"]
CMD ["--help"]
EOF

# 3. podman's settings for this machine, then the image.
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max)
[[ $nproc == unlimited || $nproc -gt $pid_max ]] && nproc=$pid_max
[[ $nofile == unlimited ]] && nofile=1048576
export CONTAINERS_CONF=$out/containers.conf
cat >"$CONTAINERS_CONF" <<EOF
# Written by scripts/image.sh for this machine; see the comment at its top.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
events_logger = "file"
EOF
start=$(date +%s)
podman build --quiet --pull=never --network=none -t "$tag" "$context" >/dev/null
say "podman build: $(seconds "$start") s, $tag is $(podman image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%.0f", $1 / 1e6 }') MB"
if [[ -n ${BERTH_IMAGE_ARCHIVE:-} ]]; then
    podman save --quiet --format docker-archive -o "$BERTH_IMAGE_ARCHIVE" "$tag"
    say "saved $BERTH_IMAGE_ARCHIVE (kind load image-archive takes it)"
fi

# 4. Run it.
cleanup() {
    # The API server's container goes last: the others live in its network namespace.
    local name
    for name in frr agent controller api; do
        podman rm -f "$run_id-$name" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT

help=$(podman run --rm --network none --read-only "$tag")
grep -q '^Usage: berth' <<<"$help" || fail "berth --help printed: $help"
say "ran: berth --help ($(podman run --rm --network none --read-only "$tag" version))"

# The lab API server holds the cluster; the others join its network namespace (loopback only).
state=$out/run
rm -rf "$state" && mkdir -p "$state" && chmod 0777 "$state"
podman run -d --name "$run_id-api" --network none --read-only -v "$state:/state" "$tag" \
    lab apiserver --listen 127.0.0.1:6443 --kubeconfig /state/kubeconfig >/dev/null
for _ in $(seq 100); do [[ -s $state/kubeconfig ]] && break; sleep 0.1; done
[[ -s $state/kubeconfig ]] || fail "the lab API server wrote no kubeconfig: $(podman logs "$run_id-api" 2>&1 | tail -5)"
api_pid=$(podman inspect --format '{{.State.Pid}}' "$run_id-api")
in_netns() { nsenter --net="/proc/$api_pid/ns/net" "$@"; }
kube() { in_netns kubectl --kubeconfig "$state/kubeconfig" "$@"; }

# The CRDs, as `helm install` applies them (the lab API server has no OpenAPI for kubectl to
# validate against).
podman run --rm --network none --read-only "$tag" crds >"$state/crds.yaml"
kube apply --validate=false -f "$state/crds.yaml" >/dev/null

podman run -d --name "$run_id-controller" --network "container:$run_id-api" --read-only \
    --cap-drop ALL --security-opt no-new-privileges -v "$state:/state:ro" "$tag" \
    controller --kubeconfig /state/kubeconfig --admin-listen 127.0.0.1:9090 >/dev/null
podman run -d --name "$run_id-agent" --network "container:$run_id-api" --read-only --tmpfs /run \
    --user 0 --cap-drop ALL --cap-add NET_ADMIN --cap-add NET_RAW --security-opt no-new-privileges \
    -v "$state:/state:ro" "$tag" \
    agent --node-name image-node --kubeconfig /state/kubeconfig --admin-listen 127.0.0.1:10356 >/dev/null

user=$(podman top "$run_id-controller" huser user | awk 'NR == 2 { print $1 "/" $2 }')
[[ $user == 65532/65532 ]] || fail "the controller runs as $user, not 65532"
say "ran: the controller as user 65532 with a read-only root filesystem and no capability"

kube create service clusterip web --tcp=80:8080 >/dev/null
cluster_ip=
for _ in $(seq 150); do
    cluster_ip=$(kube get service web -o 'jsonpath={.spec.clusterIP}' 2>/dev/null || true)
    [[ -n $cluster_ip ]] && break
    sleep 0.2
done
[[ -n $cluster_ip ]] || fail "the controller assigned no ClusterIP: $(podman logs "$run_id-controller" 2>&1 | tail -5)"
say "ran: the controller in the image assigned ClusterIP $cluster_ip"

probe=
for _ in $(seq 150); do
    probe=$(podman logs "$run_id-agent" 2>&1 | grep -m1 'backend auto' || true)
    [[ -n $probe ]] && break
    sleep 0.2
done
grep -q 'nft_usable=true' <<<"$probe" || fail "the agent's backend probe: ${probe:-no answer}: $(podman logs "$run_id-agent" 2>&1 | tail -5)"
podman logs "$run_id-agent" 2>&1 | grep -q 'datapath backend.*nftables' || fail "the agent did not choose nftables"
say "ran: the agent's backend probe in the image: $(sed -E 's/.*(nft_usable=[a-z]+ iptables_forward_drops=[a-z]+).*/\1/' <<<"$probe"), backend nftables"
programmed=
for _ in $(seq 150); do
    if podman exec "$run_id-agent" nft list table ip berth 2>/dev/null | grep -q "$cluster_ip"; then
        programmed=yes
        break
    fi
    sleep 0.2
done
[[ -n $programmed ]] || fail "the agent did not program $cluster_ip: $(podman logs "$run_id-agent" 2>&1 | tail -5)"
say "ran: the agent programmed $cluster_ip into its nftables table, as root with only NET_ADMIN and NET_RAW"

# The iptables backend's tools, as the agent would run them (nft and legacy variants).
podman exec "$run_id-agent" sh -ec '
    iptables -t nat -N BERTH-IMAGE-PROBE && iptables -t nat -X BERTH-IMAGE-PROBE
    ip6tables -t nat -N BERTH-IMAGE-PROBE && ip6tables -t nat -X BERTH-IMAGE-PROBE
    iptables-legacy -t nat -N BERTH-IMAGE-PROBE && iptables-legacy -t nat -X BERTH-IMAGE-PROBE
    iptables-save -t filter >/dev/null 2>&1 && conntrack -L >/dev/null 2>&1' ||
    fail "iptables, ip6tables, iptables-legacy or conntrack is not usable in the image"
# FRR as the chart's sidecar runs it: root with only FRR's capabilities, a read-only root, its
# sockets in a directory it shares with the agent, which reaches them as a member of frrvty.
frr_dir=$out/frr-run
rm -rf "$frr_dir" && mkdir -p "$frr_dir" && chmod 0777 "$frr_dir"
podman run -d --name "$run_id-frr" --network "container:$run_id-api" --read-only --tmpfs /var/tmp --group-add 951 \
    --user 0 --cap-drop ALL --cap-add NET_ADMIN,NET_RAW,NET_BIND_SERVICE,SYS_ADMIN,SETUID,SETGID,KILL \
    --security-opt no-new-privileges -v "$frr_dir:/var/run/frr" --entrypoint /bin/bash "$tag" -c '
    for d in zebra bfdd bgpd; do
        /usr/lib/frr/$d -u frr -g frr -i /var/run/frr/$d.pid --vty_socket /var/run/frr -z /var/run/frr/zserv.api -f /dev/null --log stdout &
    done
    wait -n; exit 1' >/dev/null
for _ in $(seq 100); do [[ -S $frr_dir/bgpd.vty && -S $frr_dir/bfdd.vty ]] && break; sleep 0.1; done
[[ $(stat -c %g "$frr_dir/bgpd.vty") == 951 ]] || fail "FRR's vty sockets are not in group 951: $(ls -ln "$frr_dir"; podman logs "$run_id-frr" 2>&1 | tail -5)"
printf 'router bgp 64512\n bgp router-id 198.18.0.11\n neighbor 198.18.0.1 remote-as 64513\nexit\n' >"$frr_dir/frr.conf"
podman run --rm --network "container:$run_id-api" --read-only --user 0 --group-add 951 --cap-drop ALL \
    --cap-add NET_ADMIN --cap-add NET_RAW --security-opt no-new-privileges -v "$frr_dir:/var/run/frr" \
    --entrypoint /bin/bash "$tag" -ec '
    python3 /usr/lib/frr/frr-reload.py --reload --stdout --vty_socket /var/run/frr --confdir /var/run/frr --rundir /var/run/frr /var/run/frr/frr.conf >/dev/null
    vtysh --vty_socket /var/run/frr -c "show bgp summary json" | grep -q 198.18.0.1' ||
    fail "the agent's frr-reload.py and vtysh could not configure the FRR sidecar"
say "ran: FRR $(podman exec "$run_id-frr" vtysh --vty_socket /var/run/frr -c 'show version' 2>/dev/null | awk 'NR == 1 { print $2 }') as the chart's sidecar, configured by frr-reload.py as the agent runs it (root in group frrvty, only NET_ADMIN and NET_RAW)"
say "ran: iptables $(podman exec "$run_id-agent" iptables --version | awk '{ print $2, $3 }'), ip6tables, iptables-legacy, conntrack and $(podman exec "$run_id-agent" nft --version) usable with NET_ADMIN"
say "done: $tag"
