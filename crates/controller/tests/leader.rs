//! Leader election: two replicas, one writer; takeover after a crash only once the lease has
//! expired; a graceful stop hands the Lease back. Every check reads the Lease or the requests a
//! replica sent, never the wall clock, so a loaded machine slows the test but cannot fail it.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use berth_controller::LeaseConfig;
use common::*;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
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

const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/berth-controller";

async fn lease(client: &kube::Client) -> Option<LeaseSpec> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    leases.get_opt("berth-controller").await.unwrap()?.spec
}

async fn holder(client: &kube::Client) -> Option<String> {
    lease(client).await?.holder_identity
}

fn micros(t: &Option<MicroTime>) -> i64 {
    t.as_ref().expect("a lease time").0.as_microsecond()
}

/// Waits until `requests` holds `more` reads of the Lease beyond `seen`: the replica is alive
/// and has looked at the Lease since then.
async fn lease_reads(requests: &Requests, seen: usize, more: usize) -> usize {
    wait_until("the replica to read the Lease again", || {
        let now = requests.count(&http::Method::GET, LEASE_PATH);
        async move { now >= seen + more }
    })
    .await;
    requests.count(&http::Method::GET, LEASE_PATH)
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
    let (client_a, requests_a) = recording(client.clone());
    let (client_b, requests_b) = recording(client.clone());
    let a = spawn_controller(client_a, mk_leader_config("replica-a"));
    let b = spawn_controller(client_b, mk_leader_config("replica-b"));
    wait_until("a leader", || async { holder(&client).await.is_some() }).await;
    let leader_id = holder(&client).await.unwrap();
    for i in 0..10 {
        create_svc(
            &client,
            &format!("s{i}"),
            json!({"type": "NodePort", "ports": [{"port": 80}]}),
        )
        .await;
    }
    for i in 0..10 {
        wait_svc(&client, &format!("s{i}"), "allocated", |s| {
            allocated(s).is_some()
        })
        .await;
    }
    let ((leader, _), (standby, standby_requests)) = if leader_id == "replica-a" {
        ((a, requests_a), (b, requests_b))
    } else {
        ((b, requests_b), (a, requests_a))
    };
    // The standby ran all along: it read the Lease again after every Service was allocated,
    // so it saw the whole stretch in which the leader wrote, and it sent no write.
    let seen = standby_requests.count(&http::Method::GET, LEASE_PATH);
    lease_reads(&standby_requests, seen, 2).await;
    assert_eq!(holder(&client).await.as_deref(), Some(leader_id.as_str()));
    assert_eq!(standby.metric("berth_controller_leader"), 0.0, "both lead");
    assert_eq!(leader.metric("berth_controller_leader"), 1.0);
    assert!(writes(&leader) > 0.0);
    assert_eq!(writes(&standby), 0.0, "the standby wrote");
    assert_eq!(
        standby_requests.writes_outside("/apis/coordination.k8s.io/"),
        [],
        "the standby wrote"
    );

    // The leader crashes without releasing: the standby takes over, but only once the claim
    // it last saw renewed has expired (read from the Lease: no wall-clock bound here).
    let before = lease(&client).await.unwrap();
    leader.crash().await;
    create_svc(&client, "after-crash", json!({"ports": [{"port": 80}]})).await;
    wait_svc(&client, "after-crash", "allocated by the new leader", |s| {
        cluster_ip(s).is_some()
    })
    .await;
    let after = lease(&client).await.unwrap();
    assert_ne!(after.holder_identity.as_deref(), Some(leader_id.as_str()));
    assert_eq!(
        after.lease_transitions,
        before.lease_transitions.map(|n| n + 1),
        "{after:?}"
    );
    let duration = i64::from(before.lease_duration_seconds.unwrap()) * 1_000_000;
    assert!(
        micros(&after.acquire_time) >= micros(&before.renew_time) + duration,
        "taken over before the old claim expired: {before:?} then {after:?}"
    );
    assert!(writes(&standby) > 0.0);

    // A new replica stands by while the standby leads; a graceful stop hands the Lease back.
    let (client_c, requests_c) = recording(client.clone());
    let c = spawn_controller(client_c, mk_leader_config("replica-c"));
    lease_reads(&requests_c, 0, 2).await;
    assert_eq!(writes(&c), 0.0, "a standby wrote");
    assert_eq!(requests_c.writes_outside("/apis/coordination.k8s.io/"), []);
    let held = lease(&client).await.unwrap();
    standby.stop().await;
    // Released by the stopping replica (no holder, a one-second claim), unless replica-c has
    // already taken it, which then counts one more transition.
    let released = lease(&client).await.unwrap();
    match released.holder_identity.as_deref() {
        None => assert_eq!(released.lease_duration_seconds, Some(1), "{released:?}"),
        Some("replica-c") => assert_eq!(
            released.lease_transitions,
            held.lease_transitions.map(|n| n + 1)
        ),
        other => panic!("the stopped replica did not hand the Lease back: {other:?}"),
    }
    wait_until("replica-c leads", || async {
        holder(&client).await.as_deref() == Some("replica-c")
    })
    .await;
    create_svc(&client, "after-handover", json!({"ports": [{"port": 80}]})).await;
    wait_svc(&client, "after-handover", "allocated", |s| {
        cluster_ip(s).is_some()
    })
    .await;
    c.stop().await;
    server.shutdown().await.unwrap();
}
