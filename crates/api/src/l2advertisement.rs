//! `L2Advertisement`: which pools are announced over ARP, from which nodes and interfaces.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use berth_core::{dns1123_subdomain_problem, interface_name_problem, FieldErrors};

use crate::convert::{selector_matches, validate_label_selector};
use crate::schema::{self, MAX_INTERFACES};

/// Announces the addresses of the selected pools from the selected nodes. Every list is ORed
/// within itself; an empty list selects everything (all pools, all nodes, all interfaces).
// Printer columns repeat `type_ = ...`, which the lint mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "L2Advertisement",
    derive = "PartialEq",
    shortname = "l2adv",
    category = "berth",
    doc = "L2Advertisement makes the addresses of some IPPools reachable over ARP from some nodes.",
    printcolumn(name = "IP Pools", type_ = "string", json_path = ".spec.ipPools"),
    printcolumn(name = "Interfaces", type_ = "string", json_path = ".spec.interfaces"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct L2AdvertisementSpec {
    /// IPPools by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::pool_names")]
    pub ip_pools: Vec<String>,
    /// IPPools by label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic_selector_list)]
    pub ip_pool_selectors: Vec<LabelSelector>,
    /// Nodes that may announce, by label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic_selector_list)]
    pub node_selectors: Vec<LabelSelector>,
    /// Node interfaces to answer ARP on, by name (at most 15 characters each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::interfaces")]
    pub interfaces: Vec<String>,
}

impl L2AdvertisementSpec {
    /// Every problem in the spec, with `spec.`-rooted paths.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = FieldErrors::default();
        check_names(
            &self.ip_pools,
            "spec.ipPools",
            dns1123_subdomain_problem,
            &mut errors,
        );
        for (i, selector) in self.ip_pool_selectors.iter().enumerate() {
            validate_label_selector(selector, &format!("spec.ipPoolSelectors[{i}]"), &mut errors);
        }
        for (i, selector) in self.node_selectors.iter().enumerate() {
            validate_label_selector(selector, &format!("spec.nodeSelectors[{i}]"), &mut errors);
        }
        if self.interfaces.len() > MAX_INTERFACES {
            errors.push(
                "spec.interfaces",
                None,
                format!("must have at most {MAX_INTERFACES} items"),
            );
        }
        check_names(
            &self.interfaces,
            "spec.interfaces",
            interface_name_problem,
            &mut errors,
        );
        errors.into_result()
    }

    /// Whether the pool named `pool`, with labels `labels`, is announced by this advertisement.
    /// Selectors must have passed [`validate`](Self::validate); an invalid one matches nothing.
    pub fn selects_pool(&self, pool: &str, labels: &BTreeMap<String, String>) -> bool {
        if self.ip_pools.is_empty() && self.ip_pool_selectors.is_empty() {
            return true;
        }
        self.ip_pools.iter().any(|p| p == pool)
            || self
                .ip_pool_selectors
                .iter()
                .any(|s| selector_matches(s, labels))
    }

    /// Whether a node with labels `labels` may announce for this advertisement.
    pub fn selects_node(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selectors.is_empty()
            || self
                .node_selectors
                .iter()
                .any(|s| selector_matches(s, labels))
    }

    /// Whether ARP may be answered on interface `name`.
    pub fn selects_interface(&self, name: &str) -> bool {
        self.interfaces.is_empty() || self.interfaces.iter().any(|i| i == name)
    }
}

fn check_names(
    names: &[String],
    path: &str,
    problem: fn(&str) -> Option<String>,
    errors: &mut FieldErrors,
) {
    let mut seen = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if let Some(problem) = problem(name) {
            errors.push(at, Some(name), problem);
        } else if let Some(j) = seen.insert(name.as_str(), i) {
            errors.push(at, Some(name), format!("duplicate of {path}[{j}]"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::tests::{labels, mk_selector};

    #[test]
    fn empty_spec_selects_everything() {
        let spec = L2AdvertisementSpec::default();
        assert!(spec.validate().is_ok());
        assert!(spec.selects_pool("any", &labels(&[])));
        assert!(spec.selects_node(&labels(&[("a", "b")])));
        assert!(spec.selects_interface("eth0"));
    }

    #[test]
    fn pools_by_name_or_label() {
        let spec = L2AdvertisementSpec {
            ip_pools: vec!["default".into()],
            ip_pool_selectors: vec![mk_selector(&[("env", "lab")], &[])],
            ..Default::default()
        };
        assert!(spec.selects_pool("default", &labels(&[])));
        assert!(spec.selects_pool("other", &labels(&[("env", "lab")])));
        assert!(!spec.selects_pool("other", &labels(&[("env", "prod")])));
    }

    #[test]
    fn nodes_and_interfaces() {
        let spec = L2AdvertisementSpec {
            node_selectors: vec![
                mk_selector(&[], &[("role", "In", &["edge", "gateway"])]),
                mk_selector(&[("zone", "a")], &[("disabled", "DoesNotExist", &[])]),
            ],
            interfaces: vec!["eth0".into()],
            ..Default::default()
        };
        assert!(spec.selects_node(&labels(&[("role", "edge")])));
        assert!(spec.selects_node(&labels(&[("zone", "a")])));
        assert!(!spec.selects_node(&labels(&[("zone", "a"), ("disabled", "")])));
        assert!(!spec.selects_node(&labels(&[("role", "worker")])));
        assert!(spec.selects_interface("eth0"));
        assert!(!spec.selects_interface("eth1"));
    }

    #[test]
    fn validation_reports_every_problem() {
        let spec = L2AdvertisementSpec {
            ip_pools: vec!["default".into(), "Bad Pool".into(), "default".into()],
            ip_pool_selectors: vec![mk_selector(&[], &[("x", "In", &[])])],
            node_selectors: vec![
                mk_selector(&[], &[]),
                mk_selector(&[], &[("y", "Exists", &["z"])]),
            ],
            interfaces: vec![
                "eth0".into(),
                "a-very-long-interface".into(),
                "..".into(),
                "eth0".into(),
            ],
        };
        let paths: Vec<String> = spec
            .validate()
            .unwrap_err()
            .iter()
            .map(|e| e.path.clone())
            .collect();
        assert_eq!(
            paths,
            [
                "spec.ipPools[1]",
                "spec.ipPools[2]",
                "spec.ipPoolSelectors[0].matchExpressions[0].values",
                "spec.nodeSelectors[1].matchExpressions[0].values",
                "spec.interfaces[1]",
                "spec.interfaces[2]",
                "spec.interfaces[3]",
            ]
        );
    }

    #[test]
    fn interface_count_is_bounded() {
        let spec = L2AdvertisementSpec {
            interfaces: (0..=MAX_INTERFACES).map(|i| format!("eth{i}")).collect(),
            ..Default::default()
        };
        let errors = spec.validate().unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors.0[0].path, "spec.interfaces");
    }
}
