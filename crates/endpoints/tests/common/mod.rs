//! Builders shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;

use berth_testing::{mk_selector_service, PodFacts};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use berth_endpoints::SlicePlan;

pub fn mk_service(name: &str, ports: &[(&str, IntOrString)]) -> Service {
    let ports: Vec<(&str, i32, IntOrString)> = ports
        .iter()
        .enumerate()
        .map(|(i, (port_name, target))| (*port_name, 80 + i as i32, target.clone()))
        .collect();
    mk_selector_service(
        "default",
        name,
        &format!("{name}-uid"),
        name,
        "10.96.0.10",
        &ports,
    )
}

pub struct PodArgs<'a> {
    pub app: &'a str,
    pub index: u32,
    pub ready: bool,
    pub terminating: bool,
    pub node: u32,
    /// Named container ports ("http" -> number).
    pub ports: Vec<(&'a str, i32)>,
}

pub fn mk_pod(args: &PodArgs<'_>) -> Pod {
    let i = args.index;
    berth_testing::mk_pod(&PodFacts {
        namespace: "default",
        name: format!("{}-{i}", args.app),
        uid: format!("{}-pod-{i}", args.app),
        app: args.app,
        node: format!("node-{}", args.node),
        ip: format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256),
        ready: args.ready,
        deleted_at: args.terminating.then_some("2026-01-01T00:00:00Z"),
        ports: &args.ports,
    })
}

/// What the API server would hold after the controller applied `plan` to
/// `existing`; created slices get `<generateName><counter>` names.
pub fn apply_plan(
    existing: &[EndpointSlice],
    plan: &SlicePlan,
    counter: &mut u32,
) -> Vec<EndpointSlice> {
    let mut by_name: BTreeMap<String, EndpointSlice> = existing
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap(), s.clone()))
        .collect();
    for name in &plan.delete {
        assert!(
            by_name.remove(name).is_some(),
            "delete of unknown slice {name}"
        );
    }
    for slice in &plan.update {
        let name = slice.metadata.name.clone().unwrap();
        assert!(
            by_name.contains_key(&name),
            "update of unknown slice {name}"
        );
        by_name.insert(name, slice.clone());
    }
    for slice in &plan.create {
        assert!(slice.metadata.name.is_none());
        let mut slice = slice.clone();
        let name = format!(
            "{}{counter:05}",
            slice.metadata.generate_name.clone().unwrap()
        );
        *counter += 1;
        slice.metadata.name = Some(name.clone());
        by_name.insert(name, slice);
    }
    by_name.into_values().collect()
}

/// Names slices as the API server would on create.
pub fn named(slices: Vec<EndpointSlice>) -> Vec<EndpointSlice> {
    let mut counter = 0;
    apply_plan(
        &[],
        &SlicePlan {
            create: slices,
            ..Default::default()
        },
        &mut counter,
    )
}
