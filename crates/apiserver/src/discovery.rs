//! Discovery documents (legacy, unaggregated): enough for kube-rs and kubectl to find every resource.

use super::resource::{Catalogue, ResourceInfo};
use serde_json::{json, Value};

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub fn version() -> Value {
    json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-berth-lab", "gitCommit": "", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "none", "compiler": "rustc", "platform": "linux/amd64"
    })
}

pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

pub fn api_group_list(cat: &Catalogue) -> Value {
    let groups: Vec<Value> = cat
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, versions)| group_doc(&g, &versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

pub fn api_group(cat: &Catalogue, group: &str) -> Option<Value> {
    cat.groups()
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(g, versions)| {
            let mut doc = group_doc(&g, &versions);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            doc
        })
}

/// The resources served at one group-version; `None` when it serves none, so that the
/// discovery and OpenAPI documents of an unknown group-version are both a 404.
fn served<'c>(cat: &'c Catalogue, group: &str, version: &str) -> Option<Vec<&'c ResourceInfo>> {
    let infos: Vec<&ResourceInfo> = cat
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    (!infos.is_empty()).then_some(infos)
}

pub fn resource_list(cat: &Catalogue, group: &str, version: &str) -> Option<Value> {
    let infos = served(cat, group, version)?;
    let mut resources = Vec::new();
    for r in infos {
        let mut doc = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": VERBS, "storageVersionHash": "",
        });
        if !r.short_names.is_empty() {
            doc["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            doc["categories"] = json!(r.categories);
        }
        resources.push(doc);
        if r.status_subresource {
            resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.scale_subresource {
            resources.push(json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// `/openapi/v3`: one entry per served group-version.
pub fn openapi_v3_root(cat: &Catalogue) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in cat.groups() {
        for v in versions {
            let key = if group.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{group}/{v}")
            };
            let url = format!("/openapi/v3/{key}?hash=berth-lab");
            paths.insert(key, json!({"serverRelativeURL": url}));
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<group-version>`: paths only, no schemas. kubectl reads the PATCH operations to learn
/// that the server validates fields itself (so it skips client-side schema validation), and falls
/// back to its built-in types for strategic merge.
pub fn openapi_v3_group_version(cat: &Catalogue, gv_path: &str) -> Option<Value> {
    let (group, version) = match gv_path
        .trim_matches('/')
        .split('/')
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["api", v] => (String::new(), (*v).to_owned()),
        ["apis", g, v] => ((*g).to_owned(), (*v).to_owned()),
        _ => return None,
    };
    let infos = served(cat, &group, &version)?;
    let params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force"]
        .iter()
        .map(|n| json!({"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    let mut paths = serde_json::Map::new();
    for r in infos {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let item = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let op = |action: &str| {
            json!({"operationId": format!("{action}{}", r.kind), "parameters": params, "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK"}}})
        };
        paths.insert(item, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.34.0"}, "paths": paths, "components": {"schemas": {}}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openapi_v3_lists_patch_with_field_validation() {
        let cat = Catalogue::build([]);
        let root = openapi_v3_root(&cat);
        assert!(root["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap()
            .starts_with("/openapi/v3/api/v1"));
        assert!(root["paths"]["apis/coordination.k8s.io/v1"].is_object());
        let doc = openapi_v3_group_version(&cat, "api/v1").unwrap();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/services/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Service");
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation"));
        assert!(openapi_v3_group_version(&cat, "apis/nope/v1").is_none());
    }

    #[test]
    fn core_resources_listed_with_status_subresources() {
        let cat = Catalogue::build([]);
        let doc = resource_list(&cat, "", "v1").unwrap();
        let names: Vec<&str> = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for want in [
            "namespaces",
            "services",
            "services/status",
            "pods",
            "pods/status",
            "nodes",
            "endpoints",
            "events",
            "configmaps",
        ] {
            assert!(names.contains(&want), "{want}");
        }
        assert_eq!(doc["groupVersion"], "v1");
        assert!(resource_list(&cat, "nope", "v1").is_none());
    }

    #[test]
    fn apps_serves_deployments_and_replicasets_with_scale() {
        let cat = Catalogue::build([]);
        let doc = resource_list(&cat, "apps", "v1").unwrap();
        let resources = doc["resources"].as_array().unwrap();
        let names: Vec<&str> = resources
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "deployments",
                "deployments/status",
                "deployments/scale",
                "replicasets",
                "replicasets/status",
                "replicasets/scale"
            ]
        );
        let scale = &resources[2];
        assert_eq!(
            (&scale["group"], &scale["version"], &scale["kind"]),
            (&json!("autoscaling"), &json!("v1"), &json!("Scale"))
        );
        assert_eq!(resources[0]["shortNames"], json!(["deploy"]));
        assert_eq!(resources[0]["categories"], json!(["all"]));
    }

    #[test]
    fn groups_exclude_core() {
        let cat = Catalogue::build([]);
        let doc = api_group_list(&cat);
        let names: Vec<&str> = doc["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec![
                "discovery.k8s.io",
                "coordination.k8s.io",
                "events.k8s.io",
                "networking.k8s.io",
                "apps",
                "apiextensions.k8s.io"
            ]
        );
        assert_eq!(
            api_group(&cat, "discovery.k8s.io").unwrap()["preferredVersion"]["groupVersion"],
            "discovery.k8s.io/v1"
        );
    }
}
