//! Every reason a Service is refused gets both the `berth.dev/Allocated=False` condition and a
//! Warning Event naming the same problem: one row per reason.

use serde_json::{json, Value};

use super::Op::*;
use super::Want::*;
use super::{lb, run, svc, Row};

const POOL: &[&str] = &["198.18.0.10-198.18.0.11"];

fn requesting(ip: &str) -> Value {
    svc(json!({"type": "LoadBalancer", "loadBalancerIP": ip, "ports": [{"port": 80}]}))
}

fn annotated(key: &str, value: &str, port: u16) -> Value {
    json!({"metadata": {"annotations": {key: value}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": port}]}})
}

/// `setup` then the refused Service "x" created last: its condition says `reason` and its
/// Event carries `text`.
fn refused(
    name: &'static str,
    setup: Vec<super::Op>,
    x: Value,
    reason: &'static str,
    text: &'static str,
) {
    let mut ops = setup;
    ops.extend([
        Start,
        Settle,
        Create("x", x),
        Settle,
        Expect(Allocated("x", "False")),
        Expect(Reason("x", reason)),
        Expect(Message("x", text)),
        Expect(Warning("x", "AllocationFailed", text)),
    ]);
    run(Row { name, ops });
}

#[test]
fn an_address_already_held() {
    refused(
        "an address already held",
        vec![Create(
            "a",
            svc(json!({"type": "ClusterIP", "clusterIP": "10.96.0.50", "ports": [{"port": 80}]})),
        )],
        svc(json!({"type": "ClusterIP", "clusterIP": "10.96.0.50", "ports": [{"port": 80}]})),
        "IPAlreadyAllocated",
        "provided IP is already allocated",
    );
}

#[test]
fn a_node_port_already_held() {
    refused(
        "a node port already held",
        vec![
            Pool("p", POOL),
            Create(
                "a",
                svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]})),
            ),
        ],
        svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]})),
        "PortAlreadyAllocated",
        "provided port is already allocated",
    );
}

#[test]
fn a_requested_address_outside_every_pool() {
    refused(
        "a requested address outside every pool",
        vec![Pool("p", POOL)],
        requesting("198.18.5.5"),
        "NotInAnyPool",
        "198.18.5.5",
    );
}

#[test]
fn a_requested_address_outside_every_pool_by_annotation() {
    refused(
        "a requested address outside every pool, by annotation",
        vec![Pool("p", POOL)],
        annotated("berth.dev/load-balancer-ips", "198.18.5.5", 80),
        "NotInAnyPool",
        "198.18.5.5",
    );
}

#[test]
fn a_pool_that_does_not_exist() {
    refused(
        "a pool that does not exist",
        vec![Pool("p", POOL)],
        annotated("berth.dev/ip-pool", "nope", 80),
        "PoolNotFound",
        "nope",
    );
}

#[test]
fn a_pool_that_does_not_admit_the_service() {
    refused(
        "a pool that does not admit the Service",
        vec![PoolSpec(
            "p",
            json!({"addresses": POOL, "serviceAllocation": {"namespaces": ["other"]}}),
        )],
        annotated("berth.dev/ip-pool", "p", 80),
        "PoolNotAdmitting",
        "p",
    );
}

#[test]
fn no_pool_at_all() {
    refused("no pool at all", vec![], lb(), "NoAvailablePool", "");
}

#[test]
fn a_full_pool() {
    refused(
        "a full pool",
        vec![Pool("p", POOL), Create("a", lb()), Create("b", lb())],
        lb(),
        "NoAvailablePool",
        "",
    );
}

#[test]
fn a_full_pool_by_name() {
    refused(
        "a full pool, by name",
        vec![Pool("p", POOL), Create("a", lb()), Create("b", lb())],
        annotated("berth.dev/ip-pool", "p", 80),
        "RangeFull",
        "p",
    );
}

#[test]
fn two_services_asking_for_one_address_without_a_sharing_key() {
    refused(
        "two Services asking for one address without a sharing key",
        vec![Pool("p", POOL), Create("a", requesting("198.18.0.10"))],
        requesting("198.18.0.10"),
        "SharingConflict",
        "198.18.0.10",
    );
}

#[test]
fn an_invalid_request() {
    refused(
        "an invalid request",
        vec![Pool("p", POOL)],
        svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 40000}]})),
        "InvalidRequest",
        "40000",
    );
}

#[test]
fn a_sharing_conflict() {
    refused(
        "a sharing conflict",
        vec![
            Pool("p", &["198.18.0.10-198.18.0.10"]),
            Create("a", annotated("berth.dev/sharing-key", "k", 80)),
        ],
        json!({"metadata": {"annotations": {"berth.dev/sharing-key": "k", "berth.dev/load-balancer-ips": "198.18.0.10"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
        "SharingConflict",
        "198.18.0.10",
    );
}

#[test]
fn a_service_holding_an_address_asks_for_one_outside_every_pool() {
    run(Row {
        name: "a Service holding an address asks for one outside every pool",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Patch("a", json!({"spec": {"loadBalancerIP": "198.18.5.5"}})),
            Settle,
            Expect(Allocated("a", "False")),
            Expect(Reason("a", "NotInAnyPool")),
            Expect(Warning("a", "AllocationFailed", "198.18.5.5")),
        ],
    });
}

#[test]
fn a_kept_address_then_a_request_outside_every_pool() {
    run(Row {
        name: "a kept address, then a request outside every pool",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            DeletePool("p"),
            Settle,
            Expect(Warning("a", "PoolGone", "")),
            Patch("a", json!({"spec": {"loadBalancerIP": "198.18.5.5"}})),
            Settle,
            Expect(Allocated("a", "False")),
            Expect(Reason("a", "NotInAnyPool")),
            Expect(Warning("a", "AllocationFailed", "198.18.5.5")),
        ],
    });
}

#[test]
fn a_pool_name_of_60_kib_is_bounded_in_the_condition() {
    let name: &'static str = Box::leak("p".repeat(60 * 1024).into_boxed_str());
    run(Row {
        name: "a pool name of 60 KiB is bounded in the condition",
        ops: vec![
            Pool("p", POOL),
            Start,
            Settle,
            Create("x", annotated("berth.dev/ip-pool", name, 80)),
            Settle,
            Expect(Reason("x", "PoolNotFound")),
            Expect(MessageBounded("x", berth_api::MAX_CONDITION_MESSAGE)),
        ],
    });
}
