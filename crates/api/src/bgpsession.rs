//! `BGPSessionState`: one node's BGP session with one `BGPPeer`, as that node's FRR sees it,
//! written by that node's agent (as MetalLB's resource of the same name). Like
//! `ServiceL2Status`, the agent owns these records in its own namespace and nothing else it
//! writes, so it needs no right on the cluster-scoped `BGPPeer` objects:
//! `kubectl get bgpsessionstates -n <agent namespace>` (`bgpsession`) lists every node's sessions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// One node's session with one peer. The record exists while that node's agent runs with the
/// peer selected for it, and is deleted by the same agent when the peer no longer applies or
/// the agent stops. It states an observation, so it has no status of its own: the agent
/// writes it whole, and `conditions` carry the verdict.
// Printer columns repeat `type_ = ...`, which the lint mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "BGPSessionState",
    namespaced,
    derive = "PartialEq",
    shortname = "bgpsession",
    category = "berth",
    doc = "BGPSessionState records one node's BGP (and BFD) session with one BGPPeer.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Peer", type_ = "string", json_path = ".spec.peer"),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.peerAddress"),
    printcolumn(name = "BGP", type_ = "string", json_path = ".spec.bgpState"),
    printcolumn(name = "BFD", type_ = "string", json_path = ".spec.bfdState"),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".spec.conditions[?(@.type==\"Established\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BGPSessionStateSpec {
    /// The node whose agent writes the record.
    pub node: String,
    /// The BGPPeer's name.
    pub peer: String,
    /// The peer's address, as the BGPPeer gives it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub peer_address: String,
    /// FRR's BGP state: Established, Idle, Connect, Active, OpenSent, OpenConfirm; `NotConfigured`
    /// when the peer was left out of this node's configuration, `Unknown` when FRR cannot be asked.
    pub bgp_state: String,
    /// FRR's BFD state (Up, Down, Init, AdminDown) when the peer names a BFDProfile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd_state: Option<String>,
    /// `Established`: True when the session is up; otherwise False with a reason
    /// (`BadPeerAS`, `AuthenticationFailure`, `NotConfigured`, `Connecting`, ...) and a message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::conditions_map)]
    pub conditions: Vec<Condition>,
}
