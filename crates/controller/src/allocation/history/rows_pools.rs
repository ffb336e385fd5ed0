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
fn a_pool_deleted_and_re_created_changes_nothing_a_client_sees() {
    run(Row {
        name: "a pool deleted and re-created changes nothing a client sees",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create("b", lb()),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            DeletePool("p"),
            Settle,
            // Kept, marked, and named by the Event and the condition.
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(HoldsLb("a", &["198.18.0.10"])),
            Expect(Allocated("a", "False")),
            Expect(Message("a", "IPPool \"p\" no longer contains 198.18.0.10")),
            Expect(Message("a", "until the Service changes")),
            Expect(Warning("a", "PoolGone", "IPPool \"p\"")),
            Expect(KeptAddresses(2)),
            // Nobody else is given a kept address, even once a pool has it again.
            Create("c", lb()),
            Settle,
            Expect(Ingress("c", &[])),
            Pool("p", &["198.18.0.10-198.18.0.12"]),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(Ingress("c", &["198.18.0.12"])),
            Expect(Allocated("a", "True")),
            Expect(Allocated("b", "True")),
            Expect(Exact("a")),
            Expect(KeptAddresses(0)),
            Expect(Entry("a", false)),
            Expect(CountsTrue),
        ],
    });
}

#[test]
fn a_service_that_changes_while_it_keeps_an_address_is_decided_again() {
    run(Row {
        name: "a Service that changes while it keeps an address is decided again",
        ops: vec![
            Pool("p", POOL),
            Pool("q", &["198.18.0.20-198.18.0.20"]),
            Create(
                "a",
                json!({"metadata": {"annotations": {"berth.dev/ip-pool": "p"}},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            ),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            DeletePool("p"),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            // A label change is no change of what it asks for.
            Patch("a", json!({"metadata": {"labels": {"app": "x"}}})),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Patch(
                "a",
                json!({"metadata": {"annotations": {"berth.dev/ip-pool": "q"}}}),
            ),
            Settle,
            Expect(Ingress("a", &["198.18.0.20"])),
            Expect(Allocated("a", "True")),
            Expect(HoldsLb("a", &["198.18.0.20"])),
            Expect(KeptAddresses(0)),
            Expect(CountsTrue),
        ],
    });
}

#[test]
fn an_address_that_leaves_every_pool_is_kept_and_comes_back_when_the_pool_widens() {
    run(Row {
        name: "an address that leaves every pool is kept, and counted when the pool widens",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create("b", lb()),
            Start,
            Settle,
            // Narrowed: b's address leaves the pool, a's stays.
            Pool("p", ONE),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(Allocated("a", "True")),
            Expect(Allocated("b", "False")),
            Expect(KeptAddresses(1)),
            Expect(CountsTrue),
            Pool("p", &["198.18.0.10-198.18.0.12"]),
            Settle,
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(Allocated("b", "True")),
            Expect(CountsTrue),
        ],
    });
}

#[test]
fn after_its_grace_a_service_gets_an_address_from_the_pools_as_they_are() {
    run(Row {
        name: "after its grace a Service gets an address from the pools as they are",
        ops: vec![
            Grace(Some(60)),
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Pool("p", &["198.18.0.20-198.18.0.21"]),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Message("a", "keeps it until 2023-11-14T22:14:20")),
            Wait(59),
            DecideNothing,
            Wait(1),
            Settle,
            Expect(Ingress("a", &["198.18.0.20"])),
            Expect(Allocated("a", "True")),
            Expect(Exact("a")),
            Expect(CountsTrue),
        ],
    });
}

#[test]
fn a_grace_of_nothing_replaces_an_address_at_once_or_clears_it() {
    run(Row {
        name: "a grace of nothing replaces an address at once, or clears it",
        ops: vec![
            Grace(Some(0)),
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Pool("p", &["198.18.0.20-198.18.0.21"]),
            Settle,
            Expect(Ingress("a", &["198.18.0.20"])),
            Expect(Exact("a")),
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
fn a_new_leader_keeps_an_address_whose_pool_went_away() {
    run(Row {
        name: "a new leader keeps an address whose pool went away",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            DeletePool("p"),
            Settle,
            Start,
            Create("b", lb()),
            Pool("q", &["198.18.0.10-198.18.0.10"]),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &[])),
            Expect(Allocated("a", "True")),
            Expect(Conflicts(0)),
            // Restarted before it saw the pool go: the same.
            DeletePool("q"),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Message("a", "198.18.0.10 is in no IPPool any more")),
            Expect(KeptAddresses(1)),
        ],
    });
}

#[test]
fn a_service_naming_a_pool_that_does_not_exist_keeps_its_address_for_a_while() {
    run(Row {
        name: "a Service naming a pool that does not exist keeps its address for a while",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create("b", lb()),
            Start,
            Settle,
            Patch(
                "a",
                json!({"metadata": {"annotations": {"berth.dev/ip-pool": "q"}}}),
            ),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Allocated("a", "False")),
            Expect(Message(
                "a",
                "IPPool \"q\" not found; the Service keeps 198.18.0.10 until",
            )),
            Expect(Warning("a", "AllocationFailed", "IPPool \"q\" not found")),
            // The pool appears: the Service moves into it, its old address is free.
            Pool("q", &["198.18.0.20-198.18.0.20"]),
            Settle,
            Expect(Ingress("a", &["198.18.0.20"])),
            Expect(Allocated("a", "True")),
            Create("c", lb()),
            Settle,
            Expect(Ingress("c", &["198.18.0.10"])),
            // Named wrongly for good: let go after the grace, so it blocks nobody for ever.
            Patch(
                "b",
                json!({"metadata": {"annotations": {"berth.dev/ip-pool": "typo"}}}),
            ),
            Settle,
            Expect(Ingress("b", &["198.18.0.11"])),
            Wait(300),
            Settle,
            Expect(Ingress("b", &[])),
            Expect(Allocated("b", "False")),
            Expect(HoldsLb("b", &[])),
            Expect(CountsTrue),
        ],
    });
}

#[test]
fn a_status_clearing_write_is_not_undone_by_a_decision_from_before_its_echo() {
    // The stranded Service: its pool deleted (with no grace, so it loses its address), its
    // status cleared, then the pool re-created — seen on the IPPool watch before the Service
    // watch brought the clearing write back. Decided then, it read its status as before the
    // clear: took the address it named back, found nothing to write, and the echo was its
    // own. No address, Allocated=False, never decided again; the pool counted the address.
    run(Row {
        name: "a status-clearing write is not undone by a decision from before its echo",
        ops: vec![
            Grace(Some(0)),
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            DeletePool("p"),
            WatchPools,
            Decide("a"),
            Send("a"),
            Expect(Ingress("a", &[])),
            Expect(Message("a", "no available IPs for IPv4 IPFamily")),
            Pool("p", POOL),
            WatchPools,
            DecideNothing,
            Watch,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Allocated("a", "True")),
            Expect(Exact("a")),
            Expect(CountsTrue),
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
            // No status from berth, conditions included.
            Expect(Allocated("a", "")),
            Expect(Writes(1)),
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

#[test]
fn the_periodic_resync_decides_every_service_lacking_an_address_it_should_have() {
    run(Row {
        name: "the periodic resync decides every Service lacking an address it should have",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Create("b", lb()),
            Create(
                "c",
                svc(json!({"type": "ClusterIP", "ports": [{"port": 80}]})),
            ),
            Create(
                "d",
                svc(
                    json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/other",
                    "ports": [{"port": 80}]}),
                ),
            ),
            Start,
            Settle,
            Expect(Ingress("b", &[])),
            Expect(Writes(7)),
            Resync,
            Expect(Marked("a", false)),
            Expect(Marked("b", true)),
            Expect(Marked("c", false)),
            // A class berth does not serve is decided too, and finds nothing to write.
            Expect(Marked("d", true)),
            Settle,
            Expect(Writes(7)),
        ],
    });
}
