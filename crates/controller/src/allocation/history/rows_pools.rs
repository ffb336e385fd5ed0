//! LoadBalancer addresses and the pools they come from: choice, exhaustion, pools deleted and
//! re-created, namespaces selected by label, sharing keys, classes berth does not serve.

use serde_json::json;

use super::Op::*;
use super::Want::*;
use super::{lb, run, svc, Row};

const POOL: &[&str] = &["198.18.0.10-198.18.0.11"];
const ONE: &[&str] = &["198.18.0.10-198.18.0.10"];

fn shared(key: &str, port: u16) -> serde_json::Value {
    json!({"metadata": {"annotations": {"berth.dev/sharing-key": key}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": port}]}})
}

#[test]
fn the_lowest_free_address_first_and_a_failure_when_the_pool_is_full() {
    run(Row {
        name: "the lowest free address first, and a failure when the pool is full",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create("b", lb()),
            Create("c", lb()),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(Ingress("c", &[])),
            Expect(Allocated("c", "False")),
            Expect(Entry("c", true)),
            // It keeps its ClusterIP and node port all the same.
            Expect(Exact("c")),
        ],
    });
}

#[test]
fn a_failure_wakes_when_a_change_of_type_frees_an_address() {
    run(Row {
        name: "a failure wakes when a change of type frees an address",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create("b", lb()),
            Create("c", lb()),
            Start,
            Settle,
            Patch(
                "a",
                json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
            ),
            Settle,
            Expect(Ingress("a", &[])),
            Expect(Ingress("c", &["198.18.0.10"])),
            Expect(Allocated("c", "True")),
            Expect(NodePorts("a", &[None])),
        ],
    });
}

#[test]
fn a_pool_deleted_takes_its_addresses_re_created_they_come_back() {
    run(Row {
        name: "a pool deleted takes its addresses; re-created, they come back",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            DeletePool("p"),
            Settle,
            Expect(Ingress("a", &[])),
            Expect(Allocated("a", "False")),
            Expect(HoldsLb("a", &[])),
            Pool("p", POOL),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Allocated("a", "True")),
        ],
    });
}

#[test]
fn an_address_that_leaves_every_pool_is_replaced_from_the_pools_as_they_are() {
    run(Row {
        name: "an address that leaves every pool is replaced from the pools as they are",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Pool("p", &["198.18.0.20-198.18.0.21"]),
            Settle,
            Expect(Ingress("a", &["198.18.0.20"])),
            Expect(Exact("a")),
        ],
    });
}

#[test]
fn a_pool_that_selects_namespaces_by_label_serves_a_service_once_its_namespace_matches() {
    run(Row {
        name: "a pool that selects namespaces by label serves a Service once its namespace matches",
        ops: vec![
            PoolSpec(
                "p",
                json!({"addresses": POOL,
                "serviceAllocation": {"namespaceSelector": {"matchLabels": {"team": "a"}}}}),
            ),
            Namespace("default", json!({})),
            Create("a", lb()),
            Start,
            Settle,
            Expect(Allocated("a", "False")),
            Namespace("default", json!({"team": "a"})),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Allocated("a", "True")),
        ],
    });
}

#[test]
fn a_requested_address_is_given_when_a_pool_holds_it() {
    run(Row {
        name: "a requested address is given when a pool holds it",
        ops: vec![
            Pool("p", POOL),
            Create(
                "a",
                json!({"metadata": {"annotations": {"berth.dev/load-balancer-ips": "198.18.0.11"}},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            ),
            Create("b", lb()),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.11"])),
            Expect(Ingress("b", &["198.18.0.10"])),
        ],
    });
}

#[test]
fn services_of_one_sharing_key_with_distinct_ports_share_an_address() {
    run(Row {
        name: "Services of one sharing key with distinct ports share an address",
        ops: vec![
            Pool("p", ONE),
            Create("a", shared("k", 80)),
            Create("b", shared("k", 81)),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Allocated("b", "True")),
            // The address stays with the other when one goes.
            Delete("a"),
            Create("c", lb()),
            Settle,
            Expect(HoldsLb("b", &["198.18.0.10"])),
            Expect(Allocated("c", "False")),
            Delete("b"),
            Settle,
            Expect(Ingress("c", &["198.18.0.10"])),
        ],
    });
}

#[test]
fn services_of_one_sharing_key_with_one_port_do_not_share() {
    run(Row {
        name: "Services of one sharing key with one port do not share",
        ops: vec![
            Pool("p", ONE),
            Create("a", shared("k", 80)),
            Create("b", shared("k", 80)),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &[])),
            Expect(Allocated("b", "False")),
        ],
    });
}

#[test]
fn a_class_berth_does_not_serve_gets_a_clusterip_and_node_ports_no_address() {
    run(Row {
        name: "a class berth does not serve gets a ClusterIP and node ports, no address",
        ops: vec![
            Pool("p", POOL),
            Create(
                "a",
                svc(
                    json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/other",
                "ports": [{"port": 80}]}),
                ),
            ),
            Start,
            Settle,
            Expect(Ingress("a", &[])),
            Expect(HoldsLb("a", &[])),
            Expect(NodePortsSet("a")),
            Expect(Exact("a")),
        ],
    });
}

#[test]
fn an_externalname_service_gets_nothing_and_nothing_is_written() {
    run(Row {
        name: "an ExternalName Service gets nothing and nothing is written",
        ops: vec![
            Pool("p", POOL),
            Create(
                "a",
                svc(json!({"type": "ExternalName", "externalName": "example.invalid"})),
            ),
            Start,
            Settle,
            Expect(Writes(0)),
            Expect(ClusterIp("a", None)),
            Expect(Exact("a")),
        ],
    });
}
