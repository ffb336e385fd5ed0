//! A Pod as the endpoints controller decodes it from the API: only the fields endpoints read.
//! The decoder skips everything else (managed fields, container specs, statuses) instead of
//! allocating it, which is most of a pod's size and of the time spent decoding 100,000 of them.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::NamespaceResourceScope;
use serde::{Deserialize, Deserializer};

/// The metadata fields kept; the watcher needs the resourceVersion to resume.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    deletion_timestamp: Option<Time>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = SlimMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        deletion_timestamp: m.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimPort {
    pub(crate) name: Option<String>,
    pub(crate) container_port: i32,
    pub(crate) protocol: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimContainer {
    pub(crate) restart_policy: Option<String>,
    pub(crate) ports: Option<Vec<SlimPort>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimSpec {
    pub(crate) node_name: Option<String>,
    pub(crate) hostname: Option<String>,
    pub(crate) subdomain: Option<String>,
    pub(crate) containers: Option<Vec<SlimContainer>>,
    pub(crate) init_containers: Option<Vec<SlimContainer>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SlimPodIp {
    pub(crate) ip: String,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SlimCondition {
    #[serde(rename = "type")]
    pub(crate) type_: String,
    pub(crate) status: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimStatus {
    pub(crate) phase: Option<String>,
    #[serde(rename = "podIP")]
    pub(crate) pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pub(crate) pod_ips: Option<Vec<SlimPodIp>>,
    pub(crate) conditions: Option<Vec<SlimCondition>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SlimPod {
    #[serde(deserialize_with = "slim_meta", default)]
    pub(crate) metadata: ObjectMeta,
    pub(crate) spec: Option<SlimSpec>,
    pub(crate) status: Option<SlimStatus>,
}

impl kube::Resource for SlimPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::Resource;

    #[test]
    fn addresses_the_same_api_as_a_pod() {
        assert_eq!(
            SlimPod::url_path(&(), Some("shop")),
            Pod::url_path(&(), Some("shop"))
        );
        assert_eq!(SlimPod::api_version(&()), Pod::api_version(&()));
        assert_eq!(SlimPod::kind(&()), Pod::kind(&()));
    }

    #[test]
    fn keeps_what_endpoints_read_and_skips_the_rest() {
        let pod: SlimPod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "shop", "uid": "u", "resourceVersion": "4",
                         "labels": {"app": "web"}, "annotations": {"big": "x"},
                         "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
                         "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n1", "hostname": "h", "subdomain": "s",
                     "containers": [{"name": "c", "image": "i", "env": [{"name": "X"}],
                                     "ports": [{"name": "http", "containerPort": 8080,
                                                "protocol": "TCP"}]}],
                     "initContainers": [{"name": "p", "restartPolicy": "Always"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                       "containerStatuses": [{"name": "c"}]}
        }))
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("a"));
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("4"));
        assert!(pod.metadata.annotations.is_none() && pod.metadata.managed_fields.is_none());
        assert!(pod.metadata.deletion_timestamp.is_some());
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let ports = spec.containers.unwrap()[0].ports.clone().unwrap();
        assert_eq!(ports[0].container_port, 8080);
        let init = spec.init_containers.unwrap();
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
        let status = pod.status.unwrap();
        assert_eq!(status.conditions.unwrap()[0].status, "True");
        assert_eq!(status.pod_ips.unwrap()[0].ip, "10.0.0.1");
    }
}
