//! Properties over random pod populations: membership, slice bounds, and that
//! planning from any earlier state converges on the desired endpoints.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

mod common;

use std::collections::BTreeMap;

use berth_endpoints::{
    build_endpoints, compute_desired_slices, plan_endpoint_slices, NodeZones, SliceConfig,
    MAX_ENDPOINTS_ADDRESSES,
};
use common::{apply_plan, mk_pod, mk_service, named, PodArgs};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;

/// How one generated pod differs from a plain ready one.
#[derive(Debug, Clone)]
struct PodShape {
    ready: bool,
    terminating: bool,
    has_ip: bool,
    terminal: bool,
    foreign_namespace: bool,
    /// 0: http on 8080, 1: http on 9090, 2: no http port.
    http: u8,
    node: u32,
}

fn shape() -> impl Strategy<Value = PodShape> {
    (
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        0u8..3,
        0u32..5,
    )
        .prop_map(
            |(ready, terminating, has_ip, terminal, foreign_namespace, http, node)| PodShape {
                ready,
                terminating,
                has_ip,
                terminal,
                foreign_namespace,
                http,
                node,
            },
        )
}

fn service() -> Service {
    // "http" is named (resolved per pod), "admin" is a fixed number.
    mk_service(
        "web",
        &[
            ("http", IntOrString::String("http".into())),
            ("admin", IntOrString::Int(7000)),
        ],
    )
}

fn build_pod(index: u32, s: &PodShape) -> Pod {
    let ports = match s.http {
        0 => vec![("http", 8080)],
        1 => vec![("http", 9090)],
        _ => vec![],
    };
    let mut pod = mk_pod(&PodArgs {
        app: "web",
        index,
        ready: s.ready,
        terminating: s.terminating,
        node: s.node,
        ports,
    });
    let status = pod.status.as_mut().unwrap();
    if !s.has_ip {
        status.pod_ip = None;
        status.pod_ips = None;
    }
    if s.terminal {
        status.phase = Some("Failed".into());
    }
    if s.foreign_namespace {
        pod.metadata.namespace = Some("other".into());
    }
    pod
}

fn pods(shapes: &[PodShape]) -> Vec<Pod> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| build_pod(i as u32, s))
        .collect()
}

fn counts_in_slices(slices: &[EndpointSlice]) -> BTreeMap<(String, String), usize> {
    let mut counts = BTreeMap::new();
    for slice in slices {
        let port_names: Vec<String> = slice
            .ports
            .iter()
            .flatten()
            .map(|p| p.name.clone().unwrap_or_default())
            .collect();
        for ep in &slice.endpoints {
            let pod = ep.target_ref.as_ref().unwrap().name.clone().unwrap();
            for port in &port_names {
                *counts.entry((pod.clone(), port.clone())).or_default() += 1;
            }
            if port_names.is_empty() {
                *counts.entry((pod, String::new())).or_default() += 1;
            }
        }
    }
    counts
}

/// (address type, sorted ports, endpoint) of every endpoint, as a sorted list.
fn content(slices: &[EndpointSlice]) -> Vec<String> {
    let mut all: Vec<String> = slices
        .iter()
        .flat_map(|s| {
            let mut ports: Vec<String> = s
                .ports
                .iter()
                .flatten()
                .map(|p| format!("{:?}/{:?}", p.name, p.port))
                .collect();
            ports.sort();
            s.endpoints
                .iter()
                .map(move |e| format!("{} {:?} {:?}", s.address_type, ports, e))
        })
        .collect();
    all.sort();
    all
}

fn zones() -> NodeZones {
    let mut nodes = NodeZones::new();
    for n in 0..5 {
        nodes.insert(format!("node-{n}"), Some(format!("zone-{}", n % 2)));
    }
    nodes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_usable_pod_appears_once_per_port(
        shapes in prop::collection::vec(shape(), 0..250),
        max in 1usize..60,
    ) {
        let svc = service();
        let pods = pods(&shapes);
        let config = SliceConfig::new(max).unwrap();
        let desired = compute_desired_slices(&svc, &pods, &zones()).value.unwrap();
        let slices = desired.build_slices(&config);
        let counts = counts_in_slices(&slices);

        for (i, s) in shapes.iter().enumerate() {
            let name = format!("web-{i}");
            let usable = s.has_ip && !s.terminal && !s.foreign_namespace;
            let http = usize::from(usable && s.http < 2);
            let admin = usize::from(usable);
            prop_assert_eq!(counts.get(&(name.clone(), "http".into())).copied().unwrap_or(0), http);
            prop_assert_eq!(counts.get(&(name.clone(), "admin".into())).copied().unwrap_or(0), admin);
            prop_assert_eq!(counts.get(&(name, String::new())).copied().unwrap_or(0), 0);
        }
        for slice in &slices {
            prop_assert!(slice.endpoints.len() <= max);
            // One port number per slice and port name: pods with 8080 and 9090 never mix.
            let names: Vec<_> = slice.ports.iter().flatten().map(|p| p.name.clone()).collect();
            let mut dedup = names.clone();
            dedup.dedup();
            prop_assert_eq!(names, dedup);
        }
    }

    #[test]
    fn endpoints_list_each_pod_once_per_port(shapes in prop::collection::vec(shape(), 0..250)) {
        let svc = service();
        let pods = pods(&shapes);
        let endpoints = build_endpoints(&svc, &pods).value.unwrap();
        // (pod, port name) -> (times listed ready, times listed not ready)
        let mut seen = BTreeMap::<(String, String), (usize, usize)>::new();
        let mut total = 0;
        for subset in endpoints.subsets.iter().flatten() {
            for port in subset.ports.iter().flatten() {
                let port = port.name.clone().unwrap();
                for a in subset.addresses.iter().flatten() {
                    let pod = a.target_ref.as_ref().unwrap().name.clone().unwrap();
                    seen.entry((pod, port.clone())).or_default().0 += 1;
                }
                for a in subset.not_ready_addresses.iter().flatten() {
                    let pod = a.target_ref.as_ref().unwrap().name.clone().unwrap();
                    seen.entry((pod, port.clone())).or_default().1 += 1;
                }
            }
            total += subset.addresses.as_ref().map_or(0, Vec::len);
            total += subset.not_ready_addresses.as_ref().map_or(0, Vec::len);
        }
        prop_assert!(total <= MAX_ENDPOINTS_ADDRESSES);
        for (i, s) in shapes.iter().enumerate() {
            let name = format!("web-{i}");
            let listed = s.has_ip && !s.terminal && !s.foreign_namespace && !s.terminating;
            let once = if s.ready { (1, 0) } else { (0, 1) };
            let want = |serves: bool| if listed && serves { once } else { (0, 0) };
            let got = |port: &str| seen.get(&(name.clone(), port.to_string())).copied().unwrap_or((0, 0));
            prop_assert_eq!(got("admin"), want(true));
            prop_assert_eq!(got("http"), want(s.http < 2));
        }
    }

    #[test]
    fn planning_from_any_state_converges(
        before in prop::collection::vec(shape(), 0..150),
        after in prop::collection::vec(shape(), 0..150),
        max in 1usize..40,
    ) {
        let svc = service();
        let config = SliceConfig::new(max).unwrap();
        let old = compute_desired_slices(&svc, &pods(&before), &zones()).value.unwrap();
        let existing = named(old.build_slices(&config));

        let new = compute_desired_slices(&svc, &pods(&after), &zones()).value.unwrap();
        let plan = plan_endpoint_slices(&new, &existing, &config);
        let mut counter = 1000;
        let applied = apply_plan(&existing, &plan, &mut counter);

        prop_assert_eq!(content(&applied), content(&new.build_slices(&config)));
        for slice in &applied {
            prop_assert!(slice.endpoints.len() <= max);
            // An empty slice is only ever the placeholder of an address type without endpoints.
            if slice.endpoints.is_empty() {
                let same_type = applied.iter().filter(|s| s.address_type == slice.address_type).count();
                prop_assert_eq!(same_type, 1, "stray empty slice {:?}", slice.metadata.name);
            }
        }
        let again = plan_endpoint_slices(&new, &applied, &config);
        prop_assert!(again.is_empty(), "not converged: {:?}", again);
        // Every existing slice is kept, rewritten or deleted: exactly one of them.
        let mut accounted: Vec<String> = plan
            .unchanged
            .iter()
            .chain(&plan.delete)
            .cloned()
            .chain(plan.update.iter().map(|s| s.metadata.name.clone().unwrap()))
            .collect();
        accounted.sort();
        let mut all: Vec<String> = existing.iter().map(|s| s.metadata.name.clone().unwrap()).collect();
        all.sort();
        prop_assert_eq!(accounted, all);
    }
}
