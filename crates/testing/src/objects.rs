//! Kubernetes objects as tests write them: JSON in the API server's own shape (what a test
//! creates through a client), and the typed k8s-openapi value it deserializes to. A `null` in a
//! builder's JSON means "absent", exactly as the API server reads it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, Pod, PodCondition, PodIP, PodSpec, PodStatus, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// The typed object `value` describes; panics with the reason when it does not.
pub fn from_json<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap_or_else(|err| panic!("not a valid object: {err}"))
}

/// A Service `namespace/name` with `spec`; add `status` or labels to the result as needed.
pub fn mk_service_json(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec
    })
}

pub fn mk_service(namespace: &str, name: &str, spec: Value) -> Service {
    from_json(mk_service_json(namespace, name, spec))
}

/// An IPv4 EndpointSlice `namespace/name` of `service`.
pub fn mk_slice_json(
    namespace: &str,
    service: &str,
    name: &str,
    ports: Value,
    endpoints: Value,
) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {"kubernetes.io/service-name": service}
        },
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints
    })
}

pub fn mk_slice(
    namespace: &str,
    service: &str,
    name: &str,
    ports: Value,
    endpoints: Value,
) -> EndpointSlice {
    from_json(mk_slice_json(namespace, service, name, ports, endpoints))
}

/// A Node with `labels` (`null`: none) and `(type, address)` pairs (none: no status).
pub fn mk_node_json(name: &str, labels: Value, addresses: &[(&str, &str)]) -> Value {
    let status = if addresses.is_empty() {
        Value::Null
    } else {
        let addresses: Vec<Value> = addresses
            .iter()
            .map(|(kind, address)| json!({"type": kind, "address": address}))
            .collect();
        json!({"addresses": addresses})
    };
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": status
    })
}

pub fn mk_node(name: &str, labels: Value, addresses: &[(&str, &str)]) -> Node {
    from_json(mk_node_json(name, labels, addresses))
}

/// A ClusterIP Service `namespace/name` selecting `app: <app>`, IPv4, with TCP ports
/// `(name, port, targetPort)`.
pub fn mk_selector_service(
    namespace: &str,
    name: &str,
    uid: &str,
    app: &str,
    cluster_ip: &str,
    ports: &[(&str, i32, IntOrString)],
) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".into(), app.into())])),
            cluster_ip: Some(cluster_ip.into()),
            ip_families: Some(vec!["IPv4".into()]),
            ports: Some(
                ports
                    .iter()
                    .map(|(port_name, port, target)| ServicePort {
                        name: Some((*port_name).into()),
                        port: *port,
                        target_port: Some(target.clone()),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What varies between the running pods tests build.
pub struct PodFacts<'a> {
    pub namespace: &'a str,
    pub name: String,
    pub uid: String,
    pub app: &'a str,
    pub node: String,
    pub ip: String,
    pub ready: bool,
    /// The deletion timestamp of a terminating pod (RFC 3339).
    pub deleted_at: Option<&'a str>,
    /// Named ports of its one container, `app`.
    pub ports: &'a [(&'a str, i32)],
}

/// A Running pod labelled `app: <app>`, with its IP and its Ready condition, as the kubelet
/// reports them.
pub fn mk_pod(facts: &PodFacts<'_>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(facts.name.clone()),
            namespace: Some(facts.namespace.into()),
            uid: Some(facts.uid.clone()),
            labels: Some(BTreeMap::from([("app".into(), facts.app.into())])),
            deletion_timestamp: facts.deleted_at.map(|at| {
                Time(
                    at.parse()
                        .unwrap_or_else(|err| panic!("deletion timestamp {at:?}: {err}")),
                )
            }),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(facts.node.clone()),
            containers: vec![Container {
                name: "app".into(),
                ports: Some(
                    facts
                        .ports
                        .iter()
                        .map(|(name, number)| ContainerPort {
                            name: Some((*name).into()),
                            container_port: *number,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(facts.ip.clone()),
            pod_ips: Some(vec![PodIP {
                ip: facts.ip.clone(),
            }]),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if facts.ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_means_absent_and_an_empty_map_is_kept() {
        let bare = mk_node("n1", Value::Null, &[]);
        assert_eq!(bare.metadata.labels, None);
        assert_eq!(bare.status, None);

        let labelled = mk_node("n1", json!({}), &[("InternalIP", "198.18.0.11")]);
        assert_eq!(labelled.metadata.labels, Some(BTreeMap::new()));
        let addresses = labelled
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default();
        assert_eq!(addresses.len(), 1);
        assert_eq!(addresses[0].type_, "InternalIP");
    }

    #[test]
    fn slices_name_their_service() {
        let slice = mk_slice("ns1", "web", "web-1", json!([]), json!([]));
        let labels = slice.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("kubernetes.io/service-name").map(String::as_str),
            Some("web")
        );
        assert_eq!(slice.address_type, "IPv4");
    }

    #[test]
    fn a_terminating_pod_carries_its_deletion_timestamp() {
        let pod = mk_pod(&PodFacts {
            namespace: "default",
            name: "web-0".into(),
            uid: "web-pod-0".into(),
            app: "web",
            node: "node-1".into(),
            ip: "10.244.1.2".into(),
            ready: false,
            deleted_at: Some("2026-01-01T00:00:00Z"),
            ports: &[("http", 8080)],
        });
        assert!(pod.metadata.deletion_timestamp.is_some());
        let status = pod.status.unwrap_or_default();
        assert_eq!(status.pod_ip.as_deref(), Some("10.244.1.2"));
        let ready = status.conditions.unwrap_or_default();
        assert_eq!(ready[0].status, "False");
    }
}
