//! Starting, restarting and deleting: what a new leader adopts before it assigns, which of
//! two claimants keeps a value, and what a crash between decisions and writes leaves (the
//! sequences behind the SIGKILL test: a restart is a new state machine listing the objects).

use serde_json::json;

use super::Fault::*;
use super::Op::*;
use super::Want::*;
use super::{complete_lb, ingress, lb, run, svc, Row};

const POOL: &[&str] = &["198.18.0.10-198.18.0.11"];
const ONE: &[&str] = &["198.18.0.10-198.18.0.10"];

fn with_status(mut object: serde_json::Value, status: serde_json::Value) -> serde_json::Value {
    object["status"] = status["status"].clone();
    object
}

fn cluster_ip(ip: &str) -> serde_json::Value {
    svc(json!({"clusterIP": ip, "clusterIPs": [ip], "ports": [{"port": 80}]}))
}

fn node_port(port: u16) -> serde_json::Value {
    svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": port}]}))
}

#[test]
fn adopt_then_assign_never_steals() {
    run(Row {
        name: "adopt then assign never steals",
        ops: vec![
            Pool("p", POOL),
            Create("b", lb()),
            // Written by an earlier leader; `b`, decided first, must not take its address.
            Create(
                "z",
                with_status(complete_lb("10.96.0.77", 30555), ingress("198.18.0.10")),
            ),
            Start,
            Settle,
            Expect(Ingress("z", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(ClusterIp("z", Some("10.96.0.77"))),
            Expect(Exact("z")),
            Expect(Exact("b")),
            Expect(Conflicts(0)),
        ],
    });
}

#[test]
fn the_older_service_keeps_a_conflicting_clusterip() {
    run(Row {
        name: "the older Service keeps a conflicting ClusterIP",
        ops: vec![
            Create("a", cluster_ip("10.96.0.5")),
            Create("b", cluster_ip("10.96.0.5")),
            Start,
            Settle,
            Expect(Allocated("a", "True")),
            Expect(Allocated("b", "False")),
            Expect(Message("b", "provided IP is already allocated")),
            // Its spec is left as it is.
            Expect(ClusterIp("b", Some("10.96.0.5"))),
            Expect(HoldsClusterIps("a", &["10.96.0.5"])),
            Expect(HoldsClusterIps("b", &[])),
            Expect(Conflicts(2)),
        ],
    });
}

#[test]
fn the_older_service_keeps_a_conflicting_node_port() {
    run(Row {
        name: "the older Service keeps a conflicting node port",
        ops: vec![
            Create("a", node_port(30100)),
            Create("b", node_port(30100)),
            Start,
            Settle,
            Expect(Allocated("a", "True")),
            Expect(Allocated("b", "False")),
            Expect(Message("b", "provided port is already allocated")),
            Expect(NodePorts("b", &[Some(30100)])),
            Expect(HoldsPort("a", 30100, true)),
            Expect(Conflicts(2)),
        ],
    });
}

#[test]
fn a_restart_writes_nothing_for_services_already_allocated() {
    run(Row {
        name: "a restart writes nothing for Services already allocated",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create("b", node_port(30100)),
            Create("c", svc(json!({"ports": [{"port": 80}]}))),
            Start,
            Settle,
            Start,
            Settle,
            Expect(Writes(0)),
            Expect(Exact("a")),
            Expect(Exact("b")),
            Expect(Exact("c")),
            Expect(Conflicts(0)),
        ],
    });
}

#[test]
fn a_crash_between_the_spec_and_the_status_write_the_next_leader_adopts_the_spec() {
    run(Row {
        name: "a crash between the spec and the status write: the next leader adopts the spec",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Decide("a"),
            Fail(Pass),
            Fail(NotLeading),
            Send("a"),
            Start,
            Settle,
            // Only the status is left to write.
            Expect(Writes(1)),
            Expect(Allocated("a", "True")),
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Exact("a")),
        ],
    });
}

#[test]
fn a_crash_after_deciding_before_any_write_the_next_leader_decides_afresh() {
    run(Row {
        name: "a crash after deciding, before any write: the next leader decides afresh",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create("b", lb()),
            Start,
            Decide("a"),
            Drop("a"),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(Exact("a")),
            Expect(Exact("b")),
        ],
    });
}

#[test]
fn a_killed_leader_s_write_landing_after_the_next_leader_listed_is_held_on_sight() {
    run(Row {
        name: "a killed leader's write landing after the next leader listed is held on sight",
        ops: vec![
            Pool("p", POOL),
            Create("a", complete_lb("10.96.0.77", 30555)),
            Create("b", lb()),
            Start,
            PatchStatus("a", ingress("198.18.0.10")),
            Watch,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(Exact("a")),
            Expect(Exact("b")),
        ],
    });
}

#[test]
fn a_delete_releases_at_once() {
    run(Row {
        name: "a delete releases at once",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Start,
            Settle,
            Remove("a"),
            Create("b", lb()),
            Watch,
            Expect(HoldsLb("a", &[])),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Allocated("b", "True")),
        ],
    });
}

#[test]
fn a_service_waiting_for_space_gets_it_when_a_delete_frees_it() {
    run(Row {
        name: "a Service waiting for space gets it when a delete frees it",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Create("b", lb()),
            Start,
            Settle,
            Expect(Allocated("b", "False")),
            Expect(Entry("b", true)),
            Delete("a"),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Allocated("b", "True")),
            Expect(Entry("b", false)),
        ],
    });
}

#[test]
fn a_release_removes_the_service_s_one_entry() {
    run(Row {
        name: "a release removes the Service's one entry",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Create("b", lb()),
            Start,
            Settle,
            Expect(Entry("b", true)),
            Remove("b"),
            Watch,
            Expect(Entry("b", false)),
            Expect(HoldsClusterIps("b", &[])),
        ],
    });
}

#[test]
fn a_service_recreated_under_the_same_name_starts_from_nothing() {
    run(Row {
        name: "a Service recreated under the same name starts from nothing",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Recreate("a", svc(json!({"ports": [{"port": 80}]}))),
            Create("b", lb()),
            Watch,
            Expect(HoldsLb("a", &[])),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Exact("a")),
            Expect(Allocated("a", "True")),
        ],
    });
}

#[test]
fn a_relist_after_a_broken_watch_releases_what_was_deleted_meanwhile() {
    run(Row {
        name: "a relist after a broken watch releases what was deleted meanwhile",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Start,
            Settle,
            Remove("a"),
            Create("b", lb()),
            Relist,
            Expect(HoldsLb("a", &[])),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
        ],
    });
}
