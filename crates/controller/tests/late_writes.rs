//! A killed controller's write landing after its replacement decided the same Service from the
//! older version: the replacement's write is refused (409, nothing written), and what its
//! decision gave the Service must not stay held against what the Service now names, or those
//! values are refused as changed ("a cluster IP may not change once set") or replaced; nor may
//! it be freed while the write that landed names it, or it goes to another Service.
//!
//! The late write is made deterministic by the controller's client: the first time it sends a
//! matching write, the late write is sent first.
//!
//! Address plan: service CIDR 10.96.0.0/16, node ports 30000-32767, one pool 198.18.0.10-11.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth_controller::LeaseConfig;

use common::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

async fn merge_patch(client: &Client, name: &str, status: bool, patch: Value) {
    let api: Api<Service> = Api::default_namespaced(client.clone());
    let params = PatchParams::default();
    if status {
        api.patch_status(name, &params, &Patch::Merge(&patch))
            .await
            .unwrap();
    } else {
        api.patch(name, &params, &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

/// The lab with the one pool of the address plan.
async fn start_lab_with_pool() -> (berth_lab::LabApiServerHandle, Client) {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "pool",
        json!({"addresses": ["198.18.0.10-198.18.0.11"]}),
    )
    .await;
    (server, client)
}

/// A LoadBalancer Service whose spec is complete: its first write is the status write.
fn complete_lb(ip: &str, port: u16) -> Value {
    json!({"type": "LoadBalancer", "clusterIP": ip, "clusterIPs": [ip],
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
        "ports": [{"port": 80, "nodePort": port}]})
}

/// Waits until each of `names` is decided, and checks that each got everything it asked for.
async fn wait_allocated(client: &Client, names: &[&str]) {
    for name in names {
        let s = wait_svc(client, name, "allocated", |s| allocated(s).is_some()).await;
        assert_eq!(
            allocated(&s).unwrap().0,
            "True",
            "{name}: {:?}",
            allocated(&s)
        );
    }
}

fn health_check_port(s: &Service) -> Option<i32> {
    s.spec.as_ref().and_then(|sp| sp.health_check_node_port)
}

/// The sequence of the reliability test's flake: the replacement decides ClusterIP, node port
/// and healthCheckNodePort from a version without them; the killed controller's spec write with
/// other values lands first; the replacement's write is refused. The Service keeps the values
/// that landed, and nothing is reported as a conflict.
#[tokio::test]
async fn values_a_refused_spec_write_gave_are_released_so_the_landed_ones_are_adopted() {
    let (server, client) = start_lab_with_pool().await;
    create_svc(
        &client,
        "s",
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
    )
    .await;
    let killed = before_patch(
        client.clone(),
        "/api/v1/namespaces/default/services/s",
        1,
        |c| {
            Box::pin(async move {
                let spec = json!({"spec": {
                    "clusterIP": "10.96.0.77", "clusterIPs": ["10.96.0.77"],
                    "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80, "nodePort": 30555}],
                    "healthCheckNodePort": 30556}});
                merge_patch(&c, "s", false, spec).await;
            })
        },
    );
    let ctrl = spawn_controller(killed, mk_config());
    let s = wait_svc(&client, "s", "a decision after the late write", |s| {
        allocated(s).is_some()
    })
    .await;
    assert_eq!(allocated(&s).unwrap().0, "True", "{:?}", allocated(&s));
    assert_eq!(cluster_ip(&s).as_deref(), Some("10.96.0.77"));
    assert_eq!(node_ports(&s), [Some(30555)]);
    assert_eq!(health_check_port(&s), Some(30556));
    assert_eq!(ingress_ips(&s), ["198.18.0.10"]);
    assert_eq!(ctrl.metric("berth_controller_conflicts_total"), 0.0);

    // A real change of a set ClusterIP is still refused, in the apiserver's words.
    merge_patch(
        &client,
        "s",
        false,
        json!({"spec": {"clusterIP": "10.96.0.78", "clusterIPs": ["10.96.0.78"]}}),
    )
    .await;
    let s = wait_svc(&client, "s", "the change refused", |s| {
        allocated(s).is_some_and(|c| c.0 == "False")
    })
    .await;
    let message = allocated(&s).unwrap().2;
    assert!(
        message.contains("a cluster IP may not change once set"),
        "{message}"
    );
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// The same with the status: the replacement picks 198.18.0.10 for a Service whose killed
/// controller's status write naming 198.18.0.11 lands first. The Service keeps 198.18.0.11.
#[tokio::test]
async fn an_address_a_refused_status_write_gave_is_released_so_the_landed_one_is_kept() {
    let (server, client) = start_lab_with_pool().await;
    // The spec is complete, so the status write is the first write.
    create_svc(&client, "s", complete_lb("10.96.0.77", 30555)).await;
    let killed = before_patch(
        client.clone(),
        "/api/v1/namespaces/default/services/s/status",
        1,
        |c| {
            Box::pin(async move {
                let status = json!({"status": {"loadBalancer": {"ingress": [
                    {"ip": "198.18.0.11", "ipMode": "VIP"}]}}});
                merge_patch(&c, "s", true, status).await;
            })
        },
    );
    let ctrl = spawn_controller(killed, mk_config());
    let s = wait_svc(&client, "s", "a decision after the late write", |s| {
        allocated(s).is_some()
    })
    .await;
    assert_eq!(allocated(&s).unwrap().0, "True", "{:?}", allocated(&s));
    assert_eq!(ingress_ips(&s), ["198.18.0.11"]);
    // And it stays there: nothing decides it away afterwards.
    settled(&client).await;
    assert_eq!(ingress_ips(&get_svc(&client, "s").await), ["198.18.0.11"]);
    // The other address is free: a second Service gets it.
    create_svc(
        &client,
        "t",
        json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
    )
    .await;
    let t = wait_svc(&client, "t", "an address", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&t), ["198.18.0.10"]);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// The killed controller's status write names the very address the replacement picked (both
/// take the lowest free one): the replacement's write is refused, and the address must stay
/// held for the Service that now names it, not go to the next Service decided. One write at a
/// time, so that `t` waits in the queue while `s`'s write is out, and is decided right after
/// the refusal, before `s` is decided again.
#[tokio::test]
async fn an_address_a_refused_status_write_gave_is_not_handed_out_while_the_landed_write_names_it()
{
    let (server, client) = start_lab_with_pool().await;
    create_svc(&client, "s", complete_lb("10.96.0.77", 30555)).await;
    let t_spec = complete_lb("10.96.0.78", 30556);
    let killed = before_patch(
        client.clone(),
        "/api/v1/namespaces/default/services/s/status",
        1,
        move |c| {
            let t_spec = t_spec.clone();
            Box::pin(async move {
                // `t` is seen, and waits for the one write slot `s` holds.
                create_svc(&c, "t", t_spec).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let status = json!({"status": {"loadBalancer": {"ingress": [
                    {"ip": "198.18.0.10", "ipMode": "VIP"}]}}});
                merge_patch(&c, "s", true, status).await;
            })
        },
    );
    let mut cfg = mk_config();
    cfg.max_in_flight = 1;
    let ctrl = spawn_controller(killed, cfg);
    let t = wait_svc(&client, "t", "an address", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&t), ["198.18.0.11"]);
    let s = wait_svc(&client, "s", "allocated", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&s).unwrap().0, "True", "{:?}", allocated(&s));
    assert_eq!(ingress_ips(&s), ["198.18.0.10"]);
    settled(&client).await;
    assert_eq!(ingress_ips(&get_svc(&client, "s").await), ["198.18.0.10"]);
    assert_eq!(ingress_ips(&get_svc(&client, "t").await), ["198.18.0.11"]);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// The killed controller gave two Services the two addresses in the other order than the
/// replacement: `a` is refused, `b`'s landed status names the address `a`'s refused write
/// would have named. `b` keeps it (what only a refused write would name gives way to what a
/// Service names), and `a` keeps the other.
#[tokio::test]
async fn an_address_a_refused_write_would_have_named_gives_way_to_a_service_naming_it() {
    let (server, client) = start_lab_with_pool().await;
    create_svc(&client, "a", complete_lb("10.96.0.77", 30555)).await;
    create_svc(&client, "b", complete_lb("10.96.0.78", 30556)).await;
    let killed = before_patch(
        client.clone(),
        "/api/v1/namespaces/default/services/a/status",
        1,
        |c| {
            Box::pin(async move {
                for (name, ip) in [("a", "198.18.0.11"), ("b", "198.18.0.10")] {
                    let status = json!({"status": {"loadBalancer": {"ingress": [
                        {"ip": ip, "ipMode": "VIP"}]}}});
                    merge_patch(&c, name, true, status).await;
                }
                // Both changes are seen before the refusal.
                tokio::time::sleep(Duration::from_millis(300)).await;
            })
        },
    );
    let mut cfg = mk_config();
    cfg.max_in_flight = 1;
    let ctrl = spawn_controller(killed, cfg);
    wait_allocated(&client, &["a", "b"]).await;
    settled(&client).await;
    assert_eq!(ingress_ips(&get_svc(&client, "a").await), ["198.18.0.11"]);
    assert_eq!(ingress_ips(&get_svc(&client, "b").await), ["198.18.0.10"]);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// The killed controller's status write lands after the replacement listed, on a Service `z`
/// the replacement decides last: the address it names is held from the moment the watch shows
/// it, so `c`, decided first and needing an address, gets the other one. One write at a time:
/// `a`'s spec write is the one the late write lands before.
#[tokio::test]
async fn an_address_a_late_write_names_is_held_before_its_service_is_decided() {
    let (server, client) = start_lab_with_pool().await;
    create_svc(&client, "a", json!({"ports": [{"port": 80}]})).await;
    create_svc(&client, "c", complete_lb("10.96.0.78", 30556)).await;
    create_svc(&client, "z", complete_lb("10.96.0.79", 30557)).await;
    let killed = before_patch(
        client.clone(),
        "/api/v1/namespaces/default/services/a",
        1,
        |c| {
            Box::pin(async move {
                let status = json!({"status": {"loadBalancer": {"ingress": [
                    {"ip": "198.18.0.10", "ipMode": "VIP"}]}}});
                merge_patch(&c, "z", true, status).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            })
        },
    );
    let mut cfg = mk_config();
    cfg.max_in_flight = 1;
    let ctrl = spawn_controller(killed, cfg);
    wait_allocated(&client, &["a", "c", "z"]).await;
    settled(&client).await;
    assert_eq!(ingress_ips(&get_svc(&client, "c").await), ["198.18.0.11"]);
    assert_eq!(ingress_ips(&get_svc(&client, "z").await), ["198.18.0.10"]);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// This replica's own write, sent just before it stopped leading (a renewal that missed its
/// deadline) and answered late, must land before the replica's next term lists: the next term
/// would hand the address out again. Here the write waits (up to 2.5 s) for the other Service
/// to get an address; the next term must not have started meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_that_ends_lets_its_writes_land_before_the_next_term_lists() {
    let (server, client) = start_lab_with_pool().await;
    create_svc(&client, "s", complete_lb("10.96.0.77", 30555)).await;
    let slow_lease = Arc::new(AtomicBool::new(false));
    let first = Arc::new(AtomicBool::new(true));
    let service = tower::service_fn({
        let (client, slow_lease) = (client.clone(), slow_lease.clone());
        move |req: http::Request<kube::client::Body>| {
            let (client, slow_lease, first) = (client.clone(), slow_lease.clone(), first.clone());
            let t_spec = complete_lb("10.96.0.78", 30556);
            async move {
                let path = req.uri().path().to_string();
                if path.contains("/leases/") && slow_lease.swap(false, Ordering::SeqCst) {
                    // The renewal misses the deadline: the replica stops leading.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                } else if req.method() == http::Method::PATCH
                    && path == "/api/v1/namespaces/default/services/s/status"
                    && first.swap(false, Ordering::SeqCst)
                {
                    // A task of its own, as a request on the wire: dropping the job that sent it
                    // does not stop it.
                    let sent = tokio::spawn(async move {
                        create_svc(&client, "a-t", t_spec).await;
                        slow_lease.store(true, Ordering::SeqCst);
                        for _ in 0..50 {
                            if !ingress_ips(&get_svc(&client, "a-t").await).is_empty() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        client.send(req).await
                    });
                    return sent.await.unwrap();
                }
                client.send(req).await
            }
        }
    });
    let replica = Client::new(service, "default");
    let mut cfg = mk_config();
    // `a-t` waits for the one write slot `s` holds, until the term ends.
    cfg.max_in_flight = 1;
    let mut lease = LeaseConfig::new("kube-system", "replica-a");
    lease.lease_duration = Duration::from_secs(2);
    lease.renew_deadline = Duration::from_millis(1500);
    lease.retry_period = Duration::from_millis(200);
    cfg.lease = Some(lease);
    let ctrl = spawn_controller(replica, cfg);
    let t = wait_svc(&client, "a-t", "an address", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&t), ["198.18.0.11"]);
    let s = wait_svc(&client, "s", "an address", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&s), ["198.18.0.10"]);
    settled(&client).await;
    assert_eq!(ingress_ips(&get_svc(&client, "s").await), ["198.18.0.10"]);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}
