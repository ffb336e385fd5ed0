//! Topology hints on EndpointSlice endpoints, as kube-controller-manager writes them for a
//! Service's `spec.trafficDistribution` (`k8s.io/endpointslice/trafficdist`).

use k8s_openapi::api::discovery::v1::{EndpointHints, ForNode, ForZone};

use crate::{ANNOTATION_TOPOLOGY_AWARE_HINTS, ANNOTATION_TOPOLOGY_MODE};

/// Which hints a Service's endpoints get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Distribution {
    /// No hints (and any that were written are removed).
    None,
    /// `forZones`: the endpoint's own zone (`PreferSameZone`, and `PreferClose`, its older name).
    SameZone,
    /// `forNodes`: the endpoint's own node, and `forZones` as for `SameZone` (`PreferSameNode`).
    SameNode,
}

impl Distribution {
    /// From `spec.trafficDistribution` and the topology annotations. Unknown values give no
    /// hints, as upstream's default heuristic. A `topology-mode` annotation (other than
    /// `Disabled`) hands the Service upstream to its topology cache (hints in proportion to each
    /// zone's CPUs), which ignores `trafficDistribution`; berth has no such cache and writes none.
    pub(crate) fn of(
        traffic_distribution: Option<&str>,
        annotation: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let topology_mode = annotation(ANNOTATION_TOPOLOGY_MODE)
            .or_else(|| annotation(ANNOTATION_TOPOLOGY_AWARE_HINTS))
            .unwrap_or_default();
        if !matches!(topology_mode.as_str(), "" | "disabled" | "Disabled") {
            return Distribution::None;
        }
        match traffic_distribution {
            Some("PreferClose" | "PreferSameZone") => Distribution::SameZone,
            Some("PreferSameNode") => Distribution::SameNode,
            _ => Distribution::None,
        }
    }

    /// The hints of an endpoint on `node` in `zone`; `None` when there is nothing to say.
    pub(crate) fn hints(self, node: Option<&str>, zone: Option<&str>) -> Option<EndpointHints> {
        let given = |name: Option<&str>| name.filter(|n| !n.is_empty()).map(str::to_owned);
        let for_zones = match self {
            Distribution::None => None,
            Distribution::SameZone | Distribution::SameNode => {
                given(zone).map(|name| vec![ForZone { name }])
            }
        };
        let for_nodes = match self {
            Distribution::SameNode => given(node).map(|name| vec![ForNode { name }]),
            Distribution::None | Distribution::SameZone => None,
        };
        (for_zones.is_some() || for_nodes.is_some()).then_some(EndpointHints {
            for_nodes,
            for_zones,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones(hints: &Option<EndpointHints>) -> Vec<String> {
        let zones = hints.as_ref().and_then(|h| h.for_zones.clone());
        zones.into_iter().flatten().map(|z| z.name).collect()
    }

    fn nodes(hints: &Option<EndpointHints>) -> Vec<String> {
        let nodes = hints.as_ref().and_then(|h| h.for_nodes.clone());
        nodes.into_iter().flatten().map(|n| n.name).collect()
    }

    #[test]
    fn distribution_from_the_spec_and_annotations() {
        let none = |_: &str| None;
        let auto = |key: &str| (key == ANNOTATION_TOPOLOGY_MODE).then(|| "Auto".to_owned());
        let old = |key: &str| (key == ANNOTATION_TOPOLOGY_AWARE_HINTS).then(|| "auto".to_owned());
        let off = |key: &str| (key == ANNOTATION_TOPOLOGY_MODE).then(|| "Disabled".to_owned());
        type Annotations<'a> = &'a dyn Fn(&str) -> Option<String>;
        let rows: [(Option<&str>, Annotations, Distribution); 9] = [
            (None, &none, Distribution::None),
            (Some("PreferClose"), &none, Distribution::SameZone),
            (Some("PreferSameZone"), &none, Distribution::SameZone),
            (Some("PreferSameNode"), &none, Distribution::SameNode),
            (Some("PreferSomewhere"), &none, Distribution::None),
            (Some("preferclose"), &none, Distribution::None),
            (Some("PreferSameZone"), &auto, Distribution::None),
            (Some("PreferSameNode"), &old, Distribution::None),
            (Some("PreferSameZone"), &off, Distribution::SameZone),
        ];
        for (spec, annotation, want) in rows {
            assert_eq!(Distribution::of(spec, annotation), want, "{spec:?}");
        }
    }

    #[test]
    fn hints_name_the_endpoints_own_zone_and_node() {
        let (n, z) = (Some("node-1"), Some("zone-a"));
        let rows = [
            (Distribution::None, n, z, vec![], vec![]),
            (Distribution::SameZone, n, z, vec!["zone-a"], vec![]),
            (Distribution::SameZone, n, None, vec![], vec![]),
            (Distribution::SameZone, n, Some(""), vec![], vec![]),
            (Distribution::SameNode, n, z, vec!["zone-a"], vec!["node-1"]),
            (Distribution::SameNode, n, None, vec![], vec!["node-1"]),
            (Distribution::SameNode, None, z, vec!["zone-a"], vec![]),
            (Distribution::SameNode, None, None, vec![], vec![]),
        ];
        for (dist, node, zone, want_zones, want_nodes) in rows {
            let hints = dist.hints(node, zone);
            assert_eq!(zones(&hints), want_zones, "{dist:?} {node:?} {zone:?}");
            assert_eq!(nodes(&hints), want_nodes, "{dist:?} {node:?} {zone:?}");
            if want_zones.is_empty() && want_nodes.is_empty() {
                assert!(hints.is_none(), "no empty hints object");
            }
        }
    }
}
