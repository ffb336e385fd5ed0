//! Whether RBAC rules allow requests, as the RBAC authorizer decides it, and the chart's rules
//! for each component, rendered by the real Helm engine (`scripts/chart.py rbac`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use berth_lab::{LabApiServerHandle, RecordedRequest};
use serde::Deserialize;
use serde_json::Value;

/// Rules the chart grants that no scenario exercises, and why they stay. Each is
/// `(component, api group, resource, verb, why)`.
const KEPT: &[(&str, &str, &str, &str, &str)] = &[];

// ---------------------------------------------------------------------------------------------
// Rules and requests.

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// `None`: a ClusterRole bound cluster-wide; `Some(ns)`: a Role (or binding) in `ns`.
    namespace: Option<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChartRules {
    pub controller: Vec<Rule>,
    pub agent: Vec<Rule>,
}

/// `resource` or `resource/subresource`, as RBAC names it.
pub fn rbac_resource(r: &RecordedRequest) -> String {
    if r.subresource.is_empty() {
        r.resource.clone()
    } else {
        format!("{}/{}", r.resource, r.subresource)
    }
}

/// Whether `rule` allows `request`, as the RBAC authorizer decides it.
pub fn allows(rule: &Rule, request: &RecordedRequest) -> bool {
    let in_scope = match &rule.namespace {
        None => true,
        Some(ns) => *ns == request.namespace,
    };
    let named = rule.resource_names.is_empty()
        || (!request.name.is_empty()
            && matches!(request.verb.as_str(), "get" | "update" | "patch" | "delete")
            && rule.resource_names.contains(&request.name));
    in_scope
        && named
        && rule.api_groups.contains(&request.api_group)
        && rule.resources.contains(&rbac_resource(request))
        && rule.verbs.contains(&request.verb)
}

/// The requests no rule allows.
pub fn denied<'a>(rules: &[Rule], requests: &'a [RecordedRequest]) -> Vec<&'a RecordedRequest> {
    requests
        .iter()
        .filter(|r| !rules.iter().any(|rule| allows(rule, r)))
        .collect()
}

/// `(group, resource, verb)` granted by some rule that no request used (nor `KEPT` explains).
pub fn unused(
    component: &str,
    rules: &[Rule],
    requests: &[RecordedRequest],
) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in &rule.api_groups {
            for resource in &rule.resources {
                for verb in &rule.verbs {
                    let used = requests.iter().any(|r| {
                        r.api_group == *group
                            && rbac_resource(r) == *resource
                            && r.verb == *verb
                            && allows(rule, r)
                    });
                    let kept = KEPT.iter().any(|(c, g, res, v, _why)| {
                        *c == component && g == group && res == resource && v == verb
                    });
                    if !used && !kept {
                        out.insert((group.clone(), resource.clone(), verb.clone()));
                    }
                }
            }
        }
    }
    out
}

pub fn requests_of(server: &LabApiServerHandle, token: &str) -> Vec<RecordedRequest> {
    server
        .recorded_requests()
        .into_iter()
        .filter(|r| r.identity == token)
        .collect()
}

pub fn summary(requests: &[RecordedRequest]) -> BTreeSet<String> {
    requests
        .iter()
        .map(|r| {
            format!(
                "{} {}/{} ns={:?}",
                r.verb,
                if r.api_group.is_empty() {
                    "core"
                } else {
                    &r.api_group
                },
                rbac_resource(r),
                r.namespace
            )
        })
        .collect()
}

/// Both directions for one component; the problems found, empty when the rules are exact.
pub fn compare(component: &str, rules: &[Rule], requests: &[RecordedRequest]) -> Vec<String> {
    assert!(!requests.is_empty(), "{component} made no requests at all");
    let mut problems: Vec<String> = denied(rules, requests)
        .into_iter()
        .map(|r| format!("{component}: the chart does not allow {r:?}"))
        .collect();
    for (group, resource, verb) in unused(component, rules, requests) {
        problems.push(format!(
            "{component}: the chart grants {verb} on {group:?} {resource}, which no scenario used"
        ));
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The table in docs/rbac.md: each rule, the value sets that grant it and the scenarios that used it.

/// One scenario of a component: its label in the table, the rules its values render, and the
/// requests it made.
pub struct Run<'a> {
    pub label: &'a str,
    pub rules: &'a [Rule],
    pub requests: &'a [RecordedRequest],
}

const VERB_ORDER: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// The Markdown table of `component`'s rules over `runs`: one row per scope, API group, resource
/// and the runs that grant and use it, with the verbs that share them.
pub fn table(component: &str, runs: &[Run]) -> String {
    type Key = (String, String, String, String);
    let mut seen: BTreeMap<Key, (Vec<&str>, Vec<&str>)> = BTreeMap::new();
    for run in runs {
        for rule in run.rules {
            let scope = rule
                .namespace
                .as_ref()
                .map_or_else(|| "cluster".to_owned(), |ns| format!("namespace {ns}"));
            for group in &rule.api_groups {
                for resource in &rule.resources {
                    for verb in &rule.verbs {
                        let key = (scope.clone(), group.clone(), resource.clone(), verb.clone());
                        let (granted, used) = seen.entry(key).or_default();
                        if !granted.contains(&run.label) {
                            granted.push(run.label);
                        }
                        let hit = run.requests.iter().any(|r| {
                            r.api_group == *group
                                && rbac_resource(r) == *resource
                                && r.verb == *verb
                                && allows(rule, r)
                        });
                        if hit && !used.contains(&run.label) {
                            used.push(run.label);
                        }
                    }
                }
            }
        }
    }
    let mut rows: BTreeMap<(String, String, String, String, String), Vec<String>> = BTreeMap::new();
    for ((scope, group, resource, verb), (granted, used)) in seen {
        let granted = if granted.len() == runs.len() {
            "always".to_owned()
        } else {
            granted.join("; ")
        };
        let kept = KEPT.iter().find(|(c, g, res, v, _)| {
            *c == component && *g == group && *res == resource && *v == verb
        });
        let used = match (used.is_empty(), kept) {
            (false, _) => used.join("; "),
            (true, Some((.., why))) => format!("kept: {why}"),
            (true, None) => "nothing (the test fails)".to_owned(),
        };
        let group = if group.is_empty() {
            "core".to_owned()
        } else {
            group
        };
        rows.entry((scope, group, resource, granted, used))
            .or_default()
            .push(verb);
    }
    let mut out = String::from(
        "| Scope | API group | Resource | Verbs | Granted with | Exercised by |\n|---|---|---|---|---|---|\n",
    );
    for ((scope, group, resource, granted, used), mut verbs) in rows {
        verbs.sort_by_key(|v| VERB_ORDER.iter().position(|o| o == v).unwrap_or(usize::MAX));
        out.push_str(&format!(
            "| {scope} | {group} | {resource} | {} | {granted} | {used} |\n",
            verbs.join(", ")
        ));
    }
    out
}

/// Checks the table between `<!-- BEGIN {section} -->` and `<!-- END {section} -->` in
/// docs/rbac.md against `generated`; with `BERTH_UPDATE_DOCS=1` it rewrites the table instead.
/// The problem, if the docs are out of date.
pub fn check_docs(section: &str, generated: &str) -> Option<String> {
    let path = repo().join("docs/rbac.md");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let (begin, end) = (
        format!("<!-- BEGIN {section} -->\n"),
        format!("<!-- END {section} -->"),
    );
    let Some((head, rest)) = text.split_once(&begin) else {
        return Some(format!("{} has no `{}`", path.display(), begin.trim()));
    };
    let Some((current, tail)) = rest.split_once(&end) else {
        return Some(format!("{} has no `{end}`", path.display()));
    };
    if current == generated {
        return None;
    }
    if std::env::var("BERTH_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, format!("{head}{begin}{generated}{end}{tail}")).unwrap();
        return None;
    }
    Some(format!(
        "the {section} table in {} is out of date (BERTH_UPDATE_DOCS=1 rewrites it); it should read:\n{generated}",
        path.display()
    ))
}

// ---------------------------------------------------------------------------------------------
// The chart's rules, rendered by the real Helm engine.

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, or `None` (with the reason printed) where it is missing outside CI.
pub fn python() -> Option<PathBuf> {
    let python = repo().join(".venv/bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import helm_python, yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ready {
        return Some(python);
    }
    let why = format!(
        "{} with helm-python-sdk is missing (run `make deps`)",
        python.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipping: {why}");
    None
}

/// `scripts/chart.py <command> <values>`: the chart rendered with `values`, read as JSON.
fn chart_py(python: &Path, command: &str, values: Value) -> Value {
    let out = Command::new(python)
        .arg(repo().join("scripts/chart.py"))
        .arg(command)
        .arg(values.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rendering the chart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The agent container of the chart's DaemonSet rendered with `values`: its arguments and its
/// environment as the pod spec gives it.
pub fn chart_agent_container(python: &Path, values: Value) -> (Vec<String>, Vec<Value>) {
    let container = chart_py(python, "agent", values);
    (
        serde_json::from_value(container["args"].clone()).unwrap(),
        serde_json::from_value(container["env"].clone()).unwrap(),
    )
}

pub fn chart_rules(python: &Path, values: Value) -> ChartRules {
    serde_json::from_value(chart_py(python, "rbac", values)).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_allow_what_rbac_allows() {
        let rule =
            |ns: Option<&str>, group: &str, resources: &[&str], verbs: &[&str], names: &[&str]| {
                Rule {
                    namespace: ns.map(str::to_owned),
                    api_groups: vec![group.into()],
                    resources: resources.iter().map(|s| (*s).into()).collect(),
                    verbs: verbs.iter().map(|s| (*s).into()).collect(),
                    resource_names: names.iter().map(|s| (*s).into()).collect(),
                }
            };
        let request = |verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str| {
            RecordedRequest {
                identity: "t".into(),
                verb: verb.into(),
                api_group: group.into(),
                resource: resource.into(),
                subresource: sub.into(),
                namespace: ns.into(),
                name: name.into(),
                count: 1,
            }
        };
        let services = rule(None, "", &["services"], &["list", "patch"], &[]);
        assert!(allows(
            &services,
            &request("patch", "", "services", "", "web", "a")
        ));
        assert!(allows(
            &services,
            &request("list", "", "services", "", "", "")
        ));
        assert!(!allows(
            &services,
            &request("patch", "", "services", "status", "web", "a")
        ));
        assert!(!allows(
            &services,
            &request("delete", "", "services", "", "web", "a")
        ));
        assert!(!allows(
            &services,
            &request("list", "apps", "services", "", "", "")
        ));
        let status = rule(None, "", &["services/status"], &["patch"], &[]);
        assert!(allows(
            &status,
            &request("patch", "", "services", "status", "web", "a")
        ));
        let lease = rule(
            Some("berth-system"),
            "coordination.k8s.io",
            &["leases"],
            &["get", "create"],
            &[],
        );
        assert!(allows(
            &lease,
            &request(
                "get",
                "coordination.k8s.io",
                "leases",
                "",
                "berth-system",
                "l"
            )
        ));
        assert!(!allows(
            &lease,
            &request(
                "get",
                "coordination.k8s.io",
                "leases",
                "",
                "kube-system",
                "l"
            )
        ));
        assert!(!allows(
            &lease,
            &request("get", "coordination.k8s.io", "leases", "", "", "")
        ));
        let named = rule(None, "", &["nodes"], &["get", "list"], &["n1"]);
        assert!(allows(&named, &request("get", "", "nodes", "", "", "n1")));
        assert!(!allows(&named, &request("get", "", "nodes", "", "", "n2")));
        assert!(!allows(&named, &request("list", "", "nodes", "", "", "")));

        let rules = vec![services.clone()];
        let used = [request("list", "", "services", "", "", "")];
        assert_eq!(
            unused("x", &rules, &used),
            BTreeSet::from([("".to_owned(), "services".to_owned(), "patch".to_owned())])
        );
        assert_eq!(
            denied(&rules, &[request("watch", "", "services", "", "", "")]).len(),
            1
        );
    }

    #[test]
    fn the_table_groups_verbs_by_who_grants_and_uses_them() {
        let rule = |ns: Option<&str>, resources: &[&str], verbs: &[&str]| Rule {
            namespace: ns.map(str::to_owned),
            api_groups: vec![String::new()],
            resources: resources.iter().map(|s| (*s).into()).collect(),
            verbs: verbs.iter().map(|s| (*s).into()).collect(),
            resource_names: Vec::new(),
        };
        let request = |verb: &str, resource: &str, ns: &str| RecordedRequest {
            identity: "t".into(),
            verb: verb.into(),
            api_group: String::new(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: ns.into(),
            name: "x".into(),
            count: 1,
        };
        let base = [rule(None, &["services"], &["watch", "list", "patch"])];
        let more = [
            rule(None, &["services"], &["watch", "list", "patch"]),
            rule(Some("ns"), &["configmaps"], &["get"]),
        ];
        let a = [
            request("list", "services", ""),
            request("watch", "services", ""),
        ];
        let b = [
            request("list", "services", ""),
            request("watch", "services", ""),
            request("patch", "services", "web"),
        ];
        let runs = [
            Run {
                label: "a",
                rules: &base,
                requests: &a,
            },
            Run {
                label: "b",
                rules: &more,
                requests: &b,
            },
        ];
        assert_eq!(
            table("x", &runs),
            "| Scope | API group | Resource | Verbs | Granted with | Exercised by |\n\
             |---|---|---|---|---|---|\n\
             | cluster | core | services | list, watch | always | a; b |\n\
             | cluster | core | services | patch | always | b |\n\
             | namespace ns | core | configmaps | get | b | nothing (the test fails) |\n"
        );
    }
}
