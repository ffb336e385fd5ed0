//! The resource catalogue: built-in kinds the lab serves, plus every custom resource its CRDs define.

use std::borrow::Cow;

use serde_json::Value;

use super::columns::{printer_columns, PrinterColumn};

/// How lists inside objects of a resource merge (strategic merge patch and server-side apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// A built-in kind: the field tags of the upstream Go types apply.
    BuiltIn,
    /// A custom resource: lists are atomic unless the CRD schema says otherwise; no strategic merge.
    Custom,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub status_subresource: bool,
    /// Serves `/scale` (an `autoscaling/v1` Scale over `spec.replicas`), as Deployments and
    /// ReplicaSets do.
    pub scale_subresource: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub schema: Schema,
    /// A custom resource's `additionalPrinterColumns` for this version (none for built-ins).
    pub printer_columns: Vec<PrinterColumn>,
}

impl ResourceInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Objects are stored once per group and resource; versions only change the `apiVersion` shown.
    /// events.k8s.io Events are the core Events seen through another group, as upstream stores them.
    pub fn storage_key(&self) -> String {
        if super::events::is_events_group(&self.group, &self.plural) {
            return "/events".to_owned();
        }
        format!("{}/{}", self.group, self.plural)
    }

    /// Whether objects of this resource are stored in another group's shape (core/v1 Events
    /// written through events.k8s.io), so writes convert them before they are kept.
    pub fn stored_as_core_events(&self) -> bool {
        super::events::is_events_group(&self.group, &self.plural)
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn is_crd(&self) -> bool {
        self.group == "apiextensions.k8s.io" && self.plural == "customresourcedefinitions"
    }

    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }
}

struct BuiltIn {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
    scale: bool,
    short: &'static [&'static str],
}

const BUILT_INS: &[BuiltIn] = &[
    BuiltIn {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        status: true,
        scale: false,
        short: &["ns"],
    },
    BuiltIn {
        group: "",
        version: "v1",
        plural: "services",
        kind: "Service",
        namespaced: true,
        status: true,
        scale: false,
        short: &["svc"],
    },
    BuiltIn {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        status: true,
        scale: false,
        short: &["po"],
    },
    BuiltIn {
        group: "",
        version: "v1",
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        status: true,
        scale: false,
        short: &["no"],
    },
    BuiltIn {
        group: "",
        version: "v1",
        plural: "endpoints",
        kind: "Endpoints",
        namespaced: true,
        status: false,
        scale: false,
        short: &["ep"],
    },
    BuiltIn {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status: false,
        scale: false,
        short: &["ev"],
    },
    BuiltIn {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        status: false,
        scale: false,
        short: &["cm"],
    },
    // BGP peers' passwords; stored as written (`stringData` is not folded into `data`).
    BuiltIn {
        group: "",
        version: "v1",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        status: false,
        scale: false,
        short: &[],
    },
    BuiltIn {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        kind: "EndpointSlice",
        namespaced: true,
        status: false,
        scale: false,
        short: &[],
    },
    BuiltIn {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        status: false,
        scale: false,
        short: &[],
    },
    BuiltIn {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status: false,
        scale: false,
        short: &["ev"],
    },
    // The cluster's Service IP ranges (GA in Kubernetes 1.33): the lab keeps `kubernetes`, made
    // from its service CIDRs, as an API server does; service proxies read them all.
    BuiltIn {
        group: "networking.k8s.io",
        version: "v1",
        plural: "servicecidrs",
        kind: "ServiceCIDR",
        namespaced: false,
        status: true,
        scale: false,
        short: &[],
    },
    BuiltIn {
        group: "apps",
        version: "v1",
        plural: "deployments",
        kind: "Deployment",
        namespaced: true,
        status: true,
        scale: true,
        short: &["deploy"],
    },
    BuiltIn {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        kind: "ReplicaSet",
        namespaced: true,
        status: true,
        scale: true,
        short: &["rs"],
    },
    BuiltIn {
        group: "apiextensions.k8s.io",
        version: "v1",
        plural: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        namespaced: false,
        status: true,
        scale: false,
        short: &["crd", "crds"],
    },
];

/// The built-in resources, in discovery order.
pub fn built_ins() -> Vec<ResourceInfo> {
    BUILT_INS
        .iter()
        .map(|b| ResourceInfo {
            group: b.group.to_owned(),
            version: b.version.to_owned(),
            plural: b.plural.to_owned(),
            singular: b.kind.to_lowercase(),
            kind: b.kind.to_owned(),
            namespaced: b.namespaced,
            status_subresource: b.status,
            scale_subresource: b.scale,
            short_names: b.short.iter().map(|s| (*s).to_owned()).collect(),
            // `kubectl get all` asks for the kinds in the category "all"; of the served ones,
            // upstream puts Pods, Services, Deployments and ReplicaSets there.
            categories: if matches!(
                (b.group, b.plural),
                ("", "pods" | "services") | ("apps", "deployments" | "replicasets")
            ) {
                vec!["all".to_owned()]
            } else {
                Vec::new()
            },
            schema: Schema::BuiltIn,
            printer_columns: Vec::new(),
        })
        .collect()
}

/// The served versions of one CRD object as resources. A malformed CRD yields nothing rather than an
/// error, because it was already accepted and must not break discovery for everything else.
pub fn from_crd(crd: &Value) -> Vec<ResourceInfo> {
    let spec = &crd["spec"];
    let (Some(group), Some(plural), Some(kind)) = (
        spec["group"].as_str(),
        spec["names"]["plural"].as_str(),
        spec["names"]["kind"].as_str(),
    ) else {
        return Vec::new();
    };
    let singular = spec["names"]["singular"]
        .as_str()
        .map_or_else(|| kind.to_lowercase(), str::to_owned);
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    spec["versions"]
        .as_array()
        .map(|versions| {
            versions
                .iter()
                .filter(|v| v["served"].as_bool().unwrap_or(true))
                .filter_map(|v| {
                    Some(ResourceInfo {
                        group: group.to_owned(),
                        version: v["name"].as_str()?.to_owned(),
                        plural: plural.to_owned(),
                        singular: singular.clone(),
                        kind: kind.to_owned(),
                        namespaced,
                        status_subresource: v["subresources"].get("status").is_some(),
                        // A CRD's scale paths are not served: berth's CRDs declare none.
                        scale_subresource: false,
                        short_names: strings(&spec["names"]["shortNames"]),
                        categories: strings(&spec["names"]["categories"]),
                        schema: Schema::Custom,
                        printer_columns: printer_columns(v),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The catalogue as served at one moment: built-ins plus the custom resources of the given CRDs.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    resources: Vec<ResourceInfo>,
}

impl Catalogue {
    pub fn build<'a>(crds: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut resources = built_ins();
        for crd in crds {
            for info in from_crd(crd) {
                let clashes = resources.iter().any(|r| {
                    r.group == info.group && r.version == info.version && r.plural == info.plural
                });
                if !clashes {
                    resources.push(info);
                }
            }
        }
        Self { resources }
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceInfo> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    pub fn all(&self) -> &[ResourceInfo] {
        &self.resources
    }

    /// Served (group, versions) pairs, groups in first-seen order with the core group first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in &self.resources {
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, versions)) => {
                    if !versions.contains(&r.version) {
                        versions.push(r.version.clone());
                    }
                }
                None => out.push((r.group.clone(), vec![r.version.clone()])),
            }
        }
        out
    }
}

/// A stored object as `api_version` shows it. Custom resources are stored once for all their
/// versions (only `apiVersion` changes); core Events read through events.k8s.io are converted.
pub fn view<'a>(obj: &'a Value, api_version: &str) -> Cow<'a, Value> {
    if obj["apiVersion"].as_str() == Some(api_version) {
        Cow::Borrowed(obj)
    } else if api_version == super::events::EVENTS_API_VERSION && obj["kind"] == "Event" {
        Cow::Owned(super::events::to_events(obj))
    } else {
        let mut o = obj.clone();
        o["apiVersion"] = Value::String(api_version.to_owned());
        Cow::Owned(o)
    }
}

/// An object's stored text `json` as `api_version` shows it (see [`view`]): the stored text
/// itself when the versions agree, so reads pay no encoding.
pub fn text_as<'a>(obj: &Value, json: &'a str, api_version: &str) -> Cow<'a, str> {
    match view(obj, api_version) {
        Cow::Borrowed(_) => Cow::Borrowed(json),
        Cow::Owned(o) => Cow::Owned(o.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_crd(scope: &str, with_status: bool) -> Value {
        let mut version = json!({"name": "v1", "served": true, "storage": true});
        if with_status {
            version["subresources"] = json!({"status": {}});
        }
        json!({
            "spec": {
                "group": "berth.dev", "scope": scope,
                "names": {"plural": "ippools", "kind": "IPPool", "shortNames": ["ipp"]},
                "versions": [version, {"name": "v0", "served": false}]
            }
        })
    }

    #[test]
    fn pods_and_services_are_in_the_category_all() {
        let all: Vec<String> = built_ins()
            .into_iter()
            .filter(|r| r.categories.contains(&"all".to_owned()))
            .map(|r| r.plural)
            .collect();
        assert_eq!(all, ["services", "pods", "deployments", "replicasets"]);
    }

    #[test]
    fn crd_versions_become_resources() {
        let infos = from_crd(&mk_crd("Cluster", true));
        assert_eq!(infos.len(), 1, "unserved versions are not served");
        assert!(!infos[0].namespaced);
        assert!(infos[0].status_subresource);
        assert_eq!(infos[0].singular, "ippool");
        assert_eq!(infos[0].short_names, vec!["ipp"]);
        assert_eq!(infos[0].api_version(), "berth.dev/v1");
    }

    #[test]
    fn namespaced_crd_without_status() {
        let infos = from_crd(&mk_crd("Namespaced", false));
        assert!(infos[0].namespaced);
        assert!(!infos[0].status_subresource);
    }

    #[test]
    fn malformed_crd_is_ignored() {
        assert!(from_crd(&json!({"spec": {}})).is_empty());
    }

    #[test]
    fn catalogue_finds_builtins_and_custom() {
        let crd = mk_crd("Namespaced", true);
        let cat = Catalogue::build([&crd]);
        assert!(cat.find("", "v1", "services").is_some());
        let cidrs = cat.find("networking.k8s.io", "v1", "servicecidrs").unwrap();
        assert_eq!(
            (
                cidrs.kind.as_str(),
                cidrs.namespaced,
                cidrs.status_subresource
            ),
            ("ServiceCIDR", false, true)
        );
        assert!(cat.find("berth.dev", "v1", "ippools").is_some());
        assert!(cat.find("berth.dev", "v0", "ippools").is_none());
        let groups = cat.groups();
        assert_eq!(groups[0].0, "");
        assert!(groups
            .iter()
            .any(|(g, v)| g == "berth.dev" && v == &vec!["v1".to_owned()]));
    }

    #[test]
    fn crd_cannot_shadow_builtin() {
        let crd = json!({"spec": {"group": "", "names": {"plural": "services", "kind": "Fake"},
            "versions": [{"name": "v1", "served": true}]}});
        let cat = Catalogue::build([&crd]);
        assert_eq!(
            cat.find("", "v1", "services").map(|r| r.kind.as_str()),
            Some("Service")
        );
    }
}
