//! SIGKILL reliability of the real `berth controller` process.
//!
//! Two replicas of the built binary run with leader election (short lease timings) against the
//! lab API server (in this process, 127.0.0.1 only). While Services over 1,000 names are created,
//! changed and deleted, replicas are SIGKILLed at random moments, mostly the leader (found from
//! the Lease holder), sometimes the standby, and every killed replica is started again. A
//! watcher checks all along that no live Service loses or changes a value it was given. Then,
//! with one leader left, everything must converge: nothing has two owners, every Service holds
//! what it needs, pool counts equal what live Services hold. A second phase repeats this under
//! the lab's fault injection (errors and dropped watches), which is switched off before the
//! final convergence.
//!
//! Two such labs (each its own API server, replicas, churn and watcher: 2,000 Service names in
//! all) run side by side, each with half of the 50 kills (and of the 4 under faults). Most of
//! a leader kill's time is the wait until its Lease expires, so the labs overlap that idle time
//! rather than the CPU: the same number of kills, each at its own random moment of a leader's
//! work and each followed by a takeover, in about half the time of one lab doing them all.
//!
//! The random choices follow one seed, printed at the start (lab `n` uses seed + `n`);
//! `BERTH_SIGKILL_SEED` repeats a run.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_lab::{Faults, LabApiServer};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use support::check::{check_final, track, Holdings, Tracker};
use support::churn::{churn, pools, ChurnStats, NODE_PORT_RANGE, SERVICE_CIDRS};
use support::replicas::{
    lease_holder, wait_for_leader, ReplicaSpec, Replicas, ScratchDir, SHORT_LEASE_FLAGS,
};

/// Service names in each lab. Half of the single lab's 2,000 keeps each lab's mix of writes:
/// with every name created once first, a lab over 2,000 names in half the time would spend
/// most of its kills on creations rather than changes and deletions.
const NAMES: usize = 1000;
/// SIGKILLs over all labs, with the API server's faults off and on.
const KILLS: usize = 50;
const FAULT_KILLS: usize = 4;
/// Labs run side by side, each with its share of the kills. A takeover is mostly waiting for
/// the killed leader's Lease to expire (idle time, not CPU), so two labs make the same number
/// of kills, each with a takeover of its own, in about half the time.
const LABS: usize = 2;
const TAKEOVER_LIMIT: Duration = Duration::from_secs(20);
const CONVERGE_LIMIT: Duration = Duration::from_secs(90);

async fn install(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in berth_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let api: Api<berth_api::IPPool> = Api::all(client.clone());
    for (name, addresses, auto) in pools() {
        let pool: berth_api::IPPool = serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": name},
            "spec": {"addresses": addresses, "autoAssign": auto}}))
        .unwrap();
        api.create(&PostParams::default(), &pool).await.unwrap();
    }
}

/// The churn's writers, each over its own share of the names.
struct Churn {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Churn {
    fn start(client: &Client, seed: u64, stats: &Arc<ChurnStats>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let writers = 2;
        let tasks = (0..writers)
            .map(|w| {
                let names: Vec<usize> = (0..NAMES).filter(|i| i % writers == w).collect();
                tokio::spawn(churn(
                    Api::default_namespaced(client.clone()),
                    names,
                    seed.wrapping_add(w as u64),
                    stop.clone(),
                    stats.clone(),
                    Duration::from_millis(20),
                ))
            })
            .collect();
        Self { stop, tasks }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("churn did not stop")
                .unwrap();
        }
    }
}

/// SIGKILLs `kills` times at random moments; returns how many hit the leader and the
/// longest time until another replica held the Lease.
async fn kill_at_random(
    client: &Client,
    replicas: &mut Replicas,
    rng: &mut SmallRng,
    kills: usize,
) -> (usize, Duration) {
    let mut leader_kills = 0;
    let mut longest = Duration::ZERO;
    wait_for_leader(client, replicas, None, TAKEOVER_LIMIT).await;
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..800))).await;
        replicas.assert_all_running();
        let leader = lease_holder(client)
            .await
            .and_then(|h| replicas.slot_of(&h));
        let slot = match (leader, rng.random_bool(0.7)) {
            (Some(l), true) => l,
            (Some(l), false) => (l + 1) % replicas.len(),
            (None, _) => rng.random_range(0..replicas.len()),
        };
        let identity = replicas.get(slot).unwrap().identity.clone();
        replicas.kill(slot);
        replicas.start(slot);
        if leader == Some(slot) {
            leader_kills += 1;
            let (_, took) =
                wait_for_leader(client, replicas, Some(&identity), TAKEOVER_LIMIT).await;
            longest = longest.max(took);
        }
    }
    (leader_kills, longest)
}

/// Waits until the final-state rules hold; returns what is held and how long it took.
async fn wait_converged(
    client: &Client,
    replicas: &mut Replicas,
    tracker: &Mutex<Tracker>,
) -> (Holdings, Duration) {
    let start = Instant::now();
    let mut last = String::new();
    let mut reported = Instant::now();
    while start.elapsed() < CONVERGE_LIMIT {
        if reported.elapsed() > Duration::from_secs(5) && !last.is_empty() {
            println!(
                "controller_sigkill: converging for {:.0?}: {last}",
                start.elapsed()
            );
            reported = Instant::now();
        }
        replicas.assert_all_running();
        let services = Api::<Service>::all(client.clone())
            .list(&ListParams::default())
            .await;
        let pools = Api::<berth_api::IPPool>::all(client.clone())
            .list(&ListParams::default())
            .await;
        match (services, pools) {
            (Ok(s), Ok(p)) => match check_final(&s.items, &p.items) {
                Ok(h) => return (h, start.elapsed()),
                Err(e) => last = e,
            },
            (Err(e), _) | (_, Err(e)) => last = e.to_string(),
        }
        // Each check lists every Service; more often would mostly slow the API server down.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let violations = tracker.lock().unwrap().violations.clone();
    let mut metrics = String::new();
    for slot in 0..replicas.len() {
        if let Some(r) = replicas.get(slot) {
            for line in r.metrics().await.lines().filter(|l| {
                !l.starts_with('#')
                    && [
                        "leader",
                        "services",
                        "conflicts",
                        "errors",
                        "writes",
                        "allocations",
                    ]
                    .iter()
                    .any(|m| l.starts_with(&format!("berth_controller_{m}")))
            }) {
                metrics += &format!("{} {line}\n", r.identity);
            }
        }
    }
    let first = last
        .split(|c: char| c == ':' || c.is_whitespace())
        .find(|w| w.starts_with("svc-"))
        .unwrap_or_default()
        .to_string();
    let svc = Api::<Service>::default_namespaced(client.clone())
        .get_opt(&first)
        .await
        .ok()
        .flatten()
        .map(|mut s| {
            s.metadata.managed_fields = None;
            serde_json::to_string(&s).unwrap()
        });
    panic!(
        "not converged after {CONVERGE_LIMIT:?}: {last}\n{first}: {svc:?}\n{metrics}\
         changed values seen: {violations:#?}\n{}",
        replicas.logs()
    );
}

/// Kills every replica but the leader, which goes on with everything it watched during the
/// churn: one leader is left, and the convergence that follows is its own work.
async fn leave_one_leader(client: &Client, replicas: &mut Replicas) -> usize {
    let (leader, _) = wait_for_leader(client, replicas, None, TAKEOVER_LIMIT).await;
    for slot in (0..replicas.len()).filter(|s| *s != leader) {
        replicas.kill(slot);
    }
    leader
}

fn assert_no_violations(tracker: &Mutex<Tracker>) -> u64 {
    let t = tracker.lock().unwrap();
    assert!(
        t.violations.is_empty(),
        "{} values changed on live Services, first: {:#?}",
        t.violations.len(),
        &t.violations[..t.violations.len().min(10)]
    );
    t.versions
}

/// What one lab's run saw.
struct LabRun {
    leader_kills: usize,
    fault_leader_kills: usize,
    longest_takeover: Duration,
    kill_phase: Duration,
    converge: Duration,
    converge_after_faults: Duration,
    versions: u64,
    held: Holdings,
    held_after_faults: Holdings,
    stats: String,
}

/// One lab: its API server, two replicas, the churn and the watcher; both phases, `kills` and
/// `fault_kills` SIGKILLs.
async fn run_lab(lab: usize, seed: u64, kills: usize, fault_kills: usize) -> LabRun {
    let began = Instant::now();
    let server = LabApiServer::builder().start().await.unwrap();
    let client = server.client().unwrap();
    install(&client).await;
    let scratch = ScratchDir::new(&format!("berth-controller-sigkill-{lab}"));
    let kubeconfig = scratch.path.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut args: Vec<String> = vec![
        "--service-cidr".into(),
        SERVICE_CIDRS.into(),
        "--node-port-range".into(),
        NODE_PORT_RANGE.into(),
        "--default-class".into(),
        "l2".into(),
        "--log-level".into(),
        "warn,berth_controller=debug".into(),
    ];
    args.extend(SHORT_LEASE_FLAGS.iter().map(|s| s.to_string()));
    let mut replicas = Replicas::new(
        ReplicaSpec {
            bin: env!("CARGO_BIN_EXE_berth").into(),
            kubeconfig,
            log_dir: scratch.path.clone(),
            args,
            env: Vec::new(),
        },
        2,
    );
    replicas.start(0);
    replicas.start(1);

    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let stop_tracking = Arc::new(AtomicBool::new(false));
    let tracking = tokio::spawn(track(
        client.clone(),
        tracker.clone(),
        stop_tracking.clone(),
    ));
    let stats = Arc::new(ChurnStats::default());
    let mut rng = SmallRng::seed_from_u64(seed);

    // Phase 1: kills while the churn runs.
    let churning = Churn::start(&client, rng.random(), &stats);
    let (leader_kills, longest_takeover) =
        kill_at_random(&client, &mut replicas, &mut rng, kills).await;
    let kill_phase = began.elapsed();
    churning.stop().await;
    leave_one_leader(&client, &mut replicas).await;
    let (held, converge) = wait_converged(&client, &mut replicas, &tracker).await;
    let versions = assert_no_violations(&tracker);

    // Phase 2: the same under injected faults, then faults off.
    for slot in 0..replicas.len() {
        if replicas.get(slot).is_none() {
            replicas.start(slot);
        }
    }
    server
        .set_faults(Faults {
            error_rate: 0.1,
            throttle_share: 0.25,
            watch_drop_rate: 0.05,
            seed,
            ..Faults::default()
        })
        .unwrap();
    let churning = Churn::start(&client, rng.random(), &stats);
    let (fault_leader_kills, _) =
        kill_at_random(&client, &mut replicas, &mut rng, fault_kills).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    churning.stop().await;
    server.set_faults(Faults::default()).unwrap();
    leave_one_leader(&client, &mut replicas).await;
    let (held_after_faults, converge_after_faults) =
        wait_converged(&client, &mut replicas, &tracker).await;
    stop_tracking.store(true, Ordering::Relaxed);
    tracking.await.unwrap();
    let versions = versions.max(assert_no_violations(&tracker));
    drop(replicas);
    server.shutdown().await.unwrap();
    LabRun {
        leader_kills,
        fault_leader_kills,
        longest_takeover,
        kill_phase,
        converge,
        converge_after_faults,
        versions,
        held,
        held_after_faults,
        stats: stats.line(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_controllers_never_double_assign_and_converge() {
    let seed = support::replicas::seed_from_env("BERTH_SIGKILL_SEED");
    println!("controller_sigkill: seed={seed} (BERTH_SIGKILL_SEED={seed} repeats the run)");
    let began = Instant::now();
    let labs: Vec<_> = (0..LABS)
        .map(|lab| {
            tokio::spawn(run_lab(
                lab,
                seed.wrapping_add(lab as u64),
                KILLS / LABS,
                FAULT_KILLS / LABS,
            ))
        })
        .collect();
    for (lab, handle) in labs.into_iter().enumerate() {
        // A lab's panic is the test's, with its own message.
        let run = handle
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let LabRun {
            leader_kills,
            fault_leader_kills,
            longest_takeover,
            kill_phase,
            converge,
            converge_after_faults,
            versions,
            held,
            held_after_faults,
            stats,
        } = run;
        println!(
            "controller_sigkill: lab {lab}: kills={} (leader {leader_kills}) fault-phase kills={} \
             (leader {fault_leader_kills}) services {stats} live={} cluster_ips={} node_ports={} \
             lb_ips={} (shared {}) longest_takeover={longest_takeover:.2?} kill_phase={kill_phase:.0?} \
             converge={converge:.2?} converge_after_faults={converge_after_faults:.2?} \
             versions_watched={versions}",
            KILLS / LABS,
            FAULT_KILLS / LABS,
            held_after_faults.services,
            held_after_faults.cluster_ips,
            held_after_faults.node_ports,
            held_after_faults.lb_ips,
            held_after_faults.shared_lb_ips,
        );
        println!("controller_sigkill: lab {lab}: after phase 1 {held:?}");
    }
    println!("controller_sigkill: total={:.1?}", began.elapsed());
}
