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

pub fn resource_list(cat: &Catalogue, group: &str, version: &str) -> Option<Value> {
    let infos: Vec<&ResourceInfo> = cat
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if infos.is_empty() {
        return None;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
                "apiextensions.k8s.io"
            ]
        );
        assert_eq!(
            api_group(&cat, "discovery.k8s.io").unwrap()["preferredVersion"]["groupVersion"],
            "discovery.k8s.io/v1"
        );
    }
}
