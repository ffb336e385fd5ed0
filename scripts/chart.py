#!/usr/bin/env python3
"""The Helm chart's checks, with the real Helm engine (helm-python-sdk) and kubernetes-validate.

    chart.py check                 lint, render and check every value set (make test-chart)
    chart.py rbac [VALUES_JSON]    the rules each ServiceAccount of one rendering holds, as JSON:
                                   {"controller": [{"namespace": null|NS, "apiGroups": [...],
                                   "resources": [...], "verbs": [...], "resourceNames": [...]}],
                                   "agent": [...]}; the RBAC test compares them with the requests
                                   berth really makes in the lab
    chart.py agent [VALUES_JSON]   the agent container of one rendering, as JSON: {"args": [...],
                                   "env": [...]} exactly as the DaemonSet gives them; the RBAC test
                                   runs `berth agent` with them
    chart.py admission [VALUES_JSON]
                                   the ValidatingAdmissionPolicies of one rendering with their
                                   bindings, as JSON: {"policies": [...], "bindings": [...]}; the
                                   admission test evaluates their CEL against agents' requests

Value sets: the chart's defaults and every charts/berth/ci/<name>-values.yaml. Kubernetes versions:
the oldest and newest berth supports (SUPPORTED_KUBERNETES below; the README says the same).
"""

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "berth"
RELEASE = "berth"
NAMESPACE = "berth-system"
# The oldest and newest Kubernetes versions berth supports: kube-rs 5 with k8s-openapi 0.29
# covers 1.33 to 1.37, and berth uses only GA v1 APIs.
SUPPORTED_KUBERNETES = ["1.33.0", "1.37.0"]
# Kinds no Kubernetes schema knows: berth's own are checked against its CRDs, the ServiceMonitor
# against the few fields the Prometheus Operator requires.
BERTH_KINDS = {"IPPool", "L2Advertisement"}
# libyaml's loader where PyYAML has it: the same documents, parsed several times faster.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# kubernetes-validate reads and parses a kind's JSON schema and the whole definitions file
# (megabytes) again for every document it validates; the files do not change during a run, so
# each is parsed once. Nothing mutates a loaded schema (jsonschema and referencing only read it).
_kv = kubernetes_validate.utils
_kv.schema_contents = functools.cache(_kv.schema_contents)
_kv.all_versions = functools.cache(_kv.all_versions)


class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, where, message):
        if not ok:
            self.items.append(f"{where}: {message}")
        return ok


def value_sets():
    sets = {"defaults": {}}
    for path in sorted((CHART / "ci").glob("*-values.yaml")):
        sets[path.name[: -len("-values.yaml")]] = yaml.safe_load(path.read_text()) or {}
    return sets


def render(values):
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for template, text in sorted(out.items()):
        if not template.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.load_all(text, Loader=YAML_LOADER):
            if doc:
                docs.append((template, doc))
    return docs


def notes(values):
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next((text for name, text in out.items() if name.endswith("NOTES.txt")), "")


def merged(values):
    with helm.Chart.load(str(CHART)) as chart:
        return chart.merge_values(values)


@functools.cache
def crd_schemas():
    schemas = {}
    for doc in yaml.load_all((CHART / "crds" / "berth.dev.yaml").read_text(), Loader=YAML_LOADER):
        if not doc:
            continue
        kind = doc["spec"]["names"]["kind"]
        for version in doc["spec"]["versions"]:
            api_version = f'{doc["spec"]["group"]}/{version["name"]}'
            schemas[(api_version, kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def by_kind(docs, kind):
    return [d for _, d in docs if d.get("kind") == kind]


def one(docs, kind, name_suffix):
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} *{name_suffix}, found {len(found)}")
    return found[0]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


# ---------------------------------------------------------------------------------------------
# RBAC: the rules bound to each component's ServiceAccount, cluster-wide or in one namespace.


def component_rules(docs, values):
    values = merged(values)
    prefix = f"{RELEASE}-berth" if "berth" not in RELEASE else RELEASE
    accounts = {
        "controller": values["controller"]["serviceAccount"]["name"] or f"{prefix}-controller",
        "agent": values["agent"]["serviceAccount"]["name"] or f"{prefix}-agent",
    }
    roles = {}
    for _, d in docs:
        if d["kind"] in ("ClusterRole", "Role"):
            roles[(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])] = d
    out = {component: [] for component in accounts}
    for _, d in docs:
        if d["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        ns = d["metadata"].get("namespace") if d["kind"] == "RoleBinding" else None
        ref = d["roleRef"]
        role_ns = ns if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        if role is None:
            raise AssertionError(f'{d["kind"]} {d["metadata"]["name"]} binds a missing {ref}')
        for subject in d["subjects"]:
            for component, account in accounts.items():
                if (
                    subject["kind"] == "ServiceAccount"
                    and subject["name"] == account
                    and subject["namespace"] == NAMESPACE
                ):
                    for rule in role.get("rules", []):
                        out[component].append(
                            {
                                "namespace": ns,
                                "apiGroups": rule.get("apiGroups", []),
                                "resources": rule.get("resources", []),
                                "verbs": rule.get("verbs", []),
                                "resourceNames": rule.get("resourceNames", []),
                            }
                        )
    return out


# ---------------------------------------------------------------------------------------------
# The checks of one value set.


def check_lint(f, name, values):
    for version in SUPPORTED_KUBERNETES:
        report = helm.lint(str(CHART), values, strict=False, namespace=NAMESPACE, kube_version=f"v{version}")
        errors = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        errors += report.get("errors") or []
        f.check(not errors, f"{name}: lint (Kubernetes {version})", f"warnings or errors: {errors}")


def check_validates(f, name, docs):
    schemas = crd_schemas()
    for template, doc in docs:
        where = f'{name}: {template} {doc["kind"]} {doc["metadata"].get("name")}'
        if doc["kind"] in BERTH_KINDS:
            schema = schemas.get((doc["apiVersion"], doc["kind"]))
            if f.check(schema is not None, where, "no CRD for it in the chart"):
                try:
                    jsonschema.Draft7Validator(schema).validate(doc)
                except jsonschema.ValidationError as e:
                    f.check(False, where, f"not valid for its CRD: {e.message}")
            continue
        if doc["kind"] == "ServiceMonitor":
            spec = doc.get("spec", {})
            f.check(doc["apiVersion"] == "monitoring.coreos.com/v1", where, "apiVersion")
            f.check(spec.get("selector") and spec.get("endpoints"), where, "selector and endpoints")
            continue
        if doc["kind"] == "PrometheusRule":
            f.check(doc["apiVersion"] == "monitoring.coreos.com/v1", where, "apiVersion")
            shipped = yaml.safe_load((CHART / "monitoring" / "alerts.yaml").read_text())
            f.check(doc.get("spec") == shipped, where, "spec is monitoring/alerts.yaml")
            continue
        for version in SUPPORTED_KUBERNETES:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                f.check(False, where, f"Kubernetes {version}: {e.message} at {list(e.path)}")
            except kubernetes_validate.SchemaNotFoundError:
                f.check(False, where, f"Kubernetes {version} has no schema for it")


def check_controller(f, name, docs, values):
    where = f"{name}: controller"
    deploy = one(docs, "Deployment", "-controller")
    spec = deploy["spec"]["template"]["spec"]
    f.check(deploy["spec"]["replicas"] == values["controller"]["replicas"], where, "replicas")
    pod = spec.get("securityContext", {})
    f.check(pod.get("runAsNonRoot") is True, where, "pod runAsNonRoot")
    f.check(pod.get("seccompProfile", {}).get("type") == "RuntimeDefault", where, "pod seccomp")
    f.check(not spec.get("hostNetwork"), where, "no host network")
    (container,) = spec["containers"]
    sc = container.get("securityContext", {})
    f.check(sc.get("allowPrivilegeEscalation") is False, where, "allowPrivilegeEscalation")
    f.check(sc.get("readOnlyRootFilesystem") is True, where, "readOnlyRootFilesystem")
    f.check(sc.get("runAsNonRoot") is True, where, "runAsNonRoot")
    f.check(sc.get("capabilities") == {"drop": ["ALL"]}, where, f'capabilities {sc.get("capabilities")}')
    f.check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where, "seccomp")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        f.check(container.get(probe, {}).get("httpGet", {}).get("path") == path, where, probe)
    admin_port = int(values["controller"]["config"]["adminListen"].rsplit(":", 1)[1])
    f.check(container["ports"][0]["containerPort"] == admin_port, where, "admin port")
    spread = spec.get("topologySpreadConstraints") or []
    f.check(any(c["topologyKey"] == "kubernetes.io/hostname" for c in spread), where, "spread across nodes")
    env = env_of(container)
    f.check(env.get("BERTH_IDENTITY", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name", where, "identity from the pod name")
    check_flag_env(f, where, env, values["controller"]["config"], {"leaseNamespace": NAMESPACE})
    check_binary_accepts(f, where, container)
    pdbs = by_kind(docs, "PodDisruptionBudget")
    f.check(len(pdbs) == (1 if values["controller"]["podDisruptionBudget"]["enabled"] else 0), where, "PodDisruptionBudget")


def check_flag_env(f, where, env, config, chart_defaults):
    """Every non-empty flag value reaches the container as its BERTH_ variable, and nothing else
    of the flag section does."""
    expected = {}
    for key, value in config.items():
        value = value if value not in ("", None) else chart_defaults.get(key, "")
        if value in ("", None):
            continue
        flag = "".join("_" + c if c.isupper() else c.upper() for c in key)
        text = ",".join(value) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) else str(value)
        expected[f"BERTH_{flag}"] = text
    for var, text in expected.items():
        f.check(env.get(var, {}).get("value") == text, where, f"{var}={text!r}, rendered {env.get(var)}")


# What the Downward API gives the variables the chart takes from it, for the parse check.
DOWNWARD = {"metadata.name": "berth-controller-5d8f-x2x9", "spec.nodeName": "node-1"}


def check_binary_accepts(f, where, container):
    """The real binary parses and validates the container's arguments and variables: it gets as
    far as reading its (missing) kubeconfig, so no value was refused."""
    binary = os.environ.get("BERTH_BIN")
    if not binary:
        return False
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = DOWNWARD[var["valueFrom"]["fieldRef"]["fieldPath"]]
    # The mounted membership Secret: a key file of the same shape in a scratch directory.
    scratch = None
    if env.get("BERTH_MEMBERSHIP_KEY_FILE", "").startswith("/etc/berth/membership/"):
        scratch = tempfile.mkdtemp(prefix="berth-chart-check-")
        key = pathlib.Path(scratch) / "key"
        key.write_text("k" * 64)
        env["BERTH_MEMBERSHIP_KEY_FILE"] = str(key)
    kubeconfig = "/nonexistent/berth-chart-check/kubeconfig"
    run = subprocess.run(
        [binary, *container["args"], "--kubeconfig", kubeconfig],
        env=env, capture_output=True, text=True, timeout=30,
    )
    if scratch:
        shutil.rmtree(scratch)
    f.check(
        run.returncode == 1 and f"reading the kubeconfig {kubeconfig}" in run.stderr,
        where,
        f"`berth {' '.join(container['args'])}` refused the rendered settings: {run.stderr.strip()}",
    )
    return True


def check_agent(f, name, docs, values):
    where = f"{name}: agent"
    ds = one(docs, "DaemonSet", "-agent")
    spec = ds["spec"]["template"]["spec"]
    f.check(spec.get("hostNetwork") is True, where, "hostNetwork")
    f.check(spec.get("priorityClassName") == "system-node-critical", where, "priorityClassName")
    f.check({"operator": "Exists"} in (spec.get("tolerations") or []), where, "tolerates every taint")
    strategy = ds["spec"]["updateStrategy"]
    f.check(strategy.get("type") == "RollingUpdate" and strategy.get("rollingUpdate", {}).get("maxUnavailable") == 1, where, "rolling update, maxUnavailable 1")
    containers = {c["name"]: c for c in spec["containers"]}
    bgp = values["agent"]["config"]["bgpSpeaker"]
    f.check(sorted(containers) == (["agent", "frr"] if bgp else ["agent"]), where, f"containers {sorted(containers)}: the FRR sidecar exactly with bgpSpeaker")
    container = containers["agent"]
    sc = container.get("securityContext", {})
    caps = sc.get("capabilities", {})
    f.check(caps.get("drop") == ["ALL"], where, "drops all capabilities")
    wanted = ["NET_ADMIN", "NET_RAW"] + (["SYS_NICE"] if values["agent"]["membership"]["realtime"] else [])
    f.check(sorted(caps.get("add", [])) == wanted, where, f'adds only {", ".join(wanted)}: {caps.get("add")}')
    f.check(not sc.get("privileged"), where, "not privileged")
    f.check(sc.get("allowPrivilegeEscalation") is False, where, "allowPrivilegeEscalation")
    f.check(sc.get("readOnlyRootFilesystem") is True, where, "readOnlyRootFilesystem")
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    f.check(mounts.get("xtables-lock", {}).get("mountPath") == "/run/xtables.lock", where, "xtables lock mount")
    f.check(volumes.get("xtables-lock", {}).get("hostPath") == {"path": "/run/xtables.lock", "type": "FileOrCreate"}, where, "xtables lock hostPath")
    host_paths = [v for v in volumes.values() if "hostPath" in v]
    f.check(len(host_paths) == 1, where, f"only the xtables lock from the host: {host_paths}")
    if bgp:
        check_frr(f, where, spec, containers, values)
    env = env_of(container)
    f.check(env.get("BERTH_NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName", where, "node name from the Downward API")
    check_flag_env(f, where, env, values["agent"]["config"], {"leaseNamespace": NAMESPACE})
    check_binary_accepts(f, where, container)
    existing = values["agent"]["membership"]["existingSecret"]
    secret_name = volumes.get("membership", {}).get("secret", {}).get("secretName")
    f.check(mounts.get("membership", {}).get("readOnly") is True, where, "membership key mounted read-only")
    secrets = by_kind(docs, "Secret")
    if existing:
        f.check(secret_name == existing, where, "mounts the existing membership Secret")
        f.check(not secrets, where, "creates no Secret when one exists")
    else:
        f.check(len(secrets) == 1 and secrets[0]["metadata"]["name"] == secret_name and "key" in secrets[0].get("data", {}), where, "creates the membership Secret it mounts")


def check_agent_rollout(f):
    """What rolls the agents. Every agent setting is a flag or variable of the pod template, so a
    changed value rolls them. The membership Secret has no checksum annotation, on purpose
    (docs/architecture.md, membership key rotation): agents re-read the key files every 10 s, and a render
    without a cluster makes a new key each time, which a checksum would turn into a restart of
    every agent, with a new key, on every render."""
    where = "agent rollout"

    def template(docs):
        return one(docs, "DaemonSet", "-agent")["spec"]["template"]

    first = template(render({}))
    f.check(first == template(render({})), where, "two renders give the same agent pod template")
    f.check(not any(k.startswith("checksum/") for k in (first["metadata"].get("annotations") or {})),
            where, "no checksum annotation on the agent pod template")
    changed = template(render({"agent": {"config": {"membershipHeartbeatInterval": "50ms"}}}))
    f.check(changed != first, where, "a changed agent setting changes the pod template (the agents roll)")


def check_frr(f, where, spec, containers, values):
    """The FRR sidecar: FRR's own capabilities and nothing more, a read-only root, the shared
    directory at the agent's frrDir, and the agent in the vty group instead of holding
    CAP_DAC_OVERRIDE."""
    frr = containers["frr"]
    sc = frr.get("securityContext", {})
    caps = sc.get("capabilities", {})
    f.check(caps.get("drop") == ["ALL"], where, "frr drops all capabilities")
    wanted = ["KILL", "NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW", "SETGID", "SETUID", "SYS_ADMIN"]
    f.check(sorted(caps.get("add", [])) == wanted, where, f'frr adds only {wanted}: {caps.get("add")}')
    f.check(not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False, where, "frr not privileged")
    f.check(sc.get("readOnlyRootFilesystem") is True, where, "frr readOnlyRootFilesystem")
    frr_dir = values["agent"]["config"]["frrDir"]
    for name, c in containers.items():
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        f.check(mounts.get("frr-run") == frr_dir, where, f"{name} mounts the FRR directory at {frr_dir}")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    f.check("emptyDir" in volumes.get("frr-run", {}), where, "the FRR directory is an emptyDir")
    script = " ".join(frr.get("args", []))
    for daemon in ("zebra", "bgpd", "bfdd"):
        f.check(f"/usr/lib/frr/$daemon" in script and daemon in script, where, f"frr starts {daemon}")
    f.check(f'dir="{frr_dir}"' in script, where, "frr's sockets in frrDir")
    groups = spec.get("securityContext", {}).get("supplementalGroups", [])
    f.check(values["agent"]["frr"]["vtyGroup"] in groups, where, "the pod joins the vty group")


def check_rbac(f, name, docs, values):
    where = f"{name}: rbac"
    for _, d in docs:
        if d["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in d.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                f.check("*" not in rule.get(field, []), where, f'{d["metadata"]["name"]}: wildcard in {field}')
            if "secrets" in rule.get("resources", []):
                # Only the BGP peers' password Secrets, by name, read only, in one namespace.
                f.check(
                    d["kind"] == "Role" and rule.get("verbs") == ["get"] and rule.get("resources") == ["secrets"]
                    and rule.get("resourceNames") == values["agent"]["frr"]["passwordSecrets"]
                    and values["agent"]["config"]["bgpSpeaker"],
                    where, f'{d["metadata"]["name"]}: Secrets through the API beyond the named BGP password Secrets')
    rules = component_rules(docs, values)
    endpoints_on = values["controller"]["config"]["endpoints"] == "on"
    granted = {(g, r) for rule in rules["controller"] for g in rule["apiGroups"] for r in rule["resources"]}
    for resource in (("", "pods"), ("", "endpoints")):
        f.check((resource in granted) == endpoints_on, where, f"controller {resource} granted exactly when endpoints are on")
    # EndpointSlices are always read (never written without endpoints on): the datapath report
    # counts a Service's endpoints against the agents' size bounds, and the aws-nlb class takes
    # `ip` targets from them.
    slices = ("discovery.k8s.io", "endpointslices")
    f.check(slices in granted, where, f"controller {slices} granted (read always)")
    slice_verbs = {v for rule in rules["controller"] if "endpointslices" in rule["resources"] for v in rule["verbs"]}
    f.check(endpoints_on or not (slice_verbs - {"list", "watch"}), where, "controller writes EndpointSlices only with endpoints on")
    lease_rules = [r for r in rules["controller"] if "leases" in r["resources"]]
    f.check(all(r["namespace"] == NAMESPACE for r in lease_rules), where, "Leases only in the lease namespace")
    f.check(bool(lease_rules) == values["controller"]["config"]["leaderElection"], where, "Lease rights exactly with leader election")
    f.check(rules["agent"], where, "agent has rules")


def check_selectors(f, name, docs):
    """Every selector selects the pods it is meant for (the API server refuses a workload whose
    selector misses its own template; a PDB or Service that selects nothing fails silently)."""
    pods = {}
    for kind in ("Deployment", "DaemonSet"):
        for d in by_kind(docs, kind):
            labels = d["spec"]["template"]["metadata"].get("labels", {})
            selector = d["spec"]["selector"].get("matchLabels", {})
            f.check(selector and selector.items() <= labels.items(), f"{name}: {kind}", "selector misses its pods")
            pods[d["metadata"]["name"]] = labels
    selecting = [(d["kind"], d["metadata"]["name"], d["spec"]["selector"].get("matchLabels", {})) for d in by_kind(docs, "PodDisruptionBudget")]
    selecting += [("Service", d["metadata"]["name"], d["spec"].get("selector", {})) for d in by_kind(docs, "Service")]
    for kind, obj, selector in selecting:
        hits = [w for w, labels in pods.items() if selector and selector.items() <= labels.items()]
        f.check(len(hits) == 1, f"{name}: {kind} {obj}", f"selects {hits}, not exactly one workload's pods")


def check_schema_rejects(f):
    bad = [
        {"controller": {"config": {"defaultClass": "metallb"}}},
        {"controller": {"config": {"endpoints": True}}},
        {"controller": {"config": {"serviceCidr": "nonsense"}}},
        {"controller": {"config": {"leaseDuration": "soon"}}},
        {"controller": {"config": {"noSuchFlag": 1}}},
        {"controller": {"replicas": 0}},
        {"agent": {"config": {"proxyMode": "iptables"}}},
        {"agent": {"config": {"adminListen": "10356"}}},
        {"agent": {"config": {"masqueradeAll": "yes"}}},
        {"agent": {"frr": {"passwordSecrets": ["Not A Name"]}}},
        {"agent": {"frr": {"vtyGroup": "frrvty"}}},
        {"ipPool": {"addresses": "198.18.0.200"}},
        {"image": {"pullPolicy": "Sometimes"}},
        {"unknownTopLevel": True},
    ]
    with helm.Chart.load(str(CHART)) as chart:
        for values in bad:
            try:
                chart.validate_schema(values)
                f.check(False, "values.schema.json", f"accepted {values}")
            except helm.HelmError:
                pass
        for name, values in value_sets().items():
            try:
                chart.validate_schema(values)
            except helm.HelmError as e:
                f.check(False, "values.schema.json", f"refused the {name} value set: {e}")


def check_value_set(f, name, values):
    docs = render(values)
    full = merged(values)
    check_validates(f, name, docs)
    check_controller(f, name, docs, full)
    check_agent(f, name, docs, full)
    check_rbac(f, name, docs, full)
    check_selectors(f, name, docs)
    kinds = sorted({d["kind"] for _, d in docs})
    f.check(bool(by_kind(docs, "IPPool")) == full["ipPool"]["create"], name, "IPPool only when asked")
    f.check(bool(by_kind(docs, "L2Advertisement")) == full["l2Advertisement"]["create"], name, "L2Advertisement only when asked")
    f.check(bool(by_kind(docs, "ServiceMonitor")) == full["serviceMonitor"]["enabled"], name, "ServiceMonitor only when asked")
    f.check(bool(by_kind(docs, "PrometheusRule")) == full["prometheusRule"]["enabled"], name, "PrometheusRule only when asked")
    dashboards = [d for d in by_kind(docs, "ConfigMap") if "berth.json" in d.get("data", {})]
    f.check(bool(dashboards) == full["grafanaDashboard"]["enabled"], name, "dashboard ConfigMap only when asked")
    for d in dashboards:
        f.check(json.loads(d["data"]["berth.json"]) == json.loads((CHART / "monitoring" / "dashboard.json").read_text()),
                name, "the dashboard ConfigMap holds monitoring/dashboard.json")
        f.check(d["metadata"]["labels"].get("grafana_dashboard") == "1", name, "the dashboard carries the sidecar's label")
    text = notes(values)
    f.check("rollout status" in text and full["agent"]["config"]["proxyMode"] in text, name, "NOTES.txt says how to check the install")
    return len(docs), kinds


# The template functions of the oldest Helm the chart supports, 3.8: Go 1.17's text/template
# built-ins, the sprig 3.2 functions in use or common, and Helm's own. A function outside this list
# may be newer than Helm 3.8: check when it came before adding it here.
HELM_38_FUNCTIONS = {
    # text/template (Go 1.17)
    "and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge", "index", "len", "print", "printf",
    "println", "slice", "html", "js", "urlquery", "call",
    # sprig 3.2
    "default", "empty", "coalesce", "ternary", "quote", "squote", "trim", "trimPrefix",
    "trimSuffix", "trunc", "upper", "lower", "replace", "contains", "hasPrefix", "hasSuffix",
    "snakecase", "splitList", "join", "list", "first", "last", "has", "uniq", "dict", "get", "set",
    "hasKey", "keys", "merge", "mergeOverwrite", "deepCopy", "kindIs", "typeOf", "toString", "int",
    "toStrings", "b64enc", "b64dec", "sha256sum", "randAlphaNum", "regexMatch", "semverCompare",
    "nindent", "indent", "fail",
    # Helm
    "include", "tpl", "required", "lookup", "toYaml", "fromYaml", "toJson", "fromJson",
}
# Keywords of actions, and the ones newer than Go 1.17 (break, continue: 1.18; else with: 1.23).
TEMPLATE_KEYWORDS = {"if", "else", "end", "range", "with", "define", "template", "block", "nil", "true", "false"}


def check_helm_38(f):
    """The templates use nothing newer than Helm 3.8 (built with Go 1.17): only its functions, no
    break, continue or else-with, and no `and`/`or` whose later arguments index what an earlier one
    guards (Go 1.17 evaluates every argument of `and` and `or`)."""
    import re

    for path in sorted((CHART / "templates").iterdir()):
        text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", path.read_text(), flags=re.S)
        for action in re.findall(r"\{\{-?(.*?)-?\}\}", text, flags=re.S):
            code = re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', '""', action)
            where = f"{path.name}: {{{{{action.strip()[:60]}}}}}"
            for name in re.findall(r"(?:^|[(|]|:?=)\s*([A-Za-z_][A-Za-z0-9_]*)", code):
                f.check(
                    name in HELM_38_FUNCTIONS or name in TEMPLATE_KEYWORDS,
                    where,
                    f"{name} is not a function Helm 3.8 is known to have",
                )
            f.check(not re.search(r"^\s*(break|continue)\b|^\s*else\s+with\b", code), where, "needs Go 1.18 or later")
            f.check(not re.search(r"\b(and|or)\b.*\bindex\b", code), where, "and/or with index: Go 1.17 evaluates every argument")


def check():
    f = Failures()
    check_helm_38(f)
    if not os.environ.get("BERTH_BIN"):
        print("chart: BERTH_BIN unset: the rendered settings are not fed to the binary", file=sys.stderr)
    check_schema_rejects(f)
    check_agent_rollout(f)
    for name, values in value_sets().items():
        check_lint(f, name, values)
        count, kinds = check_value_set(f, name, values)
        print(f"chart: {name}: {count} manifests ({', '.join(kinds)})")
    if f.items:
        for item in f.items:
            print(f"FAIL {item}", file=sys.stderr)
        print(f"chart: {len(f.items)} failures", file=sys.stderr)
        return 1
    print(
        f"chart: {len(value_sets())} value sets rendered, linted and valid for Kubernetes "
        f"{' and '.join(SUPPORTED_KUBERNETES)}"
    )
    return 0


def rbac(values_json):
    values = json.loads(values_json) if values_json else {}
    print(json.dumps(component_rules(render(values), values)))
    return 0


def agent(values_json):
    values = json.loads(values_json) if values_json else {}
    containers = one(render(values), "DaemonSet", "-agent")["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "agent"]
    print(json.dumps({"args": container["args"], "env": container.get("env", [])}))
    return 0


def admission(values_json):
    values = json.loads(values_json) if values_json else {}
    docs = render(values)
    print(json.dumps({
        "policies": by_kind(docs, "ValidatingAdmissionPolicy"),
        "bindings": by_kind(docs, "ValidatingAdmissionPolicyBinding"),
    }))
    return 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "check":
        return check()
    if len(argv) >= 2 and argv[1] == "rbac":
        return rbac(argv[2] if len(argv) > 2 else "")
    if len(argv) >= 2 and argv[1] == "agent":
        return agent(argv[2] if len(argv) > 2 else "")
    if len(argv) >= 2 and argv[1] == "admission":
        return admission(argv[2] if len(argv) > 2 else "")
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
