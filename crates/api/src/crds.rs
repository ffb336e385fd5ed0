//! The CRD manifests, generated from the Rust types so the two cannot disagree.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Map, Value};

use crate::{
    BFDProfile, BGPAdvertisement, BGPPeer, BGPSessionState, Error, IPPool, L2Advertisement,
    ServiceL2Status,
};

/// Every berth CRD, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        IPPool::crd(),
        L2Advertisement::crd(),
        BGPPeer::crd(),
        BGPAdvertisement::crd(),
        BFDProfile::crd(),
        ServiceL2Status::crd(),
        BGPSessionState::crd(),
    ]
}

/// All CRDs as one multi-document YAML stream, each document starting with `---`. Keys are
/// sorted whatever serde_json's map flavour is, so the text depends only on the types.
pub fn crds_yaml() -> Result<String, Error> {
    let mut out = String::new();
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let value = serde_json::to_value(&crd).map_err(|source| Error::ConvertCrd {
            name: name.clone(),
            source,
        })?;
        let yaml = serde_yaml::to_string(&sorted(value))
            .map_err(|source| Error::RenderCrd { name, source })?;
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sorted(v)))
                    .collect::<Map<String, Value>>(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
