//! SIGKILL reliability of the `aws-nlb` class: the real `berth controller` process against the
//! lab API server (in this process) and `moto_server`, both on 127.0.0.1.
//!
//! moto's EC2 gets a VPC, two subnets and three instances first, so the Nodes' `providerID`s
//! and the subnets are real ones. Then 50 Services of class `berth.dev/aws-nlb` each go
//! through a cycle (create, update, delete: ports, traffic policy, scheme and tags change),
//! several at a time, while the controller is SIGKILLed at random moments (mostly with
//! reconciles under way) and started again. A few times moto is frozen (SIGSTOP) and the
//! controller is stopped with SIGTERM instead: its AWS calls hang, so the loop must abandon
//! them at the end of its term, and moto finishes the requests it had received after the
//! controller is gone. A few more Services are created and left live.
//!
//! Then, with the controller left running, everything must converge: every deleted Service is
//! gone from the API (its finalizer removed), and moto holds exactly the resources of the live
//! Services — one NLB each, one target group per port at the node port with the right health
//! check and targets, one listener per port forwarding to it, no duplicate names, nothing of
//! a deleted Service and nothing untagged. moto accepts duplicates, so this is checked here.
//! The sweep may remove target groups a kill orphaned (that is what it is for), but never a
//! load balancer: an NLB of a Service that is gone would mean a finalizer came off too early.
//!
//! Two such labs (each its own moto, API server and controller, 50 cycles and 2 live Services)
//! run side by side: 100 cycles in all, as one lab used to make alone. Most of a kill's time is
//! waiting (for the restarted controller to call AWS again, for moto, for retries), not CPU, so
//! the labs overlap it and take about half the time of one lab doing every cycle.
//!
//! The random choices follow one seed, printed at the start (lab `n` uses seed + `n`);
//! `BERTH_AWS_SIGKILL_SEED` repeats a run. Needs `moto_server` (`make deps`): without it the
//! test skips, and fails under `CI=true` or `BERTH_REQUIRE_ROOT=1`.

#![allow(clippy::unwrap_used)]

#[path = "support/aws_state.rs"]
mod aws_state;
// Only the processes of the shared harness; the rest is the allocation test's.
#[allow(dead_code)]
#[path = "support/replicas.rs"]
mod replicas;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use aws_state::{check_final, create_nodes, moto_state};
use berth_api::names::{annotation as ann, class, label};
use berth_testing::moto::Moto;
use berth_testing::{install_crds, start_lab, Requirement};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use replicas::{ReplicaSpec, Replicas, ScratchDir};
use serde_json::{json, Value};

const CLUSTER: &str = "sigkill";
/// Labs side by side, each with its own moto, API server and controller.
const LABS: usize = 2;
/// Services that go through create, update and delete, in each lab.
const CYCLES: usize = 50;
/// Services created (and updated) after them and left live, in each lab.
const LIVE: usize = 2;
/// Services in their cycle at the same time, at most.
const CONCURRENT: usize = 6;
const NODES: usize = 3;
/// Chance of a SIGKILL after each write.
const KILL_CHANCE: f64 = 0.12;
/// Graceful stops while moto is frozen, spread over each lab's run.
const FROZEN_STOPS: usize = 3;
/// Deletions left over from the churn drain at the ELBv2 client's 3 changes per second.
const CONVERGE_LIMIT: Duration = Duration::from_secs(150);

fn name(i: usize) -> String {
    format!("svc-{i:03}")
}

/// The ports a Service may have: (name, port, protocol).
const PORTS: [(&str, u16, &str); 4] = [
    ("http", 80, "TCP"),
    ("https", 443, "TCP"),
    ("dns", 53, "UDP"),
    ("alt", 8080, "TCP"),
];

fn random_ports(rng: &mut SmallRng) -> Value {
    let n = rng.random_range(1..=2);
    let mut chosen: Vec<usize> = (0..PORTS.len()).collect();
    for i in 0..n {
        let j = rng.random_range(i..chosen.len());
        chosen.swap(i, j);
    }
    let ports: Vec<Value> = chosen[..n]
        .iter()
        .map(|&i| json!({"name": PORTS[i].0, "port": PORTS[i].1, "protocol": PORTS[i].2}))
        .collect();
    Value::Array(ports)
}

/// The update a cycle makes: new ports, the other traffic policy, the other scheme (the NLB
/// is replaced) or new tags.
fn random_update(rng: &mut SmallRng, svc: &Service) -> (&'static str, Value) {
    let spec = svc.spec.clone().unwrap_or_default();
    match rng.random_range(0..4) {
        0 => ("ports", json!({"spec": {"ports": random_ports(rng)}})),
        1 => {
            let local = spec.external_traffic_policy.as_deref() == Some("Local");
            let policy = if local { "Cluster" } else { "Local" };
            // The allocation loop gives a Local Service its healthCheckNodePort.
            (
                "policy",
                json!({"spec": {"externalTrafficPolicy": policy, "healthCheckNodePort": null}}),
            )
        }
        2 => {
            let facing = svc.annotations().get(ann::AWS_LOAD_BALANCER_SCHEME)
                == Some(&"internet-facing".to_string());
            let scheme = if facing {
                "internal"
            } else {
                "internet-facing"
            };
            (
                "scheme",
                json!({"metadata": {"annotations": {ann::AWS_LOAD_BALANCER_SCHEME: scheme}}}),
            )
        }
        _ => {
            let tags = format!("team=t{}", rng.random_range(0..1000));
            (
                "tags",
                json!({"metadata": {"annotations": {ann::AWS_ADDITIONAL_RESOURCE_TAGS: tags}}}),
            )
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

/// Resumes a frozen moto when dropped, also when the test panics.
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> Self {
        signal(pid, "-STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A counter's value in `/metrics` text, summed over every series of `name` whose labels
/// contain `labels` (0 when absent).
fn metric(text: &str, name: &str, labels: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What the killed and stopped controllers reported before they went.
#[derive(Debug, Default)]
struct Reported {
    swept_load_balancers: u64,
    swept_target_groups: u64,
}

impl Reported {
    async fn add(&mut self, replicas: &Replicas) {
        if let Some(r) = replicas.get(0) {
            self.add_text(&r.metrics().await);
        }
    }

    fn add_text(&mut self, text: &str) {
        self.swept_load_balancers += metric(
            text,
            "berth_aws_swept_resources_total",
            "kind=\"load_balancer\"",
        );
        self.swept_target_groups += metric(
            text,
            "berth_aws_swept_resources_total",
            "kind=\"target_group\"",
        );
    }
}

/// The cycles' writer, which also kills and restarts the controller.
struct Churn<'a> {
    client: &'a Client,
    services: Api<Service>,
    replicas: &'a mut Replicas,
    moto: &'a Moto,
    rng: SmallRng,
    reported: Reported,
    kills: usize,
    kills_mid_call: usize,
    frozen_stops: usize,
    writes: BTreeMap<&'static str, usize>,
}

impl Churn<'_> {
    async fn write(&mut self, what: &'static str) {
        *self.writes.entry(what).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(0..150))).await;
        if self.rng.random_bool(KILL_CHANCE) {
            self.kill().await;
        }
    }

    /// The AWS calls the running controller has made (0 before it serves `/metrics`).
    async fn calls(&self) -> (u64, String) {
        let text = match self.replicas.get(0) {
            Some(r) => r.metrics().await,
            None => String::new(),
        };
        (metric(&text, "berth_aws_calls_total", ""), text)
    }

    /// SIGKILL once the controller is calling AWS (most writes start a reconcile; a restarted
    /// controller reconciles everything), at a random moment after that.
    async fn kill(&mut self) {
        self.replicas.assert_all_running();
        let (before, _) = self.calls().await;
        let waiting = Instant::now();
        while self.calls().await.0 == before && waiting.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(0..400))).await;
        let (a, _) = self.calls().await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        let (b, text) = self.calls().await;
        self.reported.add_text(&text);
        self.replicas.kill(0);
        self.kills += 1;
        // Calls still flowing in the last 30 ms: the kill cut a reconcile short.
        if b > a {
            self.kills_mid_call += 1;
        }
        self.replicas.start(0);
    }

    /// moto frozen, then SIGTERM: AWS calls under way hang, and the loop must give them up
    /// 3 s after its term ends so that the process stops.
    async fn frozen_stop(&mut self) {
        self.replicas.assert_all_running();
        self.reported.add(self.replicas).await;
        let frozen = Frozen::new(self.moto.pid());
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..400))).await;
        let stopped = self.replicas.stop(0, Duration::from_secs(15)).await;
        drop(frozen);
        assert!(
            stopped,
            "berth controller did not stop within 15 s of SIGTERM while AWS calls hung\n{}",
            self.replicas.logs()
        );
        self.frozen_stops += 1;
        self.replicas.start(0);
    }

    async fn create(&mut self, i: usize) {
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name(i), "namespace": "default"},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": class::AWS_NLB,
                     "ports": random_ports(&mut self.rng)},
        }))
        .unwrap();
        self.services
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
        self.write("create").await;
    }

    async fn update(&mut self, i: usize) {
        let svc = self.services.get(&name(i)).await.unwrap();
        let (what, patch) = random_update(&mut self.rng, &svc);
        self.services
            .patch(&name(i), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("{what} update of {}: {e}", name(i)));
        self.write(what).await;
    }

    async fn delete(&mut self, i: usize) {
        self.services
            .delete(&name(i), &DeleteParams::default())
            .await
            .unwrap();
        self.write("delete").await;
    }

    /// A node leaves the targets and comes back, which re-reconciles every Service.
    async fn exclude_node(&mut self, excluded: bool) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let value = excluded.then_some("");
        let patch =
            json!({"metadata": {"labels": {label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: value}}});
        nodes
            .patch("node-1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        self.write("node").await;
    }

    /// Every cycle: created, updated once or twice, deleted; at most `CONCURRENT` at a time,
    /// interleaved at random. Then `LIVE` more, created and updated only.
    async fn run(&mut self) {
        let total = CYCLES + LIVE;
        // (index, updates still to make)
        let mut active: Vec<(usize, u8)> = Vec::new();
        let mut next = 0;
        let frozen_at: BTreeSet<usize> = (1..=FROZEN_STOPS)
            .map(|k| k * CYCLES / (FROZEN_STOPS + 1))
            .collect();
        let mut frozen_done = BTreeSet::new();
        let mut node_moves = 0;
        loop {
            if let Some(&at) = frozen_at
                .iter()
                .find(|a| next >= **a && !frozen_done.contains(*a))
            {
                frozen_done.insert(at);
                self.frozen_stop().await;
            }
            // node-1 leaves the targets a third of the way through and is back at two thirds.
            if next >= CYCLES / 3 && node_moves == 0 || next >= 2 * CYCLES / 3 && node_moves == 1 {
                node_moves += 1;
                self.exclude_node(node_moves == 1).await;
            }
            let can_create = next < total && active.len() < CONCURRENT;
            if can_create && (active.is_empty() || self.rng.random_bool(0.4)) {
                self.create(next).await;
                active.push((next, self.rng.random_range(1..=2)));
                next += 1;
                continue;
            }
            let ready: Vec<usize> = (0..active.len())
                .filter(|&k| active[k].0 < CYCLES || active[k].1 > 0)
                .collect();
            if ready.is_empty() {
                if next >= total {
                    break;
                }
                continue;
            }
            let k = ready[self.rng.random_range(0..ready.len())];
            let (i, updates) = active[k];
            if updates > 0 {
                self.update(i).await;
                active[k].1 -= 1;
            } else {
                self.delete(i).await;
                active.swap_remove(k);
            }
        }
    }
}

/// What one lab's run saw.
struct LabRun {
    kills: usize,
    kills_mid_call: usize,
    frozen_stops: usize,
    writes: BTreeMap<&'static str, usize>,
    found: aws_state::Found,
    reported: Reported,
    churn_took: Duration,
    converge: Duration,
    total: Duration,
}

/// One lab: its moto, API server and controller; the cycles with their kills, then the
/// convergence and its checks.
async fn run_lab(lab: usize, seed: u64) -> LabRun {
    let began = Instant::now();
    // moto's start-up waits on a process: off the runtime's threads, which the other lab's API
    // server needs.
    let moto = tokio::task::spawn_blocking(|| berth_testing::moto::start(NODES))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    let (server, client) = start_lab().await;
    install_crds(&client).await;
    create_nodes(&client, &moto).await;

    let scratch = ScratchDir::new(&format!("berth-aws-sigkill-{lab}"));
    let kubeconfig = scratch.path.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let args: Vec<String> = [
        "--leader-election",
        "false",
        "--default-class",
        "l2",
        "--aws-nlb",
        "on",
        "--cluster-name",
        CLUSTER,
        "--aws-subnets",
        &moto.subnets.join(","),
        "--aws-endpoint-url",
        &moto.url,
        // Often, so that it runs beside reconciles and after the last kill.
        "--aws-sweep-interval",
        "5s",
        "--log-level",
        "warn,berth_controller=debug,berth_aws=debug",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Only for moto (the endpoint is always given): never real credentials, and no instance
    // metadata look-up.
    let env = [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut replicas = Replicas::new(
        ReplicaSpec {
            bin: env!("CARGO_BIN_EXE_berth").into(),
            kubeconfig,
            log_dir: scratch.path.clone(),
            args,
            env,
        },
        1,
    );
    replicas.start(0);

    let services: Api<Service> = Api::default_namespaced(client.clone());
    let mut churn = Churn {
        client: &client,
        services: services.clone(),
        replicas: &mut replicas,
        moto: &moto,
        rng: SmallRng::seed_from_u64(seed),
        reported: Reported::default(),
        kills: 0,
        kills_mid_call: 0,
        frozen_stops: 0,
        writes: BTreeMap::new(),
    };
    churn.run().await;
    let churn_took = began.elapsed();
    let Churn {
        mut reported,
        kills,
        kills_mid_call,
        frozen_stops,
        writes,
        ..
    } = churn;
    let gone: BTreeSet<String> = (0..CYCLES).map(name).collect();

    // The last controller converges on its own.
    let converging = Instant::now();
    let mut reported_last = String::new();
    let found = loop {
        replicas.assert_all_running();
        let listed = services.list(&ListParams::default()).await;
        let state = tokio::task::block_in_place(|| moto_state(&moto));
        let last = match (listed, state) {
            (Ok(list), Ok(state)) => {
                match check_final(CLUSTER, &list.items, &gone, &state, &moto.instances) {
                    Ok(found) if list.items.len() == LIVE => break found,
                    Ok(_) => format!("{} Services, not {LIVE}", list.items.len()),
                    Err(e) => e,
                }
            }
            (Err(e), _) => e.to_string(),
            (_, Err(e)) => e,
        };
        if last != reported_last {
            println!(
                "aws_sigkill: converging for {:.0?}: {last}",
                converging.elapsed()
            );
            reported_last = last.clone();
        }
        assert!(
            converging.elapsed() < CONVERGE_LIMIT,
            "not converged after {CONVERGE_LIMIT:?} (seed {seed}): {last}\n{}",
            replicas.logs()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let converge = converging.elapsed();

    // The running controller's metrics: the sweep's counter and the reconcile timer are there
    // under their names, and no sweep, in any of the processes, found an NLB left behind.
    let text = replicas.get(0).unwrap().metrics().await;
    assert!(
        metric(
            &text,
            "berth_aws_reconcile_duration_seconds_count",
            "action=\"apply\""
        ) > 0,
        "no timed apply reconcile in /metrics:\n{text}"
    );
    assert!(
        metric(&text, "berth_aws_calls_total", "outcome=\"success\"") > 0,
        "no AWS calls in /metrics:\n{text}"
    );
    reported.add_text(&text);
    assert_eq!(
        reported.swept_load_balancers, 0,
        "the sweep removed load balancers of Services that are gone (seed {seed}): a finalizer came off too early\n{}",
        replicas.logs()
    );

    drop(replicas);
    server.shutdown().await.unwrap();
    LabRun {
        kills,
        kills_mid_call,
        frozen_stops,
        writes,
        found,
        reported,
        churn_took,
        converge,
        total: began.elapsed(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_aws_controller_leaves_exactly_the_live_services_nlbs() {
    berth_testing::require!(Requirement::Moto);
    let seed = replicas::seed_from_env("BERTH_AWS_SIGKILL_SEED");
    println!("aws_sigkill: seed={seed} (BERTH_AWS_SIGKILL_SEED={seed} repeats the run)");
    let began = Instant::now();
    let labs: Vec<_> = (0..LABS)
        .map(|lab| tokio::spawn(run_lab(lab, seed.wrapping_add(lab as u64))))
        .collect();
    let (mut kills, mut kills_mid_call, mut frozen_stops) = (0, 0, 0);
    for (lab, handle) in labs.into_iter().enumerate() {
        // A lab's panic is the test's, with its own message.
        let run = handle
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let LabRun {
            kills: lab_kills,
            kills_mid_call: lab_mid_call,
            frozen_stops: lab_frozen,
            writes,
            found,
            reported,
            churn_took,
            converge,
            total,
        } = run;
        println!(
            "aws_sigkill: lab {lab}: cycles={CYCLES} live={LIVE} writes={writes:?} kills={lab_kills} (with AWS calls under way: {lab_mid_call}) frozen_stops={lab_frozen} \
             found: load_balancers={} target_groups={} listeners={} targets={} \
             swept_target_groups={} swept_load_balancers={} churn={churn_took:.0?} converge={converge:.1?} total={total:.0?}",
            found.load_balancers,
            found.target_groups,
            found.listeners,
            found.targets,
            reported.swept_target_groups,
            reported.swept_load_balancers,
        );
        kills += lab_kills;
        kills_mid_call += lab_mid_call;
        frozen_stops += lab_frozen;
    }
    // The run really did what it is for (a seeded 12% chance per write gives about 40 kills
    // over the labs).
    assert!(
        kills >= 10 && kills_mid_call >= 5 && frozen_stops == LABS * FROZEN_STOPS,
        "too few interruptions: kills={kills} mid-call={kills_mid_call} frozen={frozen_stops}"
    );
    println!("aws_sigkill: total={:.0?}", began.elapsed());
}
