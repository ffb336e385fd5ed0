//! Planner scenarios: what changes when the cluster changes a little.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

mod common;

use berth_endpoints::{
    compute_desired_slices, plan_endpoint_slices, DesiredSlices, NodeZones, SliceConfig,
    LABEL_MANAGED_BY,
};
use common::{apply_plan, mk_pod, mk_service, named, PodArgs};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn nodes() -> NodeZones {
    let mut nodes = NodeZones::new();
    for n in 0..4 {
        nodes.insert(format!("node-{n}"), Some(format!("zone-{}", n % 2)));
    }
    nodes
}

fn pod(i: u32, ready: bool) -> Pod {
    mk_pod(&PodArgs {
        app: "web",
        index: i,
        ready,
        terminating: false,
        node: i % 4,
        ports: vec![("http", 8080)],
    })
}

fn service() -> Service {
    mk_service("web", &[("http", IntOrString::String("http".into()))])
}

fn desired(service: &Service, pods: &[Pod]) -> DesiredSlices {
    compute_desired_slices(service, pods, &nodes())
        .value
        .unwrap()
}

fn config(max: usize) -> SliceConfig {
    SliceConfig::new(max).unwrap()
}

/// Slices as they stand once `pods` were reconciled from nothing.
fn established(service: &Service, pods: &[Pod], max: usize) -> Vec<EndpointSlice> {
    named(desired(service, pods).build_slices(&config(max)))
}

fn names(slices: &[EndpointSlice]) -> Vec<String> {
    slices
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect()
}

fn slice_holding(slices: &[EndpointSlice], pod_name: &str) -> String {
    slices
        .iter()
        .find(|s| {
            s.endpoints
                .iter()
                .any(|e| e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some(pod_name))
        })
        .and_then(|s| s.metadata.name.clone())
        .unwrap()
}

#[test]
fn readiness_change_rewrites_only_the_slice_holding_the_pod() {
    let svc = service();
    let mut pods: Vec<Pod> = (0..25).map(|i| pod(i, true)).collect();
    let existing = established(&svc, &pods, 10);
    assert_eq!(existing.len(), 3);
    let holder = slice_holding(&existing, "web-13");
    pods[13] = pod(13, false);

    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(names(&plan.update), vec![holder.clone()]);
    assert_eq!(plan.unchanged.len(), 2);
    let updated = &plan.update[0];
    assert_eq!(updated.endpoints.len(), 10);
    let ep = updated
        .endpoints
        .iter()
        .find(|e| e.target_ref.as_ref().unwrap().name.as_deref() == Some("web-13"))
        .unwrap();
    assert_eq!(ep.conditions.as_ref().unwrap().ready, Some(false));
    // The rewrite keeps the stored object's identity for conflict detection.
    let before = existing
        .iter()
        .find(|s| s.metadata.name.as_ref() == Some(&holder))
        .unwrap();
    assert_eq!(
        updated.metadata.owner_references,
        before.metadata.owner_references
    );
}

#[test]
fn removed_pod_is_taken_out_and_new_pod_fills_that_slice() {
    let svc = service();
    let mut pods: Vec<Pod> = (0..20).map(|i| pod(i, true)).collect();
    let existing = established(&svc, &pods, 10);
    let holder = slice_holding(&existing, "web-3");
    pods.retain(|p| p.metadata.name.as_deref() != Some("web-3"));
    pods.push(pod(100, true));

    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(names(&plan.update), vec![holder]);
    let updated = &plan.update[0];
    assert_eq!(updated.endpoints.len(), 10);
    assert!(updated
        .endpoints
        .iter()
        .any(|e| e.target_ref.as_ref().unwrap().name.as_deref() == Some("web-100")));
}

#[test]
fn new_pods_fill_the_unchanged_slice_closest_to_full_before_creating() {
    let svc = service();
    // 10 + 6: the second slice has room for 4.
    let mut pods: Vec<Pod> = (0..16).map(|i| pod(i, true)).collect();
    let existing = established(&svc, &pods, 10);
    let partial = existing
        .iter()
        .find(|s| s.endpoints.len() == 6)
        .and_then(|s| s.metadata.name.clone())
        .unwrap();
    pods.extend((16..19).map(|i| pod(i, true)));

    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(names(&plan.update), vec![partial]);
    assert_eq!(plan.update[0].endpoints.len(), 9);

    // More than fits anywhere: a new slice is created and nothing else moves.
    pods.extend((19..40).map(|i| pod(i, true)));
    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    assert!(plan.delete.is_empty());
    let created: usize = plan.create.iter().map(|s| s.endpoints.len()).sum();
    let topped: usize = plan.update.iter().map(|s| s.endpoints.len()).sum();
    assert_eq!(created + topped + 10, 40);
    assert!(plan.create.iter().all(|s| s.endpoints.len() <= 10));
}

#[test]
fn emptied_slice_is_recycled_for_a_slice_that_must_be_created() {
    let svc = service();
    let pods: Vec<Pod> = (0..10).map(|i| pod(i, true)).collect();
    let existing = established(&svc, &pods, 10);
    // Every pod now serves another port number: a new group replaces the old one.
    let moved: Vec<Pod> = (0..10)
        .map(|i| {
            mk_pod(&PodArgs {
                app: "web",
                index: i,
                ready: true,
                terminating: false,
                node: i % 4,
                ports: vec![("http", 9090)],
            })
        })
        .collect();
    let plan = plan_endpoint_slices(&desired(&svc, &moved), &existing, &config(10));
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(names(&plan.update), names(&existing));
    let ports = plan.update[0].ports.as_ref().unwrap();
    assert_eq!(ports[0].port, Some(9090));
}

#[test]
fn no_endpoints_leaves_one_placeholder() {
    let svc = service();
    let pods: Vec<Pod> = (0..25).map(|i| pod(i, true)).collect();
    let existing = established(&svc, &pods, 10);
    let plan = plan_endpoint_slices(&desired(&svc, &[]), &existing, &config(10));
    assert!(plan.create.is_empty());
    assert_eq!(plan.update.len(), 1);
    assert!(plan.update[0].endpoints.is_empty());
    assert_eq!(plan.update[0].ports.as_deref(), Some(&[][..]));
    assert_eq!(plan.delete.len(), 2);

    let mut counter = 100;
    let after = apply_plan(&existing, &plan, &mut counter);
    let again = plan_endpoint_slices(&desired(&svc, &[]), &after, &config(10));
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn placeholder_is_recycled_when_endpoints_appear() {
    let svc = service();
    let existing = established(&svc, &[], 10);
    assert_eq!(existing.len(), 1);
    assert!(existing[0].endpoints.is_empty());
    let pods: Vec<Pod> = (0..3).map(|i| pod(i, true)).collect();
    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    assert!(plan.create.is_empty() && plan.delete.is_empty() && plan.unchanged.is_empty());
    assert_eq!(names(&plan.update), names(&existing));
    assert_eq!(plan.update[0].endpoints.len(), 3);
    assert_eq!(plan.update[0].ports.as_ref().unwrap()[0].port, Some(8080));
}

#[test]
fn dropped_family_and_stale_owner_are_deleted_and_foreign_slices_ignored() {
    let mut svc = service();
    let spec = svc.spec.as_mut().unwrap();
    spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let pods: Vec<Pod> = (0..5).map(|i| pod(i, true)).collect();
    let mut existing = established(&svc, &pods, 10);
    assert_eq!(existing.len(), 2, "IPv4 slice and IPv6 placeholder");

    // A slice left by an older Service of the same name.
    let mut stale = existing[0].clone();
    stale.metadata.name = Some("web-stale".into());
    stale.metadata.owner_references.as_mut().unwrap()[0].uid = "old-uid".into();
    // A slice of another manager is not ours to touch.
    let mut foreign = existing[0].clone();
    foreign.metadata.name = Some("web-foreign".into());
    foreign.metadata.labels.as_mut().unwrap().insert(
        LABEL_MANAGED_BY.into(),
        "endpointslice-controller.k8s.io".into(),
    );
    existing.push(stale);
    existing.push(foreign);

    let spec = svc.spec.as_mut().unwrap();
    spec.ip_families = Some(vec!["IPv4".into()]);
    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    let v6 = existing
        .iter()
        .find(|s| s.address_type == "IPv6")
        .and_then(|s| s.metadata.name.clone())
        .unwrap();
    let mut expected = vec![v6, "web-stale".to_string()];
    expected.sort();
    assert_eq!(plan.delete, expected);
    assert!(plan.create.is_empty() && plan.update.is_empty());
    assert!(!plan.unchanged.contains(&"web-foreign".to_string()));
}

#[test]
fn service_label_change_relabels_every_slice() {
    let mut svc = service();
    let pods: Vec<Pod> = (0..25).map(|i| pod(i, true)).collect();
    let existing = established(&svc, &pods, 10);
    svc.metadata.labels = Some([("tier".to_string(), "front".to_string())].into());
    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    assert_eq!(plan.update.len(), 3);
    for (before, after) in existing.iter().zip(&plan.update) {
        assert_eq!(before.endpoints, after.endpoints);
        assert_eq!(
            after
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get("tier")
                .map(String::as_str),
            Some("front")
        );
    }
}

#[test]
fn duplicated_endpoint_is_kept_once() {
    let svc = service();
    let pods: Vec<Pod> = (0..4).map(|i| pod(i, true)).collect();
    let mut existing = established(&svc, &pods, 10);
    let mut copy = existing[0].clone();
    copy.metadata.name = Some("web-copy".into());
    copy.endpoints.truncate(1);
    existing.push(copy);
    let plan = plan_endpoint_slices(&desired(&svc, &pods), &existing, &config(10));
    let mut counter = 50;
    let after = apply_plan(&existing, &plan, &mut counter);
    let total: usize = after.iter().map(|s| s.endpoints.len()).sum();
    assert_eq!(total, 4);
}

#[test]
fn slice_config_rejects_out_of_range_limits() {
    assert!(SliceConfig::new(0).is_err());
    assert!(SliceConfig::new(1001).is_err());
    assert_eq!(
        SliceConfig::new(1000).unwrap().max_endpoints_per_slice(),
        1000
    );
    assert_eq!(SliceConfig::default().max_endpoints_per_slice(), 100);
    assert_eq!(
        SliceConfig::new(0).unwrap_err().to_string(),
        "max endpoints per slice must be between 1 and 1000, got 0"
    );
}
