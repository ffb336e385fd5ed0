//! The endpoints controller and dual-stack pods, against the lab API server over real HTTP: as
//! kube-controller-manager writes them, a Service gets one EndpointSlice per family it has
//! (`addressType` IPv4 or IPv6, each holding only addresses of that family, taken from the pods'
//! `podIPs`), a single-stack Service only its family's slice, and the Endpoints object only the
//! primary family.
//!
//! Address plan: pods 10.244.<node>.<n> and fd00:244:<node>::<n> on nodes n1 and n2; Services
//! 10.96.0.0/16 and fd00:96::/112.

#![allow(clippy::unwrap_used)]

mod endpoints_support;

use endpoints_support::*;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

/// Reports both of a pod's addresses (IPv4 first, as on a dual-stack node) and its readiness.
async fn set_dual_status(env: &Env, name: &str, ips: [&str; 2], ready: bool) {
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ips[0],
        "podIPs": [{"ip": ips[0]}, {"ip": ips[1]}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
    }});
    env.pods()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

fn mk_dual_service(name: &str, app: &str) -> serde_json::Value {
    let mut svc = mk_service(name, app, "fd00:96::10", json!(8080));
    svc["spec"]["clusterIPs"] = json!(["fd00:96::10", "10.96.0.10"]);
    svc["spec"]["ipFamilies"] = json!(["IPv6", "IPv4"]);
    svc["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
    svc
}

/// (addressType, [(address, ready)]) of every berth slice of `service`, sorted.
async fn slices_by_family(env: &Env, service: &str) -> Vec<(String, Vec<(String, bool)>)> {
    let mut out: Vec<(String, Vec<(String, bool)>)> = env
        .berth_slices(service)
        .await
        .into_iter()
        .map(|s| {
            let mut endpoints: Vec<(String, bool)> = s
                .endpoints
                .iter()
                .flat_map(|e| {
                    let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
                    e.addresses.iter().map(move |a| (a.clone(), ready))
                })
                .collect();
            endpoints.sort();
            (s.address_type, endpoints)
        })
        .collect();
    out.sort();
    out
}

fn family(address_type: &str, endpoints: &[(&str, bool)]) -> (String, Vec<(String, bool)>) {
    (
        address_type.to_owned(),
        endpoints
            .iter()
            .map(|(a, r)| ((*a).to_owned(), *r))
            .collect(),
    )
}

#[tokio::test]
async fn dual_stack_pods_fill_one_slice_per_family() {
    let env = Env::start().await;
    env.create_service(mk_dual_service("web", "web")).await;
    env.create_service(mk_service("web4", "web", "10.96.0.11", json!(8080)))
        .await;
    for (name, node, ips, ready) in [
        ("a", "n1", ["10.244.1.5", "fd00:244:1::5"], true),
        ("b", "n2", ["10.244.2.5", "fd00:244:2::5"], false),
    ] {
        let pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(mk_pod(name, "web", node, 8080)).unwrap();
        env.pods().create(&Default::default(), &pod).await.unwrap();
        set_dual_status(&env, name, ips, ready).await;
    }

    let want = vec![
        family("IPv4", &[("10.244.1.5", true), ("10.244.2.5", false)]),
        family("IPv6", &[("fd00:244:1::5", true), ("fd00:244:2::5", false)]),
    ];
    eventually("a slice per family", WAIT, || async {
        (slices_by_family(&env, "web").await == want).then_some(())
    })
    .await;
    // The single-stack Service over the same pods: its family only.
    let want4 = vec![family(
        "IPv4",
        &[("10.244.1.5", true), ("10.244.2.5", false)],
    )];
    eventually("the IPv4 Service's one slice", WAIT, || async {
        (slices_by_family(&env, "web4").await == want4).then_some(())
    })
    .await;
    // Endpoints, which holds one family, holds the primary one.
    let ips = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        env.endpoint_ips("web").await,
        Some((ips(&["fd00:244:1::5"]), ips(&["fd00:244:2::5"])))
    );

    // b turns ready: both families follow.
    set_dual_status(&env, "b", ["10.244.2.5", "fd00:244:2::5"], true).await;
    let want = vec![
        family("IPv4", &[("10.244.1.5", true), ("10.244.2.5", true)]),
        family("IPv6", &[("fd00:244:1::5", true), ("fd00:244:2::5", true)]),
    ];
    eventually("readiness in both families", WAIT, || async {
        (slices_by_family(&env, "web").await == want).then_some(())
    })
    .await;

    // a goes: it leaves both slices, which stay one per family.
    env.pods()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let want = vec![
        family("IPv4", &[("10.244.2.5", true)]),
        family("IPv6", &[("fd00:244:2::5", true)]),
    ];
    eventually("a gone from both families", WAIT, || async {
        (slices_by_family(&env, "web").await == want).then_some(())
    })
    .await;
    env.stop().await;
}
