//! The load-balancer cleanup finalizer (`service.kubernetes.io/load-balancer-cleanup`) on `l2`
//! Services, as upstream's e2e test checks it: present once the Service is served, removed only
//! after the address is released and the status cleared, on deletion and on a type change.

use serde_json::json;

use super::Op::*;
use super::Want::*;
use super::{lb, run, svc, Row};

const POOL: &[&str] = &["198.18.0.10-198.18.0.11"];
const CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";

#[test]
fn a_served_load_balancer_gets_the_cleanup_finalizer_in_its_first_write() {
    run(Row {
        name: "a served LoadBalancer gets the cleanup finalizer in its first write",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Expect(Finalizers("a", &[CLEANUP])),
            Expect(Ingress("a", &["198.18.0.10"])),
            // The spec write carried it: a spec write, then the status write.
            Expect(Writes(2)),
        ],
    });
}

#[test]
fn a_deleted_load_balancer_goes_once_its_address_is_released_and_its_status_cleared() {
    run(Row {
        name: "a deleted LoadBalancer goes once its address is released and its status cleared",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Delete("a"),
            // Held by the finalizer, the Service is decided: its status is cleared first.
            Watch,
            Decide("a"),
            Send("a"),
            Expect(Exists("a", true)),
            Expect(Ingress("a", &[])),
            Expect(Finalizers("a", &[CLEANUP])),
            Settle,
            Expect(Exists("a", false)),
            // The address is free for the next Service.
            Create("b", lb()),
            Settle,
            Expect(Ingress("b", &["198.18.0.10"])),
        ],
    });
}

#[test]
fn a_change_of_type_removes_the_finalizer_after_the_status_is_cleared() {
    run(Row {
        name: "a change of type removes the finalizer after the status is cleared",
        ops: vec![
            Pool("p", POOL),
            Create("a", lb()),
            Start,
            Settle,
            Patch("a", json!({"spec": {"type": "ClusterIP"}})),
            Settle,
            Expect(Ingress("a", &[])),
            Expect(Finalizers("a", &[])),
            Expect(Exists("a", true)),
            // And back: the finalizer comes back with the address.
            Patch("a", json!({"spec": {"type": "LoadBalancer"}})),
            Settle,
            Expect(Finalizers("a", &[CLEANUP])),
            Expect(Ingress("a", &["198.18.0.10"])),
        ],
    });
}

#[test]
fn a_class_berth_does_not_serve_gets_no_finalizer_and_keeps_its_own() {
    run(Row {
        name: "a class berth does not serve gets no finalizer and keeps its own",
        ops: vec![
            Pool("p", POOL),
            Create(
                "other",
                svc(
                    json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/other",
                    "ports": [{"port": 80}]}),
                ),
            ),
            Start,
            Settle,
            Expect(Finalizers("other", &[])),
            // Another controller's cleanup finalizer on its own Service is left alone, deleted or not.
            Patch("other", json!({"metadata": {"finalizers": [CLEANUP]}})),
            Delete("other"),
            Settle,
            Expect(Finalizers("other", &[CLEANUP])),
            Expect(Exists("other", true)),
        ],
    });
}
