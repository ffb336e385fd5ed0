#!/usr/bin/env bash
# Installs the Debian packages berth's test suite needs, only when something is missing, so a
# machine that is already set up pays one quick probe per package and never touches apt.
set -euo pipefail

# package:probe — the probe is a command, or `py:` followed by Python modules that must import.
# kubectl is probed by command because it may come from a package other than Debian's.
wanted=(
    "iproute2:ip"
    "iptables:iptables"
    "nftables:nft"
    "kubernetes-client:kubectl"
    "procps:pgrep"
    "conntrack:conntrack"
    "curl:curl"
    # Runs a controller replica with its wall clock skewed (tests/controller_clock_skew.rs).
    "faketime:faketime"
    # BGP: the speaker (zebra, bgpd, bfdd, vtysh) and frr-reload.py, which applies a rendered config.
    "frr:vtysh"
    "frr-pythontools:/usr/lib/frr/frr-reload.py"
    "python3-venv:py:venv ensurepip"
)

python=${PYTHON:-python3}
export PATH="$PATH:/usr/sbin:/sbin"

present() {
    local package=$1 probe=$2
    if [[ $probe == py:* ]]; then
        local modules=${probe#py:}
        "$python" -c "import ${modules// /, }" 2>/dev/null && return 0
    elif [[ $probe == /* ]]; then
        [[ -e $probe ]] && return 0
    elif command -v "$probe" >/dev/null 2>&1; then
        return 0
    fi
    dpkg -s "$package" >/dev/null 2>&1
}

missing=()
for entry in "${wanted[@]}"; do
    package=${entry%%:*}
    probe=${entry#*:}
    present "$package" "$probe" || missing+=("$package")
done

if ((${#missing[@]} == 0)); then
    echo "deps: system packages present"
    exit 0
fi

echo "deps: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
    echo "deps: need root to install ${missing[*]} (run 'make deps' as root)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
