//! NDP with three real agents: the L2 lab of `l2_lab` (a LAN bridge, three node namespaces each
//! running `berth agent --l2-announcer --membership on`, the lab API server in a control-plane
//! namespace, a client) with an IPv6 LoadBalancer address (`l2_lab/ndp.rs`). A capture in the
//! client namespace records every Neighbor Advertisement on the LAN and sends the solicitations.
//! Checked: exactly one NA for each Neighbor Solicitation, sent to its group (multicast) or
//! straight to the owner (unicast, what a kernel sends to confirm a stale entry, and what
//! MetalLB's announcer left unanswered: metallb#2685, #2920); none from the other nodes, none for
//! an address outside the pools; the unsolicited NA (override set) on every takeover; failover
//! on SIGKILL, link down and graceful stop, and back. Needs root and iproute2; skips with a
//! message elsewhere, and fails instead under `CI=true` or `BERTH_REQUIRE_ROOT=1`. Every
//! namespace is `berth-tn<pid>-*`, deleted at the end (also on failure).

#![allow(clippy::unwrap_used)]

mod l2_lab;

use std::time::{Duration, Instant};

use berth_l2::frame::Mac;
use l2_lab::ndp::{announce_ipv6, vip6, NdpCapture, STRAY6, VIP6};
use l2_lab::*;

#[test]
fn three_agents_answer_each_neighbor_solicitation_once_and_fail_over() {
    run_lab("tn", |lab| async move {
        let ndp = NdpCapture::start(&lab.client_ns);
        let began = Instant::now();
        announce_ipv6(&lab.client).await;
        let lab = scenario(lab, &ndp, began).await;
        drop(ndp);
        lab
    });
}

/// Solicits `n` times by multicast and `n` times unicast to `owner`, 20 ms apart, and checks
/// that each solicitation got exactly one answer, from `owner`, and that the LAN carried no other
/// solicited NA for the address meanwhile.
async fn one_answer_each(ndp: &NdpCapture, owner: Mac, n: usize, what: &str) {
    let from = Instant::now();
    let mut sources = Vec::new();
    for _ in 0..n {
        sources.push(ndp.solicit(vip6(), None));
        tokio::time::sleep(Duration::from_millis(20)).await;
        sources.push(ndp.solicit(vip6(), Some(owner)));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, source) in sources.iter().enumerate() {
        let answers = ndp.answers_to(*source);
        let kind = if i % 2 == 0 { "multicast" } else { "unicast" };
        assert_eq!(
            answers.len(),
            1,
            "{what}: {kind} NS from {source}: {answers:?}"
        );
        let na = answers[0];
        assert_eq!(na.mac, owner, "{what}: {kind} NS answered by {na:?}");
        assert!(na.solicited && na.r#override, "{what}: {na:?}");
    }
    let solicited = ndp.since(vip6(), from, |na| na.solicited);
    assert_eq!(
        solicited.len(),
        sources.len(),
        "{what}: solicited NAs on the LAN: {solicited:?}"
    );
}

/// An unsolicited NA for VIP6 from `mac` with override set, to all nodes, since `from`.
fn unsolicited_from(ndp: &NdpCapture, mac: Mac, from: Instant, what: &str) {
    let all_nodes: std::net::Ipv6Addr = "ff02::1".parse().unwrap();
    let seen = ndp.since(vip6(), from, |na| !na.solicited);
    assert!(
        seen.iter()
            .any(|na| na.mac == mac && na.r#override && na.to == all_nodes),
        "{what}: no unsolicited NA from {mac:02x?}: {seen:?}"
    );
}

async fn scenario(mut lab: L2Lab, ndp: &NdpCapture, began: Instant) -> L2Lab {
    let macs = lab.macs.clone();
    let owner = owner_among(&NODES, VIP6);
    let next = owner_among(&without(&NODES, &[&owner]), VIP6);
    let third = without(&NODES, &[&owner, &next])[0];
    ndp.until(vip6(), Some(macs[owner.as_str()]), "first election")
        .await;
    unsolicited_from(ndp, macs[owner.as_str()], began, "first election");

    one_answer_each(ndp, macs[owner.as_str()], 10, "steady state").await;
    // A unicast solicitation to a node that does not own the address gets no answer (the
    // kernel then falls back to multicast), nor does an address outside the pools.
    for mac in [macs[next.as_str()], macs[third]] {
        let source = ndp.solicit(vip6(), Some(mac));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(ndp.answers_to(source), vec![], "unicast NS to a non-owner");
    }
    assert!(ndp.ask(STRAY6.parse().unwrap()).await.is_empty());

    for (how, signal) in [
        ("SIGKILL", "-KILL"),
        ("link down", ""),
        ("graceful stop", "-TERM"),
    ] {
        let from = Instant::now();
        if signal.is_empty() {
            lab.set_link(&owner, false);
        } else {
            lab.agents.stop(&owner, signal);
        }
        ndp.until(vip6(), Some(macs[next.as_str()]), how).await;
        unsolicited_from(ndp, macs[next.as_str()], from, how);
        one_answer_each(ndp, macs[next.as_str()], 3, how).await;

        let back = Instant::now();
        if signal.is_empty() {
            lab.set_link(&owner, true);
        } else {
            lab.agents.start(&owner);
        }
        ndp.until(vip6(), Some(macs[owner.as_str()]), &format!("{how}: back"))
            .await;
        unsolicited_from(ndp, macs[owner.as_str()], back, &format!("{how}: back"));
        // Let the interim owner's last gratuitous round pass before counting answers again.
        tokio::time::sleep(Duration::from_millis(500)).await;
        one_answer_each(ndp, macs[owner.as_str()], 3, &format!("{how}: back")).await;
    }
    eprintln!("NDP scenario took {:?}", began.elapsed());
    lab
}
