//! Patches, server-side apply, CRDs and leader election through the real kube-rs client.

#![allow(clippy::unwrap_used)]

mod common;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube_lease_manager::LeaseManagerBuilder;
use serde_json::json;
use std::time::Duration;

fn code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other:?}"),
    }
}

async fn mk_web(svcs: &Api<Service>) -> Service {
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}})).unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap()
}

fn port_names(svc: &Service) -> Vec<(i32, Option<String>, String)> {
    svc.spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| {
            let target = p.target_port.as_ref().map(|t| match t {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i) => i.to_string(),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
            });
            (p.port, p.name.clone(), target.unwrap_or_default())
        })
        .collect()
}

#[tokio::test]
async fn merge_json_and_strategic_patches() {
    let (server, client) = common::start().await;
    let svcs = Api::<Service>::default_namespaced(client.clone());
    mk_web(&svcs).await;
    let pp = PatchParams::default();

    let merged = svcs
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front", "app": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.metadata.labels.unwrap(),
        [("tier".to_owned(), "front".to_owned())].into()
    );

    let ops: json_patch::Patch = serde_json::from_value(
        json!([{"op": "replace", "path": "/spec/ports/0/name", "value": "web"}]),
    )
    .unwrap();
    let patched = svcs
        .patch("web", &pp, &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(port_names(&patched)[0].1.as_deref(), Some("web"));
    let bad: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/spec/ports/0/name", "value": "nope"}]),
    )
    .unwrap();
    assert_eq!(
        code(
            &svcs
                .patch("web", &pp, &Patch::<()>::Json(bad))
                .await
                .unwrap_err()
        ),
        422
    );

    // Strategic merge keys Service ports by `port`: one port changes, the other stays.
    let smp = svcs
        .patch(
            "web",
            &pp,
            &Patch::Strategic(json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        port_names(&smp),
        vec![
            (80, Some("web".into()), "80".into()),
            (443, Some("https".into()), "8443".into())
        ]
    );
    let smp = svcs
        .patch(
            "web",
            &pp,
            &Patch::Strategic(json!({"spec": {"ports": [{"port": 80, "$patch": "delete"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(port_names(&smp).len(), 1);

    let pods = Api::<Pod>::default_namespaced(client);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}})).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = pods
        .patch(
            "p",
            &pp,
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "b", "image": "z"}]}})),
        )
        .await
        .unwrap();
    let images: Vec<_> = pod
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.image.unwrap())
        .collect();
    assert_eq!(images, vec!["x", "z"]);
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.244.1.5"}});
    let pod = pods
        .patch_status("p", &pp, &Patch::Strategic(status))
        .await
        .unwrap();
    let status = json!({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}});
    let pod2 = pods
        .patch_status("p", &pp, &Patch::Strategic(status))
        .await
        .unwrap();
    assert_eq!(
        pod.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("10.244.1.5")
    );
    assert_eq!(
        pod2.status.unwrap().conditions.unwrap().len(),
        2,
        "conditions merge by type"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn merge_patch_with_stale_version_conflicts() {
    let (server, client) = common::start().await;
    let svcs = Api::<Service>::default_namespaced(client);
    let svc = mk_web(&svcs).await;
    let rv = svc.metadata.resource_version.unwrap();
    svcs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    let stale = json!({"metadata": {"resourceVersion": rv, "labels": {"x": "2"}}});
    assert_eq!(
        code(
            &svcs
                .patch("web", &PatchParams::default(), &Patch::Merge(stale))
                .await
                .unwrap_err()
        ),
        409
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn server_side_apply_ownership_and_conflicts() {
    let (server, client) = common::start().await;
    let svcs = Api::<Service>::default_namespaced(client);
    let alice = PatchParams::apply("alice");
    let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "labels": {"owner": "alice"}},
        "spec": {"type": "ClusterIP", "ports": [{"port": 80, "name": "http"}]}});
    let created = svcs
        .patch("web", &alice, &Patch::Apply(&cfg))
        .await
        .unwrap();
    let mf = created.metadata.managed_fields.clone().unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("alice"), Some("Apply"))
    );
    assert!(mf[0].fields_v1.as_ref().unwrap().0["f:spec"]["f:type"].is_object());

    // A controller writes the ClusterIP by a plain update: it owns that field now.
    let mut with_ip = created.clone();
    with_ip.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.10".into());
    svcs.replace(
        "web",
        &PostParams {
            field_manager: Some("berth-controller".into()),
            ..Default::default()
        },
        &with_ip,
    )
    .await
    .unwrap();

    // Bob applies a different type: conflict with alice, named field, named manager.
    let bob_cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"type": "NodePort"}});
    let err = svcs
        .patch("web", &PatchParams::apply("bob"), &Patch::Apply(&bob_cfg))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code, 409);
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"alice\": .spec.type"
    );
    let causes = &status.details.as_ref().unwrap().causes;
    assert_eq!(causes[0].field, ".spec.type");

    // Forced, bob takes the field; alice keeps the rest.
    let forced = svcs
        .patch(
            "web",
            &PatchParams::apply("bob").force(),
            &Patch::Apply(&bob_cfg),
        )
        .await
        .unwrap();
    assert_eq!(
        forced.spec.as_ref().unwrap().type_.as_deref(),
        Some("NodePort")
    );
    assert_eq!(
        forced.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("10.96.0.10")
    );
    let managers: Vec<_> = forced
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|m| m.manager.unwrap())
        .collect();
    assert!(
        managers.contains(&"alice".to_owned())
            && managers.contains(&"bob".to_owned())
            && managers.contains(&"berth-controller".to_owned())
    );

    // Alice drops her label from her config: the server removes it.
    let cfg2 = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80, "name": "http"}]}});
    let after = svcs
        .patch("web", &alice, &Patch::Apply(&cfg2))
        .await
        .unwrap();
    assert!(after.metadata.labels.unwrap_or_default().is_empty());

    // Status through apply, as berth's agent writes its announcement.
    let st = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}});
    let with_status = svcs
        .patch_status(
            "web",
            &PatchParams::apply("berth-controller"),
            &Patch::Apply(&st),
        )
        .await
        .unwrap();
    assert_eq!(
        with_status
            .status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap()[0]
            .ip
            .as_deref(),
        Some("198.18.0.200")
    );
    assert_eq!(
        code(
            &svcs
                .patch("web", &PatchParams::default(), &Patch::Apply(&st))
                .await
                .unwrap_err()
        ),
        400,
        "apply needs a field manager"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn crd_then_custom_resources_are_served() {
    let (server, client) = common::start().await;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "ippools.berth.dev"},
        "spec": {"group": "berth.dev", "scope": "Cluster", "names": {"plural": "ippools", "singular": "ippool", "kind": "IPPool", "listKind": "IPPoolList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    })).unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        await_condition(
            crds.clone(),
            "ippools.berth.dev",
            conditions::is_crd_established(),
        ),
    )
    .await
    .unwrap()
    .unwrap();

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("berth.dev", "v1alpha1", "IPPool"),
        "ippools",
    );
    let pools: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let pool: DynamicObject = serde_json::from_value(json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "lan"}, "spec": {"addresses": ["198.18.0.200-198.18.0.250"]}, "status": {"assigned": 9}})).unwrap();
    let created = pools.create(&PostParams::default(), &pool).await.unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status subresource: create ignores status"
    );
    let mut st = created.clone();
    st.data["status"] = json!({"assigned": 1});
    let updated = pools
        .replace_status("lan", &PostParams::default(), &st)
        .await
        .unwrap();
    assert_eq!(updated.data["status"]["assigned"], 1);
    let cfg = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "lan"}, "spec": {"addresses": ["198.18.0.0/24"]}});
    let err = pools
        .patch("lan", &PatchParams::apply("me"), &Patch::Apply(&cfg))
        .await
        .unwrap_err();
    assert_eq!(
        code(&err),
        409,
        "the creator owns spec.addresses with another value"
    );
    let applied = pools
        .patch(
            "lan",
            &PatchParams::apply("me").force(),
            &Patch::Apply(&cfg),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["spec"]["addresses"][0], "198.18.0.0/24");
    assert_eq!(
        code(
            &pools
                .patch("lan", &PatchParams::default(), &Patch::Strategic(json!({})))
                .await
                .unwrap_err()
        ),
        415
    );

    // A namespaced CRD without status.
    let crd2: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}
    })).unwrap();
    crds.create(&PostParams::default(), &crd2).await.unwrap();
    let war = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &war);
    let w: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "status": {"ok": true}})).unwrap();
    let w = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(
        w.data["status"]["ok"], true,
        "no status subresource: status is ordinary content"
    );
    assert_eq!(
        Api::<DynamicObject>::all_with(client.clone(), &war)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    crds.delete("ippools.berth.dev", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(code(&pools.get("lan").await.unwrap_err()), 404);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn leader_election_with_kube_lease_manager() {
    let (server, client) = common::start().await;
    let mk = |id: &str| {
        LeaseManagerBuilder::new(client.clone(), "berth-controller")
            .with_namespace("kube-system")
            .with_identity(id)
            .with_duration(2)
            .with_grace(1)
            .build()
    };
    let first = mk("replica-a").await.unwrap();
    let second = mk("replica-b").await.unwrap();
    assert!(
        first.changed().await.unwrap(),
        "the first replica becomes leader"
    );
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get("berth-controller")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("replica-a")
    );

    // The second waits; once the first releases, it takes over.
    let waiter = tokio::spawn(async move {
        loop {
            if second.changed().await.unwrap() {
                return second;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiter.is_finished(),
        "no second leader while the first holds the lease"
    );
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .unwrap()
        .unwrap();
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get("berth-controller")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("replica-b")
    );
    second.release().await.unwrap();
    server.shutdown().await.unwrap();
}
