//! `ServiceL2Status`: where a LoadBalancer Service's address is announced over ARP/NDP, written
//! by the announcing node's agent (as MetalLB's resource of the same name). The agent owns
//! these records and nothing else it writes, so it needs no right on Services:
//! `kubectl get servicel2statuses -n <agent namespace>` (`l2status`) lists who answers for what.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One node announcing one Service's addresses: the record exists while that node's agent
/// answers for them, and is deleted by the same agent when it stops. It states a fact, so it
/// has no status of its own: the agent writes it whole.
// Printer columns repeat `type_ = ...`, which the lint mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "ServiceL2Status",
    namespaced,
    derive = "PartialEq",
    shortname = "l2status",
    category = "berth",
    doc = "ServiceL2Status records which node announces a LoadBalancer Service's addresses over ARP/NDP.",
    printcolumn(
        name = "Service Namespace",
        type_ = "string",
        json_path = ".spec.serviceNamespace"
    ),
    printcolumn(name = "Service", type_ = "string", json_path = ".spec.serviceName"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Addresses", type_ = "string", json_path = ".spec.addresses"),
    printcolumn(name = "Interfaces", type_ = "string", json_path = ".spec.interfaces"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceL2StatusSpec {
    /// The node whose agent answers for the addresses.
    pub node: String,
    /// The Service's namespace.
    pub service_namespace: String,
    /// The Service's name.
    pub service_name: String,
    /// The Service's addresses this node answers for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// The interfaces it answers on; empty: every interface the agent answers on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
}
