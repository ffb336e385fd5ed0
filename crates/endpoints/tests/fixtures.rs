//! Table tests: each `fixtures/*.yaml` holds a Service, pods (listed, or
//! generated from a template) and the expected Endpoints and EndpointSlices,
//! compared as JSON, or a summary of them for large cases.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;

use berth_endpoints::{
    build_endpoint_slices, build_endpoints, compute_desired_slices, plan_endpoint_slices,
    NodeZones, SliceConfig, ANNOTATION_OVER_CAPACITY,
};
use k8s_openapi::api::core::v1::{Endpoints, Pod, PodCondition, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Fixture {
    #[allow(dead_code)]
    description: String,
    max_endpoints_per_slice: Option<usize>,
    /// Node -> zone. Absent: every node a pod names exists, without a zone.
    nodes: Option<BTreeMap<String, Option<String>>>,
    service: Service,
    #[serde(default)]
    pods: Vec<Pod>,
    generate: Option<Generate>,
    expected: Option<Expected>,
    summary: Option<Summary>,
    #[serde(default)]
    skipped: Vec<String>,
}

/// `count` copies of `template`, named `<name>-<i>`, with IPs counting up
/// from `ipv4Base + 1`; those from index `notReadyFrom` on are not Ready.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Generate {
    count: u32,
    template: Pod,
    ipv4_base: Ipv4Addr,
    not_ready_from: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expected {
    endpoints: Value,
    slices: Value,
}

#[derive(Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Summary {
    /// Address type and endpoint count of each slice, in order.
    slices: Vec<(String, usize)>,
    ready_addresses: usize,
    not_ready_addresses: usize,
    over_capacity: bool,
}

fn generated(g: &Generate) -> Vec<Pod> {
    (0..g.count)
        .map(|i| {
            let mut pod = g.template.clone();
            let base = pod.metadata.name.clone().unwrap();
            pod.metadata.name = Some(format!("{base}-{i}"));
            pod.metadata.uid = Some(format!("{base}-uid-{i}"));
            let ip = Ipv4Addr::from(u32::from(g.ipv4_base) + i + 1).to_string();
            let status = pod.status.get_or_insert_with(Default::default);
            status.pod_ip = Some(ip.clone());
            status.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP { ip }]);
            let ready = g.not_ready_from.is_none_or(|from| i < from);
            status.conditions = Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]);
            pod
        })
        .collect()
}

fn node_zones(fixture: &Fixture, pods: &[Pod]) -> NodeZones {
    let mut zones = NodeZones::new();
    match &fixture.nodes {
        Some(nodes) => {
            for (node, zone) in nodes {
                zones.insert(node.clone(), zone.clone());
            }
        }
        None => {
            for pod in pods {
                if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    zones.insert(node, None);
                }
            }
        }
    }
    zones
}

fn summarize(endpoints: &Option<Endpoints>, slices: &Option<Vec<EndpointSlice>>) -> Summary {
    let endpoints = endpoints.as_ref().unwrap();
    let subsets = endpoints.subsets.iter().flatten();
    Summary {
        slices: slices
            .iter()
            .flatten()
            .map(|s| (s.address_type.clone(), s.endpoints.len()))
            .collect(),
        ready_addresses: subsets
            .clone()
            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
            .sum(),
        not_ready_addresses: subsets
            .map(|s| s.not_ready_addresses.as_ref().map_or(0, Vec::len))
            .sum(),
        over_capacity: endpoints
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANNOTATION_OVER_CAPACITY)),
    }
}

fn run(path: &Path) {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let fixture: Fixture =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: cannot parse: {e}"));
    let mut pods = fixture.pods.clone();
    if let Some(g) = &fixture.generate {
        pods.extend(generated(g));
    }
    let nodes = node_zones(&fixture, &pods);
    let config = match fixture.max_endpoints_per_slice {
        Some(max) => SliceConfig::new(max).unwrap(),
        None => SliceConfig::default(),
    };

    let endpoints = build_endpoints(&fixture.service, &pods);
    let slices = build_endpoint_slices(&fixture.service, &pods, &nodes, &config);

    if let Some(expected) = &fixture.expected {
        let got = serde_json::to_value(&endpoints.value).unwrap();
        assert_eq!(
            got,
            expected.endpoints,
            "{name}: Endpoints differ; got\n{}",
            serde_yaml::to_string(&got).unwrap()
        );
        let got = serde_json::to_value(&slices.value).unwrap();
        assert_eq!(
            got,
            expected.slices,
            "{name}: EndpointSlices differ; got\n{}",
            serde_yaml::to_string(&got).unwrap()
        );
    }
    if let Some(summary) = &fixture.summary {
        assert_eq!(
            &summarize(&endpoints.value, &slices.value),
            summary,
            "{name}: summary differs"
        );
    }
    assert!(
        fixture.expected.is_some() || fixture.summary.is_some(),
        "{name}: expects nothing"
    );

    let skipped: BTreeSet<String> = endpoints
        .skipped
        .iter()
        .chain(&slices.skipped)
        .map(ToString::to_string)
        .collect();
    let expected_skipped: BTreeSet<String> = fixture.skipped.iter().cloned().collect();
    assert_eq!(skipped, expected_skipped, "{name}: skipped inputs differ");

    // The order in which pods arrive never changes the result.
    let mut reversed = pods.clone();
    reversed.reverse();
    assert_eq!(
        build_endpoints(&fixture.service, &reversed).value,
        endpoints.value,
        "{name}"
    );
    assert_eq!(
        build_endpoint_slices(&fixture.service, &reversed, &nodes, &config).value,
        slices.value,
        "{name}"
    );

    // The planner creates exactly these slices from nothing, and then has nothing to do.
    if let Some(desired) = compute_desired_slices(&fixture.service, &pods, &nodes).value {
        let from_scratch = plan_endpoint_slices(&desired, &[], &config);
        assert_eq!(Some(&from_scratch.create), slices.value.as_ref(), "{name}");
        assert!(from_scratch.update.is_empty() && from_scratch.delete.is_empty());
        let existing = common::named(from_scratch.create);
        let again = plan_endpoint_slices(&desired, &existing, &config);
        assert!(
            again.is_empty(),
            "{name}: second plan is not a no-op: {again:?}"
        );
        assert_eq!(again.unchanged.len(), existing.len(), "{name}");
    }
}

#[test]
fn fixtures() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 12, "fixtures missing from {}", dir.display());
    for path in paths {
        run(&path);
    }
}
