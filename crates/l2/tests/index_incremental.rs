//! The incremental election equals the election from scratch: random sequences of watch events,
//! live-set and interface changes, with the table read at random points (so changes pile up
//! between two reads), and [`L2Index::answers`] must equal [`L2Index::answers_full`] at each.
//!
//! Twelve nodes, more than the election order the index keeps per address, so the fallback to
//! weighing every node is taken too; unknown nodes in slices and the live set, shared and
//! out-of-pool addresses, both traffic policies, relists and Node churn.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use berth_l2::L2Index;
use berth_testing::mk_node;
use common::*;
use proptest::prelude::*;
use serde_json::json;

const NODES: usize = 12;
const SERVICES: usize = 6;
/// Addresses Services draw from: two in `default`, one in `quiet` (advertised only by the
/// second advertisement), one IPv6, one in no pool.
const ADDRESSES: [&str; 5] = [
    "198.18.0.200",
    "198.18.0.201",
    "198.18.0.100",
    "fd00:198:18::5",
    "198.18.0.9",
];

fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

#[derive(Debug, Clone)]
enum Op {
    Service {
        svc: usize,
        ips: Vec<usize>,
        local: bool,
    },
    DeleteService(usize),
    Slice {
        slice: usize,
        svc: usize,
        endpoints: Vec<(usize, bool)>,
    },
    DeleteSlice(usize),
    Node {
        node: usize,
        rack: bool,
        excluded: bool,
    },
    DeleteNode(usize),
    Live(Vec<usize>),
    LocalUp(Vec<bool>),
    Advertisement {
        quiet: bool,
        rack_only: bool,
        eth1_only: bool,
    },
    RelistServices(Vec<usize>),
    Read,
}

fn op() -> impl Strategy<Value = Op> {
    let node = 0..NODES + 2;
    prop_oneof![
        4 => (0..SERVICES, prop::collection::vec(0..ADDRESSES.len(), 0..3), any::<bool>())
            .prop_map(|(svc, ips, local)| Op::Service { svc, ips, local }),
        1 => (0..SERVICES).prop_map(Op::DeleteService),
        4 => (0..SERVICES + 2, 0..SERVICES, prop::collection::vec((node.clone(), any::<bool>()), 0..4))
            .prop_map(|(slice, svc, endpoints)| Op::Slice { slice, svc, endpoints }),
        1 => (0..SERVICES + 2).prop_map(Op::DeleteSlice),
        1 => (0..NODES + 2, any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(node, rack, excluded)| Op::Node { node, rack, excluded }),
        1 => (0..NODES + 2).prop_map(Op::DeleteNode),
        2 => prop::collection::vec(node, 0..NODES).prop_map(Op::Live),
        1 => prop::collection::vec(any::<bool>(), 2).prop_map(Op::LocalUp),
        1 => (any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(quiet, rack_only, eth1_only)| Op::Advertisement { quiet, rack_only, eth1_only }),
        1 => prop::collection::vec(0..SERVICES, 0..SERVICES).prop_map(Op::RelistServices),
        4 => Just(Op::Read),
    ]
}

fn service(svc: usize, ips: &[usize], local: bool) -> k8s_openapi::api::core::v1::Service {
    let ips: Vec<&str> = ips.iter().map(|i| ADDRESSES[*i]).collect();
    let policy = if local { "Local" } else { "Cluster" };
    mk_lb(&format!("svc-{svc}"), &ips, policy, json!(null))
}

fn node(i: usize, rack: bool, excluded: bool) -> k8s_openapi::api::core::v1::Node {
    let mut labels = json!({"kubernetes.io/hostname": node_name(i)});
    if rack {
        labels["rack"] = json!("a");
    }
    if excluded {
        labels["node.kubernetes.io/exclude-from-external-load-balancers"] = json!("");
    }
    mk_node(&node_name(i), labels, &[])
}

fn listed() -> L2Index {
    let mut index = L2Index::new("node-1");
    index.reset_pools(&[
        mk_pool("default", json!(null), &["198.18.0.200-198.18.0.250"]),
        mk_pool("quiet", json!({"tier": "b"}), &["198.18.0.100/30"]),
        mk_pool("v6", json!(null), &["fd00:198:18::/120"]),
    ]);
    index.reset_advertisements(&[mk_adv("lan", json!({"ipPools": ["default", "v6"]}))]);
    let nodes: Vec<_> = (0..NODES).map(|i| node(i, i % 3 == 0, false)).collect();
    index.reset_nodes(&nodes);
    index.reset_services(&[]);
    index.reset_slices(&[]);
    index.set_local_up(["eth0".to_string()].into());
    index
}

fn apply(index: &mut L2Index, op: &Op, services: &mut [Option<(Vec<usize>, bool)>]) {
    match op {
        Op::Service { svc, ips, local } => {
            index.apply_service(&service(*svc, ips, *local));
            services[*svc] = Some((ips.clone(), *local));
        }
        Op::DeleteService(svc) => {
            index.delete_service(&service(*svc, &[], false));
            services[*svc] = None;
        }
        Op::Slice {
            slice,
            svc,
            endpoints,
        } => {
            let endpoints: Vec<(String, bool)> = endpoints
                .iter()
                .map(|(n, ready)| (node_name(*n), *ready))
                .collect();
            let endpoints: Vec<(&str, bool)> =
                endpoints.iter().map(|(n, r)| (n.as_str(), *r)).collect();
            index.apply_slice(&mk_endpoints(
                &format!("svc-{svc}"),
                &format!("slice-{slice}"),
                &endpoints,
            ));
        }
        Op::DeleteSlice(slice) => {
            index.delete_slice(&mk_endpoints("any", &format!("slice-{slice}"), &[]));
        }
        Op::Node {
            node: i,
            rack,
            excluded,
        } => {
            index.apply_node(&node(*i, *rack, *excluded));
        }
        Op::DeleteNode(i) => {
            index.delete_node(&node(*i, false, false));
        }
        Op::Live(nodes) => {
            let live: BTreeSet<String> = nodes.iter().map(|n| node_name(*n)).collect();
            index.set_live(Arc::new(live));
        }
        Op::LocalUp(up) => {
            let names = ["eth0", "eth1"];
            let up: BTreeSet<String> = names
                .iter()
                .zip(up)
                .filter(|(_, up)| **up)
                .map(|(n, _)| n.to_string())
                .collect();
            index.set_local_up(up);
        }
        Op::Advertisement {
            quiet,
            rack_only,
            eth1_only,
        } => {
            let mut spec = json!({"ipPools": ["default", "v6"]});
            if *quiet {
                spec["ipPools"] = json!(["default", "v6", "quiet"]);
            }
            if *rack_only {
                spec["nodeSelectors"] = json!([{"matchLabels": {"rack": "a"}}]);
            }
            if *eth1_only {
                spec["interfaces"] = json!(["eth1"]);
            }
            index.apply_advertisement(&mk_adv("lan", spec));
        }
        Op::RelistServices(keep) => {
            let list: Vec<_> = keep
                .iter()
                .filter_map(|svc| {
                    let (ips, local) = services[*svc].clone()?;
                    Some(service(*svc, &ips, local))
                })
                .collect();
            index.reset_services(&list);
            for (svc, held) in services.iter_mut().enumerate() {
                if !keep.contains(&svc) {
                    *held = None;
                }
            }
        }
        Op::Read => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_incremental_election_equals_the_election_from_scratch(
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut index = listed();
        let mut services = vec![None; SERVICES];
        prop_assert_eq!(index.answers(), index.answers_full());
        for (step, op) in ops.iter().enumerate() {
            apply(&mut index, op, &mut services);
            if matches!(op, Op::Read) || step + 1 == ops.len() {
                let full = index.answers_full();
                prop_assert_eq!(index.answers(), full, "after step {}: {:?}", step, op);
            }
        }
    }
}
