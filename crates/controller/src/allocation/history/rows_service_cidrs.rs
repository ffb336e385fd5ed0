//! ServiceCIDR objects: the allocator serves every ready one, a new one adds room, a
//! requested ClusterIP may lie in any of them, and one being deleted (or gone) hands out
//! nothing new while its Services keep what they hold. A cluster without them behaves as
//! `--service-cidr` says (every other history).

use serde_json::json;

use super::Op::*;
use super::Want::*;
use super::{run, svc, Row};

fn dynamic() -> serde_json::Value {
    svc(json!({"ports": [{"port": 80}]}))
}

fn requested(ip: &str) -> serde_json::Value {
    svc(json!({"clusterIP": ip, "clusterIPs": [ip], "ports": [{"port": 80}]}))
}

#[test]
fn a_second_service_cidr_adds_room_when_the_first_is_full() {
    run(Row {
        name: "a second ServiceCIDR adds room when the first is full",
        ops: vec![
            ServiceCidrFlag("10.96.0.0/30"),
            ServiceCidr("kubernetes", &["10.96.0.0/30"], false),
            Create("a", dynamic()),
            Create("b", dynamic()),
            Start,
            Settle,
            Expect(ClusterIpIn("a", "10.96.0.0/30")),
            Expect(ClusterIpIn("b", "10.96.0.0/30")),
            Create("c", dynamic()),
            Settle,
            Expect(Allocated("c", "False")),
            Expect(Message("c", "range is full")),
            ServiceCidr("extra", &["10.97.0.0/30"], false),
            Settle,
            Expect(ClusterIpIn("c", "10.97.0.0/30")),
            Expect(Allocated("c", "True")),
            Expect(Exact("c")),
        ],
    });
}

#[test]
fn a_requested_cluster_ip_inside_a_second_service_cidr_is_accepted() {
    run(Row {
        name: "a requested ClusterIP inside a second ServiceCIDR is accepted",
        ops: vec![
            ServiceCidr("kubernetes", &["10.96.0.0/16"], false),
            ServiceCidr("extra", &["10.97.0.0/24"], false),
            Create("r", requested("10.97.0.9")),
            Start,
            Settle,
            Expect(Allocated("r", "True")),
            Expect(HoldsClusterIps("r", &["10.97.0.9"])),
            Create("s", requested("10.98.0.9")),
            Settle,
            Expect(Allocated("s", "False")),
            Expect(Message(
                "s",
                "The range of valid IPs is 10.97.0.0/24,10.96.0.0/16",
            )),
        ],
    });
}

#[test]
fn with_the_kind_served_but_no_object_the_flag_holds() {
    run(Row {
        name: "the kind served, no object: --service-cidr holds",
        ops: vec![
            ServiceCidr("empty", &[], false),
            Create("r", requested("10.97.0.9")),
            Create("a", dynamic()),
            Start,
            Settle,
            Expect(Allocated("r", "False")),
            Expect(Message("r", "The range of valid IPs is 10.96.0.0/16")),
            Expect(ClusterIpIn("a", "10.96.0.0/16")),
        ],
    });
}

#[test]
fn a_deleted_service_cidr_hands_out_nothing_its_services_still_hold() {
    run(Row {
        name: "a deleted ServiceCIDR hands out nothing its Services still hold",
        ops: vec![
            ServiceCidrFlag("10.96.0.0/30"),
            ServiceCidr("kubernetes", &["10.96.0.0/30"], false),
            ServiceCidr("old", &["10.97.0.0/30"], false),
            Create("a", requested("10.97.0.1")),
            Create("b", requested("10.97.0.2")),
            Start,
            Settle,
            Expect(HoldsClusterIps("a", &["10.97.0.1"])),
            Expect(HoldsClusterIps("b", &["10.97.0.2"])),
            // Being deleted: `b` lets its address go; nothing takes it again.
            ServiceCidr("old", &["10.97.0.0/30"], true),
            Delete("b"),
            Settle,
            Create("c", requested("10.97.0.2")),
            Create("d", dynamic()),
            Create("e", dynamic()),
            Settle,
            Expect(Allocated("c", "False")),
            Expect(Message("c", "allocator not ready")),
            Expect(ClusterIpIn("d", "10.96.0.0/30")),
            Expect(ClusterIpIn("e", "10.96.0.0/30")),
            Create("f", dynamic()),
            Settle,
            Expect(Message("f", "range is full")),
            // A new leader adopts what `a` holds in the range being deleted.
            Start,
            Settle,
            Expect(HoldsClusterIps("a", &["10.97.0.1"])),
            Expect(Allocated("a", "True")),
            // The object gone: `a` keeps its address and nobody is given it.
            DeleteServiceCidr("old"),
            Settle,
            Expect(HoldsClusterIps("a", &["10.97.0.1"])),
            Create("g", requested("10.97.0.1")),
            Settle,
            Expect(Allocated("g", "False")),
            Expect(HoldsClusterIps("g", &[])),
            Expect(Conflicts(0)),
        ],
    });
}
