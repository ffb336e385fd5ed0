//! Builders shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodCondition, PodIP, PodSpec, PodStatus, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use berth_endpoints::SlicePlan;

pub fn mk_service(name: &str, ports: &[(&str, IntOrString)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("{name}-uid")),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".into(), name.into())])),
            cluster_ip: Some("10.96.0.10".into()),
            ip_families: Some(vec!["IPv4".into()]),
            ports: Some(
                ports
                    .iter()
                    .enumerate()
                    .map(|(i, (port_name, target))| ServicePort {
                        name: Some((*port_name).into()),
                        port: 80 + i as i32,
                        target_port: Some(target.clone()),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
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
    let ip = format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256);
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("{}-{i}", args.app)),
            namespace: Some("default".into()),
            uid: Some(format!("{}-pod-{i}", args.app)),
            labels: Some(BTreeMap::from([("app".into(), args.app.into())])),
            deletion_timestamp: args
                .terminating
                .then(|| Time("2026-01-01T00:00:00Z".parse().unwrap())),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(format!("node-{}", args.node)),
            containers: vec![Container {
                name: "app".into(),
                ports: Some(
                    args.ports
                        .iter()
                        .map(|(name, number)| ContainerPort {
                            name: Some((*name).into()),
                            container_port: *number,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.clone()),
            pod_ips: Some(vec![PodIP { ip }]),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if args.ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
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
