//! Two replicas of the real `berth controller`, leader election on, serving the `aws-nlb`
//! class against `moto_server` while the leader is killed, partitioned from the API server
//! (its term lost while the process lives and can still reach AWS) and paused (SIGSTOP past
//! its lease, then woken).
//!
//! Each replica reaches the API server (in this process) and moto through proxies of its own
//! on 127.0.0.1: the API proxy can be cut, which partitions that replica; the AWS proxy
//! records when each request arrives. Services go through create, update and delete several
//! at a time; a disruption of the leader follows every few writes, kill, partition and pause
//! in turn. Then, with both replicas running, everything must converge to exactly the live
//! Services' resources (one NLB each, nothing duplicated, nothing of a deleted Service).
//!
//! And AWS traffic never overlaps: once another replica has called AWS, a replica whose calls
//! came before makes no call again unless it acquired the Lease since. A deposed leader must
//! stop calling AWS before its successor starts.
//!
//! Two such labs (each its own moto, API server, proxies and replicas, 12 cycles and 2 live
//! Services) run side by side. Each lab makes at least 38 writes (a cycle's three, a live
//! Service's create), so 6 disruptions, two of each kind; 12 in all, as one lab with 24 cycles
//! used to make. A disruption is mostly waiting (for a Lease to expire, for a paused replica),
//! not CPU, so the labs overlap it and take about half the time.
//!
//! The random choices follow one seed, printed at the start (lab `n` uses seed + `n`);
//! `BERTH_AWS_FAILOVER_SEED` repeats a run. Needs `moto_server` (`make deps`): without it the
//! test skips, and fails under `CI=true` or `BERTH_REQUIRE_ROOT=1`.

#![allow(clippy::unwrap_used)]

#[path = "support/aws_state.rs"]
mod aws_state;
#[allow(dead_code)]
#[path = "support/replicas.rs"]
mod replicas;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_state::{check_final, create_nodes, moto_state};
use berth_api::names::{annotation as ann, class};
use berth_testing::{install_crds, start_lab, Requirement};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use replicas::{
    lease_holder, wait_for_leader, ReplicaSpec, Replicas, ScratchDir, SHORT_LEASE_FLAGS,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CLUSTER: &str = "failover";
/// Labs side by side, each with its own moto, API server, proxies and replicas.
const LABS: usize = 2;
/// Services that go through create, update and delete, in each lab.
const CYCLES: usize = 12;
/// Services created after them and left live, in each lab.
const LIVE: usize = 2;
const CONCURRENT: usize = 4;
const NODES: usize = 2;
/// A disruption of the leader after every this many writes.
const DISRUPT_EVERY: usize = 6;
/// How long a partition or a pause lasts: past the lease, so the standby takes over.
const CUT_FOR: Duration = Duration::from_millis(3500);
/// The Lease is polled this often; an acquisition is seen this much after it at most.
const POLL: Duration = Duration::from_millis(20);
const SEEN_SLACK: Duration = Duration::from_millis(300);
const TAKEOVER_LIMIT: Duration = Duration::from_secs(20);
const CONVERGE_LIMIT: Duration = Duration::from_secs(120);

fn name(i: usize) -> String {
    format!("svc-{i:03}")
}

/// When each request reached AWS, and from which slot.
type Arrivals = Arc<Mutex<Vec<(Instant, usize)>>>;

/// A TCP proxy on 127.0.0.1 to `upstream`. `cut` closes every connection and refuses new
/// ones until `heal`; with `arrivals`, every read from the client is recorded.
struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr, record: Option<(usize, Arrivals)>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let accept = {
            let (cut, conns) = (cut.clone(), conns.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue;
                    }
                    let record = record.clone();
                    let task = tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let (mut cr, mut cw) = client.into_split();
                        let (mut sr, mut sw) = server.into_split();
                        let up = async {
                            let mut buf = vec![0u8; 16 * 1024];
                            loop {
                                let n = match cr.read(&mut buf).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => n,
                                };
                                if let Some((slot, arrivals)) = &record {
                                    arrivals.lock().unwrap().push((Instant::now(), *slot));
                                }
                                if sw.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                            let _ = sw.shutdown().await;
                        };
                        let down = async {
                            let _ = tokio::io::copy(&mut sr, &mut cw).await;
                            let _ = cw.shutdown().await;
                        };
                        tokio::join!(up, down);
                    });
                    conns.lock().unwrap().push(task.abort_handle());
                }
            })
        };
        Proxy {
            addr,
            cut,
            conns,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
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

/// Resumes a paused replica when dropped, also when the test panics.
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// Who held the Lease, as polled: (when first seen, holder).
type Holders = Arc<Mutex<Vec<(Instant, String)>>>;

fn poll_holders(client: Client, stop: Arc<AtomicBool>) -> (Holders, tokio::task::JoinHandle<()>) {
    let holders: Holders = Arc::default();
    let task = {
        let holders = holders.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(h) = lease_holder(&client).await {
                    let mut seen = holders.lock().unwrap();
                    if seen.last().is_none_or(|(_, last)| *last != h) {
                        seen.push((Instant::now(), h));
                    }
                }
                tokio::time::sleep(POLL).await;
            }
        })
    };
    (holders, task)
}

/// The first time AWS traffic overlapped: a replica called AWS after another one had, having
/// called before it, with no acquisition of the Lease by it in between.
fn first_overlap(
    arrivals: &[(Instant, usize)],
    starts: &[(Instant, usize, String)],
    holders: &[(Instant, String)],
    began: Instant,
) -> Option<String> {
    let identity = |t: Instant, slot: usize| -> Option<&str> {
        starts
            .iter()
            .filter(|(at, s, _)| *s == slot && *at <= t)
            .map(|(_, _, id)| id.as_str())
            .next_back()
    };
    let mut calls: Vec<(Instant, &str)> = arrivals
        .iter()
        .filter_map(|(t, slot)| Some((*t, identity(*t, *slot)?)))
        .collect();
    calls.sort();
    let mut last_by: std::collections::BTreeMap<&str, Instant> = Default::default();
    let mut last: Option<(Instant, &str)> = None;
    for &(t, who) in &calls {
        if let (Some((t_other, other)), Some(&mine)) = (last, last_by.get(who)) {
            if other != who && mine < t_other {
                let acquired = holders
                    .iter()
                    .any(|(at, h)| h == who && *at > t_other && *at <= t + SEEN_SLACK);
                if !acquired {
                    return Some(format!(
                        "{who} called AWS at +{:?} after {other} did at +{:?}, without taking the Lease back (holders: {:?})",
                        t - began,
                        t_other - began,
                        holders
                            .iter()
                            .map(|(at, h)| (*at - began, h.as_str()))
                            .collect::<Vec<_>>()
                    ));
                }
            }
        }
        last_by.insert(who, t);
        last = Some((t, who));
    }
    None
}

/// One lab: its moto, API server, proxies and two replicas; the cycles with their disruptions,
/// then the convergence and every check.
async fn run_lab(lab: usize, seed: u64) {
    let began = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    // moto's start-up waits on a process: off the runtime's threads, which the other lab's API
    // server and proxies need.
    let moto = tokio::task::spawn_blocking(|| berth_testing::moto::start(NODES))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    let (server, client) = start_lab().await;
    install_crds(&client).await;
    create_nodes(&client, &moto).await;

    let scratch = ScratchDir::new(&format!("berth-aws-failover-{lab}"));
    let base_kubeconfig = scratch.path.join("kubeconfig");
    server.write_kubeconfig(&base_kubeconfig).unwrap();
    let api_addr: SocketAddr = server.url().trim_start_matches("http://").parse().unwrap();
    let moto_addr: SocketAddr = moto.url.trim_start_matches("http://").parse().unwrap();
    let arrivals: Arrivals = Arc::default();
    let mut api_proxies = Vec::new();
    let mut aws_proxies = Vec::new();
    let mut slots = Vec::new();
    for slot in 0..2 {
        let api = Proxy::start(api_addr, None).await;
        let aws = Proxy::start(moto_addr, Some((slot, arrivals.clone()))).await;
        let kubeconfig = scratch.path.join(format!("kubeconfig-{slot}"));
        let text = std::fs::read_to_string(&base_kubeconfig).unwrap();
        std::fs::write(&kubeconfig, text.replace(&server.url(), &api.url())).unwrap();
        slots.push((
            kubeconfig,
            vec!["--aws-endpoint-url".to_string(), aws.url()],
        ));
        api_proxies.push(api);
        aws_proxies.push(aws);
    }
    let mut args: Vec<String> = [
        "--leader-election",
        "true",
        "--default-class",
        "l2",
        "--aws-nlb",
        "on",
        "--cluster-name",
        CLUSTER,
        "--aws-subnets",
        &moto.subnets.join(","),
        "--aws-sweep-interval",
        "5s",
        "--log-level",
        "warn,berth_controller=debug,berth_aws=debug",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(SHORT_LEASE_FLAGS.iter().map(|s| s.to_string()));
    // Only for moto: never real credentials, and no instance metadata look-up.
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
            kubeconfig: base_kubeconfig,
            log_dir: scratch.path.clone(),
            args,
            env,
        },
        2,
    );
    let mut starts: Vec<(Instant, usize, String)> = Vec::new();
    for (slot, (kubeconfig, extra)) in slots.into_iter().enumerate() {
        replicas.set_slot(slot, kubeconfig, extra);
        starts.push((Instant::now(), slot, String::new()));
        replicas.start(slot);
        starts.last_mut().unwrap().2 = replicas.get(slot).unwrap().identity.clone();
    }
    let stop_polling = Arc::new(AtomicBool::new(false));
    let (holders, poller) = poll_holders(client.clone(), stop_polling.clone());
    wait_for_leader(&client, &mut replicas, None, TAKEOVER_LIMIT).await;

    let services: Api<Service> = Api::default_namespaced(client.clone());
    let ports = |rng: &mut SmallRng| {
        let all = [(80, "TCP"), (443, "TCP"), (53, "UDP")];
        let (port, protocol) = all[rng.random_range(0..all.len())];
        json!([{"name": "p", "port": port, "protocol": protocol}])
    };
    let mut writes = 0usize;
    let mut disruptions = [0usize; 3];
    let total = CYCLES + LIVE;
    let mut active: Vec<(usize, bool)> = Vec::new();
    let mut next = 0;
    while next < total || active.iter().any(|(i, _)| *i < CYCLES) {
        let create = next < total && active.len() < CONCURRENT && rng.random_bool(0.5);
        if create || active.is_empty() {
            let svc: Service = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name(next), "namespace": "default"},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": class::AWS_NLB,
                         "ports": ports(&mut rng)},
            }))
            .unwrap();
            services.create(&PostParams::default(), &svc).await.unwrap();
            active.push((next, false));
            next += 1;
        } else {
            let k = rng.random_range(0..active.len());
            let (i, updated) = active[k];
            if !updated {
                let patch = if rng.random_bool(0.5) {
                    json!({"spec": {"ports": ports(&mut rng)}})
                } else {
                    json!({"metadata": {"annotations": {ann::AWS_LOAD_BALANCER_SCHEME: "internet-facing"}}})
                };
                services
                    .patch(&name(i), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                active[k].1 = true;
            } else if i < CYCLES {
                services
                    .delete(&name(i), &DeleteParams::default())
                    .await
                    .unwrap();
                active.swap_remove(k);
            } else {
                // Live Services stay; nothing to write for them any more.
                active.swap_remove(k);
                continue;
            }
        }
        writes += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
        if !writes.is_multiple_of(DISRUPT_EVERY) {
            continue;
        }
        // The leader, while the reconciles the writes started are calling AWS.
        replicas.assert_all_running();
        let (leader, _) = wait_for_leader(&client, &mut replicas, None, TAKEOVER_LIMIT).await;
        let identity = replicas.get(leader).unwrap().identity.clone();
        let kind = (writes / DISRUPT_EVERY) % 3;
        disruptions[kind] += 1;
        match kind {
            0 => {
                replicas.kill(leader);
                starts.push((Instant::now(), leader, String::new()));
                replicas.start(leader);
                starts.last_mut().unwrap().2 = replicas.get(leader).unwrap().identity.clone();
            }
            1 => {
                api_proxies[leader].cut();
                wait_for_leader(&client, &mut replicas, Some(&identity), TAKEOVER_LIMIT).await;
                tokio::time::sleep(CUT_FOR.saturating_sub(Duration::from_secs(2))).await;
                api_proxies[leader].heal();
            }
            _ => {
                let paused = Paused(replicas.get(leader).unwrap().pid());
                signal(paused.0, "-STOP");
                tokio::time::sleep(CUT_FOR).await;
                drop(paused);
            }
        }
    }
    let churn_took = began.elapsed();
    let gone: BTreeSet<String> = (0..CYCLES).map(name).collect();

    let converging = Instant::now();
    let mut reported = String::new();
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
        if last != reported {
            println!(
                "aws_failover: lab {lab}: converging for {:.0?}: {last}",
                converging.elapsed()
            );
            reported = last.clone();
        }
        assert!(
            converging.elapsed() < CONVERGE_LIMIT,
            "not converged after {CONVERGE_LIMIT:?} (seed {seed}): {last}\n{}",
            replicas.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let converge = converging.elapsed();
    stop_polling.store(true, Ordering::SeqCst);
    let _ = poller.await;

    let arrivals = arrivals.lock().unwrap().clone();
    let holders = holders.lock().unwrap().clone();
    if let Some(overlap) = first_overlap(&arrivals, &starts, &holders, began) {
        panic!(
            "AWS calls of two replicas overlapped (seed {seed}): {overlap}\n{}",
            replicas.logs()
        );
    }
    let by_slot = |s: usize| arrivals.iter().filter(|(_, slot)| *slot == s).count();
    println!(
        "aws_failover: lab {lab}: cycles={CYCLES} live={LIVE} writes={writes} kills={} partitions={} pauses={} \
         lease_holders={} aws_requests=({}, {}) found: load_balancers={} target_groups={} listeners={} \
         churn={churn_took:.0?} converge={converge:.1?} total={:.0?}",
        disruptions[0],
        disruptions[1],
        disruptions[2],
        holders.len(),
        by_slot(0),
        by_slot(1),
        found.load_balancers,
        found.target_groups,
        found.listeners,
        began.elapsed(),
    );
    assert!(
        disruptions.iter().all(|n| *n >= 2),
        "too few disruptions: {disruptions:?}"
    );
    assert!(
        by_slot(0) > 0 && by_slot(1) > 0,
        "both replicas led and called AWS"
    );
    drop(replicas);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_leave_exactly_the_live_services_nlbs_and_never_call_aws_together() {
    berth_testing::require!(Requirement::Moto);
    let seed = replicas::seed_from_env("BERTH_AWS_FAILOVER_SEED");
    println!("aws_failover: seed={seed} (BERTH_AWS_FAILOVER_SEED={seed} repeats the run)");
    let began = Instant::now();
    let labs: Vec<_> = (0..LABS)
        .map(|lab| tokio::spawn(run_lab(lab, seed.wrapping_add(lab as u64))))
        .collect();
    for handle in labs {
        // A lab's panic is the test's, with its own message.
        handle
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
    println!("aws_failover: total={:.0?}", began.elapsed());
}
