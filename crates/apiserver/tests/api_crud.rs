//! CRUD, conflicts, status isolation, finalizers, selectors and pagination through the real kube-rs
//! client against the lab API server.

#![allow(clippy::unwrap_used)]

mod common;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Event, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as EventsV1;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Resource;
use serde_json::json;

fn status_code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other:?}"),
    }
}

fn reason(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(e) => e.reason.clone(),
        other => panic!("not an API error: {other:?}"),
    }
}

/// Create, get, list, replace and delete one object of a kind; returns nothing, panics on mismatch.
async fn crud<K>(api: Api<K>, obj: serde_json::Value)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
    K::DynamicType: Default,
{
    let typed: K = serde_json::from_value(obj).unwrap();
    let name = typed.meta().name.clone().unwrap();
    let created = api.create(&PostParams::default(), &typed).await.unwrap();
    assert!(created.meta().uid.is_some(), "{name}: uid");
    assert!(
        created.meta().creation_timestamp.is_some(),
        "{name}: creationTimestamp"
    );
    let fetched = api.get(&name).await.unwrap();
    assert_eq!(
        fetched.meta().resource_version,
        created.meta().resource_version
    );
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert!(listed
        .items
        .iter()
        .any(|o| o.meta().name.as_deref() == Some(name.as_str())));
    let mut changed = fetched.clone();
    changed.meta_mut().labels = Some([("touched".to_owned(), "yes".to_owned())].into());
    let replaced = api
        .replace(&name, &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(
        replaced.meta().resource_version,
        created.meta().resource_version
    );
    assert_eq!(
        status_code(
            &api.replace(&name, &PostParams::default(), &changed)
                .await
                .unwrap_err()
        ),
        409
    );
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    assert_eq!(status_code(&api.get(&name).await.unwrap_err()), 404);
}

#[tokio::test]
async fn crud_every_builtin_kind() {
    let (server, client) = common::start().await;
    let ns = "default";
    crud(
        Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": "team-a"}}),
    )
    .await;
    crud(
        Api::<Service>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .await;
    crud(Api::<Pod>::namespaced(client.clone(), ns), json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "echo"}]}})).await;
    crud(
        Api::<Node>::all(client.clone()),
        json!({"metadata": {"name": "node-1"}}),
    )
    .await;
    crud(
        Api::<Endpoints>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "web"}}),
    )
    .await;
    crud(
        Api::<Event>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "ev"}, "involvedObject": {"kind": "Service", "name": "web"}}),
    )
    .await;
    crud(
        Api::<ConfigMap>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "cm"}, "data": {"a": "b"}}),
    )
    .await;
    crud(
        Api::<EndpointSlice>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "web-1"}, "addressType": "IPv4", "endpoints": []}),
    )
    .await;
    crud(
        Api::<Lease>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}),
    )
    .await;
    crud(Api::<EventsV1>::namespaced(client.clone(), ns), json!({"metadata": {"name": "ev2"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "berth", "reportingInstance": "x", "action": "Test", "reason": "Test"})).await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn default_namespaces_and_errors_are_kubernetes_shaped() {
    let (server, client) = common::start().await;
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces.get("default").await.unwrap();
    namespaces.get("kube-system").await.unwrap();
    let svcs = Api::<Service>::namespaced(client.clone(), "nope");
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    let err = svcs.create(&PostParams::default(), &svc).await.unwrap_err();
    assert_eq!(
        (status_code(&err), reason(&err)),
        (404, "NotFound".to_owned())
    );
    let svcs = Api::<Service>::default_namespaced(client.clone());
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    let err = svcs.create(&PostParams::default(), &svc).await.unwrap_err();
    assert_eq!(
        (status_code(&err), reason(&err)),
        (409, "AlreadyExists".to_owned())
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn generate_name_and_no_allocation() {
    let (server, client) = common::start().await;
    let svcs = Api::<Service>::default_namespaced(client);
    let svc: Service = serde_json::from_value(json!({"metadata": {"generateName": "web-"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})).unwrap();
    let created = svcs.create(&PostParams::default(), &svc).await.unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");
    let spec = created.spec.unwrap();
    assert_eq!(spec.cluster_ip, None, "the lab allocates nothing");
    assert_eq!(spec.ports.unwrap()[0].node_port, None);
    assert_eq!(created.metadata.generation, Some(1));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn status_subresource_isolation() {
    let (server, client) = common::start().await;
    let svcs = Api::<Service>::default_namespaced(client);
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})).unwrap();
    let created = svcs.create(&PostParams::default(), &svc).await.unwrap();

    let mut with_status = created.clone();
    with_status.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}))
            .unwrap();
    with_status.spec.as_mut().unwrap().type_ = Some("NodePort".into());
    let after = svcs
        .replace_status("lb", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(
        after.spec.as_ref().unwrap().type_.as_deref(),
        Some("LoadBalancer"),
        "/status ignores spec"
    );
    assert_eq!(
        after
            .status
            .as_ref()
            .unwrap()
            .load_balancer
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()[0]
            .ip
            .as_deref(),
        Some("198.18.0.200")
    );
    assert_eq!(after.metadata.generation, Some(1));

    let mut main = after.clone();
    main.status = None;
    main.spec.as_mut().unwrap().selector = Some([("app".to_owned(), "web".to_owned())].into());
    let main = svcs
        .replace("lb", &PostParams::default(), &main)
        .await
        .unwrap();
    assert!(
        main.status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .is_some(),
        "the main resource ignores status"
    );
    assert_eq!(
        main.metadata.generation,
        Some(2),
        "spec change bumps generation"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (server, client) = common::start().await;
    let cms = Api::<ConfigMap>::default_namespaced(client);
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "held", "finalizers": ["berth.dev/load-balancer"]}}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let patch = json!({"metadata": {"finalizers": null}});
    cms.patch(
        "held",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    assert_eq!(status_code(&cms.get("held").await.unwrap_err()), 404);
    server.shutdown().await.unwrap();
}

/// A list read in pages speaks for the version of its first page, so that a watch from it
/// replays what changed while the pages were read: here a ConfigMap created behind the
/// cursor, which no page shows.
#[tokio::test]
async fn paged_lists_keep_the_first_page_version() {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let (server, client) = common::start().await;
    let cms = Api::<ConfigMap>::default_namespaced(client);
    let mk = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    for name in ["b", "c", "d", "e"] {
        cms.create(&PostParams::default(), &mk(name)).await.unwrap();
    }
    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    cms.create(&PostParams::default(), &mk("a")).await.unwrap();
    let rest = cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.metadata.resource_version.as_deref(), Some(rv.as_str()));
    let names: Vec<_> = first
        .items
        .iter()
        .chain(&rest.items)
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(names, ["b", "c", "d", "e"]);
    let mut events = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(std::time::Duration::from_secs(10), events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match event {
        WatchEvent::Added(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("a")),
        other => panic!("expected the creation of a, got {other:?}"),
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn selectors_pagination_and_delete_collection() {
    let (server, client) = common::start().await;
    let pods = Api::<Pod>::default_namespaced(client.clone());
    for i in 0..10 {
        let node = if i < 4 { "node-a" } else { "node-b" };
        let tier = if i % 2 == 0 { "front" } else { "back" };
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i:02}"), "labels": {"tier": tier, "i": i.to_string()}},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]}})).unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let count = |lp: ListParams| {
        let pods = pods.clone();
        async move { pods.list(&lp).await.unwrap().items.len() }
    };
    assert_eq!(count(ListParams::default().labels("tier=front")).await, 5);
    assert_eq!(
        count(ListParams::default().labels("tier in (front,back),i notin (1,2)")).await,
        8
    );
    assert_eq!(count(ListParams::default().labels("!tier")).await, 0);
    assert_eq!(
        count(ListParams::default().labels("tier,tier!=front")).await,
        5
    );
    assert_eq!(
        count(ListParams::default().fields("spec.nodeName=node-a")).await,
        4
    );
    assert_eq!(
        count(ListParams::default().fields("metadata.name=p03")).await,
        1
    );
    let err = pods
        .list(&ListParams::default().fields("spec.bogus=x"))
        .await
        .unwrap_err();
    assert_eq!(status_code(&err), 400);
    let all = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(all.items.len(), 10);

    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    loop {
        let page = pods.list(&lp).await.unwrap();
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    assert_eq!(
        names,
        (0..10).map(|i| format!("p{i:02}")).collect::<Vec<_>>()
    );

    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("tier=back"),
    )
    .await
    .unwrap();
    assert_eq!(count(ListParams::default()).await, 5);

    let svcs = Api::<Service>::default_namespaced(client);
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "ports": [{"port": 80}]}})).unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    assert_eq!(
        svcs.list(&ListParams::default().fields("spec.type=NodePort"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        svcs.list(&ListParams::default().fields("spec.clusterIP=10.96.0.10"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        svcs.list(&ListParams::default().fields("spec.type=ClusterIP"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
    server.shutdown().await.unwrap();
}
