//! The Helm chart against the binary it installs: its CRDs are exactly `berth crds`, and its
//! values map 1:1 to the flags of `berth controller --help` and `berth agent --help` (every flag
//! has a value, every value is a flag, and a value's default is the flag's unless the chart says
//! why not). The chart's rendering, lint, schemas and RBAC are checked by `make test-chart` and
//! `tests/chart_rbac.rs`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn berth(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "berth {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The flags `--help` lists, each with its default when it has one (`--help` and `--version`
/// left out).
fn help_flags(help: &str) -> BTreeMap<String, Option<String>> {
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .strip_prefix("--")
            .or_else(|| trimmed.get(4..).and_then(|t| t.strip_prefix("--")));
        if line.starts_with("  ") && trimmed.starts_with('-') {
            if let Some(flag) = flag {
                let name = flag.split([' ', '<']).next().unwrap().to_owned();
                flags.insert(name.clone(), None);
                current = Some(name);
                continue;
            }
        }
        if let (Some(name), Some(start)) = (&current, line.find("[default: ")) {
            let rest = &line[start + "[default: ".len()..];
            let default = rest[..rest.find(']').unwrap()].to_owned();
            flags.insert(name.clone(), Some(default));
        }
    }
    flags.remove("help");
    flags.remove("version");
    flags
}

fn kebab(camel: &str) -> String {
    let mut out = String::new();
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn values() -> serde_yaml::Value {
    let text = std::fs::read_to_string(repo().join("charts/berth/values.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn value_text(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::String(s) => s.clone(),
        serde_yaml::Value::Bool(b) => b.to_string(),
        serde_yaml::Value::Number(n) => n.to_string(),
        serde_yaml::Value::Null => String::new(),
        other => panic!("a flag value must be a scalar, got {other:?}"),
    }
}

/// Compares one component's `config` section with its `--help`. `chart_set` are the flags the
/// chart sets itself (with the reason), `chart_defaults` the values whose default differs from
/// the binary's on purpose.
fn check_component(
    component: &str,
    chart_set: &[(&str, &str)],
    chart_defaults: &[(&str, &str, &str)],
) -> Vec<String> {
    let flags = help_flags(&berth(&[component, "--help"]));
    assert!(
        flags.len() > 5,
        "parsed too few flags from --help: {flags:?}"
    );
    let values = values();
    let config = values[component]["config"]
        .as_mapping()
        .unwrap_or_else(|| panic!("values.yaml has no {component}.config"));
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for (key, value) in config {
        let key = key.as_str().unwrap();
        let flag = kebab(key);
        seen.push(flag.clone());
        let Some(default) = flags.get(&flag) else {
            problems.push(format!(
                "{component}.config.{key}: `berth {component}` has no --{flag}"
            ));
            continue;
        };
        let value = value_text(value);
        let expected = match chart_defaults.iter().find(|(k, _, _)| *k == key) {
            Some((_, chart_default, _why)) => (*chart_default).to_owned(),
            // No default: empty (the binary decides) or, for a switch, false.
            None => default.clone().unwrap_or_default(),
        };
        let unset_switch = default.is_none() && value == "false";
        if value != expected && !unset_switch {
            problems.push(format!(
                "{component}.config.{key} is {value:?}, --{flag} defaults to {default:?}"
            ));
        }
    }
    for flag in flags.keys() {
        let set_by_chart = chart_set.iter().any(|(f, _)| f == flag);
        if set_by_chart == seen.contains(flag) {
            problems.push(if set_by_chart {
                format!("--{flag} is set by the chart and also has a value")
            } else {
                format!(
                    "`berth {component} --{flag}` has no value in values.yaml {component}.config"
                )
            });
        }
    }
    for (flag, _) in chart_set {
        if !flags.contains_key(*flag) {
            problems.push(format!(
                "the chart sets --{flag}, which `berth {component}` lacks"
            ));
        }
    }
    problems
}

#[test]
fn controller_values_are_its_flags() {
    let problems = check_component(
        "controller",
        &[
            ("kubeconfig", "in-cluster configuration"),
            ("identity", "the pod's name, from the Downward API"),
            (
                "external-ip-cidrs",
                "agent.config.externalIpCidrs: the controller reports what the agents leave out",
            ),
            (
                "max-service-ports",
                "agent.config.maxServicePorts, likewise",
            ),
            (
                "max-endpoints-per-service-port",
                "agent.config.maxEndpointsPerServicePort, likewise",
            ),
            (
                "max-service-endpoints",
                "agent.config.maxServiceEndpoints, likewise",
            ),
        ],
        &[
            (
                "adminListen",
                "0.0.0.0:9090",
                "probes reach the pod's address",
            ),
            (
                "leaseNamespace",
                "",
                "the release namespace, where the Role is",
            ),
            ("logFormat", "json", "structured logs in a cluster"),
        ],
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn agent_values_are_its_flags() {
    let problems = check_component(
        "agent",
        &[
            ("kubeconfig", "in-cluster configuration"),
            ("node-name", "spec.nodeName, from the Downward API"),
            (
                "cleanup",
                "an init container's argument when proxyMode is none, never the agent's",
            ),
            (
                "node-port-range",
                "controller.config.nodePortRange, so both accept the same node ports",
            ),
        ],
        &[
            ("logFormat", "json", "structured logs in a cluster"),
            (
                "membership",
                "on",
                "a dead agent's addresses move within a second",
            ),
            (
                "l2Announcer",
                "true",
                "LoadBalancer Services of the default l2 class answer",
            ),
            (
                "membershipKeyFile",
                "/etc/berth/membership/key",
                "where the chart mounts the membership Secret",
            ),
            (
                "membershipPreviousKeyFile",
                "/etc/berth/membership/previous",
                "where the chart mounts the Secret's accepted second key, if it has one",
            ),
            (
                "leaseNamespace",
                "",
                "the release namespace, where the Role is",
            ),
        ],
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn help_parsing_finds_flags_and_defaults() {
    let help = "Options:\n      --service-cidr <SERVICE_CIDR>\n          CIDRs [env: BERTH_SERVICE_CIDR=] [default: 10.96.0.0/16]\n      --masquerade-all\n          all [env: BERTH_MASQUERADE_ALL=]\n  -h, --help\n          Print help\n";
    let flags = help_flags(help);
    assert_eq!(
        flags,
        BTreeMap::from([
            ("masquerade-all".to_owned(), None),
            ("service-cidr".to_owned(), Some("10.96.0.0/16".to_owned())),
        ])
    );
    assert_eq!(kebab("maxEndpointsPerSlice"), "max-endpoints-per-slice");
}

#[test]
fn chart_crds_are_berth_crds() {
    let generated = berth(&["crds"]);
    let path = repo().join("charts/berth/crds/berth.dev.yaml");
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        shipped == generated,
        "{} differs from `berth crds`: run `make crds`",
        path.display()
    );
}
