//! The announcer's election at scale: 10,000 LoadBalancer Services (a fifth of them
//! `externalTrafficPolicy: Local` with three Ready endpoints each) over 100 nodes, one pool, one
//! advertisement. Each row times [`L2Index::answers`] (incremental: only the addresses whose
//! Services or endpoints changed are elected again, each address keeps its first nodes in
//! election order) against [`L2Index::answers_full`] (every node weighed for every address, as
//! every event cost before), measured in the same run on the same index.
//!
//! Run: `cargo bench -p berth-l2 --bench election_table` (`make bench-l2`). The last line is
//! machine-readable: `l2-election: services=… nodes=… full_ms=… change_ms=… live_ms=… …`.
//! Times are medians of wall-clock runs on one thread.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_api::{IPPool, L2Advertisement};
use berth_l2::L2Index;
use berth_testing::{from_json, mk_node};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

const SERVICES: usize = 10_000;
const NODES: usize = 100;

fn node_name(i: usize) -> String {
    format!("node-{i:03}")
}

fn address(i: usize) -> IpAddr {
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    IpAddr::V4(Ipv4Addr::from(base + 1 + i as u32))
}

fn service(i: usize, ip: IpAddr) -> Service {
    let policy = if i.is_multiple_of(5) {
        "Local"
    } else {
        "Cluster"
    };
    from_json(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": format!("ns-{}", i % 50), "name": format!("svc-{i}")},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy, "ports": [{"port": 80}]},
        "status": {"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}}
    }))
}

fn slice(i: usize, first_node: usize) -> EndpointSlice {
    let endpoints: Vec<_> = (0..3)
        .map(|k| {
            json!({"addresses": [format!("10.244.{}.{}", (i / 250) % 250, i % 250 + 1)],
                   "conditions": {"ready": true},
                   "nodeName": node_name((first_node + k * 7) % NODES)})
        })
        .collect();
    from_json(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": format!("ns-{}", i % 50), "name": format!("svc-{i}-1"),
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4", "ports": [{"port": 8080}], "endpoints": endpoints
    }))
}

fn index() -> L2Index {
    let mut index = L2Index::new(&node_name(0));
    let pool: IPPool = from_json(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "default"}, "spec": {"addresses": ["198.18.0.0/15"]}
    }));
    let adv: L2Advertisement = from_json(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "L2Advertisement",
        "metadata": {"name": "lan"}, "spec": {"ipPools": ["default"]}
    }));
    index.reset_pools(&[pool]);
    index.reset_advertisements(&[adv]);
    let nodes: Vec<_> = (0..NODES)
        .map(|i| {
            mk_node(
                &node_name(i),
                json!({"kubernetes.io/hostname": node_name(i)}),
                &[],
            )
        })
        .collect();
    index.reset_nodes(&nodes);
    let services: Vec<_> = (0..SERVICES).map(|i| service(i, address(i))).collect();
    index.reset_services(&services);
    let slices: Vec<_> = (0..SERVICES)
        .filter(|i| i.is_multiple_of(5))
        .map(|i| slice(i, i))
        .collect();
    index.reset_slices(&slices);
    index.set_live(Arc::new((0..NODES).map(node_name).collect()));
    index.set_local_up(["eth0".to_string()].into());
    index
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median time of `change` followed by `answers()`, over `rounds` rounds.
fn time_incremental(
    index: &mut L2Index,
    rounds: usize,
    mut change: impl FnMut(&mut L2Index, usize),
) -> Duration {
    let samples = (0..rounds)
        .map(|round| {
            let start = Instant::now();
            change(index, round);
            black_box(index.answers());
            start.elapsed()
        })
        .collect();
    median(samples)
}

fn time_full(index: &L2Index, rounds: usize) -> Duration {
    let samples = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            black_box(index.answers_full());
            start.elapsed()
        })
        .collect();
    median(samples)
}

fn main() {
    let built = Instant::now();
    let mut index = index();
    println!(
        "l2 election: {SERVICES} Services ({} Local) on {NODES} nodes, index built in {:.0} ms",
        SERVICES / 5,
        ms(built.elapsed())
    );
    let start = Instant::now();
    let first = index.answers();
    let cold = start.elapsed();
    assert_eq!(first, index.answers_full(), "incremental and full differ");
    let full = time_full(&index, 7);

    // An endpoint moves: one Local Service's slice names other nodes.
    let change = time_incremental(&mut index, 201, |index, round| {
        let i = (round * 5 * 37) % SERVICES;
        index.apply_slice(&slice(i, round + 1));
    });
    // A Service gets another address.
    let service_change = time_incremental(&mut index, 201, |index, round| {
        let i = (round * 13 + 1) % SERVICES;
        index.apply_service(&service(i, address(SERVICES + round)));
    });
    // A node stops being live and comes back: every address is weighed again.
    let all: BTreeSet<String> = (0..NODES).map(node_name).collect();
    let live = time_incremental(&mut index, 21, |index, round| {
        let mut live = all.clone();
        if round.is_multiple_of(2) {
            live.remove(&node_name(round % NODES));
        }
        index.set_live(Arc::new(live));
    });
    // A Node joins: each address's order admits it, and every address is elected again.
    let joined = time_incremental(&mut index, 5, |index, round| {
        let name = format!("node-new-{round}");
        index.apply_node(&mk_node(
            &name,
            json!({"kubernetes.io/hostname": name}),
            &[],
        ));
    });
    assert_eq!(
        index.answers(),
        index.answers_full(),
        "incremental and full differ"
    );

    println!();
    println!(
        "| at {SERVICES} Services x {NODES} nodes | incremental ms | from scratch ms | ratio |"
    );
    println!("|---|---|---|---|");
    let row = |what: &str, d: Duration| {
        println!(
            "| {what} | {:.2} | {:.1} | {:.0}x |",
            ms(d),
            ms(full),
            ms(full) / ms(d).max(1e-6)
        );
    };
    row(
        "first table (all addresses, election orders computed)",
        cold,
    );
    row("an endpoint moves (one Local Service)", change);
    row("a Service changes address", service_change);
    row("the live set changes (every address weighed again)", live);
    row(
        "a Node joins (orders updated, every address elected again)",
        joined,
    );
    println!(
        "l2-election: services={SERVICES} nodes={NODES} full_ms={:.1} cold_ms={:.1} change_ms={:.3} \
         service_change_ms={:.3} live_ms={:.2} node_join_ms={:.1} change_speedup={:.0}",
        ms(full),
        ms(cold),
        ms(change),
        ms(service_change),
        ms(live),
        ms(joined),
        ms(full) / ms(change).max(1e-6)
    );
}
