//! Full syncs and one-endpoint-change partial syncs through the incremental planner, tree vs
//! linear dispatch: planning, rendering and applying to the in-memory iptables, with the payload
//! size, and the number of dispatch rules a first packet walks. Change syncs are repeated and
//! their median reported, as the machine running this is shared.
#![allow(clippy::unwrap_used)]

use berth_core::Protocol;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use berth_datapath::backend::{SyncKind, SyncReport};
use berth_datapath::fake::MemoryIptables;
use berth_datapath::iptables::Syncer;
use berth_datapath::trace::{dispatch_rules_walked, Origin, Packet, TraceEnv};
use berth_datapath::*;
use berth_testing::{mk_endpoint, mk_node_info, mk_service_port, port_name};

fn service_ip(i: usize) -> IpAddr {
    // 10.96.0.0/16 holds 65k Services, enough for 30k.
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i as u32,
    ))
}

/// Service `i` with its endpoints, built alone so adding one does not build (and free) a view.
fn mk_port(i: usize, endpoints: usize) -> ServicePort {
    let eps = (0..endpoints)
        .map(|e| {
            let n = (i * endpoints + e) as u32;
            mk_endpoint(
                IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + n)),
                8080,
                &format!("node-{}", e % 3),
            )
        })
        .collect();
    let mut port = mk_service_port(
        port_name(&format!("ns{}", i % 50), &format!("svc-{i}"), "http"),
        service_ip(i),
        80,
        eps,
    );
    port.node_port = (i < 2700).then(|| 30000 + i as u16);
    port
}

fn mk_view(services: usize, endpoints: usize) -> NodeView {
    let services = (0..services).map(|i| mk_port(i, endpoints)).collect();
    NodeView {
        node: mk_node_info("node-0", "198.18.0.11".parse().unwrap()),
        services,
    }
}

struct Row {
    services: usize,
    dispatch: Dispatch,
    full_bytes: usize,
    full_ms: f64,
    change_bytes: usize,
    change_ms: f64,
    change_plan_ms: f64,
    add_bytes: usize,
    add_ms: f64,
    walk_first: usize,
    walk_last: usize,
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// One sync as the agent runs it: update the planner with the Service ports its watch events
/// named (`None`: it cannot tell, so every port is fingerprinted), then apply the chains the
/// planner reports. Returns the whole wall time, the planning part of it, and the report.
fn sync_once(
    planner: &mut Planner,
    syncer: &mut Syncer<MemoryIptables>,
    view: &NodeView,
    changed: Option<&ServicePortName>,
) -> (f64, f64, SyncReport) {
    let start = Instant::now();
    match changed {
        Some(changed) => planner.update_changed(view, &|name| name == changed),
        None => planner.update(view),
    }
    let changes = planner.take_changes();
    let plan_ms = ms(start);
    let report = syncer.sync_changes(planner.ruleset(), &changes).unwrap();
    (ms(start), plan_ms, report)
}

fn measure(services: usize, dispatch: Dispatch, reps: usize) -> Row {
    let mut view = mk_view(services, 10);
    let options = PlanOptions {
        dispatch,
        cluster_cidr: Some("10.128.0.0/9".parse().unwrap()),
        ..PlanOptions::default()
    };
    let mut planner = Planner::new(options.clone());
    let mut syncer =
        Syncer::new(MemoryIptables::default()).rewriting_every_sync(rewritten_every_sync(dispatch));

    let (full_ms, _, full) = sync_once(&mut planner, &mut syncer, &view, None);
    assert_eq!(full.kind, SyncKind::Full);

    let env = TraceEnv {
        local_addresses: view.node.addresses.clone(),
        ..TraceEnv::default()
    };
    let walk = |rs: &Ruleset, i: usize| {
        let packet = Packet {
            src: "10.128.0.1".parse().unwrap(),
            dst: service_ip(i),
            protocol: Protocol::Tcp,
            dport: 80,
            origin: Origin::Network,
            bridged: false,
        };
        dispatch_rules_walked(rs, &env, &packet).unwrap().unwrap()
    };
    let (walk_first, walk_last) = (
        walk(planner.ruleset(), 0),
        walk(planner.ruleset(), services - 1),
    );

    // One endpoint of one Service changes address, as a pod restart does; a different Service
    // each time, so no repetition finds its work already done.
    let mut change_ms = Vec::new();
    let mut change_plan_ms = Vec::new();
    let mut change_bytes = Vec::new();
    for rep in 0..reps {
        let changed = &mut view.services[(services / 2 + rep) % services];
        changed.endpoints.make_mut()[3].ip = IpAddr::V4(Ipv4Addr::new(10, 255, 0, rep as u8));
        let name = changed.name.clone();
        let (wall, plan_part, change) = sync_once(&mut planner, &mut syncer, &view, Some(&name));
        assert_eq!(change.kind, SyncKind::Partial);
        change_ms.push(wall);
        change_plan_ms.push(plan_part);
        change_bytes.push(change.payload_bytes as f64);
    }

    // A new Service: linear dispatch rewrites its whole entry chain, the tree one leaf.
    // Built alone: freeing a whole throw-away view here made glibc consolidate hundreds of
    // thousands of freed chunks inside the timed sync, which showed up as an O(Services) add.
    let mut added = mk_port(services, 10);
    added.node_port = None;
    let name = added.name.clone();
    view.services.push(added);
    let (add_ms, _, add) = sync_once(&mut planner, &mut syncer, &view, Some(&name));
    Row {
        services,
        dispatch,
        full_bytes: full.payload_bytes,
        full_ms,
        change_bytes: median(change_bytes) as usize,
        change_ms: median(change_ms),
        change_plan_ms: median(change_plan_ms),
        add_bytes: add.payload_bytes,
        add_ms,
        walk_first,
        walk_last,
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::var("BERTH_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 30_000]);
    let reps: usize = std::env::var("BERTH_BENCH_REPS")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(7);
    println!(
        "{:>8} {:>7} {:>12} {:>10} {:>13} {:>11} {:>14} {:>10} {:>9} {:>11} {:>10}",
        "services",
        "mode",
        "full_bytes",
        "full_ms",
        "change_bytes",
        "change_ms",
        "of_which_plan",
        "add_bytes",
        "add_ms",
        "walk_first",
        "walk_last"
    );
    let mut rows = Vec::new();
    for &n in &sizes {
        for dispatch in [Dispatch::Linear, Dispatch::Tree] {
            let name = format!("{dispatch:?}").to_lowercase();
            if std::env::var("BERTH_BENCH_DISPATCH").is_ok_and(|only| only != name) {
                continue;
            }
            let row = measure(n, dispatch, reps);
            println!(
                "{:>8} {:>7} {:>12} {:>10.1} {:>13} {:>11.1} {:>14.1} {:>10} {:>9.1} {:>11} {:>10}",
                row.services,
                format!("{:?}", row.dispatch).to_lowercase(),
                row.full_bytes,
                row.full_ms,
                row.change_bytes,
                row.change_ms,
                row.change_plan_ms,
                row.add_bytes,
                row.add_ms,
                row.walk_first,
                row.walk_last
            );
            rows.push(row);
        }
    }
    let pick = |dispatch| {
        rows.iter()
            .find(|r| r.services == 10_000 && r.dispatch == dispatch)
    };
    if let (Some(tree), Some(linear)) = (pick(Dispatch::Tree), pick(Dispatch::Linear)) {
        println!(
            "datapath-plan: change_10k_tree_bytes={} change_10k_linear_bytes={} change_10k_tree_ms={:.1} change_10k_linear_ms={:.1}",
            tree.change_bytes, linear.change_bytes, tree.change_ms, linear.change_ms
        );
    }
}
