//! `berth agent` on the nftables backend, SIGKILLed at random moments of a large sync, never leaves
//! half a table: after every kill, berth's tables (`ip berth` and its nat shards `ip berth-<n>`,
//! one transaction over all of them) are exactly the ruleset the node held
//! before (old) or the one the agent was writing (new), never a prefix of the transaction. Run
//! with each writer: netlink (the default: the batch is built in memory and handed to the kernel
//! in one `send`, so a kill before it commits nothing and one after it cannot stop the kernel's
//! transaction) and `nft -f -` (`--nft-writer nft`).
//!
//! The old ruleset is what the agent programs for the first half of the Services, the new one for
//! all of them (at least 3,000); both are recorded once from converged agents. Each round loads the
//! old table, starts an agent against the full API state (its first sync replaces the table in one
//! transaction) and kills it: with `nft`, half of the rounds at a random instant after the start,
//! half at a random instant after its `nft` child appears, which is when a streamed write was
//! cut (`nft` may outlive the agent, so each check waits until nothing runs in the namespace any
//! more); with netlink, every round at a random instant between the start and the time a full
//! sync took.
//! Root, iproute2 and nft (skips with a message elsewhere, fails under `CI=true`).
//!
//! Address plan: the node namespaces `berth-ak<pid>-<writer>` have only loopback, where the one
//! lab API server listens for each writer's agent; Services 10.96.0.0/16, endpoints
//! 10.244.1.0/24 (no traffic is sent).
//! With netlink also from an empty namespace, a cold load, which the agent writes in stages (one
//! transaction per table without its base chains, then one adding them all): after every kill
//! there is no base chain, or the whole new table.
//! `BERTH_SIGKILL_SERVICES`, `BERTH_SIGKILL_ROUNDS` and `BERTH_SIGKILL_COLD_ROUNDS` change the
//! size (defaults 3,000, 12 rounds per writer and 5 cold rounds).

#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_lab::apiserver::write_kubeconfig;
use berth_lab::netns::bind_tcp_in_netns;
use berth_lab::{LabApiServer, Listener};
use berth_testing::{require, Requirement};
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::json;

/// How long an agent may take to program the whole table.
const CONVERGE: Duration = Duration::from_secs(120);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A bare network namespace with loopback up, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("berth-ak{}-{tag}", std::process::id());
        for args in [
            vec!["netns", "add", &name],
            vec!["-n", &name, "link", "set", "lo", "up"],
        ] {
            assert!(Command::new("ip").args(&args).status().unwrap().success());
        }
        Netns(name)
    }

    fn nft(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.0, "nft"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            let mut input = input;
            input.write_all(text.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// berth's IPv4 tables (the main one and its nat shards: the namespace holds no other) as a
    /// sorted list of lines, each prefixed with its table (set elements print in the kernel's
    /// order, which need not survive a reload); empty when there is no table.
    fn table(&self) -> Vec<String> {
        let listing = Command::new("ip")
            .args(["netns", "exec", &self.0, "nft", "list", "ruleset", "ip"])
            .output()
            .unwrap();
        let mut table = String::new();
        let mut lines: Vec<String> = Vec::new();
        for line in String::from_utf8_lossy(&listing.stdout).lines() {
            let line = line.trim().trim_end_matches(',');
            if let Some(name) = line.strip_prefix("table ip ") {
                table = name.trim_end_matches(" {").to_string();
            }
            if !line.is_empty() {
                lines.push(format!("{table}: {line}"));
            }
        }
        lines.sort();
        lines
    }

    /// Command lines of the processes running in the namespace, arguments joined by spaces.
    fn processes(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.0])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).ok())
            .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
            .collect()
    }

    /// Whether an `nft -f -` (a transaction, not the start-up `--check`) is running.
    fn applying(&self) -> bool {
        self.processes().iter().any(|p| p.starts_with("nft -f -"))
    }

    /// Waits until nothing runs in the namespace: a killed agent's `nft` child has finished.
    fn wait_idle(&self) {
        let deadline = Instant::now() + CONVERGE;
        while !self.processes().is_empty() {
            assert!(
                Instant::now() < deadline,
                "{:?} still running",
                self.processes()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The agent process, killed when dropped.
struct Agent(Child);

impl Agent {
    fn start(ns: &Netns, kubeconfig: &std::path::Path, writer: &str) -> Agent {
        Agent(
            Command::new("ip")
                .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_berth"), "agent"])
                .args(["--node-name", "node1", "--cluster-cidr", "10.244.0.0/16"])
                .args(["--backend", "nftables", "--min-sync-interval", "100ms"])
                .args(["--nft-writer", writer])
                .args(["--admin-listen", "127.0.0.1:0"])
                .args(["--healthz-bind-address", "127.0.0.1"])
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts an agent and waits until berth's table has every DNAT and stays as it is; the agent is
/// stopped after. Returns the table and how long after the start the first listing with every
/// DNAT came back: the agent writes in one transaction, so that listing saw the whole table,
/// and the next one only confirms that nothing follows.
fn converge(
    ns: &Netns,
    kubeconfig: &std::path::Path,
    writer: &str,
    expected_rules: usize,
) -> (Vec<String>, Duration) {
    let mut agent = Agent::start(ns, kubeconfig, writer);
    let started = Instant::now();
    let deadline = started + CONVERGE;
    let mut last = Vec::new();
    let mut complete = None;
    let took = loop {
        let table = ns.table();
        let dnats = table.iter().filter(|l| l.contains("dnat to")).count();
        if dnats >= expected_rules {
            let took = *complete.get_or_insert_with(|| started.elapsed());
            if table == last {
                break took;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not program {expected_rules} DNATs (has {dnats})"
        );
        last = table;
        std::thread::sleep(Duration::from_millis(500));
    };
    agent.kill();
    ns.wait_idle();
    (last, took)
}

fn service(i: usize) -> Service {
    let ip = format!("10.96.{}.{}", 1 + i / 250, 1 + i % 250);
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}))
    .unwrap()
}

fn slice(i: usize) -> EndpointSlice {
    serde_json::from_value(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [format!("10.244.1.{}", 1 + i % 250)],
            "conditions": {"ready": true}, "nodeName": "node1"}]}),
    )
    .unwrap()
}

async fn create_services(client: &kube::Client, range: std::ops::Range<usize>) {
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    stream::iter(range)
        .map(|i| {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                services.create(&PostParams::default(), &service(i)).await?;
                slices.create(&PostParams::default(), &slice(i)).await
            }
        })
        .buffer_unordered(16)
        .try_for_each(|_| async { Ok(()) })
        .await
        .unwrap();
}

/// A small xorshift: the kill instants, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The tables a writer's converged agents programmed, and how long the full sync took.
struct Recorded {
    old: Vec<String>,
    old_text: String,
    new: Vec<String>,
    full_sync: Duration,
}

/// One API server and one set of Services for both writers, each writer in its own namespace
/// (the server listens inside both). The rounds run one writer after the other: side by side
/// they would share the machine's two cores and the kill instants would mean less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_leaves_the_old_table_or_the_new_one() {
    require!(Requirement::Netns, Requirement::Nft);
    let rounds = env_or("BERTH_SIGKILL_ROUNDS", 12);
    let total = env_or("BERTH_SIGKILL_SERVICES", 3_000).max(2);
    let seed = std::env::var("BERTH_SIGKILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let writers = ["netlink", "nft"];
    let namespaces: Vec<Netns> = writers.iter().map(|w| Netns::new(w)).collect();
    let mut builder = LabApiServer::builder().listen("127.0.0.1:0".parse().unwrap());
    let mut inside_addrs = Vec::new();
    for ns in &namespaces {
        let inside = bind_tcp_in_netns(&ns.0, "127.0.0.1:0".parse().unwrap()).unwrap();
        inside_addrs.push(inside.local_addr().unwrap());
        builder = builder.listener(Listener::Bound(inside));
    }
    let server = builder.start().await.unwrap();
    let outside = *server
        .addrs()
        .iter()
        .find(|a| !inside_addrs.contains(a))
        .unwrap();
    let mut config = kube::Config::new(format!("http://{outside}").parse().unwrap());
    config.default_namespace = "default".into();
    let client = kube::Client::try_from(config).unwrap();
    let dir = berth_testing::unique_dir("agent-sigkill-nft");
    let kubeconfigs: Vec<std::path::PathBuf> = writers
        .iter()
        .zip(&inside_addrs)
        .map(|(writer, addr)| {
            let path = dir.join(format!("kubeconfig-{writer}"));
            write_kubeconfig(&path, &format!("http://{addr}")).unwrap();
            path
        })
        .collect();
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node1"},
                "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.11"}]}}))
            .unwrap(),
        )
        .await
        .unwrap();

    // The old ruleset: the first half of the Services, programmed by a converged agent. Both
    // writers at once: only what they program is kept, not how long it took.
    let half = total / 2;
    create_services(&client, 0..half).await;
    let olds: Vec<(Vec<String>, String)> = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let running: Vec<_> = writers
                .iter()
                .zip(&namespaces)
                .zip(&kubeconfigs)
                .map(|((writer, ns), kc)| {
                    scope.spawn(move || {
                        let (old, _) = converge(ns, kc, writer, half);
                        (old, ns.nft(&["list", "ruleset", "ip"], None))
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|r| r.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    });
    // The new one: all of them. The time it took bounds the random kill instants, so one
    // writer after the other, each with the machine to itself.
    create_services(&client, half..total).await;
    let recorded: Vec<Recorded> = tokio::task::block_in_place(|| {
        writers
            .iter()
            .zip(&namespaces)
            .zip(&kubeconfigs)
            .zip(olds)
            .map(|(((writer, ns), kc), (old, old_text))| {
                let (new, full_sync) = converge(ns, kc, writer, total);
                assert_ne!(old, new);
                Recorded {
                    old,
                    old_text,
                    new,
                    full_sync,
                }
            })
            .collect()
    });
    for ((writer, ns), (kc, rec)) in writers
        .iter()
        .zip(&namespaces)
        .zip(kubeconfigs.iter().zip(&recorded))
    {
        eprintln!(
            "agent SIGKILL on nftables ({writer}): {total} Services, {rounds} rounds, \
             BERTH_SIGKILL_SEED={seed}"
        );
        tokio::task::block_in_place(|| {
            killed_agent_rounds(writer, ns, kc, rec, total, rounds, seed)
        });
    }
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

fn killed_agent_rounds(
    writer: &str,
    ns: &Netns,
    kubeconfig: &std::path::Path,
    rec: &Recorded,
    total: usize,
    rounds: usize,
    seed: u64,
) {
    let Recorded {
        old,
        old_text,
        new,
        full_sync,
    } = rec;
    let full_sync = *full_sync;
    let mut rng = Rng(seed);
    let outcome = {
        let mut seen = (0, 0, 0); // (old, new, kills while nft was running)
        for round in 0..rounds {
            ns.nft(&["-f", "-"], Some(&format!("flush ruleset ip\n{old_text}")));
            assert_eq!(&ns.table(), old, "round {round}: the old table reloads");
            let mut agent = Agent::start(ns, kubeconfig, writer);
            let started = Instant::now();
            let during_nft = if writer == "netlink" || round % 2 == 0 {
                std::thread::sleep(Duration::from_millis(
                    rng.below(full_sync.as_millis() as u64),
                ));
                ns.applying()
            } else {
                // Wait for the agent's `nft` child, then kill within its first 300 ms. A child
                // missed between two looks shows up as a kill after the sync.
                let give_up = started + full_sync * 3 + Duration::from_secs(5);
                while !ns.applying() && Instant::now() < give_up {
                    std::thread::sleep(Duration::from_millis(2));
                }
                std::thread::sleep(Duration::from_millis(rng.below(300)));
                ns.applying()
            };
            agent.kill();
            ns.wait_idle();
            let table = ns.table();
            if &table == old {
                seen.0 += 1;
            } else if &table == new {
                seen.1 += 1;
            } else {
                let missing = new.iter().filter(|l| !table.contains(l)).count();
                panic!(
                    "round {round} (killed {:?} after start, nft running: {during_nft}): the \
                     table is neither the old ruleset nor the new one ({} lines, {missing} of \
                     the new one's {} missing)",
                    started.elapsed(),
                    table.len(),
                    new.len()
                );
            }
            seen.2 += usize::from(during_nft);
        }
        seen
    };
    eprintln!(
        "agent SIGKILL on nftables ({writer}): {rounds} kills, {} left the old table, {} the new \
         one, {} while nft was running; a full sync of {total} Services took {full_sync:?}",
        outcome.0, outcome.1, outcome.2
    );
    if writer == "nft" {
        assert!(outcome.2 > 0, "no kill landed while nft was running");
    } else {
        assert!(outcome.0 > 0, "no kill landed before the batch was sent");
        let cold = env_or("BERTH_SIGKILL_COLD_ROUNDS", 5);
        cold_rounds(ns, kubeconfig, new, full_sync, cold, &mut rng);
    }
}

/// Kills during a cold load (no berth table in the namespace), which the agent writes in stages:
/// one transaction per table without its base chains, then one adding every base chain. After
/// every kill no base chain exists (tables without one are inert: no packet enters them) or the
/// whole new table does.
fn cold_rounds(
    ns: &Netns,
    kubeconfig: &std::path::Path,
    new: &[String],
    full_sync: Duration,
    rounds: usize,
    rng: &mut Rng,
) {
    let mut seen = (0, 0, 0); // (nothing hooked, of which some tables written, the new table)
    for round in 0..rounds {
        ns.nft(&["flush", "ruleset", "ip"], None);
        assert!(ns.table().is_empty(), "round {round}: no table to start");
        let mut agent = Agent::start(ns, kubeconfig, "netlink");
        let started = Instant::now();
        // Random instants up to the time a load took; the last round early, so that at least one
        // kill lands before the load is complete whatever the instants.
        let instant = match round + 1 == rounds {
            true => 50,
            false => rng.below(full_sync.as_millis() as u64),
        };
        std::thread::sleep(Duration::from_millis(instant));
        agent.kill();
        ns.wait_idle();
        let table = ns.table();
        if table == new {
            seen.2 += 1;
            continue;
        }
        let hooked: Vec<&String> = table.iter().filter(|l| l.contains(" hook ")).collect();
        assert!(
            hooked.is_empty(),
            "cold round {round} (killed {:?} after start): base chains without the whole new \
             table ({} lines, {} of the new one's {} missing): {hooked:?}",
            started.elapsed(),
            table.len(),
            new.iter().filter(|l| !table.contains(l)).count(),
            new.len()
        );
        seen.0 += 1;
        seen.1 += usize::from(!table.is_empty());
    }
    eprintln!(
        "agent SIGKILL on nftables (netlink), cold loads: {rounds} kills, {} left no base chain \
         ({} of them with tables written), {} the new table",
        seen.0, seen.1, seen.2
    );
    assert!(
        seen.0 > 0,
        "no kill landed before the base chains were added"
    );
}
