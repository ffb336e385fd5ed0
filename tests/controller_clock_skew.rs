//! Leader election between real `berth controller` processes whose wall clocks disagree.
//!
//! Two replicas of the built binary run with leader election against the lab API server (in
//! this process, 127.0.0.1 only): the leader with the machine's clock, the standby under
//! `faketime` with its wall clock an hour ahead (one row) or an hour behind (the other). The
//! Lease's `renewTime` is written by the leader's clock and read by the standby's, so a standby
//! that compared it with its own wall clock would take over from a healthy leader when ahead,
//! and never take over from a dead one when behind. With client-go's observed-time rule (a Lease
//! is expired when it has not changed for its duration by the observer's own monotonic clock)
//! the standby must hold still for several lease durations while the leader renews, and take
//! over within the lease duration plus a margin once the leader is SIGKILLed. The Lease the
//! standby then writes carries its skewed wall clock, which proves `faketime` reached the
//! process.
//!
//! Only the wall clock is faked (`FAKETIME_DONT_FAKE_MONOTONIC=1`): `renewTime` comes from it,
//! while tokio's timers and the observed-time rule run on `CLOCK_MONOTONIC`, as they would on a
//! node whose NTP is off. Needs `faketime` (`make deps`): without it the test skips, and fails
//! under `CI=true` or `BERTH_REQUIRE_ROOT=1`. Each row takes about 10 s.

#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "support/replicas.rs"]
mod replicas;

use std::time::{Duration, Instant};

use berth_testing::{install_crds, start_lab, Requirement};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::Client;
use replicas::{
    wait_for_leader, ReplicaSpec, Replicas, ScratchDir, LEASE_NAME, LEASE_NAMESPACE,
    SHORT_LEASE_FLAGS,
};

const LEASE_DURATION: Duration = Duration::from_secs(2);
/// How long the skewed standby must leave a renewing leader alone: three lease durations.
const HOLD: Duration = Duration::from_secs(6);
/// Room beyond the lease duration for the standby's retry period, its requests to a debug-build
/// API server and a busy machine.
const TAKEOVER_MARGIN: Duration = Duration::from_secs(3);
/// How far a wall clock may be from the skew it was given (the time between a write and the
/// test's read, and the machine's own clock steps).
const CLOCK_TOLERANCE: SignedDuration = SignedDuration::from_secs(60);

async fn lease_spec(client: &Client) -> Option<LeaseSpec> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    api.get_opt(LEASE_NAME).await.ok().flatten()?.spec
}

/// How far the Lease's `renewTime` is from the test's own wall clock.
fn renew_offset(spec: &LeaseSpec) -> SignedDuration {
    let renewed = spec
        .renew_time
        .as_ref()
        .expect("a held Lease has a renewTime")
        .0;
    renewed.duration_since(Timestamp::now())
}

fn assert_clock(what: &str, offset: SignedDuration, expected: SignedDuration) {
    let off_by = (offset - expected).abs();
    assert!(
        off_by <= CLOCK_TOLERANCE,
        "{what}: renewTime is {offset:?} from the test's clock, expected about {expected:?}"
    );
}

/// One row: a leader on the machine's clock and a standby whose wall clock is `skew` off.
async fn skewed_standby(skew: &str, expected: SignedDuration) {
    let began = Instant::now();
    let (server, client) = start_lab().await;
    install_crds(&client).await;
    let scratch = ScratchDir::new("berth-controller-clock-skew");
    let kubeconfig = scratch.path.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut args: Vec<String> = [
        "--service-cidr",
        "10.96.0.0/16,fd00:96::/112",
        "--node-port-range",
        "30000-39999",
        "--log-level",
        "warn,berth_controller::lease=debug",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(SHORT_LEASE_FLAGS.iter().map(|s| s.to_string()));
    let mut replicas = Replicas::new(
        ReplicaSpec {
            bin: env!("CARGO_BIN_EXE_berth").into(),
            kubeconfig,
            log_dir: scratch.path.clone(),
            args,
            env: vec![("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into())],
        },
        2,
    );
    // `-m`: the multi-threaded libfaketime, for tokio's worker threads.
    replicas.set_slot_wrapper(
        1,
        vec!["faketime".into(), "-m".into(), "-f".into(), skew.into()],
    );

    replicas.start(0);
    let (slot, _) = wait_for_leader(&client, &mut replicas, None, Duration::from_secs(30)).await;
    assert_eq!(slot, 0, "the only replica leads");
    let leader = replicas.get(0).unwrap().identity.clone();
    replicas.start(1);

    // The leader renews; the standby, however its clock reads renewTime, must wait.
    let hold_start = Instant::now();
    let mut renewals = 0;
    let mut last_renew = None;
    while hold_start.elapsed() < HOLD {
        replicas.assert_all_running();
        let spec = lease_spec(&client).await.expect("the Lease exists");
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some(leader.as_str()),
            "{skew}: the standby took over from a renewing leader after {:.1?}\n{}",
            hold_start.elapsed(),
            replicas.logs()
        );
        assert_clock("the leader", renew_offset(&spec), SignedDuration::ZERO);
        if last_renew != spec.renew_time {
            renewals += 1;
            last_renew = spec.renew_time;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        renewals >= 3,
        "{skew}: the leader renewed only {renewals} times in {HOLD:?}"
    );

    // The leader dies without handing the Lease back; the standby takes it once it has not
    // changed for its duration.
    replicas.kill(0);
    let limit = LEASE_DURATION + TAKEOVER_MARGIN;
    let (slot, took) = wait_for_leader(&client, &mut replicas, Some(&leader), limit).await;
    assert_eq!(slot, 1);
    let spec = lease_spec(&client).await.expect("the Lease exists");
    // The standby wrote with its own wall clock: faketime did skew the process.
    assert_clock("the skewed standby", renew_offset(&spec), expected);
    println!(
        "controller_clock_skew: standby {skew}: held through {renewals} renewals in {HOLD:?}, \
         took over {took:.2?} after the leader's SIGKILL (lease {LEASE_DURATION:?}), \
         its renewTime {:+.1} s from the test's clock, row {:.1?}",
        renew_offset(&spec).as_secs_f64(),
        began.elapsed()
    );
    drop(replicas);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_an_hour_ahead_neither_steals_nor_stalls() {
    berth_testing::require!(Requirement::Program("faketime"));
    skewed_standby("+1h", SignedDuration::from_hours(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_an_hour_behind_neither_steals_nor_stalls() {
    berth_testing::require!(Requirement::Program("faketime"));
    skewed_standby("-1h", SignedDuration::from_hours(-1)).await;
}
