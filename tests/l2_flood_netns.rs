//! The membership port under a flood, end to end: the L2 lab's three real agents (membership on)
//! and, from a host on the LAN that is no node (the lab's client namespace, 198.18.0.100),
//! 10,000 datagrams a second to the agents' SWIM ports: random bytes, correctly framed
//! datagrams under a wrong key, and replays of genuine datagrams (sealed with the cluster's
//! key, as if recorded off the wire). Meanwhile the client probes both LoadBalancer IPs by ARP
//! every 20 ms. Nothing may change: no live-set change on any agent, one answering MAC per
//! address (the owner's), and an answer for every probe. The agents' `refused_messages`
//! counters prove the flood reached them and stopped at the gate.
//!
//! One agent (n3) runs under `faketime` with its wall clock an hour ahead, as on a node whose
//! NTP is off: it must stay a member all along (every agent counts three live nodes, no
//! datagram refused as `stale`), its peers must see the hour (the clock-offset metric, which
//! also proves `faketime` reached the agent), and the replays are still refused. Needs
//! `faketime` (`make deps`).
//!
//! Bounded: 15 s of flood (`BERTH_FLOOD_SECONDS` for a longer run), about 25 s in all. Needs root, iproute2 and
//! iptables; skips with a message elsewhere, fails instead under `CI=true` or
//! `BERTH_REQUIRE_ROOT=1`. Namespaces `berth-tf<pid>-*`, deleted at the end (also on failure).
//! The address plan is at the top of `l2_lab/mod.rs`.

#![allow(clippy::unwrap_used)]

mod l2_lab;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_l2::frame::client::build_arp_request;
use berth_membership::frame::{seal, Key};
use l2_lab::*;
use rand::{Rng, RngCore, SeedableRng};

/// Datagrams per second, across the three agents.
const RATE: u64 = 10_000;
const PROBE_EVERY: Duration = Duration::from_millis(20);
/// The lab's membership key (`l2_lab`), so the replays are genuine datagrams.
const LAB_KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

fn flood_seconds() -> u64 {
    std::env::var("BERTH_FLOOD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15)
}

/// n3's wall clock, ahead of the others'.
const SKEW: &str = "+1h";
const SKEW_SECONDS: f64 = 3600.0;

#[test]
fn a_flood_of_junk_forgeries_and_replays_changes_nothing() {
    if !berth_testing::require(&[berth_testing::Requirement::Program("faketime")]) {
        return;
    }
    run_lab("tf", scenario);
}

/// Restarts n3's agent with its wall clock [`SKEW`] ahead (only the wall clock: monotonic time
/// is the machine's, as on a node whose NTP is off; `-m`: libfaketime for many threads).
fn skew_n3(lab: &mut L2Lab) {
    lab.agents.stop("n3", "-TERM");
    lab.agents.wrappers.insert(
        "n3".to_string(),
        Wrapper {
            argv: ["faketime", "-m", "-f", SKEW].map(String::from).to_vec(),
            env: vec![("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into())],
        },
    );
    lab.agents.start("n3");
}

/// Waits until every agent counts the three nodes live.
async fn until_all_live(netns: &BTreeMap<String, String>) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let live: BTreeMap<&String, f64> = netns
            .iter()
            .map(|(node, ns)| {
                (
                    node,
                    gauge(&membership_counters(ns), "berth_membership_live_nodes"),
                )
            })
            .collect();
        if live.values().all(|n| *n == 3.0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not every agent counts three live nodes with n3 {SKEW}: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn gauge(counters: &BTreeMap<String, f64>, name: &str) -> f64 {
    counters.get(name).copied().unwrap_or(f64::NAN)
}

/// The datagrams the rogue sends, cycling: a third each of random bytes, wrong-key frames and
/// replays of genuine ones.
fn mk_flood(rng: &mut rand::rngs::SmallRng) -> Vec<(SocketAddr, Vec<u8>)> {
    let real = Key::new(LAB_KEY).unwrap();
    let mut wrong_bytes = [0u8; 32];
    rng.fill_bytes(&mut wrong_bytes);
    let wrong = Key::new(&wrong_bytes.map(|b| b | 1)).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let mut out = Vec::new();
    for (i, to) in NODES.iter().enumerate() {
        let target: SocketAddr = format!("198.18.0.{}:7947", 11 + i).parse().unwrap();
        let peer = NODES[(i + 1) % NODES.len()];
        for n in 0..64u64 {
            let mut junk = vec![0u8; rng.random_range(1..1400)];
            rng.fill_bytes(&mut junk);
            out.push((target, junk));
            let mut payload = vec![0u8; rng.random_range(16..400)];
            rng.fill_bytes(&mut payload);
            out.push((target, seal(&wrong, peer, to, now + n, &payload)));
            out.push((target, seal(&real, peer, to, now + n, &payload)));
        }
    }
    out
}

/// Sends the flood from inside `netns` at [`RATE`] until `stop`; returns how many were sent.
fn flood(
    netns: String,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let socket =
            berth_lab::netns::bind_udp_in_netns(&netns, "198.18.0.100:0".parse().unwrap()).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(26);
        let datagrams = mk_flood(&mut rng);
        let began = Instant::now();
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            // Paced in 10 ms slices.
            let due = began.elapsed().as_millis() as u64 * RATE / 1000;
            while sent.load(Ordering::Relaxed) < due {
                let (to, datagram) = &datagrams[i % datagrams.len()];
                let _ = socket.send_to(datagram, to);
                i += 1;
                sent.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// One agent's `berth_membership_*` counters: live-set changes and refusals by reason.
fn membership_counters(netns: &str) -> BTreeMap<String, f64> {
    let (status, body) = berth_lab::netns::http_get(
        netns,
        "127.0.0.1:10356".parse().unwrap(),
        "/metrics",
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| {
            l.starts_with("berth_membership_changes_total")
                || l.starts_with("berth_membership_refused_messages_total")
                || l.starts_with("berth_membership_live_nodes ")
                || l.starts_with("berth_membership_peer_clock_offset_seconds ")
        })
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn changes(counters: &BTreeMap<String, f64>) -> f64 {
    counters
        .iter()
        .filter(|(k, _)| k.starts_with("berth_membership_changes_total"))
        .map(|(_, v)| v)
        .sum()
}

async fn scenario(mut lab: L2Lab) -> L2Lab {
    skew_n3(&mut lab);
    let macs = lab.macs.clone();
    let owner = owner_among(&NODES, VIP);
    let local_owner = owner_among(&["n1", "n2"], LOCAL_VIP);
    lab.capture
        .until(VIP, Some(macs[owner.as_str()]), "first election")
        .await;
    lab.capture
        .until(LOCAL_VIP, Some(macs[local_owner.as_str()]), "local policy")
        .await;
    let netns: BTreeMap<String, String> = lab.agents.netns.clone();
    until_all_live(&netns).await;
    // Settled: the gratuitous rounds of the first takeovers are over.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before: BTreeMap<String, BTreeMap<String, f64>> = netns
        .iter()
        .map(|(node, ns)| (node.clone(), membership_counters(ns)))
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flooder = flood(lab.client_ns.clone(), stop.clone(), sent.clone());
    let began = Instant::now();
    let seconds = flood_seconds();
    let mut probes: BTreeMap<&str, Vec<Instant>> = BTreeMap::new();
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while began.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        for ip in [VIP, LOCAL_VIP] {
            let IpAddr::V4(v4) = ip.parse().unwrap() else {
                unreachable!()
            };
            probes.entry(ip).or_default().push(Instant::now());
            lab.capture
                .probes
                .send(build_arp_request(PROBE_MAC, PROBE_IP, v4))
                .unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    flooder.join().unwrap();
    let flooded = sent.load(Ordering::Relaxed);
    // Late answers still count.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let after: BTreeMap<String, BTreeMap<String, f64>> = netns
        .iter()
        .map(|(node, ns)| (node.clone(), membership_counters(ns)))
        .collect();
    eprintln!(
        "flood: {flooded} datagrams in {:?} ({:.0}/s), {} probes per address",
        began.elapsed(),
        flooded as f64 / began.elapsed().as_secs_f64(),
        probes[VIP].len()
    );
    assert!(
        flooded >= RATE * seconds * 9 / 10,
        "the flood fell short: {flooded}"
    );
    for node in NODES {
        let (b, a) = (&before[node], &after[node]);
        assert_eq!(changes(a), changes(b), "{node}'s live set changed: {a:?}");
        let dropped = |reason: &str| {
            let key = format!("berth_membership_refused_messages_total{{reason=\"{reason}\"}}");
            a.get(&key).copied().unwrap_or(0.0) - b.get(&key).copied().unwrap_or(0.0)
        };
        eprintln!(
            "flood: {node} dropped size {} version {} unknown_source {} rate_limited {} backlog {} bad_tag {}",
            dropped("size"),
            dropped("version"),
            dropped("unknown_source"),
            dropped("rate_limited"),
            dropped("backlog"),
            dropped("bad_tag"),
        );
        // Every framed datagram (two thirds of its share) stopped at the gate as from an
        // unknown source; junk stopped there too, by size or version.
        assert!(
            dropped("unknown_source") >= (flooded / 3) as f64 * 2.0 / 3.0 * 0.9,
            "{node}: the flood did not reach the gate: {a:?}"
        );
        assert_eq!(dropped("bad_tag"), 0.0, "{node}: junk reached the HMAC");
        assert_eq!(
            dropped("replayed"),
            0.0,
            "{node}: a replay reached the guard"
        );
        // The skewed node stayed a member, and its clock was seen for what it is.
        assert_eq!(dropped("stale"), 0.0, "{node}: datagrams refused as stale");
        assert_eq!(
            gauge(a, "berth_membership_live_nodes"),
            3.0,
            "{node} does not count three live nodes: {a:?}"
        );
        let offset = gauge(a, "berth_membership_peer_clock_offset_seconds");
        eprintln!("flood: {node} sees a peer clock {offset:.1} s off");
        assert!(
            (offset - SKEW_SECONDS).abs() < 60.0,
            "{node}: largest peer clock offset {offset} s, n3 runs {SKEW}"
        );
    }
    // Every probe answered, each by the owner alone.
    let seen = lab.capture.seen.lock().unwrap().clone();
    for (ip, want) in [(VIP, &owner), (LOCAL_VIP, &local_owner)] {
        let target: IpAddr = ip.parse().unwrap();
        let first = probes[ip][0];
        let answers: Vec<_> = seen
            .iter()
            .filter(|(at, a, _, gratuitous)| *at >= first && *a == target && !gratuitous)
            .collect();
        let macs_seen: std::collections::BTreeSet<_> =
            answers.iter().map(|(_, _, m, _)| *m).collect();
        assert_eq!(
            macs_seen,
            [macs[want.as_str()]].into_iter().collect(),
            "{ip}: answered by {macs_seen:?}, expected {want} alone"
        );
        assert_eq!(
            answers.len(),
            probes[ip].len(),
            "{ip}: {} probes, {} answers",
            probes[ip].len(),
            answers.len()
        );
        // And no stall: no gap between answers much longer than the probe period.
        let longest = answers
            .windows(2)
            .map(|w| w[1].0.duration_since(w[0].0))
            .max()
            .unwrap_or_default();
        eprintln!(
            "flood: {ip}: {} answers, longest gap {longest:?}",
            answers.len()
        );
    }
    lab
}
