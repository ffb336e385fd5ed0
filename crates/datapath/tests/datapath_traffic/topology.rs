//! Topology-aware routing (`trafficDistribution`): a node prefers the endpoints hinted for its
//! zone or itself, and uses every endpoint when none is hinted for it. node1 is in zone-a (pods
//! a1, a2, client pod c1), node2 in zone-b (b1, b2).

use crate::cluster::*;

const ASKS: usize = 24;

pub fn same_zone_endpoints_only(c: &mut Cluster) {
    // From a pod and from the node of zone-a: a1 and a2, never b1.
    for from in ["c1", "node1"] {
        let pods = pods_of(&ask_many(c, from, sa(svc_ip(30), 80), ASKS));
        assert_eq!(
            pods.keys().collect::<Vec<_>>(),
            ["a1", "a2"],
            "{from}: {pods:?}"
        );
    }
    // From zone-b: b1 alone.
    let pods = pods_of(&ask_many(c, "node2", sa(svc_ip(30), 80), ASKS));
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["b1"], "{pods:?}");
}

pub fn same_node_endpoints_only(c: &mut Cluster) {
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(31), 80), ASKS));
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["a2"], "{pods:?}");
    let pods = pods_of(&ask_many(c, "node2", sa(svc_ip(31), 80), ASKS));
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["b1", "b2"], "{pods:?}");
}

pub fn no_endpoint_in_the_zone_falls_back_to_all(c: &mut Cluster) {
    // Every endpoint is in zone-b: node1 (zone-a) still reaches both.
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(32), 80), ASKS));
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["b1", "b2"], "{pods:?}");
}
