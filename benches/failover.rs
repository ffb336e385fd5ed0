//! `make bench-failover`: how long a client loses a LoadBalancer IP when its owner fails, with
//! real agents in network namespaces (the lab of `tests/l2_lab`). For each fault (SIGKILL of the
//! owner's agent, the owner's LAN link set down, a graceful stop) and `BERTH_FAILOVER_TRIALS`
//! trials (default 20), the client sends an ARP probe and opens a TCP connection to the VIP every
//! 20 ms; the ARP outage runs from the fault to the first reply from the new owner, the TCP outage
//! to the end of the last failed connection. The same crash trials run again with membership off
//! (Lease only, 10 s Leases): the shape of the Lease-based announcers. The same three faults are
//! measured for an IPv6 LoadBalancer address announced by NDP (`ndp_rows`): a multicast Neighbor
//! Solicitation every 20 ms, the outage running to the first solicited Neighbor Advertisement of
//! the new owner, and beside it the time to its unsolicited NA. Then 1,000 LoadBalancer
//! Services are added and the API requests of the three agents are counted at steady state, and
//! each agent's live-set changes from the first of them for `BERTH_FAILOVER_FLAP_SECONDS` (60):
//! flaps. `BERTH_FAILOVER_ONLY=flaps` runs only that part (`BERTH_FAILOVER_FLAP_LOAD=stress`
//! with `stress-ng` on every core, `BERTH_FAILOVER_LOGS=<dir>` keeps the agents' logs).
//!
//! Each trial also times the time to a new TCP connection (from the fault to the first connect
//! that succeeded after the last failed one) and the owner's return (from the interim owner's
//! last answer to the returning owner's first: the planned handover's gap, at the 20 ms probe
//! resolution). Then, with `stress-ng` holding every core (when installed), the crash trials
//! again and a watch of `BERTH_FAILOVER_WATCH_SECONDS` (600) with no fault, counting the
//! announcers' ownership changes and live-set changes: every one is a false takeover.
//!
//! Needs root; without it, prints why and a line with no numbers. Ends with
//! `failover: crash_p50_s=... crash_p99_s=... linkdown_p99_s=... graceful_p99_s=... new_conn_crash_p99_s=... return_gap_p99_s=... loaded_crash_p99_s=... false_takeovers=... lease_only_crash_p99_s=... api_rps_1k=... live_changes_1k=...`
//! where crash, link-down and graceful figures are of the per-trial client-visible outage, the
//! larger of ARP and TCP.
//! It prints `failover_ndp: crash_p99_s=... linkdown_p99_s=... graceful_p99_s=...` (the NDP
//! outage) before it.

#![allow(clippy::unwrap_used)]

#[path = "../tests/l2_lab/mod.rs"]
mod l2_lab;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use berth_l2::frame::client::build_arp_request;
use l2_lab::ndp::{announce_ipv6, vip6, NdpCapture, VIP6};
use l2_lab::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Crash,
    LinkDown,
    Graceful,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Crash => "crash (SIGKILL)",
            Fault::LinkDown => "link down",
            Fault::Graceful => "graceful stop",
        }
    }
}

struct Trial {
    arp: Duration,
    tcp: Duration,
    /// From the fault to the first new TCP connection that succeeded after the last failed one.
    new_conn: Duration,
    /// The owner's return: from the interim owner's last answer to the owner's first.
    handback: Duration,
    /// The interim owner answered after the returning owner had (two answers).
    handback_overlap: bool,
}

/// Nearest-rank percentile.
fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// One fault of the owner of VIP, measured, then undone until the owner answers again.
async fn trial(lab: &mut L2Lab, fault: Fault) -> Trial {
    let owner = owner_among(&NODES, VIP);
    let next = owner_among(&without(&NODES, &[&owner]), VIP);
    let next_mac = lab.macs[next.as_str()];
    let target: IpAddr = VIP.parse().unwrap();
    let IpAddr::V4(v4) = target else {
        unreachable!()
    };
    let addr = SocketAddr::new(target, 80);
    let t0 = Instant::now();
    // A stopping agent is not waited for: the client probes from the fault on, while the old
    // owner is still on its way out (a graceful stop deletes its Lease and records first).
    let stopping = match fault {
        Fault::Crash => Some(lab.agents.signal(&owner, "-KILL")),
        Fault::LinkDown => {
            lab.set_link(&owner, false);
            None
        }
        Fault::Graceful => Some(lab.agents.signal(&owner, "-TERM")),
    };
    let mut arp_at: Option<Instant> = None;
    let mut last_tcp_failure: Option<Instant> = None;
    let mut first_ok_after_failure: Option<Instant> = None;
    let mut tcp_ok_after_move = false;
    let deadline = t0 + Duration::from_secs(60);
    while Instant::now() < deadline {
        let tick = Instant::now();
        lab.capture
            .probes
            .send(build_arp_request(PROBE_MAC, PROBE_IP, v4))
            .unwrap();
        let ns = lab.client_ns.clone();
        let connected = tokio::task::spawn_blocking(move || {
            berth_lab::netns::connect_tcp_in_netns(&ns, addr, Duration::from_millis(20)).is_ok()
        })
        .await
        .unwrap();
        if connected {
            if arp_at.is_some() {
                tcp_ok_after_move = true;
            }
            if last_tcp_failure.is_some() && first_ok_after_failure.is_none() {
                first_ok_after_failure = Some(Instant::now());
            }
        } else {
            last_tcp_failure = Some(Instant::now());
            first_ok_after_failure = None;
        }
        if arp_at.is_none() {
            arp_at = lab
                .capture
                .seen
                .lock()
                .unwrap()
                .iter()
                .find(|(at, ip, mac, gratuitous)| {
                    *at >= t0 && *ip == target && *mac == next_mac && !gratuitous
                })
                .map(|(at, _, _, _)| *at);
        }
        if arp_at.is_some() && tcp_ok_after_move {
            break;
        }
        tokio::time::sleep_until((tick + Duration::from_millis(20)).into()).await;
    }
    let arp = arp_at.map_or(deadline - t0, |at| at - t0);
    let tcp = last_tcp_failure.map_or(Duration::ZERO, |at| at.saturating_duration_since(t0));
    let new_conn = match (last_tcp_failure, first_ok_after_failure) {
        (None, _) => Duration::ZERO,
        (Some(_), Some(ok)) => ok - t0,
        (Some(_), None) => deadline - t0,
    };
    if let Some(stopping) = stopping {
        tokio::task::spawn_blocking(move || stopping.join())
            .await
            .unwrap()
            .unwrap();
    }
    let undone = Instant::now();
    match fault {
        Fault::Crash | Fault::Graceful => lab.agents.start(&owner),
        Fault::LinkDown => lab.set_link(&owner, true),
    }
    // The return, probed every 20 ms: when did the interim owner stop, the owner start?
    let owner_mac = lab.macs[owner.as_str()];
    let back_by = Instant::now() + Duration::from_secs(30);
    let mut owner_first: Option<Instant> = None;
    while Instant::now() < back_by {
        lab.capture
            .probes
            .send(build_arp_request(PROBE_MAC, PROBE_IP, v4))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        owner_first = lab
            .capture
            .seen
            .lock()
            .unwrap()
            .iter()
            .find(|(at, ip, mac, _)| *at >= undone && *ip == target && *mac == owner_mac)
            .map(|(at, ..)| *at);
        if let Some(first) = owner_first {
            if Instant::now() > first + Duration::from_millis(300) {
                break;
            }
        }
    }
    let (handback, handback_overlap) = {
        let seen = lab.capture.seen.lock().unwrap();
        let first = owner_first.unwrap_or(back_by);
        let interim: Vec<Instant> = seen
            .iter()
            .filter(|(at, ip, mac, _)| *at >= undone && *ip == target && *mac == next_mac)
            .map(|(at, ..)| *at)
            .collect();
        let last_before = interim.iter().filter(|at| **at <= first).max().copied();
        let after = interim.iter().any(|at| *at > first);
        (last_before.map_or(Duration::ZERO, |at| first - at), after)
    };
    eventually_tcp(&lab.client_ns, "web", "TCP after the owner came back").await;
    // Let the interim owner's and the returning owner's gratuitous rounds pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Trial {
        arp,
        tcp,
        new_conn,
        handback,
        handback_overlap,
    }
}

struct Row {
    fault: Fault,
    liveness: &'static str,
    trials: Vec<Trial>,
}

impl Row {
    fn visible_p99(&self) -> Duration {
        let worst: Vec<Duration> = self.trials.iter().map(|t| t.arp.max(t.tcp)).collect();
        percentile(&worst, 99.0)
    }
}

async fn rows_for(lab: &mut L2Lab, faults: &[Fault], liveness: &'static str, n: usize) -> Vec<Row> {
    let owner = owner_among(&NODES, VIP);
    lab.capture
        .until(VIP, Some(lab.macs[owner.as_str()]), "first election")
        .await;
    eventually_tcp(&lab.client_ns, "web", "first TCP").await;
    // Every agent past its startup settle (1 s of a quiet live set) before the first fault: a
    // first trial right after the election measured the settle, not a failover.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rows = Vec::new();
    for fault in faults {
        let mut trials = Vec::new();
        for i in 0..n {
            let t = trial(lab, *fault).await;
            eprintln!(
                "{liveness} {}: trial {}: arp {} s, tcp {} s, new connection {} s, handback {} s{}",
                fault.name(),
                i + 1,
                secs(t.arp),
                secs(t.tcp),
                secs(t.new_conn),
                secs(t.handback),
                if t.handback_overlap {
                    " (two answers)"
                } else {
                    ""
                }
            );
            trials.push(t);
        }
        rows.push(Row {
            fault: *fault,
            liveness,
            trials,
        });
    }
    rows
}

/// The sum over the agents of their announcer's ownership changes and their live-set changes.
fn change_counters(lab: &L2Lab) -> (f64, f64) {
    agent_change_counters(lab)
        .values()
        .fold((0.0, 0.0), |(own, live), (o, l)| (own + o, live + l))
}

/// Per node: the announcer's ownership changes and the live-set changes its agent counted.
fn agent_change_counters(lab: &L2Lab) -> std::collections::BTreeMap<String, (f64, f64)> {
    let mut counters = std::collections::BTreeMap::new();
    for (node, ns) in &lab.agents.netns {
        let Ok((200, body)) = berth_lab::netns::http_get(
            ns,
            "127.0.0.1:10356".parse().unwrap(),
            "/metrics",
            Duration::from_secs(5),
        ) else {
            continue;
        };
        let (mut ownership, mut live) = (0.0, 0.0);
        for line in body.lines() {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let value: f64 = value.parse().unwrap_or(0.0);
            if name.starts_with("berth_l2_ownership_changes_total") {
                ownership += value;
            } else if name.starts_with("berth_membership_changes_total") {
                live += value;
            }
        }
        counters.insert(node.clone(), (ownership, live));
    }
    counters
}

/// `stress-ng` holding every core busy, inside `netns`, until dropped.
struct Load(std::process::Child);

impl Load {
    fn start(netns: &str) -> Option<Load> {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", netns, "stress-ng", "--cpu", "0", "--quiet"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        Some(Load(child))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        // stress-ng's workers leave with their parent on SIGTERM.
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// Under `stress-ng` on every core: crash trials, then a watch with no fault, counting the
/// announcers' ownership changes and live-set changes none of them caused. `None` without
/// stress-ng.
async fn loaded(lab: &mut L2Lab, n: usize, watch: Duration) -> Option<(Row, f64, f64)> {
    let has_stress = std::process::Command::new("stress-ng")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_stress {
        eprintln!("stress-ng not found: no loaded rows");
        return None;
    }
    let _load = Load::start(&lab.client_ns)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut rows = rows_for(
        lab,
        &[Fault::Crash],
        "membership, stress-ng on all cores",
        n,
    )
    .await;
    // Past the last trial's gratuitous rounds and handback.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (own_before, live_before) = change_counters(lab);
    let target: IpAddr = VIP.parse().unwrap();
    let IpAddr::V4(v4) = target else {
        unreachable!()
    };
    let began = Instant::now();
    while began.elapsed() < watch {
        lab.capture
            .probes
            .send(build_arp_request(PROBE_MAC, PROBE_IP, v4))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (own_after, live_after) = change_counters(lab);
    let answerers = lab.capture.answerers_since(VIP, began);
    eprintln!(
        "loaded watch of {watch:?}: ownership changes {}, live-set changes {}, answerers of {VIP}: {}",
        own_after - own_before,
        live_after - live_before,
        answerers.len()
    );
    Some((
        rows.remove(0),
        own_after - own_before,
        live_after - live_before,
    ))
}

/// Requests per second the API server serves at steady state with 1,000 LoadBalancer Services,
/// and the most live-set changes one agent counted from the first of them to the end of a
/// `flaps` window (each a flap: nothing failed).
async fn api_rps_1k(lab: &mut L2Lab, flaps: Duration) -> (f64, f64) {
    let began = Instant::now();
    let counted = agent_change_counters(lab);
    for i in 0..1000u32 {
        let name = format!("bulk-{i}");
        let cip = format!("10.96.{}.{}", 10 + i / 200, 10 + i % 200);
        let ip = format!("198.18.0.{}", 202 + i % 38);
        apply(
            &lab.client,
            "v1",
            "Service",
            mk_lb(
                &name,
                &cip,
                30100 + u16::try_from(i).unwrap(),
                "Cluster",
                8080,
            ),
        )
        .await;
        set_ingress(&lab.client, &name, &ip).await;
    }
    // Let the agents take it all in (records and Events of the takeovers included).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = lab.server.request_counts();
    let window = Duration::from_secs(20);
    // In slices, each with what was asked: a backlog shrinks from slice to slice, a loop does
    // not.
    let slices = 4;
    let mut log = lab.server.recorded_requests();
    for slice in 1..=slices {
        tokio::time::sleep(window / slices).await;
        let now = lab.server.recorded_requests();
        let mut kinds: std::collections::BTreeMap<String, u64> = Default::default();
        for r in requests_between(&log, &now) {
            let sub = if r.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", r.subresource)
            };
            *kinds
                .entry(format!("{} {}{sub}", r.verb, r.resource))
                .or_default() += r.count;
        }
        eprintln!("api at steady state, slice {slice} of {slices}: {kinds:?}");
        log = now;
    }
    let after = lab.server.request_counts();
    let requests = (after.reads - before.reads) + (after.writes - before.writes);
    eprintln!(
        "api at steady state over {window:?}: {} reads, {} writes",
        after.reads - before.reads,
        after.writes - before.writes
    );
    if let Some(rest) = flaps.checked_sub(began.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let mut most = 0.0f64;
    for (node, (own, live)) in agent_change_counters(lab) {
        let (own_before, live_before) = counted.get(&node).copied().unwrap_or_default();
        eprintln!(
            "1,000 Services, {:?} from the first: {node}: {} live-set changes, {} ownership changes",
            began.elapsed(),
            live - live_before,
            own - own_before
        );
        most = most.max(live - live_before);
    }
    (requests as f64 / window.as_secs_f64(), most)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !ready() {
        println!("failover: skipped (needs root and network namespaces)");
        return;
    }
    let n: usize = std::env::var("BERTH_FAILOVER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let began = Instant::now();
    let watch = Duration::from_secs(
        std::env::var("BERTH_FAILOVER_WATCH_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600),
    );
    let flaps = Duration::from_secs(
        std::env::var("BERTH_FAILOVER_FLAP_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    // `flaps`: only the 1,000-Service rows (API load and flaps), on a lab that settled first.
    if std::env::var("BERTH_FAILOVER_ONLY").as_deref() == Ok("flaps") {
        let (api_rps, most) = runtime.block_on(async {
            let mut lab = L2Lab::start("bf", "on", "10s").await;
            tokio::time::sleep(Duration::from_secs(10)).await;
            // `BERTH_FAILOVER_FLAP_LOAD=stress`: with stress-ng on every core meanwhile.
            let _load = (std::env::var("BERTH_FAILOVER_FLAP_LOAD").as_deref() == Ok("stress"))
                .then(|| Load::start(&lab.client_ns))
                .flatten();
            let measured = api_rps_1k(&mut lab, flaps).await;
            // `BERTH_FAILOVER_LOGS=<dir>`: the agents' logs are kept there, to read the flaps.
            if let Ok(keep) = std::env::var("BERTH_FAILOVER_LOGS") {
                std::fs::create_dir_all(&keep).unwrap();
                for node in NODES {
                    let log = format!("{node}.log");
                    std::fs::copy(lab.dir.join(&log), std::path::Path::new(&keep).join(&log))
                        .unwrap();
                }
            }
            lab.finish().await;
            measured
        });
        println!(
            "failover: api_rps_1k={api_rps:.2} live_changes_1k={most} flaps_s={}",
            flaps.as_secs()
        );
        return;
    }
    let (mut rows, ndp, (api_rps, flap_count), load) = runtime.block_on(async {
        let mut lab = L2Lab::start("bf", "on", "10s").await;
        let mut rows = rows_for(
            &mut lab,
            &[Fault::Crash, Fault::LinkDown, Fault::Graceful],
            "membership (heartbeat + Lease)",
            n,
        )
        .await;
        let ndp = ndp_rows(&mut lab, n).await;
        let load = loaded(&mut lab, n, watch).await;
        let load = load.map(|(row, own, live)| {
            rows.push(row);
            (own, live)
        });
        let api = api_rps_1k(&mut lab, flaps).await;
        lab.finish().await;
        (rows, ndp, api, load)
    });
    let lease_rows = runtime.block_on(async {
        let mut lab = L2Lab::start("bl", "off", "10s").await;
        let rows = rows_for(&mut lab, &[Fault::Crash], "Lease only (10 s)", n).await;
        lab.finish().await;
        rows
    });
    rows.extend(lease_rows);

    println!();
    println!("L2 failover: 3 agents, {n} trials per row, ARP probe + TCP connect every 20 ms ({:?} in all)", began.elapsed());
    println!(
        "| fault | liveness | ARP p50 s | ARP p99 s | TCP p50 s | TCP p99 s | new connection p50 s | new connection p99 s | visible p99 s | return gap p50 s | return gap p99 s | return with two answers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let pick =
            |f: fn(&Trial) -> Duration| -> Vec<Duration> { row.trials.iter().map(f).collect() };
        let (arp, tcp, conn, back) = (
            pick(|t| t.arp),
            pick(|t| t.tcp),
            pick(|t| t.new_conn),
            pick(|t| t.handback),
        );
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.fault.name(),
            row.liveness,
            secs(percentile(&arp, 50.0)),
            secs(percentile(&arp, 99.0)),
            secs(percentile(&tcp, 50.0)),
            secs(percentile(&tcp, 99.0)),
            secs(percentile(&conn, 50.0)),
            secs(percentile(&conn, 99.0)),
            secs(row.visible_p99()),
            secs(percentile(&back, 50.0)),
            secs(percentile(&back, 99.0)),
            row.trials.iter().filter(|t| t.handback_overlap).count(),
        );
    }
    print_ndp_rows(&ndp, n);
    match load {
        Some((own, live)) => println!(
            "stress-ng on all cores, {watch:?} with no fault: {own} announcer ownership changes, {live} live-set changes"
        ),
        None => println!("stress-ng not found: no loaded rows"),
    }
    println!("API requests/s, 3 agents, 1,000 LoadBalancer Services, steady state: {api_rps:.2}");
    println!(
        "live-set changes of the busiest agent, {flaps:?} from the first of 1,000 Services: {flap_count}"
    );
    let find = |fault: Fault, liveness: &str| {
        rows.iter()
            .find(|r| r.fault == fault && r.liveness.starts_with(liveness))
    };
    let p99 = |fault: Fault, liveness: &str| {
        find(fault, liveness)
            .map(|r| secs(r.visible_p99()))
            .unwrap_or_default()
    };
    let stat = |fault: Fault, liveness: &str, p: f64, f: fn(&Trial) -> Duration| {
        find(fault, liveness)
            .map(|r| secs(percentile(&r.trials.iter().map(f).collect::<Vec<_>>(), p)))
            .unwrap_or_default()
    };
    let heartbeat = "membership (heartbeat";
    println!(
        "failover: crash_p50_s={} crash_p99_s={} linkdown_p50_s={} linkdown_p99_s={} graceful_p99_s={} new_conn_crash_p50_s={} new_conn_crash_p99_s={} return_gap_p99_s={} loaded_crash_p99_s={} false_takeovers={} false_live_changes={} watch_s={} lease_only_crash_p99_s={} api_rps_1k={:.2} live_changes_1k={}",
        stat(Fault::Crash, heartbeat, 50.0, |t| t.arp.max(t.tcp)),
        p99(Fault::Crash, heartbeat),
        stat(Fault::LinkDown, heartbeat, 50.0, |t| t.arp.max(t.tcp)),
        p99(Fault::LinkDown, heartbeat),
        p99(Fault::Graceful, heartbeat),
        stat(Fault::Crash, heartbeat, 50.0, |t| t.new_conn),
        stat(Fault::Crash, heartbeat, 99.0, |t| t.new_conn),
        stat(Fault::Crash, heartbeat, 99.0, |t| t.handback),
        p99(Fault::Crash, "membership, stress-ng"),
        load.map_or("none".to_string(), |(own, _)| own.to_string()),
        load.map_or("none".to_string(), |(_, live)| live.to_string()),
        watch.as_secs(),
        p99(Fault::Crash, "Lease"),
        api_rps,
        flap_count
    );
}

// NDP rows: the same faults for the IPv6 address of `l2_lab::ndp`, kept apart from the ARP rows.

struct NdpTrial {
    /// To the first solicited NA from the new owner: when a client can resolve the address again.
    ndp: Duration,
    /// To the new owner's unsolicited NA, which updates the caches that already hold the address.
    unsolicited: Duration,
}

/// One fault of the owner of VIP6, measured by NDP, then undone until the owner answers again.
async fn ndp_trial(lab: &mut L2Lab, ndp: &NdpCapture, fault: Fault) -> NdpTrial {
    let owner = owner_among(&NODES, VIP6);
    let next = owner_among(&without(&NODES, &[&owner]), VIP6);
    let next_mac = lab.macs[next.as_str()];
    let t0 = Instant::now();
    let stopping = match fault {
        Fault::Crash => Some(lab.agents.signal(&owner, "-KILL")),
        Fault::LinkDown => {
            lab.set_link(&owner, false);
            None
        }
        Fault::Graceful => Some(lab.agents.signal(&owner, "-TERM")),
    };
    let deadline = t0 + Duration::from_secs(60);
    let first = |solicited: bool| {
        ndp.since(vip6(), t0, |na| {
            na.mac == next_mac && na.solicited == solicited
        })
        .first()
        .map(|na| na.at - t0)
    };
    let (mut answered, mut unsolicited) = (None, None);
    while Instant::now() < deadline && (answered.is_none() || unsolicited.is_none()) {
        let tick = Instant::now();
        ndp.solicit(vip6(), None);
        answered = answered.or_else(|| first(true));
        unsolicited = unsolicited.or_else(|| first(false));
        tokio::time::sleep_until((tick + Duration::from_millis(20)).into()).await;
    }
    if let Some(stopping) = stopping {
        tokio::task::spawn_blocking(move || stopping.join())
            .await
            .unwrap()
            .unwrap();
    }
    match fault {
        Fault::Crash | Fault::Graceful => lab.agents.start(&owner),
        Fault::LinkDown => lab.set_link(&owner, true),
    }
    ndp.until(vip6(), Some(lab.macs[owner.as_str()]), "the owner back")
        .await;
    // Let the interim owner's and the returning owner's unsolicited rounds pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let missing = deadline - t0;
    NdpTrial {
        ndp: answered.unwrap_or(missing),
        unsolicited: unsolicited.unwrap_or(missing),
    }
}

async fn ndp_rows(lab: &mut L2Lab, n: usize) -> Vec<(Fault, Vec<NdpTrial>)> {
    let ndp = NdpCapture::start(&lab.client_ns);
    announce_ipv6(&lab.client).await;
    let owner = owner_among(&NODES, VIP6);
    ndp.until(vip6(), Some(lab.macs[owner.as_str()]), "first election")
        .await;
    let mut rows = Vec::new();
    for fault in [Fault::Crash, Fault::LinkDown, Fault::Graceful] {
        let mut trials = Vec::new();
        for i in 0..n {
            let t = ndp_trial(lab, &ndp, fault).await;
            eprintln!(
                "NDP {}: trial {}: solicited NA {} s, unsolicited NA {} s",
                fault.name(),
                i + 1,
                secs(t.ndp),
                secs(t.unsolicited)
            );
            trials.push(t);
        }
        rows.push((fault, trials));
    }
    rows
}

fn print_ndp_rows(rows: &[(Fault, Vec<NdpTrial>)], n: usize) {
    println!();
    println!(
        "L2 failover by NDP (IPv6 address): 3 agents, membership (SWIM + Lease), {n} trials per row, multicast NS every 20 ms"
    );
    println!("| fault | NDP p50 s | NDP p99 s | unsolicited NA p50 s | unsolicited NA p99 s |");
    println!("|---|---|---|---|---|");
    let mut summary = Vec::new();
    for (fault, trials) in rows {
        let ndp: Vec<Duration> = trials.iter().map(|t| t.ndp).collect();
        let unsolicited: Vec<Duration> = trials.iter().map(|t| t.unsolicited).collect();
        println!(
            "| {} | {} | {} | {} | {} |",
            fault.name(),
            secs(percentile(&ndp, 50.0)),
            secs(percentile(&ndp, 99.0)),
            secs(percentile(&unsolicited, 50.0)),
            secs(percentile(&unsolicited, 99.0)),
        );
        let key = match fault {
            Fault::Crash => "crash",
            Fault::LinkDown => "linkdown",
            Fault::Graceful => "graceful",
        };
        summary.push(format!("{key}_p99_s={}", secs(percentile(&ndp, 99.0))));
    }
    println!("failover_ndp: {}", summary.join(" "));
}
