//! `--nodeport-addresses`: node ports answer only on the node's addresses inside the CIDRs (or
//! its primary address). node1 has two: 198.18.0.11 on the LAN (its primary, the Node's
//! InternalIP) and 10.244.1.1, its pods' gateway. Service `public` has node port 30080.

use berth_datapath::{plan, NodePortAddresses};

use crate::cluster::*;

/// Syncs node1 with `value` as its `--nodeport-addresses`, runs `scenario`, and syncs it back
/// to the default, also when the scenario fails.
fn with_node_port_addresses(c: &mut Cluster, value: &str, scenario: impl FnOnce(&mut Cluster)) {
    let sync = |c: &mut Cluster, addresses: NodePortAddresses| {
        let options = berth_datapath::PlanOptions {
            node_port_addresses: addresses,
            ..Cluster::options(c.dispatch)
        };
        let rs = plan(&c.view("node1"), &options);
        c.syncers
            .get_mut("node1")
            .unwrap()
            .sync(&rs)
            .unwrap_or_else(|err| panic!("sync on node1: {err}"));
    };
    sync(c, value.parse().unwrap());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(c)));
    sync(c, NodePortAddresses::default());
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

const NODE_PORT: u16 = 30080;

pub fn node_ports_answer_only_inside_the_cidrs(c: &mut Cluster) {
    let lan = sa(node_ip(c, "node1"), NODE_PORT);
    let pod_side = sa(v4(10, 244, 1, 1), NODE_PORT);
    // Without the flag: on both addresses.
    assert_eq!(ask(c, "client", lan).pod, "a2");
    assert_eq!(ask(c, "c1", pod_side).pod, "a2");
    with_node_port_addresses(c, "198.18.0.0/24", |c| {
        assert_eq!(ask(c, "client", lan).pod, "a2");
        // Nothing listens on 30080: the node's own stack refuses.
        assert_refused(c, "c1", pod_side);
        assert_refused(c, "node1", sa(v4(127, 0, 0, 1), NODE_PORT));
    });
    with_node_port_addresses(c, "10.244.1.0/24,fd00::/64", |c| {
        assert_refused(c, "client", lan);
        assert_eq!(ask(c, "c1", pod_side).pod, "a2");
    });
    with_node_port_addresses(c, "primary", |c| {
        assert_eq!(ask(c, "client", lan).pod, "a2");
        assert_refused(c, "c1", pod_side);
    });
    with_node_port_addresses(c, "0.0.0.0/0", |c| {
        assert_eq!(ask(c, "client", lan).pod, "a2");
        assert_eq!(ask(c, "c1", pod_side).pod, "a2");
    });
    // And back to every address.
    assert_eq!(ask(c, "c1", pod_side).pod, "a2");
}
