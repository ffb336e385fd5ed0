//! Node objects for the lab's node namespaces (pure).

use berth_core::IpFamily;
use serde_json::{json, Value};

use crate::cluster::plan::{node_ip, LabFamilies};
use crate::topology::NodeLayout;

/// `spec.providerID` of a lab node: `berth-lab://<prefix>/<node>`.
pub fn provider_id(prefix: &str, node: &str) -> String {
    format!("berth-lab://{prefix}/{node}")
}

/// The node's pod CIDRs of the cluster's families, primary first.
pub fn pod_cidrs(node: &NodeLayout, families: LabFamilies) -> Vec<String> {
    families
        .families()
        .iter()
        .filter_map(|family| match family {
            IpFamily::V4 => Some(node.pod_cidr.to_string()),
            IpFamily::V6 => node.pod_cidr6.map(|c| c.to_string()),
        })
        .collect()
}

/// The node's LAN addresses of the cluster's families, primary first: its InternalIPs.
pub fn internal_ips(node: &NodeLayout, families: LabFamilies) -> Vec<String> {
    families
        .families()
        .iter()
        .filter_map(|family| node_ip(node, *family).map(|ip| ip.to_string()))
        .collect()
}

/// The Node as the lab kubelet applies it (metadata and spec; status is [`build_node_status`]):
/// `podCIDRs` holds one CIDR per family of the cluster, primary first, as on a dual-stack node.
pub fn build_node(prefix: &str, node: &NodeLayout, families: LabFamilies) -> Value {
    let cidrs = pod_cidrs(node, families);
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "berth.dev/lab": prefix,
            },
        },
        "spec": {
            "podCIDR": cidrs.first(),
            "podCIDRs": cidrs,
            "providerID": provider_id(prefix, &node.name),
        },
    })
}

/// The Node's status: its LAN addresses (an InternalIP per family) and host name, and Ready
/// since `since` with the heartbeat `now` (RFC 3339). `lastTransitionTime` stays `since` as
/// long as the kubelet runs, so only a real transition moves it.
pub fn build_node_status(
    node: &NodeLayout,
    families: LabFamilies,
    since: &str,
    now: &str,
) -> Value {
    let mut addresses: Vec<Value> = internal_ips(node, families)
        .into_iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": node.name}));
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name},
        "status": {
            "addresses": addresses,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "berth lab kubelet is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            }],
            "nodeInfo": {
                "kubeletVersion": "berth-lab",
                "operatingSystem": "linux",
                "architecture": std::env::consts::ARCH,
                "containerRuntimeVersion": "berth-lab://echo",
                "kernelVersion": "", "osImage": "", "kubeProxyVersion": "",
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{layout, TopologySpec};

    #[test]
    fn a_node_names_its_address_pod_cidr_and_provider() {
        let l =
            layout(&TopologySpec::new("berth-lab").node("node2", Vec::<String>::new())).unwrap();
        let n = &l.nodes[0];
        let node = build_node("berth-lab", n, LabFamilies::Ipv4);
        assert_eq!(node["spec"]["podCIDR"], "10.244.1.0/24");
        assert_eq!(node["spec"]["podCIDRs"], json!(["10.244.1.0/24"]));
        assert_eq!(node["spec"]["providerID"], "berth-lab://berth-lab/node2");
        assert_eq!(
            node["metadata"]["labels"]["kubernetes.io/hostname"],
            "node2"
        );
        let status = build_node_status(n, LabFamilies::Ipv4, "t0", "t1");
        assert_eq!(
            status["status"]["addresses"][0],
            json!({"type": "InternalIP", "address": "198.18.0.11"})
        );
        let ready = &status["status"]["conditions"][0];
        assert_eq!(
            (&ready["type"], &ready["status"]),
            (&json!("Ready"), &json!("True"))
        );
        assert_eq!(
            (&ready["lastTransitionTime"], &ready["lastHeartbeatTime"]),
            (&json!("t0"), &json!("t1"))
        );
    }

    #[test]
    fn a_dual_stack_node_has_both_internal_ips_and_pod_cidrs_in_cluster_order() {
        let l = layout(
            &TopologySpec::new("berth-lab")
                .node("node1", Vec::<String>::new())
                .with_ipv6(),
        )
        .unwrap();
        let n = &l.nodes[0];
        let node = build_node("berth-lab", n, LabFamilies::Dual);
        assert_eq!(node["spec"]["podCIDR"], "10.244.1.0/24");
        assert_eq!(
            node["spec"]["podCIDRs"],
            json!(["10.244.1.0/24", "fd00:244:1::/64"])
        );
        let status = build_node_status(n, LabFamilies::Dual, "t0", "t1");
        assert_eq!(
            status["status"]["addresses"],
            json!([
                {"type": "InternalIP", "address": "198.18.0.11"},
                {"type": "InternalIP", "address": "fd00:198:18::11"},
                {"type": "Hostname", "address": "node1"},
            ])
        );
        // IPv6 only: the IPv4 LAN address is the host's, not the cluster's.
        let node = build_node("berth-lab", n, LabFamilies::Ipv6);
        assert_eq!(node["spec"]["podCIDR"], "fd00:244:1::/64");
        assert_eq!(node["spec"]["podCIDRs"], json!(["fd00:244:1::/64"]));
        let status = build_node_status(n, LabFamilies::Ipv6, "t0", "t1");
        assert_eq!(
            status["status"]["addresses"][0],
            json!({"type": "InternalIP", "address": "fd00:198:18::11"})
        );
        assert_eq!(status["status"]["addresses"].as_array().unwrap().len(), 2);
    }
}
