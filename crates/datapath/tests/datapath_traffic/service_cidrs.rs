//! ServiceCIDRs (kube-proxy's nftables `cluster-ips-check`): with the cluster's Service CIDRs
//! known, a new connection to a ClusterIP on a port its Service does not have is refused, and one
//! to an address no Service holds is dropped, from a pod and from the node itself; Services keep
//! answering. Service `web` (svc_ip(10)) has port 80 (and UDP 53); svc_ip(99) belongs to no Service.

use crate::cluster::*;

/// Syncs the nodes with the cluster's Service CIDRs (both families'), runs `scenario`, and syncs
/// back to none, also when the scenario fails.
fn with_service_cidrs(c: &mut Cluster, scenario: impl FnOnce(&mut Cluster)) {
    let sync = |c: &mut Cluster, cidrs: &[&str]| {
        let dispatch = c.dispatch;
        let cidrs: Vec<ipnet::IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        c.sync_with(|family| berth_datapath::PlanOptions {
            service_cidrs: cidrs.clone(),
            ..Cluster::options(dispatch, family)
        });
    };
    sync(c, &["10.96.0.0/16", "fd00:96::/112"]);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(c)));
    sync(c, &[]);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

pub fn undefined_ports_are_refused_and_unallocated_addresses_dropped(c: &mut Cluster) {
    with_service_cidrs(c, |c| {
        assert_refused(c, "c1", sa(svc_ip(10), 81));
        assert_refused(c, "node1", sa(svc_ip(10), 81));
        assert_dropped(c, "c1", sa(svc_ip(99), 80));
        assert!(["a1", "b1"].contains(&ask(c, "c1", sa(svc_ip(10), 80)).pod.as_str()));
    });
}
