//! Applying manifests (what `kubectl apply -f DIR` does, by server-side apply).

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, Scope};
use kube::Client;
use serde::Deserialize;
use serde_json::Value;

use super::ClusterError;

const FIELD_MANAGER: &str = "berth-lab";

/// The objects of one YAML stream, in order; empty documents are skipped.
pub fn parse_manifests(text: &str, origin: &str) -> Result<Vec<Value>, ClusterError> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|e| ClusterError::Manifest {
            origin: format!("{origin}, document {}", i + 1),
            reason: e.to_string(),
        })?;
        if value.is_null() {
            continue;
        }
        for field in ["apiVersion", "kind"] {
            if value[field].as_str().is_none_or(str::is_empty) {
                return Err(ClusterError::Manifest {
                    origin: format!("{origin}, document {}", i + 1),
                    reason: format!("no {field}"),
                });
            }
        }
        if value["metadata"]["name"].as_str().is_none_or(str::is_empty) {
            return Err(ClusterError::Manifest {
                origin: format!("{origin}, document {}", i + 1),
                reason: "no metadata.name".into(),
            });
        }
        out.push(value);
    }
    Ok(out)
}

/// The `.yaml` and `.yml` files of `dir`, by name.
pub fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, ClusterError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ClusterError::Manifest {
        origin: dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Applies every object of every file in `dir` (cluster-scoped kinds first, then the others,
/// each in file order); returns `kind/name` of each.
pub async fn apply_dir(client: &Client, dir: &Path) -> Result<Vec<String>, ClusterError> {
    let mut objects = Vec::new();
    for file in manifest_files(dir)? {
        let text = std::fs::read_to_string(&file).map_err(|e| ClusterError::Manifest {
            origin: file.display().to_string(),
            reason: e.to_string(),
        })?;
        objects.extend(parse_manifests(&text, &file.display().to_string())?);
    }
    let mut resolved = Vec::new();
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = pinned_kind(client, &gvk)
            .await
            .map_err(|e| ClusterError::Api {
                what: format!("finding the resource of {api_version} {kind}"),
                source: e,
            })?;
        resolved.push((caps.scope == Scope::Cluster, resource, object));
    }
    // Pools and advertisements before the Services that need them.
    resolved.sort_by_key(|(cluster, _, _)| !*cluster);
    let mut applied = Vec::new();
    for (cluster, resource, object) in resolved {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let api: Api<DynamicObject> = if cluster {
            Api::all_with(client.clone(), &resource)
        } else {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        };
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(|e| ClusterError::Api {
            what: format!("applying {} {name}", resource.kind),
            source: e,
        })?;
        applied.push(format!("{}/{name}", resource.kind));
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_split_into_objects() {
        let text = "# a comment\napiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\n";
        let objects = parse_manifests(text, "x.yaml").unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[1]["kind"], "Service");
    }

    #[test]
    fn objects_without_kind_or_name_are_refused_with_their_place() {
        let err = parse_manifests("apiVersion: v1\nmetadata:\n  name: a\n", "x.yaml").unwrap_err();
        assert!(err.to_string().contains("x.yaml, document 1"), "{err}");
        assert!(err.to_string().contains("no kind"), "{err}");
        let err = parse_manifests("---\napiVersion: v1\nkind: Pod\n", "y.yaml").unwrap_err();
        assert!(err.to_string().contains("no metadata.name"), "{err}");
        assert!(parse_manifests("key: [unclosed", "z.yaml").is_err());
    }

    #[test]
    fn the_examples_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let files = manifest_files(&dir).unwrap();
        assert!(!files.is_empty());
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            parse_manifests(&text, &file.display().to_string()).unwrap();
        }
    }
}
