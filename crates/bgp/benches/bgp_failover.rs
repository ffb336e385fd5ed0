//! `make bench-bgp` (root, FRR): how fast the router stops sending traffic to a node that
//! failed, on the FRR lab of `tests/frr_lab` (two nodes, a router with `maximum-paths`, BFD
//! 100 ms x 3 on both sides, hold 9 s / keepalive 3 s):
//! - SIGKILL of the process holding the node's routes (the agent): from the kill to the node's
//!   next hop gone from the router's kernel FIB;
//! - link cut at the LAN bridge: from the cut to the next hop gone (BFD's detection);
//! - the same link cut with BFD off at the router: the hold time's detection of the session, and
//!   once the stale next hop's end (graceful restart keeps it for the advertised restart time);
//! - a route written on a node (as the agent does for a new Service's address) to its next hop
//!   in the router's kernel FIB, and removed to gone: the dynamic channel, without the agent's
//!   sync before it.
//!
//! `BERTH_BGP_TRIALS` trials of each (default 20). Ends with the `bgp:` result line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/frr_lab/mod.rs"]
mod frr_lab;

use std::time::{Duration, Instant};

use frr_lab::*;

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted
        .get(i)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(f64::NAN)
}

fn summary(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort();
    (
        quantile(samples, 0.5),
        quantile(samples, 0.99),
        samples
            .last()
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(f64::NAN),
    )
}

fn both_up(lab: &Lab) -> bool {
    next_hops(lab) == ["198.18.0.11", "198.18.0.12"]
}

fn main() {
    holder_process();
    if let Some(reason) = skip_reason() {
        eprintln!("bench-bgp: {reason}");
        std::process::exit(1);
    }
    let trials: usize = std::env::var("BERTH_BGP_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(20);
    let mut lab = Lab::start("bgpb");
    spawn_holder(&mut lab, "node2");

    let mut announced = Vec::with_capacity(trials);
    let mut withdrawn = Vec::with_capacity(trials);
    for trial in 0..trials {
        let prefix = format!("198.19.10.{}/32", 100 + trial % 100);
        let at = Instant::now();
        holder_route(&mut lab, "node2", &prefix, true);
        wait_for(Duration::from_secs(10), "the route at the router", || {
            next_hops_of(&lab, &prefix) == ["198.18.0.12"]
        });
        announced.push(at.elapsed());
        let at = Instant::now();
        holder_route(&mut lab, "node2", &prefix, false);
        wait_for(
            Duration::from_secs(10),
            "the route gone from the router",
            || next_hops_of(&lab, &prefix).is_empty(),
        );
        withdrawn.push(at.elapsed());
        eprintln!(
            "route trial {trial}: announced {:?}, withdrawn {:?}",
            announced[trial], withdrawn[trial]
        );
    }

    let mut killed = Vec::with_capacity(trials);
    for trial in 0..trials {
        spawn_holder(&mut lab, "node1");
        wait_for(Duration::from_secs(10), "both next hops", || both_up(&lab));
        let mut holder = lab.holders.remove("node1").unwrap();
        holder.kill().unwrap();
        let at = Instant::now();
        wait_for(
            Duration::from_secs(10),
            "node1 withdrawn after SIGKILL",
            || next_hops(&lab) == ["198.18.0.12"],
        );
        killed.push(at.elapsed());
        let _ = holder.wait();
        eprintln!("sigkill trial {trial}: {:?}", killed[trial]);
    }

    spawn_holder(&mut lab, "node1");
    let mut cut = Vec::with_capacity(trials);
    for trial in 0..trials {
        wait_for(
            Duration::from_secs(30),
            "both sessions, next hops and node1's BFD session",
            || established(&lab) == 2 && both_up(&lab) && bfd_up(&lab, "198.18.0.11"),
        );
        run(&["ip", "-n", &lab.ns("lan"), "link", "set", "p1", "down"]);
        let at = Instant::now();
        wait_for(
            Duration::from_secs(10),
            "node1 withdrawn after a link cut",
            || next_hops(&lab) == ["198.18.0.12"],
        );
        cut.push(at.elapsed());
        run(&["ip", "-n", &lab.ns("lan"), "link", "set", "p1", "up"]);
        eprintln!("link-cut trial {trial}: {:?}", cut[trial]);
    }

    // BFD off at the router: a cut link is seen when the 9 s hold time runs out. Graceful
    // restart (on by default, the router its helper) then keeps the node's routes as stale for
    // the restart time the node advertised (FRR's 120 s): so the session's end is timed over
    // `BERTH_BGP_NOBFD_TRIALS` trials (default 5), and the next hop's end once.
    vtysh_config(
        &lab,
        "router",
        &["router bgp 64513", "no neighbor nodes bfd"],
    );
    let nobfd_trials: usize = std::env::var("BERTH_BGP_NOBFD_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(5);
    let mut hold = Vec::with_capacity(nobfd_trials);
    let mut stale = Vec::new();
    for trial in 0..nobfd_trials {
        wait_for(
            Duration::from_secs(200),
            "both sessions and next hops",
            || established(&lab) == 2 && both_up(&lab),
        );
        run(&["ip", "-n", &lab.ns("lan"), "link", "set", "p1", "down"]);
        let at = Instant::now();
        wait_for(
            Duration::from_secs(20),
            "node1's session down after a link cut, without BFD",
            || established(&lab) == 1,
        );
        hold.push(at.elapsed());
        if trial + 1 == nobfd_trials {
            wait_for(
                Duration::from_secs(200),
                "node1's stale next hop gone",
                || next_hops(&lab) == ["198.18.0.12"],
            );
            stale.push(at.elapsed());
        }
        run(&["ip", "-n", &lab.ns("lan"), "link", "set", "p1", "up"]);
        eprintln!(
            "link-cut without BFD trial {trial}: session down after {:?}{}",
            hold[trial],
            stale
                .last()
                .filter(|_| trial + 1 == nobfd_trials)
                .map(|s| format!(", next hop gone after {s:?}"))
                .unwrap_or_default()
        );
    }

    let (k50, k99, kmax) = summary(&mut killed);
    let (c50, c99, cmax) = summary(&mut cut);
    let (h50, h99, hmax) = summary(&mut hold);
    let (s50, _, _) = summary(&mut stale);
    let (a50, a99, _) = summary(&mut announced);
    let (w50, w99, _) = summary(&mut withdrawn);
    println!(
        "bgp: trials={trials} sigkill_p50_ms={k50:.0} sigkill_p99_ms={k99:.0} sigkill_max_ms={kmax:.0} \
         linkcut_bfd_p50_ms={c50:.0} linkcut_bfd_p99_ms={c99:.0} linkcut_bfd_max_ms={cmax:.0} \
         nobfd_trials={nobfd_trials} linkcut_nobfd_session_p50_ms={h50:.0} linkcut_nobfd_session_p99_ms={h99:.0} \
         linkcut_nobfd_session_max_ms={hmax:.0} linkcut_nobfd_graceful_restart_fib_ms={s50:.0} \
         route_to_fib_p50_ms={a50:.0} route_to_fib_p99_ms={a99:.0} \
         withdraw_to_fib_p50_ms={w50:.0} withdraw_to_fib_p99_ms={w99:.0}"
    );
}
