//! Leader election: two replicas, one writer; takeover after a crash within the lease
//! duration; a graceful stop hands the Lease over at once.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use berth_controller::LeaseConfig;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::json;

fn mk_leader_config(identity: &str) -> berth_controller::ControllerConfig {
    let mut cfg = mk_config();
    let mut lease = LeaseConfig::new("kube-system", identity);
    lease.lease_duration = Duration::from_secs(2);
    lease.renew_deadline = Duration::from_millis(1500);
    lease.retry_period = Duration::from_millis(200);
    cfg.lease = Some(lease);
    cfg.instance = identity.to_string();
    cfg
}

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    leases
        .get_opt("berth-controller")
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

const WRITES: [&str; 2] = [
    "berth_controller_api_writes_total{kind=\"spec\"}",
    "berth_controller_api_writes_total{kind=\"status\"}",
];

fn writes(r: &Running) -> f64 {
    WRITES.iter().map(|m| r.metric(m)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_both_write_and_a_standby_takes_over() {
    let (server, client) = start_lab().await;
    let a = spawn_controller(client.clone(), mk_leader_config("replica-a"));
    let b = spawn_controller(client.clone(), mk_leader_config("replica-b"));
    let mut leader_id = None;
    wait_until("a leader", || async { holder(&client).await.is_some() }).await;
    for i in 0..10 {
        create_svc(
            &client,
            &format!("s{i}"),
            json!({"type": "NodePort", "ports": [{"port": 80}]}),
        )
        .await;
    }
    // While both run, sample: at most one leads, and only the leader has written.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let (la, lb) = (
            a.metric("berth_controller_leader"),
            b.metric("berth_controller_leader"),
        );
        assert!(la + lb <= 1.0, "both lead");
        if la + lb == 1.0 {
            leader_id = Some(if la == 1.0 { "replica-a" } else { "replica-b" });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leader_id = leader_id.unwrap();
    assert_eq!(holder(&client).await.as_deref(), Some(leader_id));
    for i in 0..10 {
        wait_svc(&client, &format!("s{i}"), "allocated", |s| {
            allocated(s).is_some()
        })
        .await;
    }
    let (leader, standby) = if leader_id == "replica-a" {
        (a, b)
    } else {
        (b, a)
    };
    assert!(writes(&leader) > 0.0);
    assert_eq!(writes(&standby), 0.0, "the standby wrote");

    // The leader crashes without releasing: the standby takes over once the lease expires.
    let crashed_at = Instant::now();
    leader.crash().await;
    create_svc(&client, "after-crash", json!({"ports": [{"port": 80}]})).await;
    wait_svc(&client, "after-crash", "allocated by the new leader", |s| {
        cluster_ip(s).is_some()
    })
    .await;
    let took = crashed_at.elapsed();
    assert!(took < Duration::from_secs(6), "takeover took {took:?}");
    assert_ne!(holder(&client).await.as_deref(), Some(leader_id));
    assert!(writes(&standby) > 0.0);

    // A graceful stop hands the Lease back: a new replica leads well before it would expire.
    let c = spawn_controller(client.clone(), mk_leader_config("replica-c"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(writes(&c), 0.0, "a standby wrote");
    standby.stop().await;
    let stopped_at = Instant::now();
    wait_until("replica-c leads", || async {
        holder(&client).await.as_deref() == Some("replica-c")
    })
    .await;
    assert!(
        stopped_at.elapsed() < Duration::from_millis(1500),
        "handover took {:?}",
        stopped_at.elapsed()
    );
    create_svc(&client, "after-handover", json!({"ports": [{"port": 80}]})).await;
    wait_svc(&client, "after-handover", "allocated", |s| {
        cluster_ip(s).is_some()
    })
    .await;
    c.stop().await;
    server.shutdown().await.unwrap();
}
