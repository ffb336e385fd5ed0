//! The CEL rules of the BGP CRDs, evaluated client-side with the Kubernetes CEL libraries, agree
//! with berth's own validation of the same objects (`BGPPeerSpec::validate`).

// Helpers outside #[test] functions unwrap too; a panic is a test failure here.
#![allow(clippy::unwrap_used)]

use berth_api::{crds, BGPPeerSpec};
use kube::core::cel::{compile_schema, Validator};
use serde_json::{json, Value};

fn schema_of(kind: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

fn object(kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x"},
        "spec": spec,
    })
}

fn cel_messages(kind: &str, spec: Value) -> Vec<String> {
    match Validator::new().validate(&schema_of(kind), &object(kind, spec), None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

fn peer(extra: Value) -> Value {
    let mut spec = json!({"myASN": 64512, "peerASN": 64513, "peerAddress": "198.18.0.1"});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

#[test]
fn rules_compile() {
    for kind in ["BGPPeer", "BGPAdvertisement", "BFDProfile"] {
        let compiled = compile_schema(&schema_of(kind));
        assert!(
            !compiled.has_errors(),
            "{kind}: {:?}",
            compiled.compilation_errors()
        );
    }
}

/// Each row: the extra peer fields, and a fragment of the one CEL message expected (empty: valid).
const PEERS: &[(&str, &str)] = &[
    ("{}", ""),
    (r#"{"holdTime": "90s", "keepaliveTime": "30s"}"#, ""),
    (r#"{"holdTime": "1m30s"}"#, ""),
    (r#"{"holdTime": "0s", "keepaliveTime": "60s"}"#, ""),
    (
        r#"{"peerAddress": "fd00::1", "sourceAddress": "fd00::11"}"#,
        "",
    ),
    (r#"{"routerID": "198.18.0.11"}"#, ""),
    (r#"{"peerAddress": "router"}"#, "IPv4 or IPv6"),
    (r#"{"routerID": "fd00::1"}"#, "IPv4 address"),
    (r#"{"holdTime": "2s"}"#, "0s or at least 3s"),
    (r#"{"keepaliveTime": "9s"}"#, "less than holdTime"),
    (
        r#"{"holdTime": "30s", "keepaliveTime": "30s"}"#,
        "less than holdTime",
    ),
    (r#"{"peerASN": 64512, "ebgpMultiHop": true}"#, "eBGP only"),
    (r#"{"connectTime": "1s"}"#, ""),
    (r#"{"connectTime": "1092m15s"}"#, ""),
    (r#"{"connectTime": "0s"}"#, "between 1s and 65535s"),
    (r#"{"connectTime": "1092m16s"}"#, "between 1s and 65535s"),
];

#[test]
fn cel_and_berth_agree_on_peers() {
    for (extra, fragment) in PEERS {
        let spec = peer(serde_json::from_str(extra).unwrap());
        let messages = cel_messages("BGPPeer", spec.clone());
        let rust: BGPPeerSpec = serde_json::from_value(spec).unwrap();
        if fragment.is_empty() {
            assert_eq!(messages, Vec::<String>::new(), "CEL rejects {extra}");
            assert!(rust.validate().is_ok(), "berth rejects {extra}");
        } else {
            assert_eq!(messages.len(), 1, "{extra}: {messages:?}");
            assert!(messages[0].contains(fragment), "{extra}: {messages:?}");
            assert!(rust.validate().is_err(), "berth accepts {extra}");
        }
    }
}
