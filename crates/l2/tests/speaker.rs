//! Three announcers and a client on an in-memory LAN that keeps a real LAN's rules (a link
//! that is down is silent; multicast reaches only joined groups). Each node computes its own
//! answers from its own index fed the same objects; the capture of the whole LAN shows who
//! answered. Time runs paused, so the gratuitous rounds are checked at their exact offsets.
//!
//! Address plan: pool `default` 198.18.0.200-198.18.0.250 and `v6` fd00:198:18::/120, both
//! advertised; pool `quiet` 198.18.0.100/30, not advertised. Nodes node-1..3 at
//! 02:00:00:00:00:0b..0d, the client 198.18.0.100 / fd00:198:18::100 at 02:00:00:00:00:64.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use berth_l2::frame::client::{build_arp_request, build_neighbor_solicitation, read_answer};
use berth_l2::frame::Mac;
use berth_l2::{
    election_key, run_link_refreshing, Answers, L2Index, L2Metrics, Link, LinkSwitch, MemoryLan,
    MemoryLink,
};
use common::*;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const CLIENT_MAC: Mac = [2, 0, 0, 0, 0, 0x64];

fn node_mac(i: usize) -> Mac {
    [2, 0, 0, 0, 0, 0x0b + u8::try_from(i).unwrap()]
}

fn owner(candidates: &[&str], ip: IpAddr) -> usize {
    let name = candidates
        .iter()
        .min_by_key(|n| election_key(n, ip))
        .unwrap();
    NODES.iter().position(|n| n == name).unwrap()
}

struct Node {
    index: L2Index,
    answers: watch::Sender<Arc<Answers>>,
    metrics: L2Metrics,
    switch: LinkSwitch,
}

impl Node {
    fn publish(&mut self) {
        self.answers.send_replace(Arc::new(self.index.answers()));
    }
}

struct Lan {
    lan: MemoryLan,
    nodes: Vec<Node>,
    client: MemoryLink,
    stop: CancellationToken,
}

fn start(vip4: &str, vip6: &str) -> Lan {
    start_refreshing(vip4, vip6, None)
}

/// [`start`] with speakers that announce owned addresses again every `refresh`.
fn start_refreshing(vip4: &str, vip6: &str, refresh: Option<Duration>) -> Lan {
    let lan = MemoryLan::default();
    let stop = CancellationToken::new();
    let mut nodes = Vec::new();
    for (i, name) in NODES.iter().enumerate() {
        let mut index = L2Index::new(name);
        index.reset_pools(&[
            mk_pool("default", json!(null), &["198.18.0.200-198.18.0.250"]),
            mk_pool("v6", json!(null), &["fd00:198:18::/120"]),
            mk_pool("quiet", json!(null), &["198.18.0.100/30"]),
        ]);
        index.reset_advertisements(&[mk_adv("lan", json!({"ipPools": ["default", "v6"]}))]);
        index.reset_nodes(&NODES.map(mk_plain_node));
        index.reset_services(&[
            mk_lb("web", &[vip4, vip6], "Cluster", json!(null)),
            mk_lb("hidden", &["198.18.0.101"], "Cluster", json!(null)),
        ]);
        index.reset_slices(&[]);
        index.set_live(Arc::new(NODES.iter().map(|s| s.to_string()).collect()));
        index.set_local_up(["eth0".to_string()].into());
        let (tx, rx) = watch::channel(Arc::new(index.answers()));
        let metrics = L2Metrics::default();
        let link = lan.attach("eth0", node_mac(i));
        let switch = link.switch();
        tokio::spawn(run_link_refreshing(
            link,
            rx,
            metrics.clone(),
            refresh,
            stop.clone().cancelled_owned(),
        ));
        nodes.push(Node {
            index,
            answers: tx,
            metrics,
            switch,
        });
    }
    let client = lan.attach("eth0", CLIENT_MAC);
    Lan {
        lan,
        nodes,
        client,
        stop,
    }
}

/// The answers the client receives within `within`.
async fn answers_for(client: &mut MemoryLink, within: Duration) -> Vec<(IpAddr, Mac)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(Ok(frame)) = tokio::time::timeout_at(deadline, client.recv()).await {
        if let Some(answer) = read_answer(&frame).map(|a| (a.ip, a.mac)) {
            got.push(answer);
        }
    }
    got
}

fn client_v4() -> Ipv4Addr {
    "198.18.0.100".parse().unwrap()
}

fn client_v6() -> Ipv6Addr {
    "fd00:198:18::100".parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn exactly_the_owner_answers_arp_and_ndp_and_nobody_answers_outside() {
    let vip4: Ipv4Addr = "198.18.0.210".parse().unwrap();
    let vip6: Ipv6Addr = "fd00:198:18::d2".parse().unwrap();
    let mut lan = start(&vip4.to_string(), &vip6.to_string());
    // Let the first gratuitous rounds pass before asking.
    answers_for(&mut lan.client, Duration::from_secs(6)).await;

    lan.client
        .send(&build_arp_request(CLIENT_MAC, client_v4(), vip4))
        .unwrap();
    let got = answers_for(&mut lan.client, Duration::from_millis(100)).await;
    let o4 = owner(&NODES, IpAddr::V4(vip4));
    assert_eq!(got, [(IpAddr::V4(vip4), node_mac(o4))]);

    lan.client
        .send(&build_neighbor_solicitation(
            CLIENT_MAC,
            client_v6(),
            vip6,
            255,
        ))
        .unwrap();
    let got = answers_for(&mut lan.client, Duration::from_millis(100)).await;
    let o6 = owner(&NODES, IpAddr::V6(vip6));
    assert_eq!(got, [(IpAddr::V6(vip6), node_mac(o6))]);

    // Outside every pool, and in a pool no advertisement selects: silence, with reasons.
    for target in ["198.18.1.7", "198.18.0.101"] {
        lan.client
            .send(&build_arp_request(
                CLIENT_MAC,
                client_v4(),
                target.parse().unwrap(),
            ))
            .unwrap();
    }
    assert!(answers_for(&mut lan.client, Duration::from_millis(100))
        .await
        .is_empty());
    for (i, node) in lan.nodes.iter().enumerate() {
        let reasons: BTreeSet<&str> = ["not_in_pool", "not_advertised", "not_elected"]
            .into_iter()
            .filter(|r| {
                node.metrics
                    .ignored
                    .get_or_create(&berth_l2::speaker::ReasonLabels { reason: r })
                    .get()
                    > 0
            })
            .collect();
        assert!(reasons.contains("not_in_pool"), "node {i}: {reasons:?}");
        assert!(reasons.contains("not_advertised"), "node {i}: {reasons:?}");
        assert_eq!(
            reasons.contains("not_elected"),
            i != o4 || i != o6,
            "node {i}"
        );
    }
    let replies: u64 = lan.nodes.iter().map(|n| n.metrics.replies_sent.get()).sum();
    assert_eq!(replies, 2);
    lan.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn with_a_refresh_interval_the_owner_keeps_announcing_after_the_rounds() {
    let vip4: Ipv4Addr = "198.18.0.211".parse().unwrap();
    let vip6: Ipv6Addr = "fd00:198:18::d3".parse().unwrap();
    let mut lan = start_refreshing(
        &vip4.to_string(),
        &vip6.to_string(),
        Some(Duration::from_secs(60)),
    );
    let owner_mac = node_mac(owner(&NODES, IpAddr::V4(vip4)));
    let t0 = tokio::time::Instant::now();
    let mut seen: Vec<(u128, Mac)> = Vec::new();
    let end = t0 + Duration::from_secs(130);
    while tokio::time::Instant::now() < end {
        if let Ok(Ok(frame)) = tokio::time::timeout_at(end, lan.client.recv()).await {
            if let Some(answer) = read_answer(&frame).filter(|a| a.ip == IpAddr::V4(vip4)) {
                seen.push((t0.elapsed().as_millis(), answer.mac));
            }
        }
    }
    assert!(seen.iter().all(|(_, mac)| *mac == owner_mac), "{seen:?}");
    let offsets: Vec<u128> = seen.iter().map(|(at, _)| *at).collect();
    // Request and reply form in each round: the five takeover rounds, then one a minute.
    assert_eq!(
        offsets,
        [0, 0, 1100, 1100, 2200, 2200, 3300, 3300, 4400, 4400, 64_400, 64_400, 124_400, 124_400],
        "{seen:?}"
    );
    lan.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_takeover_announces_at_once_then_every_1_1_s_for_5_s() {
    let vip4: Ipv4Addr = "198.18.0.211".parse().unwrap();
    let vip6: Ipv6Addr = "fd00:198:18::d3".parse().unwrap();
    let mut lan = start(&vip4.to_string(), &vip6.to_string());
    answers_for(&mut lan.client, Duration::from_secs(6)).await;
    let first = owner(&NODES, IpAddr::V4(vip4));
    let before = lan.lan.capture().len();

    // The owner dies (its link falls silent); the survivors learn it from the live set.
    lan.nodes[first].switch.set_up(false);
    let rest: Vec<&str> = NODES
        .iter()
        .copied()
        .filter(|n| *n != NODES[first])
        .collect();
    let next = owner(&rest, IpAddr::V4(vip4));
    let live: Arc<BTreeSet<String>> = Arc::new(rest.iter().map(|s| s.to_string()).collect());
    for (i, node) in lan.nodes.iter_mut().enumerate() {
        if i != first {
            node.index.set_live(live.clone());
            node.publish();
        }
    }
    let t0 = tokio::time::Instant::now();
    let mut seen: Vec<(Duration, IpAddr, Mac)> = Vec::new();
    while tokio::time::Instant::now() < t0 + Duration::from_secs(6) {
        if let Ok(Ok(frame)) = tokio::time::timeout(Duration::from_secs(6), lan.client.recv()).await
        {
            if let Some((ip, mac)) = read_answer(&frame).map(|a| (a.ip, a.mac)) {
                if ip == IpAddr::V4(vip4) {
                    seen.push((t0.elapsed(), ip, mac));
                }
            }
        }
    }
    assert!(
        seen.iter().all(|(_, _, mac)| *mac == node_mac(next)),
        "{seen:?}"
    );
    let offsets: Vec<u128> = seen.iter().map(|(d, _, _)| d.as_millis()).collect();
    // Request and reply form, in each of five rounds.
    assert_eq!(
        offsets,
        [0, 0, 1100, 1100, 2200, 2200, 3300, 3300, 4400, 4400],
        "{seen:?}"
    );
    // Nothing more from anyone after the rounds.
    let after = lan.lan.capture();
    assert!(after.len() > before);
    lan.client
        .send(&build_arp_request(CLIENT_MAC, client_v4(), vip4))
        .unwrap();
    let got = answers_for(&mut lan.client, Duration::from_millis(100)).await;
    assert_eq!(got, [(IpAddr::V4(vip4), node_mac(next))]);
    lan.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn without_joining_the_solicited_node_group_no_solicitation_arrives() {
    // A bare link that joined nothing: the fake LAN drops the multicast NS, as a NIC would.
    let lan = MemoryLan::default();
    let mut listener = lan.attach("eth0", node_mac(0));
    let mut client = lan.attach("eth0", CLIENT_MAC);
    let vip6: Ipv6Addr = "fd00:198:18::d4".parse().unwrap();
    let ns = build_neighbor_solicitation(CLIENT_MAC, client_v6(), vip6, 255);
    client.send(&ns).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), listener.recv())
            .await
            .is_err()
    );
    listener
        .join(berth_l2::frame::solicited_node(vip6))
        .unwrap();
    client.send(&ns).unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_millis(50), listener.recv())
            .await
            .unwrap()
            .unwrap(),
        ns
    );
    // Down: neither sends nor hears.
    listener.switch().set_up(false);
    assert!(listener.send(&ns).is_err());
    client.send(&ns).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), listener.recv())
            .await
            .is_err()
    );
    let _ = &mut client;
}

/// Another host's gratuitous announcement of an owned address is a conflict only while this
/// node may answer: a withdrawn node (stopped and continued, cut off) reports nothing about
/// the peers that took its addresses over.
#[tokio::test(start_paused = true)]
async fn a_withdrawn_node_reports_no_conflict() {
    let vip: Ipv4Addr = "198.18.0.210".parse().unwrap();
    let lan = MemoryLan::default();
    let mut index = L2Index::new(NODES[0]);
    index.reset_pools(&[mk_pool(
        "default",
        json!(null),
        &["198.18.0.200-198.18.0.250"],
    )]);
    index.reset_advertisements(&[mk_adv("lan", json!({"ipPools": ["default"]}))]);
    index.reset_nodes(&[mk_plain_node(NODES[0])]);
    index.reset_services(&[mk_lb("web", &["198.18.0.210"], "Cluster", json!(null))]);
    index.reset_slices(&[]);
    index.set_live(Arc::new([NODES[0].to_string()].into()));
    index.set_local_up(["eth0".to_string()].into());
    let (_answers, rx) = watch::channel(Arc::new(index.answers()));
    // Until now: answering ended (tokio's clock, which the speaker reads).
    let past = tokio::time::Instant::now().into_std();
    let (until_tx, until) = watch::channel(Some(past));
    let (conflicts_tx, mut conflicts) = tokio::sync::mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    tokio::spawn(berth_l2::run_link_with(
        lan.attach("eth0", node_mac(0)),
        rx,
        L2Metrics::default(),
        berth_l2::LinkOptions {
            refresh: None,
            until: Some(until),
            conflicts: Some(conflicts_tx),
        },
        stop.clone().cancelled_owned(),
    ));
    let mut peer = lan.attach("eth0", node_mac(1));
    let announce = |peer: &mut MemoryLink| {
        for frame in berth_l2::frame::build_gratuitous(node_mac(1), IpAddr::V4(vip)) {
            peer.send(&frame).unwrap();
        }
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    announce(&mut peer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(conflicts.try_recv().is_err(), "withdrawn: no conflict");
    until_tx.send_replace(Some(
        tokio::time::Instant::now().into_std() + Duration::from_secs(3600),
    ));
    announce(&mut peer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let conflict = conflicts.try_recv().expect("answering: a conflict");
    assert_eq!((conflict.ip, conflict.mac), (IpAddr::V4(vip), node_mac(1)));
    stop.cancel();
}
