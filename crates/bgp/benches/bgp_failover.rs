//! `make bench-bgp` (root, FRR): how fast the router stops sending traffic to a node that
//! failed, on the FRR lab of `tests/frr_lab` (two nodes, a router with `maximum-paths`, BFD
//! 100 ms x 3 on both sides, hold 9 s / keepalive 3 s):
//! - SIGKILL of the process holding the node's routes (the agent): from the kill to the node's
//!   next hop gone from the router's kernel FIB;
//! - link cut at the LAN bridge: from the cut to the next hop gone (BFD's detection).
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

    let (k50, k99, kmax) = summary(&mut killed);
    let (c50, c99, cmax) = summary(&mut cut);
    println!(
        "bgp: trials={trials} sigkill_p50_ms={k50:.0} sigkill_p99_ms={k99:.0} sigkill_max_ms={kmax:.0} \
         linkcut_bfd_p50_ms={c50:.0} linkcut_bfd_p99_ms={c99:.0} linkcut_bfd_max_ms={cmax:.0}"
    );
}
