//! BGP announcing against a real router, on one host (root; runs serially in its own binary).
//! The lab is described in `frr_lab/mod.rs`. Killing a node's holder withdraws its route while
//! its session stays up; cutting a node's link withdraws its next hop through BFD, before the
//! hold time could. The IPv6 address travels over the IPv6 sessions (MP-BGP) to an ECMP route
//! in the router's IPv6 FIB.

// A panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod frr_lab;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use frr_lab::*;

/// Runs only when re-executed by the test as a node's holder.
#[test]
fn holder_process() {
    frr_lab::holder_process();
}

#[test]
fn routes_spread_over_nodes_and_a_killed_agent_or_cut_link_withdraws() {
    if std::env::var(HOLDER_ENV).is_ok() {
        return;
    }
    if let Some(reason) = skip_reason() {
        // As berth-testing's `require`: a strict run fails rather than skips.
        let strict = std::env::var("CI").as_deref() == Ok("true")
            || std::env::var("BERTH_REQUIRE_ROOT").as_deref() == Ok("1");
        assert!(!strict, "cannot run: {reason}");
        println!(
            "berth-test: SKIPPED routes_spread_over_nodes_and_a_killed_agent_or_cut_link_withdraws: {reason}"
        );
        return;
    }
    let mut lab = Lab::start("bgp");

    for (name, _) in NODES {
        spawn_holder(&mut lab, name);
    }
    wait_for(Duration::from_secs(10), "one next hop per node", || {
        next_hops(&lab) == ["198.18.0.11", "198.18.0.12"]
    });
    let vip6 = format!("{VIP6}/128");
    wait_for(
        Duration::from_secs(20),
        "one IPv6 next hop per node for the IPv6 address",
        || next_hops_of(&lab, &vip6).len() == 2,
    );
    let hops6 = next_hops_of(&lab, &vip6);
    assert!(
        hops6.iter().all(|h| h.starts_with("fe80:")) && hops6[0] != hops6[1],
        "two nodes' link-local next hops: {hops6:?}"
    );

    let mut served = BTreeMap::<String, usize>::new();
    for _ in 0..16 {
        if let Some(node) = fetch_from_client(&lab) {
            *served.entry(node).or_default() += 1;
        }
    }
    assert_eq!(
        served.values().sum::<usize>(),
        16,
        "every connection answered: {served:?}"
    );
    assert_eq!(
        served.len(),
        2,
        "connections spread over both nodes: {served:?}"
    );

    let mut holder = lab.holders.remove("node1").unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_for(Duration::from_secs(5), "node1's next hop withdrawn", || {
        next_hops(&lab) == ["198.18.0.12"]
    });
    wait_for(
        Duration::from_secs(5),
        "node1's IPv6 next hop withdrawn",
        || next_hops_of(&lab, &vip6).len() == 1,
    );
    assert_eq!(established(&lab), 2, "the killed agent's session stays up");
    for _ in 0..4 {
        assert_eq!(
            fetch_from_client(&lab).as_deref(),
            Some(lab.ns("node2").as_str())
        );
    }

    // node2's link cut at the bridge: nothing is sent any more, so only BFD (100 ms x 3) can
    // tell; the wait is shorter than the 9 s hold time, which would otherwise do it.
    wait_for(
        Duration::from_secs(10),
        "the router's BFD session with node2",
        || bfd_up(&lab, "198.18.0.12"),
    );
    run(&["ip", "-n", &lab.ns("lan"), "link", "set", "p2", "down"]);
    let cut = Instant::now();
    wait_for(
        Duration::from_secs(5),
        "node2's next hop withdrawn by BFD",
        || next_hops(&lab).is_empty(),
    );
    println!("frr_netns: link cut withdrawn after {:?}", cut.elapsed());
}
