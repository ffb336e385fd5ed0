//! Plan + render cost of full syncs and one-endpoint-change partial syncs, tree vs linear
//! dispatch, and the number of dispatch rules a first packet walks.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use berth_datapath::sync::{Iptables, Syncer};
use berth_datapath::trace::{dispatch_rules_walked, Origin, Packet, TraceEnv};
use berth_datapath::*;

/// Accepts every payload and only measures it, so the numbers are berth's own cost.
#[derive(Default)]
struct CountingIptables {
    last_payload_bytes: usize,
}

impl Iptables for CountingIptables {
    fn restore(&mut self, payload: &str) -> Result<(), Error> {
        self.last_payload_bytes = payload.len();
        Ok(())
    }
    fn save(&mut self, _table: Table) -> Result<String, Error> {
        Ok(String::new())
    }
    fn ensure_chain(&mut self, _table: Table, _chain: &ChainName) -> Result<(), Error> {
        Ok(())
    }
    fn chain_exists(&mut self, _table: Table, _chain: &ChainName) -> Result<bool, Error> {
        Ok(true)
    }
    fn ensure_jump(&mut self, _jump: &JumpRule) -> Result<(), Error> {
        Ok(())
    }
}

fn service_ip(i: usize) -> IpAddr {
    // 10.96.0.0/16 holds 65k Services, enough for 30k.
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i as u32,
    ))
}

fn mk_view(services: usize, endpoints: usize) -> NodeView {
    let services = (0..services)
        .map(|i| {
            let eps = (0..endpoints)
                .map(|e| {
                    let n = (i * endpoints + e) as u32;
                    Endpoint {
                        ip: IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + n)),
                        port: 8080,
                        ready: true,
                        serving: true,
                        terminating: false,
                        node_name: Some(format!("node-{}", e % 3)),
                    }
                })
                .collect();
            ServicePort {
                name: ServicePortName {
                    namespace: format!("ns{}", i % 50),
                    name: format!("svc-{i}"),
                    port: "http".into(),
                },
                protocol: Protocol::Tcp,
                port: 80,
                cluster_ips: vec![service_ip(i)],
                node_port: (i < 2700).then(|| 30000 + i as u16),
                external_ips: vec![],
                load_balancer_ingress: vec![],
                source_ranges: vec![],
                session_affinity: SessionAffinity::None,
                external_traffic_policy: TrafficPolicy::Cluster,
                internal_traffic_policy: TrafficPolicy::Cluster,
                health_check_node_port: None,
                endpoints: eps,
            }
        })
        .collect();
    NodeView {
        node: NodeInfo {
            name: "node-0".into(),
            addresses: vec!["198.18.0.11".parse().unwrap()],
        },
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

fn measure(services: usize, dispatch: Dispatch) -> Row {
    let mut view = mk_view(services, 10);
    let options = PlanOptions {
        dispatch,
        cluster_cidr: Some("10.128.0.0/9".parse().unwrap()),
        ..PlanOptions::default()
    };
    let mut syncer = Syncer::new(CountingIptables::default());

    let start = Instant::now();
    let rs = plan(&view, &options);
    let full = syncer.sync(&rs).unwrap();
    let full_ms = ms(start);

    let env = TraceEnv {
        local_addresses: view.node.addresses.clone(),
        ..TraceEnv::default()
    };
    let walk = |i: usize| {
        let packet = Packet {
            src: "10.128.0.1".parse().unwrap(),
            dst: service_ip(i),
            protocol: Protocol::Tcp,
            dport: 80,
            origin: Origin::Network,
            bridged: false,
        };
        dispatch_rules_walked(&rs, &env, &packet).unwrap().unwrap()
    };
    let (walk_first, walk_last) = (walk(0), walk(services - 1));
    drop(rs);

    // One endpoint of one Service in the middle changes address, as a pod restart does.
    view.services[services / 2].endpoints[3].ip = "10.255.0.1".parse().unwrap();
    let start = Instant::now();
    let rs = plan(&view, &options);
    let change_plan_ms = ms(start);
    let change = syncer.sync(&rs).unwrap();
    let change_ms = ms(start);
    assert_eq!(change.kind, sync::SyncKind::Partial);

    // A new Service: linear dispatch rewrites its whole entry chain, the tree one leaf.
    let mut added = mk_view(services + 1, 10).services.pop().unwrap();
    added.node_port = None;
    view.services.push(added);
    let start = Instant::now();
    let rs = plan(&view, &options);
    let add = syncer.sync(&rs).unwrap();
    let add_ms = ms(start);
    Row {
        add_bytes: add.payload_bytes,
        add_ms,
        services,
        dispatch,
        full_bytes: full.payload_bytes,
        full_ms,
        change_bytes: change.payload_bytes,
        change_ms,
        change_plan_ms,
        walk_first,
        walk_last,
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::var("BERTH_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 30_000]);
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
            let row = measure(n, dispatch);
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
