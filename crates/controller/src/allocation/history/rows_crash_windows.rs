//! Values a Service's object still names after a change that no longer uses them: held until
//! the write dropping them has landed, so that a crash in between never leaves two Services
//! naming one value (the lab proves these in `crash_windows.rs`).

use serde_json::json;

use super::Op::*;
use super::Want::*;
use super::{lb, run, svc, Row};

const ONE: &[&str] = &["198.18.0.10-198.18.0.10"];
const POOL: &[&str] = &["198.18.0.10-198.18.0.11"];

fn local_lb_with_health_check(port: u16) -> serde_json::Value {
    svc(
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
        "healthCheckNodePort": port, "ports": [{"port": 80}]}),
    )
}

#[test]
fn an_address_is_not_given_away_while_a_former_load_balancer_still_names_it() {
    run(Row {
        name: "an address is not given away while a former load balancer still names it",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Start,
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            ProviderDeleteFails(true),
            Patch(
                "a",
                json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
            ),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(HoldsLb("a", &["198.18.0.10"])),
            Expect(Entry("a", true)),
            Create("b", lb()),
            Settle,
            Expect(Allocated("b", "False")),
            Expect(Ingress("b", &[])),
            Expect(Ingress("a", &["198.18.0.10"])),
            // Once the clear lands, the address moves on.
            ProviderDeleteFails(false),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Ingress("a", &[])),
            Expect(Allocated("b", "True")),
            Expect(Entry("a", false)),
        ],
    });
}

#[test]
fn a_restart_while_a_former_load_balancer_s_clear_is_stuck_keeps_the_address_held() {
    run(Row {
        name: "a restart while a former load balancer's clear is stuck keeps the address held",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Start,
            Settle,
            ProviderDeleteFails(true),
            Patch(
                "a",
                json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
            ),
            Create("b", lb()),
            Settle,
            Expect(Allocated("b", "False")),
            Start,
            Settle,
            Expect(Ingress("b", &[])),
            Expect(HoldsLb("a", &["198.18.0.10"])),
            ProviderDeleteFails(false),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Ingress("a", &[])),
        ],
    });
}

#[test]
fn a_health_check_port_is_not_given_away_while_a_former_local_load_balancer_names_it() {
    run(Row {
        name: "a health check port is not given away while a former Local load balancer names it",
        ops: vec![
            Pool("p", POOL),
            Create("a", local_lb_with_health_check(30100)),
            Start,
            Settle,
            Expect(HealthCheck("a", Some(30100))),
            Expect(Allocated("a", "True")),
            Patch(
                "a",
                json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 81}]}}),
            ),
            Watch,
            Decide("a"),
            Expect(HoldsPort("a", 30100, true)),
            // Asking for the port while `a`'s spec still names it: refused.
            Create("b", local_lb_with_health_check(30100)),
            Watch,
            Decide("b"),
            Send("b"),
            Expect(Allocated("b", "False")),
            Expect(Message("b", "provided port is already allocated")),
            // Freed once dropped: `b` gets it.
            Send("a"),
            Settle,
            Expect(HealthCheck("a", None)),
            Expect(NodePortsSet("a")),
            Expect(Allocated("a", "True")),
            Expect(HoldsPort("a", 30100, false)),
            Expect(HealthCheck("b", Some(30100))),
            Expect(Allocated("b", "True")),
            // Back to a Local load balancer: a new port, no conflict, also after a crash.
            Patch(
                "a",
                json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            ),
            Settle,
            Expect(HealthCheckOtherThan("a", 30100)),
            Expect(Allocated("a", "True")),
            Start,
            Settle,
            Expect(Writes(0)),
            Expect(Allocated("a", "True")),
            Expect(Allocated("b", "True")),
            Expect(Exact("a")),
            Expect(Exact("b")),
        ],
    });
}

#[test]
fn a_clusterip_is_not_given_away_while_a_former_clusterip_service_names_it() {
    run(Row {
        name: "a ClusterIP is not given away while a former ClusterIP Service names it",
        ops: vec![
            Create(
                "a",
                svc(json!({"clusterIP": "10.96.0.50", "ports": [{"port": 80}]})),
            ),
            Start,
            Settle,
            Expect(Allocated("a", "True")),
            Patch(
                "a",
                json!({"spec": {"type": "ExternalName", "externalName": "example.invalid"}}),
            ),
            Watch,
            Decide("a"),
            Expect(HoldsClusterIps("a", &["10.96.0.50"])),
            Create(
                "b",
                svc(json!({"clusterIP": "10.96.0.50", "ports": [{"port": 80}]})),
            ),
            Watch,
            Decide("b"),
            Send("b"),
            Expect(Allocated("b", "False")),
            Send("a"),
            Settle,
            Expect(ClusterIp("a", None)),
            Expect(HoldsClusterIps("a", &[])),
            Expect(Allocated("b", "True")),
            Expect(HoldsClusterIps("b", &["10.96.0.50"])),
            // Back to ClusterIP: a new address, no conflict, also after a crash.
            Patch("a", json!({"spec": {"type": "ClusterIP"}})),
            Settle,
            Expect(ClusterIpOtherThan("a", "10.96.0.50")),
            Expect(Allocated("a", "True")),
            Start,
            Settle,
            Expect(Writes(0)),
            Expect(Exact("a")),
            Expect(Exact("b")),
        ],
    });
}

#[test]
fn node_ports_a_change_to_clusterip_drops_stay_held_until_the_drop_lands() {
    run(Row {
        name: "node ports a change to ClusterIP drops stay held until the drop lands",
        ops: vec![
            Create(
                "a",
                svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30200}]})),
            ),
            Start,
            Settle,
            Patch("a", json!({"spec": {"type": "ClusterIP"}})),
            Watch,
            Decide("a"),
            Expect(HoldsPort("a", 30200, true)),
            Expect(Entry("a", true)),
            Send("a"),
            Settle,
            Expect(NodePorts("a", &[None])),
            Expect(HoldsPort("a", 30200, false)),
            Expect(Entry("a", false)),
            Create(
                "b",
                svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30200}]})),
            ),
            Settle,
            Expect(Allocated("b", "True")),
            Expect(HoldsPort("b", 30200, true)),
        ],
    });
}

#[test]
fn after_a_restart_a_live_claim_goes_before_a_stale_one_whose_drop_never_landed() {
    run(Row {
        name: "after a restart a live claim goes before a stale one whose drop never landed",
        ops: vec![
            Create(
                "a",
                svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30200}]})),
            ),
            Start,
            Settle,
            Patch("a", json!({"spec": {"type": "ClusterIP"}})),
            Watch,
            Decide("a"),
            Drop("a"),
            Create(
                "b",
                svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30200}]})),
            ),
            Start,
            // Adopted after every live claim, as the stale claim is dropped anyway.
            Expect(HoldsPort("b", 30200, true)),
            Settle,
            Expect(NodePorts("a", &[None])),
            Expect(Allocated("b", "True")),
            Expect(HoldsPort("b", 30200, true)),
        ],
    });
}

#[test]
fn a_change_back_to_load_balancer_before_the_clear_lands_keeps_the_address() {
    run(Row {
        name: "a change back to LoadBalancer before the clear lands keeps the address",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Patch(
                "a",
                json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
            ),
            Watch,
            Decide("a"),
            Expect(HoldsLb("a", &["198.18.0.10"])),
            Patch(
                "a",
                json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            ),
            Create("b", lb()),
            Watch,
            // The clear is refused: the Service moved on.
            Send("a"),
            Settle,
            Expect(Ingress("a", &["198.18.0.10"])),
            Expect(Ingress("b", &["198.18.0.11"])),
            Expect(Exact("a")),
            Expect(Exact("b")),
            Expect(Entry("a", false)),
        ],
    });
}

#[test]
fn a_service_deleted_while_a_refused_write_s_values_are_held_frees_them() {
    run(Row {
        name: "a Service deleted while a refused write's values are held frees them",
        ops: vec![
            Pool("p", ONE),
            Create("a", lb()),
            Create("b", lb()),
            MaxInFlight(1),
            Start,
            Decide("a"),
            Patch("a", json!({"metadata": {"labels": {"team": "a"}}})),
            Send("a"),
            Expect(Entry("a", true)),
            Delete("a"),
            Watch,
            Expect(Entry("a", false)),
            Expect(HoldsLb("a", &[])),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Allocated("b", "True")),
        ],
    });
}
