use super::*;
use crate::endpoints::intern::Interner;
use crate::endpoints::slim_pod::SlimPod;
use chrono::TimeZone;
use serde_json::json;

fn at(second: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, second)
        .single()
        .unwrap()
}

fn mk_service(ns: &str, name: &str, selector: serde_json::Value) -> Arc<Service> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}")},
            "spec": {"selector": selector, "ports": [{"port": 80}]}
        }))
        .unwrap(),
    )
}

fn mk_pod(ns: &str, name: &str, labels: serde_json::Value, ready: bool) -> PodFacts {
    let pod: SlimPod = serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"podIP": "10.244.0.1",
                   "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
    }))
    .unwrap();
    PodFacts::from_pod(&pod, &mut Interner::default())
}

fn mk_node(name: &str, zone: Option<&str>) -> Node {
    let labels = zone.map(|z| json!({ LABEL_TOPOLOGY_ZONE: z }));
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn mk_slice(ns: &str, name: &str, service: &str, rv: &str) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "resourceVersion": rv,
                     "labels": {LABEL_SERVICE_NAME: service, LABEL_MANAGED_BY: MANAGED_BY_BERTH}},
        "addressType": "IPv4", "endpoints": []
    }))
    .unwrap()
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

/// Two Services in `shop` (one selecting a subset of the other's pods), one elsewhere.
fn mk_cache() -> Cache {
    let mut cache = Cache::new(Duration::from_secs(30));
    cache.apply_service(mk_service("shop", "web", json!({"app": "web"})), at(0));
    cache.apply_service(
        mk_service("shop", "canary", json!({"app": "web", "track": "canary"})),
        at(0),
    );
    cache.apply_service(mk_service("other", "web", json!({"app": "web"})), at(0));
    cache.apply_service(mk_service("shop", "manual", json!(null)), at(0));
    cache.reset_nodes(&[mk_node("n1", Some("z1"))]);
    cache
}

#[test]
fn a_pod_change_reaches_the_services_of_its_old_and_new_labels() {
    let mut cache = mk_cache();
    let keys = cache.apply_pod(mk_pod("shop", "p1", json!({"app": "web"}), true), at(1));
    assert_eq!(keys, vec![key("shop", "web")]);
    let keys = cache.apply_pod(
        mk_pod("shop", "p1", json!({"app": "web", "track": "canary"}), true),
        at(2),
    );
    assert_eq!(keys, vec![key("shop", "canary"), key("shop", "web")]);
    // Leaving both selectors still reaches both, so the pod is removed from their endpoints.
    let keys = cache.apply_pod(mk_pod("shop", "p1", json!({"app": "api"}), true), at(3));
    assert_eq!(keys, vec![key("shop", "canary"), key("shop", "web")]);
    assert!(cache.take_inputs(&key("shop", "web")).pods.is_empty());
}

#[test]
fn a_change_endpoints_do_not_read_reaches_no_service() {
    let mut cache = mk_cache();
    cache.apply_pod(mk_pod("shop", "p1", json!({"app": "web"}), true), at(1));
    let keys = cache.apply_pod(mk_pod("shop", "p1", json!({"app": "web"}), true), at(2));
    assert!(keys.is_empty());
    let keys = cache.apply_pod(mk_pod("shop", "p1", json!({"app": "web"}), false), at(3));
    assert_eq!(keys, vec![key("shop", "web")]);
}

#[test]
fn pod_deletion_reaches_its_services() {
    let mut cache = mk_cache();
    cache.apply_pod(mk_pod("shop", "p1", json!({"app": "web"}), true), at(1));
    assert_eq!(
        cache.delete_pod(&key("shop", "p1"), at(2)),
        vec![key("shop", "web")]
    );
    assert!(cache.delete_pod(&key("shop", "p1"), at(3)).is_empty());
    assert!(cache.take_inputs(&key("shop", "web")).pods.is_empty());
}

#[test]
fn inputs_hold_exactly_the_selected_pods_of_the_namespace_in_name_order() {
    let mut cache = mk_cache();
    let pods = [
        mk_pod("shop", "b", json!({"app": "web"}), true),
        mk_pod("shop", "a", json!({"app": "web", "track": "canary"}), true),
        mk_pod("shop", "c", json!({"app": "api"}), true),
        mk_pod("other", "d", json!({"app": "web"}), true),
    ];
    cache.reset_pods(pods.to_vec());
    let names = |inputs: Inputs| -> Vec<String> {
        inputs
            .pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    };
    assert_eq!(
        names(cache.take_inputs(&key("shop", "web"))),
        vec!["a", "b"]
    );
    assert_eq!(names(cache.take_inputs(&key("shop", "canary"))), vec!["a"]);
    assert_eq!(names(cache.take_inputs(&key("other", "web"))), vec!["d"]);
    assert!(names(cache.take_inputs(&key("shop", "manual"))).is_empty());
    assert!(cache.take_inputs(&key("shop", "gone")).service.is_none());
}

#[test]
fn only_changes_that_matter_to_endpoints_reach_a_service() {
    let mut cache = mk_cache();
    let mut svc = mk_service("shop", "web", json!({"app": "web"}));
    assert!(cache.apply_service(svc.clone(), at(1)).is_empty());
    // Status, metadata and spec fields that endpoints do not read (the allocation worker's
    // writes) leave the Service alone.
    let edit = Arc::make_mut(&mut svc);
    edit.status = Some(Default::default());
    edit.metadata.resource_version = Some("99".to_owned());
    edit.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into());
    let spec = edit.spec.as_mut().unwrap();
    spec.session_affinity = Some("ClientIP".to_owned());
    spec.health_check_node_port = Some(30_001);
    spec.load_balancer_class = Some("berth.dev/l2".to_owned());
    assert!(cache.apply_service(svc.clone(), at(1)).is_empty());
    // trafficDistribution and the topology-mode annotation decide the slices' hints.
    Arc::make_mut(&mut svc)
        .spec
        .as_mut()
        .unwrap()
        .traffic_distribution = Some("PreferSameZone".to_owned());
    assert_eq!(
        cache.apply_service(svc.clone(), at(1)),
        vec![key("shop", "web")]
    );
    Arc::make_mut(&mut svc).metadata.annotations = Some(
        [(
            "service.kubernetes.io/topology-mode".to_owned(),
            "Auto".to_owned(),
        )]
        .into(),
    );
    assert_eq!(
        cache.apply_service(svc.clone(), at(1)),
        vec![key("shop", "web")]
    );
    // The cluster IP is read: whether a Service is headless changes its Endpoints.
    Arc::make_mut(&mut svc).spec.as_mut().unwrap().cluster_ip = Some("10.96.0.10".to_owned());
    assert_eq!(cache.apply_service(svc, at(1)), vec![key("shop", "web")]);
    let keys = cache.apply_service(mk_service("shop", "web", json!({"app": "api"})), at(2));
    assert_eq!(keys, vec![key("shop", "web")]);
    // The selector index follows the new selector.
    let keys = cache.apply_pod(mk_pod("shop", "p1", json!({"app": "api"}), true), at(3));
    assert_eq!(keys, vec![key("shop", "web")]);
    assert_eq!(
        cache.delete_service(&key("shop", "web"), at(4)),
        vec![key("shop", "web")]
    );
    assert!(cache
        .apply_pod(
            mk_pod("shop", "p1", json!({"app": "api", "x": "y"}), true),
            at(5)
        )
        .is_empty());
}

#[test]
fn node_zone_changes_reach_every_service_and_others_none() {
    let mut cache = mk_cache();
    assert!(cache.apply_node(&mk_node("n1", Some("z1"))).is_empty());
    let keys = cache.apply_node(&mk_node("n1", Some("z2")));
    assert_eq!(
        keys,
        vec![
            key("other", "web"),
            key("shop", "canary"),
            key("shop", "web")
        ]
    );
    assert_eq!(cache.delete_node("n1").len(), 3);
    assert!(cache.delete_node("n1").is_empty());
}

#[test]
fn slices_are_grouped_by_service_and_own_writes_are_quiet() {
    let mut cache = mk_cache();
    let web = key("shop", "web");
    assert_eq!(
        cache.apply_slice(mk_slice("shop", "web-1", "web", "5")),
        vec![web.clone()]
    );
    cache.expect(
        &web,
        Target::Slice("web-1".into()),
        Some("6"),
        false,
        Instant::now(),
    );
    assert!(!cache.is_settled(&web, Instant::now()));
    assert!(cache
        .apply_slice(mk_slice("shop", "web-1", "web", "6"))
        .is_empty());
    assert!(cache.is_settled(&web, Instant::now()));
    assert_eq!(cache.take_inputs(&web).slices.len(), 1);
    // Relabelled to another Service: both hear of it.
    let keys = cache.apply_slice(mk_slice("shop", "web-1", "canary", "7"));
    assert_eq!(keys, vec![key("shop", "canary"), web.clone()]);
    assert!(cache.take_inputs(&web).slices.is_empty());
    // A slice of a Service that does not exist is reported, so that it can be cleaned up.
    let keys = cache.apply_slice(mk_slice("shop", "gone-1", "gone", "8"));
    assert_eq!(keys, vec![key("shop", "gone")]);
    assert!(cache.all_keys().contains(&key("shop", "gone")));
    assert_eq!(
        cache.delete_slice(&mk_slice("shop", "gone-1", "gone", "8")),
        vec![key("shop", "gone")]
    );
    assert!(!cache.all_keys().contains(&key("shop", "gone")));
}

#[test]
fn endpoints_of_services_that_do_not_exist_are_left_alone() {
    let mut cache = mk_cache();
    let ep = |ns: &str, name: &str, rv: &str| -> Endpoints {
        serde_json::from_value(
            json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}}),
        )
        .unwrap()
    };
    assert!(cache
        .apply_endpoints(ep("shop", "kubernetes", "1"))
        .is_empty());
    assert_eq!(
        cache.apply_endpoints(ep("shop", "web", "2")),
        vec![key("shop", "web")]
    );
    cache.expect(
        &key("shop", "web"),
        Target::Endpoints,
        Some("3"),
        false,
        Instant::now(),
    );
    assert!(cache.apply_endpoints(ep("shop", "web", "3")).is_empty());
    assert!(cache.take_inputs(&key("shop", "web")).endpoints.is_some());
    assert_eq!(
        cache.delete_endpoints(&key("shop", "web")),
        vec![key("shop", "web")]
    );
    assert!(cache
        .delete_endpoints(&key("shop", "kubernetes"))
        .is_empty());
}

#[test]
fn trigger_times_keep_the_newest_change_once_recording() {
    let mut cache = mk_cache();
    cache.apply_pod(mk_pod("shop", "p1", json!({"app": "web"}), true), at(1));
    assert_eq!(cache.take_inputs(&key("shop", "web")).trigger, None);
    cache.start_recording_triggers();
    cache.apply_pod(mk_pod("shop", "p1", json!({"app": "web"}), false), at(5));
    cache.apply_pod(mk_pod("shop", "p2", json!({"app": "web"}), true), at(3));
    assert_eq!(cache.take_inputs(&key("shop", "web")).trigger, Some(at(5)));
    assert_eq!(cache.take_inputs(&key("shop", "web")).trigger, None);
    cache.restore_trigger(&key("shop", "web"), Some(at(5)));
    cache.apply_pod(mk_pod("shop", "p2", json!({"app": "web"}), false), at(4));
    assert_eq!(cache.take_inputs(&key("shop", "web")).trigger, Some(at(5)));
    // A re-list is no change.
    cache.reset_services(vec![mk_service("shop", "web", json!({"app": "web"}))]);
    assert_eq!(cache.take_inputs(&key("shop", "web")).trigger, None);
}

#[test]
fn all_keys_lists_selector_services_once() {
    let cache = mk_cache();
    assert_eq!(
        cache.all_keys(),
        vec![
            key("other", "web"),
            key("shop", "canary"),
            key("shop", "web")
        ]
    );
}

#[test]
fn slices_of_other_managers_are_not_cached_and_a_handover_leaves_the_cache() {
    let mut cache = mk_cache();
    let web = key("shop", "web");
    let mut foreign = mk_slice("shop", "web-x", "web", "1");
    foreign.metadata.labels.as_mut().unwrap().insert(
        LABEL_MANAGED_BY.to_owned(),
        "endpointslice-controller.k8s.io".to_owned(),
    );
    assert!(cache.apply_slice(foreign.clone()).is_empty());
    assert!(cache.take_inputs(&web).slices.is_empty());
    // One of berth's slices handed to another manager is no longer berth's to plan with.
    cache.apply_slice(mk_slice("shop", "web-1", "web", "2"));
    foreign.metadata.name = Some("web-1".to_owned());
    assert_eq!(cache.apply_slice(foreign), vec![web.clone()]);
    assert!(cache.take_inputs(&web).slices.is_empty());
}
