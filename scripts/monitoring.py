#!/usr/bin/env python3
"""The chart's Grafana dashboard and alert rules against what berth really exports.

    monitoring.py scrape --bin target/debug/berth --out target/monitoring
        runs the real `berth controller` (endpoints and the aws-nlb class on) and `berth agent`
        (L2 announcer and membership on) against the lab API server, all inside one network
        namespace of their own (`berth-mon-<pid>`, removed afterwards), gives them an IPPool,
        an L2Advertisement, a Node and a LoadBalancer Service, and saves both /metrics pages.
    monitoring.py check --metrics target/monitoring/*.txt
        fails when the dashboard, the alert rules or the series of their promtool tests name a
        metric that neither page has, or filter or group a metric by a label its series do not
        carry (labels Prometheus adds when it scrapes, such as job and instance, excepted).

Needs root for the namespace (`scrape` says so and stops otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "charts" / "berth" / "monitoring" / "dashboard.json"
ALERTS = ROOT / "charts" / "berth" / "monitoring" / "alerts.yaml"
ALERT_TESTS = ROOT / "tests" / "monitoring" / "alerts_test.yaml"

# Labels a scrape adds (target labels, the Operator's relabelling) and the histogram bucket label.
SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container", "node", "le"}
CONTROLLER_ADMIN = "127.0.0.1:9090"
AGENT_ADMIN = "127.0.0.1:10356"
API = "127.0.0.1:6443"
# Everything the processes see: one node, one pool announced on a veth interface, one Service
# whose address the controller allocates and the agent then announces.
OBJECTS = [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "mon-node", "labels": {"kubernetes.io/hostname": "mon-node"}},
     "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
    {"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "default"},
     "spec": {"addresses": ["198.18.0.200-198.18.0.210"], "autoAssign": True, "avoidBuggyIPs": False}},
    {"apiVersion": "berth.dev/v1alpha1", "kind": "L2Advertisement", "metadata": {"name": "default"}, "spec": {}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "default", "name": "web"},
     "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    # Its NLB cannot be made (the ELBv2 endpoint is a closed port): a failed reconcile, timed.
    {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "default", "name": "nlb"},
     "spec": {"type": "LoadBalancer", "loadBalancerClass": "berth.dev/aws-nlb", "ports": [{"port": 443}]}},
]
# An address in no pool: the announcer ignores ARP requests for it, by reason.
OUTSIDE_POOLS = "198.18.0.250"


def send_arp_request(ns: str, interface: str, target: str) -> None:
    """One ARP request for `target`, sent on `interface` inside `ns` (the announcer's peer end)."""
    code = f"""
import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(({interface!r}, 0))
mac = s.getsockname()[4]
ip = bytes([198, 18, 0, 100])
frame = b"\\xff" * 6 + mac + b"\\x08\\x06" + bytes([0, 1, 8, 0, 6, 4, 0, 1]) + mac + ip + bytes(6) + socket.inet_aton({target!r})
s.send(frame)
"""
    sh("ip", "netns", "exec", ns, sys.executable, "-c", code)


# ---------------------------------------------------------------------------------------------
# scrape


def sh(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=True, **kw)


def get(ns: str, url: str, timeout: float = 2.0) -> str | None:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "curl", "-sf", "--max-time", str(timeout), url],
        capture_output=True, text=True,
    )
    return out.stdout if out.returncode == 0 else None


def wait_for(what: str, probe, deadline: float) -> str:
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.2)
    raise SystemExit(f"monitoring: timed out waiting for {what}")


def cmd_scrape(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("monitoring: scrape needs root (a network namespace of its own)", file=sys.stderr)
        return 2
    for tool in ("ip", "curl", "kubectl"):
        if shutil.which(tool) is None:
            print(f"monitoring: scrape needs {tool} (make deps installs it)", file=sys.stderr)
            return 2
    binary = str(Path(args.bin).resolve())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ns = f"berth-mon-{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="berth-mon-"))
    procs: list[subprocess.Popen] = []
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # An Ethernet interface for the announcer: a veth pair with both ends in the namespace.
        sh("ip", "-n", ns, "link", "add", "mon0", "type", "veth", "peer", "name", "mon1")
        sh("ip", "-n", ns, "link", "set", "mon0", "up")
        sh("ip", "-n", ns, "link", "set", "mon1", "up")
        kubeconfig = work / "kubeconfig"
        key = work / "membership.key"
        key.write_text(secrets.token_hex(32))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "BERTH_LOG_LEVEL": "warn",
            # The ELBv2 endpoint below is a closed port in the namespace: calls fail at once,
            # which is what makes berth_aws_calls_total carry samples. Nothing leaves the host.
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
        }

        def start(name: str, *argv: str) -> None:
            log = open(work / f"{name}.log", "w")
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, binary, *argv], env=env,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

        deadline = time.monotonic() + args.timeout
        start("apiserver", "lab", "apiserver", "--listen", API, "--kubeconfig", str(kubeconfig))
        wait_for("the lab API server", lambda: kubeconfig.exists() and get(ns, f"http://{API}/version"), deadline)
        crds = work / "crds.yaml"
        crds.write_text(sh(binary, "crds", capture_output=True, text=True).stdout)
        manifest = work / "objects.json"
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": OBJECTS}))
        # The lab API server serves no OpenAPI document for kubectl to validate against.
        for path in (crds, manifest):
            sh("ip", "netns", "exec", ns, "kubectl", "--kubeconfig", str(kubeconfig), "apply", "--validate=false",
               "-f", str(path), stdout=subprocess.DEVNULL)
        start("controller", "controller", "--kubeconfig", str(kubeconfig), "--admin-listen", CONTROLLER_ADMIN,
              "--endpoints", "on", "--aws-nlb", "on", "--cluster-name", "mon",
              "--aws-endpoint-url", "http://127.0.0.1:1", "--aws-subnets", "subnet-0")
        start("agent", "agent", "--kubeconfig", str(kubeconfig), "--node-name", "mon-node",
              "--admin-listen", AGENT_ADMIN, "--l2-announcer", "--l2-interfaces", "mon0",
              "--membership", "on", "--membership-key-file", str(key), "--membership-port", "0",
              "--membership-advertise-address", "127.0.0.1")
        def page(address: str, *wanted: str):
            def probe():
                metrics = get(ns, f"http://{address}/metrics")
                return metrics if metrics and all(w in metrics for w in wanted) else None
            return probe

        # Done when the Service's address is announced (the whole path ran), a request for an
        # address outside the pools was ignored, and the controller has tried to make the NLB.
        wait_for("the agent to announce the Service's address", page(AGENT_ADMIN, "berth_l2_announced{"), deadline)
        send_arp_request(ns, "mon1", OUTSIDE_POOLS)
        agent = wait_for("the agent to ignore a request", page(AGENT_ADMIN, "berth_l2_requests_ignored_total{"), deadline)
        controller = wait_for("the controller to try AWS",
                              page(CONTROLLER_ADMIN, "berth_aws_calls_total{", "berth_aws_reconcile_duration_seconds_count{"),
                              deadline)
        (out / "controller.txt").write_text(controller)
        (out / "agent.txt").write_text(agent)
        print(f"monitoring: saved the controller's and the agent's /metrics in {out}")
        return 0
    except (SystemExit, subprocess.CalledProcessError):
        for log in sorted(work.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
        raise
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        subprocess.run(["ip", "netns", "delete", ns], check=False)
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# check

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')
METRIC = re.compile(r"\bberth_[a-zA-Z0-9_:]+")
SUFFIXES = {
    "counter": ["_total", "_created"],
    "histogram": ["_bucket", "_sum", "_count", "_created"],
    "gauge": [""],
    "info": ["_info"],
    "unknown": [""],
    "stateset": [""],
    "gaugehistogram": ["_gbucket", "_gsum", "_gcount"],
    "summary": ["", "_sum", "_count", "_created"],
}


def bucket_bounds(pages: list[Path]) -> dict[str, set[str]]:
    """Histogram bucket series -> the `le` bounds berth exports for it."""
    bounds: dict[str, set[str]] = {}
    for page in pages:
        for line in page.read_text().splitlines():
            m = SAMPLE.match(line)
            le = re.search(r'le="([^"]*)"', m.group(2) or "") if m else None
            if m and le:
                bounds.setdefault(m.group(1), set()).add(le.group(1))
    return bounds


def exported(pages: list[Path]) -> dict[str, set[str] | None]:
    """Series name -> the label names its samples carry (None: the family has no sample yet)."""
    series: dict[str, set[str] | None] = {}
    for page in pages:
        for line in page.read_text().splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split(maxsplit=3)
                for suffix in SUFFIXES.get(kind, [""]):
                    series.setdefault(family + suffix, None)
                continue
            if line.startswith("#") or not line.strip():
                continue
            m = SAMPLE.match(line)
            if m:
                labels = set(LABEL.findall(m.group(2) or ""))
                known = series.get(m.group(1))
                series[m.group(1)] = labels | (known or set())
    return series


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every query of the dashboard and the alert rules."""
    import yaml

    found = []
    dashboard = json.loads(DASHBOARD.read_text())

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    found.append((where, value))
                else:
                    walk(value, f"{where}/{node.get('title', key)}" if key == "panels" else where)
        elif isinstance(node, list):
            for item in node:
                walk(item, f"{where}/{item.get('title', '?')}" if isinstance(item, dict) else where)

    walk(dashboard, "dashboard")
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            found.append((f"alerts/{rule.get('alert') or rule.get('record')}", rule["expr"]))
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    for test in tests["tests"]:
        for item in test.get("input_series", []):
            found.append((f"alert tests/input {item['series']}", item["series"]))
    return found


def used_labels(expr: str, metric: str) -> set[str]:
    """Label names a query matches on right after `metric` ({...}) ."""
    labels = set()
    for m in re.finditer(re.escape(metric) + r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(1)))
    return labels


def grouping_labels(expr: str) -> set[str]:
    labels = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {label.strip() for label in m.group(1).split(",") if label.strip()}
    return labels


def cmd_check(args: argparse.Namespace) -> int:
    pages = [Path(p) for p in args.metrics]
    series = exported(pages)
    bounds = bucket_bounds(pages)
    if not series:
        print("monitoring: the /metrics pages hold no metric", file=sys.stderr)
        return 1
    every_label = set().union(*(labels for labels in series.values() if labels)) | SCRAPE_LABELS
    errors = []
    count = 0
    for where, expr in queries():
        count += 1
        metrics = set(METRIC.findall(expr))
        if not metrics and not where.startswith("dashboard"):
            errors.append(f"{where}: names no berth metric")
        for metric in sorted(metrics):
            if metric not in series:
                errors.append(f"{where}: {metric} is not exported by berth")
                continue
            carried = series[metric]
            if carried is None:
                continue  # a family with no sample yet: its labels cannot be read off the page
            for label in sorted(used_labels(expr, metric) - carried - SCRAPE_LABELS):
                errors.append(f"{where}: {metric} has no label {label} (its series carry {sorted(carried)})")
        for label in sorted(grouping_labels(expr) - every_label):
            errors.append(f"{where}: no berth series carries the label {label}")
        # A test series of a histogram must use bucket bounds berth really has.
        m = re.match(r"^(berth_\w+_bucket)\{.*\ble=\"([^\"]*)\"", expr)
        if where.startswith("alert tests") and m and m.group(1) in bounds and m.group(2) not in bounds[m.group(1)]:
            errors.append(f"{where}: berth has no bucket le={m.group(2)!r} for {m.group(1)}")
    for error in errors:
        print(f"monitoring: {error}", file=sys.stderr)
    if errors:
        return 1
    print(f"monitoring: {count} queries and test series name only the {len(series)} series berth exports")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    scrape = sub.add_parser("scrape", help="save the real binaries' /metrics pages")
    scrape.add_argument("--bin", required=True)
    scrape.add_argument("--out", required=True)
    scrape.add_argument("--timeout", type=float, default=60.0)
    scrape.set_defaults(func=cmd_scrape)
    check = sub.add_parser("check", help="check the dashboard and the alerts against saved pages")
    check.add_argument("--metrics", nargs="+", required=True)
    check.set_defaults(func=cmd_check)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
