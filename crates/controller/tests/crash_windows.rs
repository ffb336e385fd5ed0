//! Windows in which a crash (or a failed write) used to leave two Services naming one address:
//! an address must stay held while the status of a Service that no longer needs it still
//! names it, and a node port while its spec does.
//!
//! Address plan: service CIDR 10.96.0.0/16, node ports 30000-32767, one pool of one address,
//! 198.18.0.10.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth_controller::load_balancer::{build_l2_ingress, LbRequest, Provider, ProviderError};
use berth_ipam::ServiceKey;
use common::*;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::LoadBalancerIngress;
use serde_json::json;

/// The `l2` provider, except that deleting fails while `fail_delete` is set, so the write that
/// clears a former LoadBalancer's status does not happen.
struct StuckDelete {
    fail_delete: AtomicBool,
}

impl Provider for StuckDelete {
    fn ensure<'a>(
        &'a self,
        req: LbRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<LoadBalancerIngress>, ProviderError>> {
        Box::pin(async move { Ok(build_l2_ingress(req.addresses)) })
    }

    fn delete<'a>(&'a self, _service: &'a ServiceKey) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            if self.fail_delete.load(Ordering::Relaxed) {
                Err(ProviderError("stuck on purpose".into()))
            } else {
                Ok(())
            }
        })
    }
}

#[tokio::test]
async fn an_address_is_not_given_away_while_a_former_load_balancer_still_names_it() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "one",
        json!({"addresses": ["198.18.0.10-198.18.0.10"]}),
    )
    .await;
    let provider = Arc::new(StuckDelete {
        fail_delete: AtomicBool::new(false),
    });
    let ctrl = spawn_controller_with(client.clone(), mk_config(), |ctrl| {
        ctrl.with_provider(provider.clone())
    });

    let lb = json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
    create_svc(&client, "a", lb.clone()).await;
    wait_svc(&client, "a", "ingress", |s| {
        ingress_ips(s) == ["198.18.0.10"]
    })
    .await;

    provider.fail_delete.store(true, Ordering::Relaxed);
    patch_svc(
        &client,
        "a",
        json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
    )
    .await;
    wait_until("the clear to fail", || async {
        events_for(&client, "a")
            .await
            .iter()
            .any(|(reason, _)| reason == "SyncLoadBalancerFailed")
    })
    .await;

    create_svc(&client, "b", lb).await;
    let b = wait_svc(&client, "b", "a decision", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&b).unwrap().0, "False", "{b:#?}");
    assert!(ingress_ips(&b).is_empty());
    assert_eq!(ingress_ips(&get_svc(&client, "a").await), ["198.18.0.10"]);

    // Once the clear lands, the address moves on.
    provider.fail_delete.store(false, Ordering::Relaxed);
    let mut moved = false;
    for _ in 0..600 {
        let b = get_svc(&client, "b").await;
        if ingress_ips(&b) == ["198.18.0.10"] {
            assert!(ingress_ips(&get_svc(&client, "a").await).is_empty());
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved, "b never got the address a gave up");
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// Kills the controller and starts a new one, which lists and adopts from scratch; returns once
/// it has adopted what the cluster holds.
async fn crash_and_restart(ctrl: Running, client: &kube::Client) -> Running {
    ctrl.crash().await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    ctrl.adopted().await;
    ctrl
}

/// After a restart: the new controller adopted `a` and `b` without finding two claims on one
/// value (the bug these tests guard), and both still hold what they held before the crash.
async fn assert_adopted_without_conflict<T: PartialEq + std::fmt::Debug>(
    ctrl: &Running,
    client: &kube::Client,
    held: impl Fn(&k8s_openapi::api::core::v1::Service) -> Option<T>,
    before: &[Option<T>],
) {
    assert_eq!(ctrl.metric("berth_controller_conflicts_total"), 0.0);
    for (name, before) in ["a", "b"].into_iter().zip(before) {
        let s = get_svc(client, name).await;
        assert_eq!(allocated(&s).map(|c| c.0), Some("True".into()), "{s:#?}");
        assert!(held(&s).is_some(), "{s:#?}");
        assert_eq!(&held(&s), before, "{name} changed across the restart");
    }
}

fn health_check_port(s: &k8s_openapi::api::core::v1::Service) -> Option<i32> {
    s.spec.as_ref().and_then(|sp| sp.health_check_node_port)
}

/// A LoadBalancer with Local policy changed to NodePort by a merge patch: the spec still names
/// its healthCheckNodePort. Freed at once, the port went to another Service while this spec
/// named it; after a crash the next leader found two claims, and one Service was refused for
/// good ("provided port is already allocated"). The port is dropped from the spec, as a real
/// cluster does on a type change, and freed only once that write has landed.
#[tokio::test]
async fn a_health_check_port_is_not_given_away_while_a_former_local_load_balancer_names_it() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "one",
        json!({"addresses": ["198.18.0.10-198.18.0.11"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    let local =
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]});
    create_svc(&client, "a", local.clone()).await;
    let a = wait_svc(&client, "a", "a healthCheckNodePort", |s| {
        health_check_port(s).is_some() && allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
    let hc = health_check_port(&a).unwrap();

    patch_svc(
        &client,
        "a",
        json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 81}]}}),
    )
    .await;
    let a = wait_svc(&client, "a", "healthCheckNodePort dropped", |s| {
        health_check_port(s).is_none() && node_ports(s).iter().all(Option::is_some)
    })
    .await;
    assert_eq!(allocated(&a).unwrap().0, "True", "{a:#?}");
    assert!(!node_ports(&a).contains(&Some(hc)));

    // Freed once dropped: another Service may ask for it.
    let mut wants = local.clone();
    wants["healthCheckNodePort"] = json!(hc);
    create_svc(&client, "b", wants).await;
    wait_svc(&client, "b", "the freed port", |s| {
        allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;

    // Back to a Local LoadBalancer: a new port, no conflict, also after a crash.
    patch_svc(
        &client,
        "a",
        json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
    )
    .await;
    let a = wait_svc(&client, "a", "a new healthCheckNodePort", |s| {
        health_check_port(s).is_some() && allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_ne!(health_check_port(&a), Some(hc));
    let before = [
        health_check_port(&a),
        health_check_port(&get_svc(&client, "b").await),
    ];
    let ctrl = crash_and_restart(ctrl, &client).await;
    assert_adopted_without_conflict(&ctrl, &client, health_check_port, &before).await;
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// A Service changed to ExternalName still names its ClusterIP until berth drops it from the
/// spec, as a real apiserver does on that change. Freed at once, the address could go to
/// another Service while this spec named it, and a change back to ClusterIP claimed it again:
/// refused for good ("provided IP is already allocated"). It is dropped, and held until then.
#[tokio::test]
async fn a_cluster_ip_is_not_given_away_while_a_former_cluster_ip_service_names_it() {
    let (server, client) = start_lab().await;
    // a's second spec write (the drop; the first filled the ClusterIP) waits until b, asking
    // for the address a still names, has been refused.
    let gated = before_patch(
        client.clone(),
        "/api/v1/namespaces/default/services/a",
        2,
        |c| {
            Box::pin(async move {
                wait_svc(&c, "b", "refused while a names the address", |s| {
                    allocated(s).is_some_and(|c| c.0 == "False")
                })
                .await;
            })
        },
    );
    let ctrl = spawn_controller(gated, mk_config());
    create_svc(&client, "a", json!({"ports": [{"port": 80}]})).await;
    let a = wait_svc(&client, "a", "a ClusterIP", |s| {
        cluster_ip(s).is_some() && allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
    let ip = cluster_ip(&a).unwrap();

    patch_svc(
        &client,
        "a",
        json!({"spec": {"type": "ExternalName", "externalName": "example.invalid"}}),
    )
    .await;
    // Refused while a names it; given once the drop has landed.
    create_svc(
        &client,
        "b",
        json!({"clusterIP": ip, "ports": [{"port": 80}]}),
    )
    .await;
    let a = wait_svc(&client, "a", "the ClusterIP dropped", |s| {
        cluster_ip(s).is_none()
    })
    .await;
    let spec = a.spec.unwrap();
    assert_eq!(spec.cluster_ips, None);
    assert_eq!((spec.ip_families, spec.ip_family_policy), (None, None));
    wait_svc(&client, "b", "the freed address", |s| {
        allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;

    // Back to ClusterIP: a new address, no conflict, also after a crash.
    patch_svc(&client, "a", json!({"spec": {"type": "ClusterIP"}})).await;
    let a = wait_svc(&client, "a", "a new ClusterIP", |s| {
        cluster_ip(s).is_some() && allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_ne!(cluster_ip(&a), Some(ip));
    let before = [cluster_ip(&a), cluster_ip(&get_svc(&client, "b").await)];
    let ctrl = crash_and_restart(ctrl, &client).await;
    assert_adopted_without_conflict(&ctrl, &client, cluster_ip, &before).await;
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}
