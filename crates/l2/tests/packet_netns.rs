//! The real AF_PACKET transport between two network namespaces joined by a veth pair: the
//! announcer side answers, and the other side's kernel fills its neighbour table from the
//! answer (ARP and NDP). Needs root and iproute2; it makes `berth-l2p<pid>-a` and `-b`, uses
//! only them, and deletes both afterwards (also on failure). Skips with a message elsewhere,
//! but fails under `CI=true` or `BERTH_REQUIRE_ROOT=1`.
//!
//! Address plan: a 198.18.0.11/24 + fd00:198:18::b/64 (the "node"), b 198.18.0.100/24 +
//! fd00:198:18::64/64 (the "client"); VIPs 198.18.0.200 and fd00:198:18::c8, in pool
//! 198.18.0.200-198.18.0.250 / fd00:198:18::/120, never configured on any interface.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_l2::{run_link, L2Index, L2Metrics, PacketLink};
use common::*;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ready() -> bool {
    berth_testing::require(&[berth_testing::Requirement::Netns])
}

/// The two namespaces, deleted on drop.
struct Pair {
    a: String,
    b: String,
}

impl Pair {
    fn create() -> Pair {
        let prefix = format!("berth-l2p{}", std::process::id());
        let pair = Pair {
            a: format!("{prefix}-a"),
            b: format!("{prefix}-b"),
        };
        ip(&["netns", "add", &pair.a]);
        ip(&["netns", "add", &pair.b]);
        ip(&[
            "-n", &pair.a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
            &pair.b,
        ]);
        for (ns, v4, v6) in [
            (&pair.a, "198.18.0.11/24", "fd00:198:18::b/64"),
            (&pair.b, "198.18.0.100/24", "fd00:198:18::64/64"),
        ] {
            ip(&["-n", ns, "addr", "add", v4, "dev", "eth0"]);
            ip(&["-n", ns, "addr", "add", v6, "dev", "eth0", "nodad"]);
            ip(&["-n", ns, "link", "set", "eth0", "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        pair
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

fn mac_of(ns: &str) -> String {
    let out = ip(&["-n", ns, "-o", "link", "show", "eth0"]);
    out.split("link/ether ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_string()
}

/// The MAC `ns`'s kernel holds for `target`, if any (any state but FAILED/INCOMPLETE).
fn neighbour(ns: &str, target: &str) -> Option<String> {
    let out = ip(&["-n", ns, "neigh", "show", target]);
    out.split("lladdr ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
}

/// Makes `ns`'s kernel resolve `target`: a TCP connection attempt that nobody completes.
fn provoke(ns: &str, target: IpAddr) {
    let addr = SocketAddr::new(target, 80);
    let _ = berth_lab::netns::run_in_netns(ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(300))
    });
}

#[test]
fn the_client_kernel_learns_the_vip_from_the_af_packet_responder() {
    if !ready() {
        return;
    }
    let pair = Pair::create();
    let node_mac = mac_of(&pair.a);
    let vip4 = "198.18.0.200";
    let vip6 = "fd00:198:18::c8";

    let mut index = L2Index::new("node-1");
    index.reset_pools(&[
        mk_pool("default", json!(null), &["198.18.0.200-198.18.0.250"]),
        mk_pool("v6", json!(null), &["fd00:198:18::/120"]),
    ]);
    index.reset_advertisements(&[mk_adv("lan", json!({}))]);
    index.reset_nodes(&[mk_plain_node("node-1")]);
    index.reset_services(&[mk_lb("web", &[vip4, vip6], "Cluster", json!(null))]);
    index.reset_slices(&[]);
    index.set_local_up(["eth0".to_string()].into());
    let answers = index.answers();
    assert_eq!(answers.owned().count(), 2);

    let stop = CancellationToken::new();
    let metrics = L2Metrics::default();
    let (_tx, rx) = watch::channel(Arc::new(answers));
    let (speaker_stop, speaker_metrics) = (stop.clone(), metrics.clone());
    let speaker = std::thread::spawn({
        let ns = pair.a.clone();
        move || {
            berth_lab::netns::run_in_netns(&ns, move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let link = PacketLink::open("eth0").unwrap();
                    run_link(link, rx, speaker_metrics, speaker_stop.cancelled_owned()).await;
                });
            })
            .unwrap();
        }
    });

    let resolve_both = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        for target in [vip4, vip6] {
            loop {
                provoke(&pair.b, target.parse().unwrap());
                if let Some(mac) = neighbour(&pair.b, target) {
                    assert_eq!(mac, node_mac, "{target}");
                    break;
                }
                assert!(Instant::now() < deadline, "{target} never resolved");
            }
        }
    };
    // The takeover's gratuitous rounds may teach the client before any reply does.
    resolve_both();
    // Once the rounds are over (five each: two ARP frames for IPv4, one NA for IPv6), only
    // replies can: forget both and resolve again.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics.gratuitous_sent.get() < 15 {
        assert!(Instant::now() < deadline, "gratuitous rounds did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
    let replies = metrics.replies_sent.get();
    ip(&["-n", &pair.b, "neigh", "flush", "all"]);
    resolve_both();
    assert_eq!(
        metrics.replies_sent.get(),
        replies + 2,
        "one ARP reply, one NA"
    );
    assert_eq!(metrics.gratuitous_sent.get(), 15);
    // Nothing answers for an address outside the pools, and the VIP is on no interface.
    provoke(&pair.b, "198.18.0.199".parse().unwrap());
    assert_eq!(neighbour(&pair.b, "198.18.0.199"), None);
    let addresses = ip(&["-n", &pair.a, "addr", "show"]);
    assert!(
        !addresses.contains(vip4) && !addresses.contains("c8/"),
        "{addresses}"
    );

    stop.cancel();
    speaker.join().unwrap();
    let not_in_pool = metrics
        .ignored
        .get_or_create(&berth_l2::speaker::ReasonLabels {
            reason: "not_in_pool",
        })
        .get();
    assert!(not_in_pool >= 1);
}
