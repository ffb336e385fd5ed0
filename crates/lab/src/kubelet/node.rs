//! Node objects for the lab's node namespaces (pure).

use serde_json::{json, Value};

use crate::topology::NodeLayout;

/// `spec.providerID` of a lab node: `berth-lab://<prefix>/<node>`.
pub fn provider_id(prefix: &str, node: &str) -> String {
    format!("berth-lab://{prefix}/{node}")
}

/// The Node as the lab kubelet applies it (metadata and spec; status is [`build_node_status`]).
pub fn build_node(prefix: &str, node: &NodeLayout) -> Value {
    let cidr = node.pod_cidr.to_string();
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
            "podCIDR": cidr,
            "podCIDRs": [cidr],
            "providerID": provider_id(prefix, &node.name),
        },
    })
}

/// The Node's status: its LAN address and host name, and Ready since `since` with the heartbeat
/// `now` (RFC 3339). `lastTransitionTime` stays `since` as long as the kubelet runs, so only a
/// real transition moves it.
pub fn build_node_status(node: &NodeLayout, since: &str, now: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": node.lan_ip.to_string()},
                {"type": "Hostname", "address": node.name},
            ],
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
        let node = build_node("berth-lab", n);
        assert_eq!(node["spec"]["podCIDR"], "10.244.1.0/24");
        assert_eq!(node["spec"]["podCIDRs"], json!(["10.244.1.0/24"]));
        assert_eq!(node["spec"]["providerID"], "berth-lab://berth-lab/node2");
        assert_eq!(
            node["metadata"]["labels"]["kubernetes.io/hostname"],
            "node2"
        );
        let status = build_node_status(n, "t0", "t1");
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
}
