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
//! Services are added and the API requests of the three agents are counted at steady state.
//!
//! Needs root; without it, prints why and a line with no numbers. Ends with
//! `failover: crash_p99_s=... linkdown_p99_s=... graceful_p99_s=... lease_only_crash_p99_s=... api_rps_1k=...`
//! where each p99 is of the per-trial client-visible outage, the larger of ARP and TCP, and
//! `failover_ndp: crash_p99_s=... linkdown_p99_s=... graceful_p99_s=...` (the NDP outage).

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
    match fault {
        Fault::Crash => lab.agents.stop(&owner, "-KILL"),
        Fault::LinkDown => lab.set_link(&owner, false),
        Fault::Graceful => lab.agents.stop(&owner, "-TERM"),
    }
    let mut arp_at: Option<Instant> = None;
    let mut last_tcp_failure: Option<Instant> = None;
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
        } else {
            last_tcp_failure = Some(Instant::now());
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
    match fault {
        Fault::Crash | Fault::Graceful => lab.agents.start(&owner),
        Fault::LinkDown => lab.set_link(&owner, true),
    }
    lab.capture
        .until(VIP, Some(lab.macs[owner.as_str()]), "the owner back")
        .await;
    eventually_tcp(&lab.client_ns, "web", "TCP after the owner came back").await;
    // Let the interim owner's and the returning owner's gratuitous rounds pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Trial { arp, tcp }
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
    let mut rows = Vec::new();
    for fault in faults {
        let mut trials = Vec::new();
        for i in 0..n {
            let t = trial(lab, *fault).await;
            eprintln!(
                "{liveness} {}: trial {}: arp {} s, tcp {} s",
                fault.name(),
                i + 1,
                secs(t.arp),
                secs(t.tcp)
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

/// Requests per second the API server serves at steady state with 1,000 LoadBalancer Services.
async fn api_rps_1k(lab: &mut L2Lab) -> f64 {
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
    // Let the agents take it all in (annotations and Events of the takeovers included).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = lab.server.request_counts();
    let window = Duration::from_secs(20);
    tokio::time::sleep(window).await;
    let after = lab.server.request_counts();
    let requests = (after.reads - before.reads) + (after.writes - before.writes);
    eprintln!(
        "api at steady state over {window:?}: {} reads, {} writes",
        after.reads - before.reads,
        after.writes - before.writes
    );
    requests as f64 / window.as_secs_f64()
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
    let (mut rows, ndp, api_rps) = runtime.block_on(async {
        let mut lab = L2Lab::start("bf", "on", "10s").await;
        let rows = rows_for(
            &mut lab,
            &[Fault::Crash, Fault::LinkDown, Fault::Graceful],
            "membership (SWIM + Lease)",
            n,
        )
        .await;
        let ndp = ndp_rows(&mut lab, n).await;
        let api = api_rps_1k(&mut lab).await;
        lab.finish().await;
        (rows, ndp, api)
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
        "| fault | liveness | ARP p50 s | ARP p99 s | TCP p50 s | TCP p99 s | visible p99 s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        let arp: Vec<Duration> = row.trials.iter().map(|t| t.arp).collect();
        let tcp: Vec<Duration> = row.trials.iter().map(|t| t.tcp).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.fault.name(),
            row.liveness,
            secs(percentile(&arp, 50.0)),
            secs(percentile(&arp, 99.0)),
            secs(percentile(&tcp, 50.0)),
            secs(percentile(&tcp, 99.0)),
            secs(row.visible_p99()),
        );
    }
    print_ndp_rows(&ndp, n);
    println!("API requests/s, 3 agents, 1,000 LoadBalancer Services, steady state: {api_rps:.2}");
    let p99 = |fault: Fault, lease_only: bool| {
        rows.iter()
            .find(|r| r.fault == fault && r.liveness.starts_with("Lease") == lease_only)
            .map(|r| secs(r.visible_p99()))
            .unwrap_or_default()
    };
    println!(
        "failover: crash_p99_s={} linkdown_p99_s={} graceful_p99_s={} lease_only_crash_p99_s={} api_rps_1k={:.2}",
        p99(Fault::Crash, false),
        p99(Fault::LinkDown, false),
        p99(Fault::Graceful, false),
        p99(Fault::Crash, true),
        api_rps
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
    match fault {
        Fault::Crash => lab.agents.stop(&owner, "-KILL"),
        Fault::LinkDown => lab.set_link(&owner, false),
        Fault::Graceful => lab.agents.stop(&owner, "-TERM"),
    }
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
