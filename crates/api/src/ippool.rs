//! `IPPool`: a cluster-scoped set of addresses that LoadBalancer IPs are taken from.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use berth_core::{
    dns1123_label_problem, parse_address, AddressError, AddressRange, FieldErrors, IpFamily,
};

use crate::convert::validate_label_selector;
use crate::schema::{self, MAX_ADDRESSES, MAX_PRIORITY, MIN_PRIORITY};

/// Addresses for LoadBalancer Services, and which Services may use them.
// Printer columns repeat `type_ = ...`, which the lint mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "IPPool",
    status = "IPPoolStatus",
    derive = "PartialEq",
    shortname = "ipp",
    category = "berth",
    doc = "IPPool is a set of addresses from which berth assigns LoadBalancer IPs.",
    printcolumn(name = "Addresses", type_ = "string", json_path = ".spec.addresses"),
    printcolumn(
        name = "Auto Assign",
        type_ = "boolean",
        json_path = ".spec.autoAssign"
    ),
    printcolumn(
        name = "Assigned (v4)",
        type_ = "integer",
        json_path = ".status.assignedIPv4"
    ),
    printcolumn(
        name = "Available (v4)",
        type_ = "integer",
        json_path = ".status.availableIPv4"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolSpec {
    /// CIDRs (`198.18.0.0/24`, `fd00::/120`) and inclusive ranges (`198.18.0.200-198.18.0.250`),
    /// IPv4 and IPv6. Entries must not overlap each other.
    #[schemars(schema_with = "schema::addresses")]
    pub addresses: Vec<String>,
    /// Whether Services that name no pool may get addresses from this one.
    #[serde(default = "default_true")]
    pub auto_assign: bool,
    /// Skip IPv4 addresses ending in .0 and .255, which some clients mistake for network or
    /// broadcast addresses.
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Which Services this pool serves, and before which other pools. Unset: every Service,
    /// after the pools that set a priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocation>,
}

fn default_true() -> bool {
    true
}

/// Restricts a pool to some Services, and orders it among pools.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAllocation {
    /// Lower numbers are tried first; pools without a priority come after all that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_PRIORITY, max = MAX_PRIORITY))]
    pub priority: Option<i32>,
    /// Namespaces whose Services may use the pool (ORed with namespaceSelector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::namespaces")]
    pub namespaces: Vec<String>,
    /// Namespaces, by label, whose Services may use the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::atomic_selector)]
    pub namespace_selector: Option<LabelSelector>,
    /// Services, by label, that may use the pool (ANDed with the namespace restriction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::atomic_selector)]
    pub service_selector: Option<LabelSelector>,
}

/// Usage of the pool, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct IPPoolStatus {
    /// IPv4 addresses held by Services.
    #[serde(default, rename = "assignedIPv4")]
    #[schemars(range(min = 0))]
    pub assigned_ipv4: i64,
    /// IPv4 addresses still free (after avoidBuggyIPs). At most 2^32, so an integer always fits.
    #[serde(default, rename = "availableIPv4")]
    #[schemars(range(min = 0))]
    pub available_ipv4: i64,
    /// IPv6 addresses held by Services.
    #[serde(default, rename = "assignedIPv6")]
    #[schemars(range(min = 0))]
    pub assigned_ipv6: i64,
    /// IPv6 addresses still free, as an exact decimal string: one /64 alone holds 2^64
    /// addresses, more than a Kubernetes integer (int64) can carry.
    #[serde(default = "zero_string", rename = "availableIPv6")]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]*)$"))]
    pub available_ipv6: String,
    /// `Overlapping` (this pool shares addresses with another) and `Valid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::conditions_map)]
    pub conditions: Vec<Condition>,
}

fn zero_string() -> String {
    "0".to_string()
}

impl Default for IPPoolStatus {
    fn default() -> Self {
        Self::from_counts(0, 0, 0, 0)
    }
}

impl IPPoolStatus {
    /// A status from counts. IPv6 availability is exact up to `u128::MAX`, which only `::/0`
    /// (2^128 addresses) exceeds, by one.
    pub fn from_counts(
        assigned_ipv4: u32,
        available_ipv4: u64,
        assigned_ipv6: u64,
        available_ipv6: u128,
    ) -> Self {
        Self {
            assigned_ipv4: i64::from(assigned_ipv4),
            available_ipv4: i64::try_from(available_ipv4).unwrap_or(i64::MAX),
            assigned_ipv6: i64::try_from(assigned_ipv6).unwrap_or(i64::MAX),
            available_ipv6: available_ipv6.to_string(),
            conditions: Vec::new(),
        }
    }
}

impl IPPoolSpec {
    /// Every problem in the spec, with `spec.`-rooted paths. The controller runs this on every
    /// pool because an apiserver without CEL (or an old CRD) may have let anything in.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = FieldErrors::default();
        if self.addresses.is_empty() {
            errors.push("spec.addresses", None, "must have at least 1 item");
        }
        if self.addresses.len() > MAX_ADDRESSES {
            errors.push(
                "spec.addresses",
                None,
                format!("must have at most {MAX_ADDRESSES} items"),
            );
        }
        let mut seen: Vec<(usize, AddressRange)> = Vec::new();
        for (i, address) in self.addresses.iter().enumerate() {
            let path = format!("spec.addresses[{i}]");
            match parse_address(address) {
                Ok(range) => {
                    if let Some((j, _)) = seen.iter().find(|(_, r)| r.overlaps(&range)) {
                        let reason = if self.addresses[*j] == *address {
                            format!("duplicate of spec.addresses[{j}]")
                        } else {
                            format!("overlaps spec.addresses[{j}] ({})", self.addresses[*j])
                        };
                        errors.push(path, Some(address), reason);
                    }
                    seen.push((i, range));
                }
                Err(AddressError { problem, .. }) => {
                    errors.push(path, Some(address), problem.to_string());
                }
            }
        }
        if let Some(allocation) = &self.service_allocation {
            allocation.validate("spec.serviceAllocation", &mut errors);
        }
        errors.into_result()
    }

    /// The parsed address ranges, in spec order; the first invalid entry is an error.
    pub fn ranges(&self) -> Result<Vec<AddressRange>, AddressError> {
        self.addresses.iter().map(|a| parse_address(a)).collect()
    }

    /// The address families the pool can serve.
    pub fn families(&self) -> Vec<IpFamily> {
        let mut families: Vec<IpFamily> = self
            .addresses
            .iter()
            .filter_map(|a| parse_address(a).ok())
            .map(|r| r.family())
            .collect();
        families.sort();
        families.dedup();
        families
    }
}

impl ServiceAllocation {
    fn validate(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(priority) = self.priority {
            if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&priority) {
                errors.push(
                    format!("{path}.priority"),
                    Some(&priority.to_string()),
                    format!("must be between {MIN_PRIORITY} and {MAX_PRIORITY}, inclusive"),
                );
            }
        }
        let mut seen = BTreeMap::new();
        for (i, namespace) in self.namespaces.iter().enumerate() {
            let at = format!("{path}.namespaces[{i}]");
            if let Some(problem) = dns1123_label_problem(namespace) {
                errors.push(at, Some(namespace), problem);
            } else if let Some(j) = seen.insert(namespace.as_str(), i) {
                errors.push(
                    at,
                    Some(namespace),
                    format!("duplicate of {path}.namespaces[{j}]"),
                );
            }
        }
        if let Some(selector) = &self.namespace_selector {
            validate_label_selector(selector, &format!("{path}.namespaceSelector"), errors);
        }
        if let Some(selector) = &self.service_selector {
            validate_label_selector(selector, &format!("{path}.serviceSelector"), errors);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn mk_spec(addresses: &[&str]) -> IPPoolSpec {
        IPPoolSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            auto_assign: true,
            avoid_buggy_ips: false,
            service_allocation: None,
        }
    }

    fn problems(spec: &IPPoolSpec) -> Vec<(String, String)> {
        match spec.validate() {
            Ok(()) => Vec::new(),
            Err(errors) => errors
                .iter()
                .map(|e| (e.path.clone(), e.detail()))
                .collect(),
        }
    }

    #[test]
    fn good_pools_validate() {
        for addresses in [
            vec!["198.18.0.200-198.18.0.250"],
            vec!["198.18.0.0/24", "fd00::/120"],
            vec![
                "10.0.0.0/24",
                "10.0.1.0-10.0.1.9",
                "2001:db8::1-2001:db8::ff",
            ],
        ] {
            assert_eq!(problems(&mk_spec(&addresses)), vec![], "{addresses:?}");
        }
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let spec = mk_spec(&[
            "198.18.0.9-198.18.0.1",
            "nonsense",
            "10.0.0.0/24",
            "10.0.0.128/25",
            "10.0.0.0/24",
            "fd00::1/64",
            "10.0.0.1-fd00::1",
        ]);
        let paths: Vec<String> = problems(&spec).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "spec.addresses[0]",
                "spec.addresses[1]",
                "spec.addresses[3]",
                "spec.addresses[4]",
                "spec.addresses[5]",
                "spec.addresses[6]",
            ]
        );
        let reasons: Vec<String> = problems(&spec).into_iter().map(|(_, r)| r).collect();
        assert!(
            reasons[0].contains("greater than the last"),
            "{}",
            reasons[0]
        );
        assert!(
            reasons[2].contains("overlaps spec.addresses[2] (10.0.0.0/24)"),
            "{}",
            reasons[2]
        );
        assert_eq!(reasons[3], "duplicate of spec.addresses[2]");
        assert!(reasons[4].contains("fd00::/64"), "{}", reasons[4]);
        assert!(reasons[5].contains("same IP family"), "{}", reasons[5]);
    }

    #[test]
    fn same_addresses_in_two_families_do_not_overlap() {
        assert!(mk_spec(&["0.0.0.0/0", "::/0"]).validate().is_ok());
    }

    #[test]
    fn address_count_is_bounded() {
        assert_eq!(
            problems(&mk_spec(&[])),
            vec![("spec.addresses".into(), "must have at least 1 item".into())]
        );
        let many: Vec<String> = (0..=MAX_ADDRESSES)
            .map(|i| format!("10.0.{}.{}/32", i / 256, i % 256))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            problems(&mk_spec(&refs)),
            vec![(
                "spec.addresses".into(),
                format!("must have at most {MAX_ADDRESSES} items")
            )]
        );
    }

    #[test]
    fn service_allocation_is_checked() {
        let mut spec = mk_spec(&["198.18.0.0/24"]);
        spec.service_allocation = Some(ServiceAllocation {
            priority: Some(MAX_PRIORITY + 1),
            namespaces: vec!["default".into(), "Bad_NS".into(), "default".into()],
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "team".into(),
                    operator: "In".into(),
                    values: None,
                }]),
                match_labels: None,
            }),
            service_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "Matches".into(),
                    values: None,
                }]),
                match_labels: None,
            }),
        });
        let paths: Vec<String> = problems(&spec).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "spec.serviceAllocation.priority",
                "spec.serviceAllocation.namespaces[1]",
                "spec.serviceAllocation.namespaces[2]",
                "spec.serviceAllocation.namespaceSelector.matchExpressions[0].values",
                "spec.serviceAllocation.serviceSelector.matchExpressions[0].operator",
            ]
        );
        spec.service_allocation = Some(ServiceAllocation {
            priority: Some(MIN_PRIORITY - 1),
            ..Default::default()
        });
        assert_eq!(problems(&spec).len(), 1);
        for priority in [MIN_PRIORITY, 50, MAX_PRIORITY] {
            spec.service_allocation = Some(ServiceAllocation {
                priority: Some(priority),
                ..Default::default()
            });
            assert!(spec.validate().is_ok(), "{priority}");
        }
    }

    #[test]
    fn defaults_apply_when_fields_are_absent() {
        let spec: IPPoolSpec =
            serde_json::from_value(serde_json::json!({"addresses": ["10.0.0.0/24"]})).unwrap();
        assert!(spec.auto_assign);
        assert!(!spec.avoid_buggy_ips);
        assert_eq!(spec.service_allocation, None);
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"addresses": ["10.0.0.0/24"], "autoAssign": true, "avoidBuggyIPs": false})
        );
    }

    #[test]
    fn ranges_and_families() {
        let spec = mk_spec(&["fd00::/120", "10.0.0.0/30", "10.0.1.0/30"]);
        assert_eq!(spec.families(), [IpFamily::V4, IpFamily::V6]);
        let ranges = spec.ranges().unwrap();
        assert_eq!(ranges.len(), 3);
        assert_eq!(ranges[1].len(), 4);
        assert!(mk_spec(&["bad"]).ranges().is_err());
    }

    #[test]
    fn status_counts_render_exactly() {
        let status = IPPoolStatus::from_counts(3, 48, 1, 1 << 64);
        assert_eq!(status.available_ipv6, "18446744073709551616");
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"assignedIPv4": 3, "availableIPv4": 48, "assignedIPv6": 1, "availableIPv6": "18446744073709551616"})
        );
        let all = IPPoolStatus::from_counts(0, 1 << 32, 0, u128::MAX);
        assert_eq!(
            all.available_ipv6,
            "340282366920938463463374607431768211455"
        );
        assert_eq!(all.available_ipv4, 1 << 32);
        let parsed: IPPoolStatus = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(parsed, IPPoolStatus::default());
        assert_eq!(parsed.available_ipv6, "0");
    }
}
