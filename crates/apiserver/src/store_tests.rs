//! Store semantics, exercised without HTTP.

use super::resource::{built_ins, Catalogue, ResourceInfo};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{ListQuery, Store};
use super::watch::EventType;
use super::write::{DeleteOptions, Door, Managed, WriteCtx};
use serde_json::{json, Value};

const NOW: &str = "2026-01-01T00:00:00Z";

fn info(group: &str, plural: &str) -> ResourceInfo {
    built_ins()
        .into_iter()
        .find(|r| r.group == group && r.plural == plural)
        .unwrap()
}

fn ctx() -> WriteCtx<'static> {
    WriteCtx {
        now: NOW,
        door: Door::Main,
        managed: Managed::Track("test"),
    }
}

fn status_ctx() -> WriteCtx<'static> {
    WriteCtx {
        door: Door::Status,
        ..ctx()
    }
}

fn mk_svc(name: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels}, "spec": {"ports": [{"port": 80}]}})
}

fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn initial_namespaces_exist() {
    let store = Store::new(100, NOW);
    let ns = info("", "namespaces");
    assert!(store.get(&ns, "", "default").is_ok());
    assert!(store.get(&ns, "", "kube-system").is_ok());
}

#[test]
fn create_sets_server_fields() {
    let mut store = Store::new(100, NOW);
    let svc = info("", "services");
    let before = store.resource_version();
    let obj = store
        .create(&svc, "default", mk_svc("web", json!({})), &ctx())
        .unwrap();
    assert_eq!(obj["apiVersion"], "v1");
    assert_eq!(obj["kind"], "Service");
    assert_eq!(obj["metadata"]["namespace"], "default");
    assert_eq!(obj["metadata"]["generation"], 1);
    assert_eq!(obj["metadata"]["creationTimestamp"], NOW);
    assert_eq!(obj["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert_eq!(rv(&obj), before + 1);
    assert!(
        obj["spec"].get("clusterIP").is_none(),
        "the lab allocates nothing"
    );
    assert_eq!(obj["metadata"]["managedFields"][0]["manager"], "test");
}

#[test]
fn create_errors() {
    let mut store = Store::new(100, NOW);
    let svc = info("", "services");
    store
        .create(&svc, "default", mk_svc("web", json!({})), &ctx())
        .unwrap();
    assert_eq!(
        store
            .create(&svc, "default", mk_svc("web", json!({})), &ctx())
            .unwrap_err()
            .reason,
        "AlreadyExists"
    );
    let err = store
        .create(&svc, "nope", mk_svc("web", json!({})), &ctx())
        .unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );
    assert_eq!(
        store
            .create(&svc, "default", json!({"metadata": {}}), &ctx())
            .unwrap_err()
            .code,
        422
    );
    let wrong_kind = json!({"kind": "Pod", "metadata": {"name": "x"}});
    assert_eq!(
        store
            .create(&svc, "default", wrong_kind, &ctx())
            .unwrap_err()
            .code,
        400
    );
    let wrong_ns = json!({"metadata": {"name": "x", "namespace": "other"}});
    assert_eq!(
        store
            .create(&svc, "default", wrong_ns, &ctx())
            .unwrap_err()
            .code,
        400
    );
}

#[test]
fn generate_name() {
    let mut store = Store::new(100, NOW);
    let cm = info("", "configmaps");
    let a = store
        .create(
            &cm,
            "default",
            json!({"metadata": {"generateName": "cfg-"}}),
            &ctx(),
        )
        .unwrap();
    let b = store
        .create(
            &cm,
            "default",
            json!({"metadata": {"generateName": "cfg-"}}),
            &ctx(),
        )
        .unwrap();
    let (na, nb) = (
        a["metadata"]["name"].as_str().unwrap(),
        b["metadata"]["name"].as_str().unwrap(),
    );
    assert!(na.starts_with("cfg-") && na.len() == 9);
    assert_ne!(na, nb);
}

#[test]
fn update_conflicts_on_stale_version() {
    let mut store = Store::new(100, NOW);
    let svc = info("", "services");
    let v1 = store
        .create(&svc, "default", mk_svc("web", json!({})), &ctx())
        .unwrap();
    let mut edit = (*v1).clone();
    edit["spec"]["selector"] = json!({"app": "web"});
    let v2 = store
        .update(&svc, "default", "web", edit.clone(), &ctx())
        .unwrap();
    assert!(rv(&v2) > rv(&v1));
    assert_eq!(v2["metadata"]["generation"], 2);
    let err = store
        .update(&svc, "default", "web", edit, &ctx())
        .unwrap_err();
    assert_eq!(err.code, 409);
    assert_eq!(err.reason, "Conflict");
}

#[test]
fn noop_update_keeps_version() {
    let mut store = Store::new(100, NOW);
    let svc = info("", "services");
    let v1 = store
        .create(&svc, "default", mk_svc("web", json!({})), &ctx())
        .unwrap();
    let v2 = store
        .update(&svc, "default", "web", (*v1).clone(), &ctx())
        .unwrap();
    assert_eq!(rv(&v1), rv(&v2));
}

#[test]
fn status_isolation_and_generation() {
    let mut store = Store::new(100, NOW);
    let svc = info("", "services");
    let mut body = mk_svc("web", json!({}));
    body["status"] = json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}});
    let v1 = store.create(&svc, "default", body, &ctx()).unwrap();
    assert!(
        v1.get("status").is_none(),
        "create ignores status behind a status subresource"
    );

    let mut with_status = (*v1).clone();
    with_status["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}});
    with_status["spec"]["type"] = json!("LoadBalancer");
    let v2 = store
        .update(&svc, "default", "web", with_status.clone(), &status_ctx())
        .unwrap();
    assert_eq!(
        v2["status"]["loadBalancer"]["ingress"][0]["ip"],
        "198.18.0.200"
    );
    assert_eq!(v2["spec"]["type"], "ClusterIP", "/status ignores spec");
    assert_eq!(
        v2["metadata"]["generation"], 1,
        "status changes do not bump generation"
    );

    let mut main = (*v2).clone();
    main["status"] = json!({});
    main["metadata"]["labels"] = json!({"a": "b"});
    let v3 = store.update(&svc, "default", "web", main, &ctx()).unwrap();
    assert_eq!(
        v3["status"]["loadBalancer"]["ingress"][0]["ip"], "198.18.0.200",
        "main ignores status"
    );
    assert_eq!(
        v3["metadata"]["generation"], 1,
        "metadata changes do not bump generation"
    );
}

#[test]
fn finalizer_lifecycle() {
    let mut store = Store::new(100, NOW);
    let cm = info("", "configmaps");
    let body = json!({"metadata": {"name": "c", "finalizers": ["berth.dev/test"]}});
    store.create(&cm, "default", body, &ctx()).unwrap();
    let marked = store
        .delete(&cm, "default", "c", &DeleteOptions::default(), NOW)
        .unwrap();
    assert_eq!(marked["metadata"]["deletionTimestamp"], NOW);
    assert!(store.get(&cm, "default", "c").is_ok());
    let again = store
        .delete(&cm, "default", "c", &DeleteOptions::default(), NOW)
        .unwrap();
    assert_eq!(rv(&again), rv(&marked), "deleting again changes nothing");
    let mut cleared = (*marked).clone();
    cleared["metadata"]["finalizers"] = json!([]);
    cleared["metadata"]["deletionTimestamp"] = Value::Null;
    store.update(&cm, "default", "c", cleared, &ctx()).unwrap();
    assert_eq!(store.get(&cm, "default", "c").unwrap_err().code, 404);
    let changes = store.changes_since(0).unwrap();
    let kinds: Vec<EventType> = changes
        .iter()
        .filter(|c| c.storage_key == "/configmaps")
        .map(|c| c.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![EventType::Added, EventType::Modified, EventType::Deleted]
    );
}

#[test]
fn delete_preconditions() {
    let mut store = Store::new(100, NOW);
    let cm = info("", "configmaps");
    store
        .create(&cm, "default", json!({"metadata": {"name": "c"}}), &ctx())
        .unwrap();
    let opts = DeleteOptions {
        uid: Some("other".into()),
        ..Default::default()
    };
    assert_eq!(
        store
            .delete(&cm, "default", "c", &opts, NOW)
            .unwrap_err()
            .code,
        409
    );
    let gone = store
        .delete(&cm, "default", "c", &DeleteOptions::default(), NOW)
        .unwrap();
    assert_eq!(rv(&gone), store.resource_version());
    assert_eq!(
        store
            .delete(&cm, "default", "c", &DeleteOptions::default(), NOW)
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn namespace_delete_removes_contents() {
    let mut store = Store::new(100, NOW);
    let (ns, cm) = (info("", "namespaces"), info("", "configmaps"));
    store
        .create(&ns, "", json!({"metadata": {"name": "team"}}), &ctx())
        .unwrap();
    store
        .create(&cm, "team", json!({"metadata": {"name": "c"}}), &ctx())
        .unwrap();
    store
        .delete(&ns, "", "team", &DeleteOptions::default(), NOW)
        .unwrap();
    assert!(store.get(&cm, "team", "c").is_err());
}

#[test]
fn list_selectors_and_pages() {
    let mut store = Store::new(1000, NOW);
    let svc = info("", "services");
    store
        .create(
            &info("", "namespaces"),
            "",
            json!({"metadata": {"name": "other"}}),
            &ctx(),
        )
        .unwrap();
    for i in 0..7 {
        let tier = if i % 2 == 0 { "front" } else { "back" };
        store
            .create(
                &svc,
                "default",
                mk_svc(&format!("s{i}"), json!({"tier": tier})),
                &ctx(),
            )
            .unwrap();
    }
    store
        .create(&svc, "other", mk_svc("x", json!({"tier": "front"})), &ctx())
        .unwrap();

    let all = store.list(&svc, None, &ListQuery::default()).unwrap();
    assert_eq!(all.items.len(), 8);
    assert_eq!(all.resource_version, store.resource_version());
    assert_eq!(
        store
            .list(&svc, Some("default"), &ListQuery::default())
            .unwrap()
            .items
            .len(),
        7
    );

    let q = ListQuery {
        labels: LabelSelector::parse("tier=front").unwrap(),
        ..Default::default()
    };
    assert_eq!(
        store.list(&svc, Some("default"), &q).unwrap().items.len(),
        4
    );
    let q = ListQuery {
        fields: FieldSelector::parse("metadata.namespace!=default", &svc).unwrap(),
        ..Default::default()
    };
    assert_eq!(store.list(&svc, None, &q).unwrap().items.len(), 1);

    let mut names = Vec::new();
    let mut remaining = Vec::new();
    let mut token = None;
    loop {
        let q = ListQuery {
            limit: Some(3),
            continue_token: token.clone(),
            ..Default::default()
        };
        let page = store.list(&svc, Some("default"), &q).unwrap();
        remaining.push(page.remaining);
        names.extend(
            page.items
                .iter()
                .map(|o| o.obj["metadata"]["name"].as_str().unwrap().to_owned()),
        );
        match page.continue_token {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(names, vec!["s0", "s1", "s2", "s3", "s4", "s5", "s6"]);
    assert_eq!(remaining, vec![Some(4), Some(1), None]);
    // Across every namespace the count follows from what the earlier pages returned.
    let total = store
        .list(&svc, None, &ListQuery::default())
        .unwrap()
        .items
        .len();
    let (mut seen, mut token) = (0, None);
    loop {
        let q = ListQuery {
            limit: Some(3),
            continue_token: token.clone(),
            ..Default::default()
        };
        let page = store.list(&svc, None, &q).unwrap();
        seen += page.items.len();
        let left = (total - seen) as u64;
        assert_eq!(page.remaining, (left > 0).then_some(left));
        match page.continue_token {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(seen, total);
    // With a selector the apiserver does not count what is left; the pages still continue.
    let q = ListQuery {
        labels: LabelSelector::parse("tier=front").unwrap(),
        limit: Some(3),
        ..Default::default()
    };
    let page = store.list(&svc, Some("default"), &q).unwrap();
    assert_eq!(page.items.len(), 3);
    assert_eq!(page.remaining, None);
    let q = ListQuery {
        continue_token: page.continue_token,
        ..q
    };
    let rest = store.list(&svc, Some("default"), &q).unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.continue_token, None);
    let bad = ListQuery {
        continue_token: Some("!!".into()),
        ..Default::default()
    };
    assert_eq!(store.list(&svc, None, &bad).unwrap_err().code, 400);
}

#[test]
fn history_is_bounded() {
    let mut store = Store::new(3, NOW);
    let cm = info("", "configmaps");
    let start = store.resource_version();
    for i in 0..5 {
        store
            .create(
                &cm,
                "default",
                json!({"metadata": {"name": format!("c{i}")}}),
                &ctx(),
            )
            .unwrap();
    }
    assert_eq!(store.changes_since(start).unwrap_err().code, 410);
    assert_eq!(
        store
            .changes_since(store.resource_version() - 2)
            .unwrap()
            .len(),
        2
    );
    store.compact();
    assert_eq!(
        store
            .changes_since(store.resource_version() - 1)
            .unwrap_err()
            .code,
        410
    );
}

#[test]
fn crd_serves_custom_resources() {
    let mut store = Store::new(100, NOW);
    let crds = info("apiextensions.k8s.io", "customresourcedefinitions");
    let crd = json!({"metadata": {"name": "ippools.berth.dev"}, "spec": {"group": "berth.dev", "scope": "Cluster",
        "names": {"plural": "ippools", "kind": "IPPool"},
        "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}}}]}});
    let created = store.create(&crds, "", crd, &ctx()).unwrap();
    assert_eq!(created["status"]["conditions"][1]["type"], "Established");
    let pool = store
        .catalogue()
        .find("berth.dev", "v1alpha1", "ippools")
        .unwrap()
        .clone();
    let obj = store
        .create(
            &pool,
            "",
            json!({"metadata": {"name": "p"}, "spec": {"addresses": ["198.18.0.200/29"]}}),
            &ctx(),
        )
        .unwrap();
    assert_eq!(obj["apiVersion"], "berth.dev/v1alpha1");
    store
        .delete(
            &crds,
            "",
            "ippools.berth.dev",
            &DeleteOptions::default(),
            NOW,
        )
        .unwrap();
    assert!(store
        .catalogue()
        .find("berth.dev", "v1alpha1", "ippools")
        .is_none());
    assert!(store.get(&pool, "", "p").is_err());

    let bad = json!({"metadata": {"name": "wrong"}, "spec": {"group": "g", "names": {"plural": "xs", "kind": "X"}, "versions": [{"name": "v1"}]}});
    assert_eq!(store.create(&crds, "", bad, &ctx()).unwrap_err().code, 422);
    let _ = Catalogue::default();
}

#[test]
fn put_creates_leases() {
    let mut store = Store::new(100, NOW);
    let leases = info("coordination.k8s.io", "leases");
    let lease = store
        .update(
            &leases,
            "default",
            "l",
            json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}),
            &ctx(),
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
    assert_eq!(
        store
            .update(
                &info("", "services"),
                "default",
                "nope",
                mk_svc("nope", json!({})),
                &ctx()
            )
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn graceful_pod_deletion_waits_for_grace_zero() {
    let mut store = Store::new(100, NOW);
    store.set_graceful_pod_deletion(true);
    let pods = info("", "pods");
    let bound = json!({"metadata": {"name": "bound"}, "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 10, "containers": [{"name": "c"}]}});
    store.create(&pods, "default", bound, &ctx()).unwrap();
    store
        .create(
            &pods,
            "default",
            json!({"metadata": {"name": "unbound"}, "spec": {"containers": [{"name": "c"}]}}),
            &ctx(),
        )
        .unwrap();

    store
        .delete(&pods, "default", "unbound", &DeleteOptions::default(), NOW)
        .unwrap();
    assert!(
        store.get(&pods, "default", "unbound").is_err(),
        "unscheduled pods go at once"
    );

    let marked = store
        .delete(&pods, "default", "bound", &DeleteOptions::default(), NOW)
        .unwrap();
    assert_eq!(
        marked["metadata"]["deletionTimestamp"],
        "2026-01-01T00:00:10Z"
    );
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 10);
    let again = store
        .delete(&pods, "default", "bound", &DeleteOptions::default(), NOW)
        .unwrap();
    assert_eq!(rv(&again), rv(&marked));
    let shorter = DeleteOptions {
        grace_period_seconds: Some(2),
        ..Default::default()
    };
    let shortened = store
        .delete(&pods, "default", "bound", &shorter, NOW)
        .unwrap();
    assert_eq!(shortened["metadata"]["deletionGracePeriodSeconds"], 2);
    let now = DeleteOptions {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    store.delete(&pods, "default", "bound", &now, NOW).unwrap();
    assert!(store.get(&pods, "default", "bound").is_err());
}

#[test]
fn a_terminating_pod_outlives_every_write_until_grace_zero() {
    let mut store = Store::new(100, NOW);
    store.set_graceful_pod_deletion(true);
    let pods = info("", "pods");
    let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 30, "containers": [{"name": "c"}]}});
    store.create(&pods, "default", pod, &ctx()).unwrap();
    store
        .delete(&pods, "default", "p", &DeleteOptions::default(), NOW)
        .unwrap();

    // An annotation, then the kubelet's status write as readiness drops: both land, the pod stays.
    let mut edit = (*store.get(&pods, "default", "p").unwrap()).clone();
    edit["metadata"]["annotations"] = json!({"a": "b"});
    store.update(&pods, "default", "p", edit, &ctx()).unwrap();
    let mut status = (*store.get(&pods, "default", "p").unwrap()).clone();
    status["status"] = json!({"conditions": [{"type": "Ready", "status": "False"}]});
    store
        .update(&pods, "default", "p", status, &status_ctx())
        .unwrap();
    let kept = store.get(&pods, "default", "p").unwrap();
    assert_eq!(kept["metadata"]["annotations"]["a"], "b");
    assert_eq!(kept["status"]["conditions"][0]["status"], "False");
    assert_eq!(kept["metadata"]["deletionGracePeriodSeconds"], 30);

    let now = DeleteOptions {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    store.delete(&pods, "default", "p", &now, NOW).unwrap();
    assert!(store.get(&pods, "default", "p").is_err());
}

#[test]
fn an_object_marked_for_deletion_goes_when_its_last_finalizer_is_removed() {
    let mut store = Store::new(100, NOW);
    let svc = info("", "services");
    let mut web = mk_svc("web", json!({}));
    web["metadata"]["finalizers"] = json!(["example.com/f"]);
    store.create(&svc, "default", web, &ctx()).unwrap();
    store
        .delete(&svc, "default", "web", &DeleteOptions::default(), NOW)
        .unwrap();
    let mut edit = (*store.get(&svc, "default", "web").unwrap()).clone();
    edit["metadata"]["finalizers"] = json!([]);
    store.update(&svc, "default", "web", edit, &ctx()).unwrap();
    assert!(store.get(&svc, "default", "web").is_err());
}

#[test]
fn pods_go_at_once_without_graceful_deletion() {
    let mut store = Store::new(100, NOW);
    let pods = info("", "pods");
    store
        .create(
            &pods,
            "default",
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}),
            &ctx(),
        )
        .unwrap();
    store
        .delete(&pods, "default", "p", &DeleteOptions::default(), NOW)
        .unwrap();
    assert!(store.get(&pods, "default", "p").is_err());
}

#[test]
fn stored_text_follows_every_write() {
    let mut store = Store::new(100, NOW);
    let svc = info("", "services");
    let start = store.resource_version();
    let v1 = store
        .create(&svc, "default", mk_svc("web", json!({"a": "1"})), &ctx())
        .unwrap();
    let mut edit = (*v1).clone();
    edit["metadata"]["labels"] = json!({"a": "2"});
    let v2 = store.update(&svc, "default", "web", edit, &ctx()).unwrap();
    let page = store.list(&svc, None, &ListQuery::default()).unwrap();
    assert_eq!(page.items.len(), 1);
    let listed: Value = serde_json::from_str(&page.items[0].json).unwrap();
    assert_eq!(listed, *v2);
    assert_eq!(listed["metadata"]["labels"]["a"], "2");

    store
        .delete(&svc, "default", "web", &DeleteOptions::default(), NOW)
        .unwrap();
    let changes = store.changes_since(start).unwrap();
    let kinds: Vec<EventType> = changes.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        vec![EventType::Added, EventType::Modified, EventType::Deleted]
    );
    for change in &changes {
        let text: Value = serde_json::from_str(&change.json).unwrap();
        assert_eq!(text, *change.object, "{:?}", change.kind);
        assert_eq!(rv(&text), change.rv);
    }
    assert!(store
        .list(&svc, None, &ListQuery::default())
        .unwrap()
        .items
        .is_empty());
}

#[test]
fn events_through_both_groups_are_one_store() {
    let mut store = Store::new(100, NOW);
    let core = info("", "events");
    let new_group = info("events.k8s.io", "events");
    let since = store.resource_version();
    let written = store
        .create(
            &new_group,
            "default",
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "web.1"}, "note": "assigned", "reason": "Ensured",
                "regarding": {"kind": "Service", "name": "web"},
                "reportingController": "berth", "eventTime": "2026-01-01T00:00:00.000000Z"}),
            &ctx(),
        )
        .unwrap();
    assert_eq!(written["apiVersion"], "v1", "kept in the core shape");
    let seen = store.get(&core, "default", "web.1").unwrap();
    assert_eq!(seen["message"], "assigned");
    assert_eq!(seen["involvedObject"]["name"], "web");
    assert_eq!(seen["reportingComponent"], "berth");
    let listed = store
        .list(&core, Some("default"), &ListQuery::default())
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let through_new: Value =
        serde_json::from_str(&listed.items[0].json_as("events.k8s.io/v1")).unwrap();
    assert_eq!(through_new["note"], "assigned");
    assert!(through_new.get("message").is_none());
    // One change, seen by watchers of either group.
    let changes = store.changes_since(since).unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].storage_key, core.storage_key());
    assert_eq!(changes[0].storage_key, new_group.storage_key());

    // An update through the new group keeps the object's identity and bumps its version.
    let mut update = super::events::to_events(&seen);
    update["series"] = json!({"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"});
    let updated = store
        .update(&new_group, "default", "web.1", update, &ctx())
        .unwrap();
    assert_eq!(updated["metadata"]["uid"], seen["metadata"]["uid"]);
    assert!(rv(&updated) > rv(&seen));
    assert_eq!(
        store.get(&core, "default", "web.1").unwrap()["series"]["count"],
        2
    );

    // A core name sent to the new group is refused as any wrong apiVersion is.
    let err = store
        .create(
            &new_group,
            "default",
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "x"}}),
            &ctx(),
        )
        .unwrap_err();
    assert_eq!(err.code, 400);
}
