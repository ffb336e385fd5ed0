use super::*;
use std::sync::Arc;

use berth_endpoints::{NodeZones, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY_BERTH};
use chrono::TimeZone;
use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::json;

fn mk_service(selector: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "web", "uid": "svc-uid"},
        "spec": {"selector": selector, "clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn mk_pod(name: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
                     "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

fn mk_inputs(service: Option<Service>, pods: Vec<Pod>) -> Inputs {
    let mut nodes = NodeZones::new();
    nodes.insert("n1", Some("z1".to_owned()));
    Inputs {
        service: service.map(Arc::new),
        pods,
        nodes: Arc::new(nodes),
        slices: Vec::new(),
        endpoints: None,
        trigger: None,
    }
}

fn trigger() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 7).single().unwrap()
}

/// What the API server would hold after applying `writes` to empty state.
fn stored(writes: &Writes) -> (Endpoints, Vec<EndpointSlice>) {
    let endpoints = match &writes.endpoints {
        Some(EndpointsWrite::Create(e)) => {
            let mut e = e.clone();
            e.metadata.resource_version = Some("1".to_owned());
            e
        }
        other => panic!("expected a create, got {other:?}"),
    };
    let slices = writes
        .slices
        .create
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = s.clone();
            s.metadata.name = Some(format!("web-{i}"));
            s.metadata.resource_version = Some("2".to_owned());
            s
        })
        .collect();
    (endpoints, slices)
}

#[test]
fn a_new_service_gets_endpoints_and_slices_stamped_with_the_trigger() {
    let mut inputs = mk_inputs(
        Some(mk_service(json!({"app": "web"}))),
        vec![mk_pod("a", "10.244.0.1"), mk_pod("b", "10.244.0.2")],
    );
    inputs.trigger = Some(trigger());
    let writes = plan_sync(&inputs, &SliceConfig::default());
    let (endpoints, slices) = stored(&writes);
    let stamp = |a: &Option<BTreeMap<String, String>>| {
        a.as_ref()
            .and_then(|a| a.get(ENDPOINTS_LAST_CHANGE_TRIGGER_TIME))
            .cloned()
    };
    assert_eq!(
        stamp(&endpoints.metadata.annotations).as_deref(),
        Some("2026-03-04T05:06:07Z")
    );
    assert_eq!(slices.len(), 1);
    let slice = &slices[0];
    assert_eq!(
        stamp(&slice.metadata.annotations).as_deref(),
        Some("2026-03-04T05:06:07Z")
    );
    assert_eq!(slice.endpoints.len(), 2);
    let labels = slice.metadata.labels.clone().unwrap();
    assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY_BERTH);
    assert_eq!(labels[LABEL_SERVICE_NAME], "web");
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        ("svc-uid", Some(true))
    );
    assert!(writes.slices.update.is_empty() && writes.slices.delete.is_empty());
}

#[test]
fn a_sync_of_what_is_already_stored_writes_nothing() {
    let pods = vec![mk_pod("a", "10.244.0.1")];
    let inputs = mk_inputs(Some(mk_service(json!({"app": "web"}))), pods.clone());
    let (endpoints, slices) = stored(&plan_sync(&inputs, &SliceConfig::default()));
    let mut again = mk_inputs(Some(mk_service(json!({"app": "web"}))), pods);
    again.endpoints = Some(Arc::new(StoredEndpoints::from(endpoints)));
    again.slices = slices;
    // A trigger alone (a change that changed nothing) is no reason to write.
    again.trigger = Some(trigger());
    assert!(plan_sync(&again, &SliceConfig::default()).is_empty());
}

#[test]
fn the_trigger_keeps_its_fraction_of_a_second() {
    let mut inputs = mk_inputs(
        Some(mk_service(json!({"app": "web"}))),
        vec![mk_pod("a", "10.244.0.1")],
    );
    inputs.trigger = Some(trigger() + chrono::Duration::milliseconds(250));
    let (_, slices) = stored(&plan_sync(&inputs, &SliceConfig::default()));
    let stamp = slices[0]
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ENDPOINTS_LAST_CHANGE_TRIGGER_TIME))
        .cloned();
    assert_eq!(stamp.as_deref(), Some("2026-03-04T05:06:07.250Z"));
}

#[test]
fn a_changed_service_keeps_other_annotations_and_drops_a_stale_trigger() {
    let inputs = mk_inputs(
        Some(mk_service(json!({"app": "web"}))),
        vec![mk_pod("a", "10.244.0.1")],
    );
    let (mut endpoints, slices) = stored(&plan_sync(&inputs, &SliceConfig::default()));
    endpoints.metadata.annotations = Some(BTreeMap::from([
        ("team".to_owned(), "shop".to_owned()),
        (
            ENDPOINTS_LAST_CHANGE_TRIGGER_TIME.to_owned(),
            "2020-01-01T00:00:00Z".to_owned(),
        ),
    ]));
    let mut next = mk_inputs(
        Some(mk_service(json!({"app": "web"}))),
        vec![mk_pod("a", "10.244.0.1"), mk_pod("b", "10.244.0.2")],
    );
    next.endpoints = Some(Arc::new(StoredEndpoints::from(endpoints)));
    next.slices = slices;
    let writes = plan_sync(&next, &SliceConfig::default());
    let Some(EndpointsWrite::Replace(replaced)) = &writes.endpoints else {
        panic!("{:?}", writes.endpoints);
    };
    assert_eq!(replaced.metadata.resource_version.as_deref(), Some("1"));
    assert_eq!(
        replaced.metadata.annotations,
        Some(BTreeMap::from([("team".to_owned(), "shop".to_owned())]))
    );
    assert_eq!(writes.slices.update.len(), 1);
    assert_eq!(writes.slices.update[0].endpoints.len(), 2);
}

#[test]
fn a_deleted_service_loses_its_endpoints_and_slices() {
    let inputs = mk_inputs(
        Some(mk_service(json!({"app": "web"}))),
        vec![mk_pod("a", "10.244.0.1")],
    );
    let (endpoints, slices) = stored(&plan_sync(&inputs, &SliceConfig::default()));
    let mut gone = mk_inputs(None, Vec::new());
    gone.endpoints = Some(Arc::new(StoredEndpoints::from(endpoints)));
    gone.slices = slices;
    let writes = plan_sync(&gone, &SliceConfig::default());
    assert_eq!(writes.endpoints, Some(EndpointsWrite::Delete));
    assert_eq!(writes.slices.delete, vec!["web-0".to_owned()]);
    assert!(writes.slices.create.is_empty());
    assert!(plan_sync(&mk_inputs(None, Vec::new()), &SliceConfig::default()).is_empty());
}

#[test]
fn a_service_without_selector_keeps_its_endpoints_but_not_berth_slices() {
    let inputs = mk_inputs(
        Some(mk_service(json!({"app": "web"}))),
        vec![mk_pod("a", "10.244.0.1")],
    );
    let (endpoints, slices) = stored(&plan_sync(&inputs, &SliceConfig::default()));
    let mut manual = mk_inputs(Some(mk_service(json!(null))), Vec::new());
    manual.endpoints = Some(Arc::new(StoredEndpoints::from(endpoints)));
    manual.slices = slices;
    let writes = plan_sync(&manual, &SliceConfig::default());
    assert_eq!(writes.endpoints, None);
    assert_eq!(writes.slices.delete, vec!["web-0".to_owned()]);
}

#[test]
fn a_service_being_deleted_gets_no_new_slices() {
    let mut svc = mk_service(json!({"app": "web"}));
    svc.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2026-03-04T05:06:07Z")).unwrap());
    let writes = plan_sync(
        &mk_inputs(Some(svc), vec![mk_pod("a", "10.244.0.1")]),
        &SliceConfig::default(),
    );
    assert!(writes.slices.create.is_empty());
}

#[test]
fn unusable_pods_are_reported_once() {
    let writes = plan_sync(
        &mk_inputs(
            Some(mk_service(json!({"app": "web"}))),
            vec![mk_pod("a", "not-an-ip"), mk_pod("b", "10.244.0.2")],
        ),
        &SliceConfig::default(),
    );
    assert_eq!(writes.skipped.len(), 1, "{:?}", writes.skipped);
}
