//! Writes that land late or are refused: a killed leader's write landing after its
//! replacement decided from the older version (the lab proves these in `late_writes.rs`),
//! and this leader's own writes refused, retried or cut short.

use serde_json::json;

use super::Fault::*;
use super::Op::*;
use super::Want::*;
use super::{complete_lb, ingress, lb, local_lb, run, svc, Row};

const POOL: &[&str] = &["198.18.0.10-198.18.0.11"];

#[test]
fn values_a_refused_spec_write_gave_are_released_so_the_landed_ones_are_adopted() {
    run(Row {
        name: "values a refused spec write gave are released, so the landed ones are adopted",
        ops: vec![
            Pool("p", POOL),
            Create("s", local_lb()),
            Start,
            Decide("s"),
            // The killed leader's spec write lands first.
            Patch(
                "s",
                json!({"spec": {
                "clusterIP": "10.96.0.77", "clusterIPs": ["10.96.0.77"],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80, "nodePort": 30555}],
                "healthCheckNodePort": 30556}}),
            ),
            Send("s"),
            Settle,
            Expect(Allocated("s", "True")),
            Expect(ClusterIp("s", Some("10.96.0.77"))),
            Expect(NodePorts("s", &[Some(30555)])),
            Expect(HealthCheck("s", Some(30556))),
            Expect(Ingress("s", &["198.18.0.10"])),
            Expect(Exact("s")),
            Expect(Conflicts(0)),
            Expect(Entry("s", false)),
            // A real change of a set ClusterIP is still refused, in the apiserver's words.
            Patch(
                "s",
                json!({"spec": {"clusterIP": "10.96.0.78", "clusterIPs": ["10.96.0.78"]}}),
            ),
            Settle,
            Expect(Allocated("s", "False")),
            Expect(Message("s", "a cluster IP may not change once set")),
        ],
    });
}

#[test]
fn an_address_a_refused_status_write_gave_is_released_so_the_landed_one_is_kept() {
    run(Row {
        name: "an address a refused status write gave is released, so the landed one is kept",
        ops: vec![
            Pool("p", POOL),
            Create("s", complete_lb("10.96.0.77", 30555)),
            Start,
            Decide("s"),
            PatchStatus("s", ingress("198.18.0.11")),
            Send("s"),
            Settle,
            Expect(Allocated("s", "True")),
            Expect(Ingress("s", &["198.18.0.11"])),
            Expect(HoldsLb("s", &["198.18.0.11"])),
            // The other address is free: a second Service gets it.
            Create("t", lb()),
            Settle,
            Expect(Ingress("t", &["198.18.0.10"])),
            Expect(Ingress("s", &["198.18.0.11"])),
        ],
    });
}

#[test]
fn an_address_a_refused_status_write_gave_is_not_handed_out_while_the_landed_write_names_it() {
    run(Row {
        name: "an address a refused status write gave is not handed out while the landed write names it",
        ops: vec![
            MaxInFlight(1),
            Pool("p", POOL),
            Create("s", complete_lb("10.96.0.77", 30555)),
            Start,
            Decide("s"),
            // `t` is seen, and waits for the one write slot `s` holds.
            Create("t", complete_lb("10.96.0.78", 30556)),
            Watch,
            DecideNothing,
            PatchStatus("s", ingress("198.18.0.10")),
            Watch,
            Send("s"),
            // Decided right after the refusal, before `s` is decided again.
            Decide("t"),
            Send("t"),
            Settle,
            Expect(Ingress("t", &["198.18.0.11"])),
            Expect(Ingress("s", &["198.18.0.10"])),
            Expect(Allocated("s", "True")),
            Expect(Exact("s")),
            Expect(Exact("t")),
        ],
    });
}

#[test]
fn the_same_when_the_refusal_comes_before_the_watch_shows_the_landed_write() {
    run(Row {
        name: "the same when the refusal comes before the watch shows the landed write",
        ops: vec![
            MaxInFlight(1),
            Pool("p", POOL),
            Create("s", complete_lb("10.96.0.77", 30555)),
            Start,
            Decide("s"),
            Create("t", complete_lb("10.96.0.78", 30556)),
            Watch,
            PatchStatus("s", ingress("198.18.0.10")),
            Send("s"),
            Expect(HoldsLb("s", &["198.18.0.10"])),
            Expect(Entry("s", true)),
            Decide("t"),
            Send("t"),
            Settle,
            Expect(Ingress("t", &["198.18.0.11"])),
            Expect(Ingress("s", &["198.18.0.10"])),
            Expect(Exact("s")),
            Expect(Entry("s", false)),
        ],
    });
}

#[test]
fn an_address_a_refused_write_would_have_named_gives_way_to_a_service_naming_it() {
    run(Row {
        name: "an address a refused write would have named gives way to a Service naming it",
        ops: vec![
            MaxInFlight(1),
            Pool("p", POOL),
            Create("a", complete_lb("10.96.0.77", 30555)),
            Create("b", complete_lb("10.96.0.78", 30556)),
            Start,
            Decide("a"),
            // The killed leader gave the two addresses in the other order.
            PatchStatus("a", ingress("198.18.0.11")),
            PatchStatus("b", ingress("198.18.0.10")),
            Watch,
            Send("a"),
            Settle,
            Expect(Ingress("a", &["198.18.0.11"])),
            Expect(Ingress("b", &["198.18.0.10"])),
            Expect(Allocated("a", "True")),
            Expect(Allocated("b", "True")),
            Expect(Exact("a")),
            Expect(Exact("b")),
        ],
    });
}

#[test]
fn an_address_a_late_write_names_is_held_before_its_service_is_decided() {
    run(Row {
        name: "an address a late write names is held before its Service is decided",
        ops: vec![
            MaxInFlight(1),
            Pool("p", POOL),
            Create("a", svc(json!({"ports": [{"port": 80}]}))),
            Create("c", complete_lb("10.96.0.78", 30556)),
            Create("z", complete_lb("10.96.0.79", 30557)),
            Start,
            Decide("a"),
            PatchStatus("z", ingress("198.18.0.10")),
            Watch,
            Expect(HoldsLb("z", &["198.18.0.10"])),
            Send("a"),
            Settle,
            Expect(Ingress("c", &["198.18.0.11"])),
            Expect(Ingress("z", &["198.18.0.10"])),
            Expect(Allocated("z", "True")),
        ],
    });
}

#[test]
fn a_term_that_ends_lets_its_writes_land_before_the_next_term_lists() {
    run(Row {
        name: "a term that ends lets its writes land before the next term lists",
        ops: vec![
            MaxInFlight(1),
            Pool("p", POOL),
            Create("s", complete_lb("10.96.0.77", 30555)),
            Start,
            Decide("s"),
            Create("a-t", complete_lb("10.96.0.78", 30556)),
            Watch,
            // The term ends with the write on its way; it lands before the next term lists.
            Send("s"),
            Start,
            Settle,
            Expect(Ingress("a-t", &["198.18.0.11"])),
            Expect(Ingress("s", &["198.18.0.10"])),
        ],
    });
}

#[test]
fn a_retry_from_the_version_a_refused_write_carried_keeps_its_values_held() {
    run(Row {
        name: "a retry from the version a refused write carried keeps its values held",
        ops: vec![
            Pool("p", POOL),
            Create("s", lb()),
            Start,
            Decide("s"),
            // Someone else's change that names no value: the write is refused.
            Patch("s", json!({"metadata": {"labels": {"team": "a"}}})),
            Send("s"),
            Expect(Entry("s", true)),
            // Retried before the watch brought the newer version: nothing new is known.
            Due,
            Decide("s"),
            Send("s"),
            Settle,
            Expect(Allocated("s", "True")),
            Expect(Ingress("s", &["198.18.0.10"])),
            Expect(Exact("s")),
            Expect(Entry("s", false)),
            Expect(Conflicts(0)),
        ],
    });
}

#[test]
fn a_status_write_refused_after_the_spec_write_landed_is_retried_from_the_written_spec() {
    run(Row {
        name: "a status write refused after the spec write landed is retried from the written spec",
        ops: vec![
            Pool("p", POOL),
            Create("s", lb()),
            Start,
            Decide("s"),
            Fail(Pass),
            Fail(Conflict),
            Send("s"),
            Expect(Writes(1)),
            // The watch has not shown the spec write: the retry decides from its answer,
            // so the values it wrote are neither assigned again nor freed.
            Due,
            Decide("s"),
            Send("s"),
            Expect(Writes(2)),
            Settle,
            Expect(Writes(2)),
            Expect(Allocated("s", "True")),
            Expect(Ingress("s", &["198.18.0.10"])),
            Expect(Exact("s")),
        ],
    });
}

#[test]
fn a_write_failing_with_a_server_error_is_retried_and_lands() {
    run(Row {
        name: "a write failing with a server error is retried and lands",
        ops: vec![
            Pool("p", POOL),
            Create("s", lb()),
            Start,
            Fail(Server),
            Fail(Server),
            Settle,
            Expect(Allocated("s", "True")),
            Expect(Ingress("s", &["198.18.0.10"])),
            Expect(Exact("s")),
        ],
    });
}

#[test]
fn a_write_cut_short_by_a_leadership_gap_is_decided_again() {
    run(Row {
        name: "a write cut short by a leadership gap is decided again",
        ops: vec![
            Pool("p", POOL),
            Create("s", lb()),
            Start,
            Fail(NotLeading),
            Settle,
            Expect(Allocated("s", "True")),
            Expect(Exact("s")),
        ],
    });
}

#[test]
fn the_echoes_of_berth_s_own_writes_decide_nothing() {
    run(Row {
        name: "the echoes of berth's own writes decide nothing",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Create(
                "b",
                svc(json!({"type": "NodePort", "ports": [{"port": 80}]})),
            ),
            Start,
            Settle,
            // One spec and one status write each.
            Expect(Writes(4)),
            Watch,
            DecideNothing,
            Settle,
            Expect(Writes(4)),
        ],
    });
}

#[test]
fn a_service_deleted_while_its_write_is_in_flight_is_released_at_once() {
    run(Row {
        name: "a Service deleted while its write is in flight is released at once",
        ops: vec![
            Pool("p", &["198.18.0.10-198.18.0.10"]),
            Create("a", lb()),
            Start,
            Decide("a"),
            Delete("a"),
            Watch,
            Expect(HoldsLb("a", &[])),
            Expect(Entry("a", false)),
            Create("b", lb()),
            Watch,
            Decide("b"),
            Send("a"),
            Send("b"),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
        ],
    });
}
