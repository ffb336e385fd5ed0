//! Which pools may serve a Service, in which order, and which pools collide with each other.

use std::collections::BTreeMap;

use crate::address::{parse_address, AddressRange};
use crate::ippool::{IPPoolSpec, ServiceAllocation};
use crate::selector::selector_matches;

impl IPPoolSpec {
    /// Whether a Service in `namespace` (whose Namespace carries `namespace_labels`) with
    /// `service_labels` may take an address from this pool. No `serviceAllocation` admits all.
    pub fn admits(
        &self,
        namespace: &str,
        namespace_labels: &BTreeMap<String, String>,
        service_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.service_allocation
            .as_ref()
            .is_none_or(|a| a.admits(namespace, namespace_labels, service_labels))
    }

    /// Priority for ordering pools: explicit priorities first (lower first), then the rest.
    pub fn priority_key(&self) -> (bool, i32) {
        match self.service_allocation.as_ref().and_then(|a| a.priority) {
            Some(priority) => (false, priority),
            None => (true, 0),
        }
    }
}

impl ServiceAllocation {
    /// The namespace restriction (listed names ORed with the namespace selector; neither set
    /// means any namespace) ANDed with the Service selector (unset means any Service).
    pub fn admits(
        &self,
        namespace: &str,
        namespace_labels: &BTreeMap<String, String>,
        service_labels: &BTreeMap<String, String>,
    ) -> bool {
        let restricted = !self.namespaces.is_empty() || self.namespace_selector.is_some();
        let namespace_ok = !restricted
            || self.namespaces.iter().any(|n| n == namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| selector_matches(s, namespace_labels));
        let service_ok = self
            .service_selector
            .as_ref()
            .is_none_or(|s| selector_matches(s, service_labels));
        namespace_ok && service_ok
    }
}

/// For each pool name, the other pools whose addresses overlap its own, for the `Overlapping`
/// condition. Pools whose addresses do not parse take no part; `validate` reports them.
pub fn overlapping_pools<'a>(
    pools: impl IntoIterator<Item = (&'a str, &'a IPPoolSpec)>,
) -> BTreeMap<&'a str, Vec<&'a str>> {
    let parsed: Vec<(&str, Vec<AddressRange>)> = pools
        .into_iter()
        .map(|(name, spec)| {
            let ranges = spec
                .addresses
                .iter()
                .filter_map(|a| parse_address(a).ok())
                .collect();
            (name, ranges)
        })
        .collect();
    let mut overlaps: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (i, (name, ranges)) in parsed.iter().enumerate() {
        for (other, other_ranges) in parsed.iter().skip(i + 1) {
            let hit = ranges
                .iter()
                .any(|r| other_ranges.iter().any(|o| r.overlaps(o)));
            if hit {
                overlaps.entry(name).or_default().push(other);
                overlaps.entry(other).or_default().push(name);
            }
        }
    }
    for others in overlaps.values_mut() {
        others.sort_unstable();
        others.dedup();
    }
    overlaps
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn mk_spec(addresses: &[&str]) -> IPPoolSpec {
        IPPoolSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            auto_assign: true,
            avoid_buggy_ips: false,
            service_allocation: None,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn mk_selector(key: &str, value: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(&[(key, value)])),
            match_expressions: None,
        }
    }

    #[test]
    fn admission() {
        let none = labels(&[]);
        let open = mk_spec(&["10.0.0.0/24"]);
        assert!(open.admits("any", &none, &none));

        let mut spec = mk_spec(&["10.0.0.0/24"]);
        spec.service_allocation = Some(ServiceAllocation {
            namespaces: vec!["edge".into()],
            namespace_selector: Some(mk_selector("team", "net")),
            service_selector: Some(mk_selector("pool", "ipv6")),
            ..Default::default()
        });
        let svc = labels(&[("pool", "ipv6")]);
        assert!(spec.admits("edge", &none, &svc));
        assert!(spec.admits("other", &labels(&[("team", "net")]), &svc));
        assert!(!spec.admits("other", &labels(&[("team", "web")]), &svc));
        assert!(
            !spec.admits("edge", &none, &none),
            "service selector is ANDed"
        );

        spec.service_allocation = Some(ServiceAllocation {
            service_selector: Some(mk_selector("pool", "ipv6")),
            ..Default::default()
        });
        assert!(
            spec.admits("anywhere", &none, &svc),
            "no namespace restriction"
        );

        spec.service_allocation = Some(ServiceAllocation {
            priority: Some(3),
            ..Default::default()
        });
        assert!(
            spec.admits("anywhere", &none, &none),
            "priority alone restricts nothing"
        );
    }

    #[test]
    fn priority_orders_explicit_before_unset() {
        let mut pools = [
            mk_spec(&["10.0.0.0/24"]),
            mk_spec(&["10.0.1.0/24"]),
            mk_spec(&["10.0.2.0/24"]),
        ];
        pools[1].service_allocation = Some(ServiceAllocation {
            priority: Some(20),
            ..Default::default()
        });
        pools[2].service_allocation = Some(ServiceAllocation {
            priority: Some(0),
            ..Default::default()
        });
        let mut keys: Vec<(bool, i32)> = pools.iter().map(IPPoolSpec::priority_key).collect();
        keys.sort();
        assert_eq!(keys, [(false, 0), (false, 20), (true, 0)]);
    }

    #[test]
    fn overlaps_between_pools() {
        let a = mk_spec(&["198.18.0.200-198.18.0.250"]);
        let b = mk_spec(&["198.18.0.0/24"]);
        let c = mk_spec(&["fd00::/120", "198.18.1.0/24"]);
        let d = mk_spec(&["fd00::ff-fd00::1ff", "bad"]);
        let overlaps = overlapping_pools([("a", &a), ("b", &b), ("c", &c), ("d", &d)]);
        assert_eq!(overlaps.get("a"), Some(&vec!["b"]));
        assert_eq!(overlaps.get("b"), Some(&vec!["a"]));
        assert_eq!(overlaps.get("c"), Some(&vec!["d"]));
        assert_eq!(overlaps.get("d"), Some(&vec!["c"]));
        let separate = overlapping_pools([("a", &a), ("c", &c)]);
        assert!(separate.is_empty());
    }
}
