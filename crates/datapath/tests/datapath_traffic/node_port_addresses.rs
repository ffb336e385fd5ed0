//! `--nodeport-addresses`: node ports answer only on the node's addresses inside the CIDRs (or
//! its primary address). node1 has two per family: 198.18.0.11 / fd00:198:18::b on the LAN (its
//! primary, the Node's InternalIP) and 10.244.1.1 / fd00:244:1::1, its pods' gateway. Service
//! `public` has node port 30080. Each value names both families' CIDRs.

use berth_core::IpFamily;
use berth_datapath::NodePortAddresses;

use crate::cluster::*;

/// Syncs the nodes with `value` as their `--nodeport-addresses`, runs `scenario`, and syncs it back
/// to the default, also when the scenario fails.
fn with_node_port_addresses(c: &mut Cluster, value: &str, scenario: impl FnOnce(&mut Cluster)) {
    let sync = |c: &mut Cluster, addresses: NodePortAddresses| {
        let dispatch = c.dispatch;
        c.sync_with(|family: IpFamily| berth_datapath::PlanOptions {
            node_port_addresses: addresses.clone(),
            ..Cluster::options(dispatch, family)
        });
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
    // Addresses of the IPv4 plan: the helpers ask in the family under test.
    let lan = sa(v4(198, 18, 0, 11), NODE_PORT);
    assert_eq!(
        node_ip(c, "node1"),
        c.ip(lan.ip()),
        "node1's LAN address moved"
    );
    let pod_side = sa(v4(10, 244, 1, 1), NODE_PORT);
    // Without the flag: on both addresses.
    assert_eq!(ask(c, "client", lan).pod, "a2");
    assert_eq!(ask(c, "c1", pod_side).pod, "a2");
    with_node_port_addresses(c, "198.18.0.0/24,fd00:198:18::/64", |c| {
        assert_eq!(ask(c, "client", lan).pod, "a2");
        // Nothing listens on 30080: the node's own stack refuses.
        assert_refused(c, "c1", pod_side);
        assert_refused(c, "node1", sa(v4(127, 0, 0, 1), NODE_PORT));
    });
    with_node_port_addresses(c, "10.244.1.0/24,fd00:244:1::/64", |c| {
        assert_refused(c, "client", lan);
        assert_eq!(ask(c, "c1", pod_side).pod, "a2");
    });
    with_node_port_addresses(c, "primary", |c| {
        assert_eq!(ask(c, "client", lan).pod, "a2");
        assert_refused(c, "c1", pod_side);
    });
    with_node_port_addresses(c, "0.0.0.0/0,::/0", |c| {
        assert_eq!(ask(c, "client", lan).pod, "a2");
        assert_eq!(ask(c, "c1", pod_side).pod, "a2");
    });
    // And back to every address.
    assert_eq!(ask(c, "c1", pod_side).pod, "a2");
}
