//! The cluster's own addresses, which no IPPool may hand out: every Node's InternalIP and
//! ExternalIP, the service CIDRs, every Node's pod CIDRs, and what the administrator reserves
//! with `--reserved-addresses` (the LAN's gateway, DNS servers, a pod CIDR not on the Nodes).
//! A pool containing any of them keeps serving its other addresses; those are cut out of it
//! (never assigned, never announced), and the pool says so in its `OverlapsCluster` condition
//! and a Warning Event. Pure.

use std::collections::BTreeMap;
use std::net::IpAddr;

use berth_core::{parse_address, AddressRange};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

/// How many colliding addresses a pool's condition names before it only counts the rest.
const NAMED_COLLISIONS: usize = 8;

/// One address (or range) of the cluster's own and what it is, for the pool's condition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClusterAddress {
    pub range: AddressRange,
    /// e.g. `InternalIP of Node node-1`, `the service CIDR`.
    pub what: String,
}

fn of_net(net: &IpNet) -> Option<AddressRange> {
    let net = net.trunc();
    AddressRange::new(net.network(), net.broadcast())
}

fn of_ip(ip: IpAddr) -> Option<AddressRange> {
    AddressRange::new(ip, ip)
}

/// The cluster's own addresses, sorted: `nodes`' addresses and pod CIDRs, the service CIDRs
/// and the administrator's reserved ranges. A Node address or pod CIDR that does not parse
/// takes no part (the Node's owner sees it elsewhere).
pub fn build_cluster_addresses<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    service_cidrs: &[IpNet],
    reserved: &[AddressRange],
) -> Vec<ClusterAddress> {
    let mut out = Vec::new();
    for net in service_cidrs {
        if let Some(range) = of_net(net) {
            out.push(ClusterAddress {
                range,
                what: "the service CIDR".into(),
            });
        }
    }
    for range in reserved {
        out.push(ClusterAddress {
            range: *range,
            what: "reserved by --reserved-addresses".into(),
        });
    }
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten();
        for a in addresses {
            if !matches!(a.type_.as_str(), "InternalIP" | "ExternalIP") {
                continue;
            }
            if let Some(range) = a.address.trim().parse().ok().and_then(of_ip) {
                out.push(ClusterAddress {
                    range,
                    what: format!("{} of Node {name}", a.type_),
                });
            }
        }
        let spec = node.spec.as_ref();
        let pod_cidrs = spec
            .and_then(|s| s.pod_cidrs.clone())
            .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
            .unwrap_or_default();
        for cidr in pod_cidrs {
            if let Some(range) = cidr.trim().parse::<IpNet>().ok().and_then(|n| of_net(&n)) {
                out.push(ClusterAddress {
                    range,
                    what: format!("the pod CIDR of Node {name}"),
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The ranges alone, to cut out of every pool.
pub fn excluded_ranges(cluster: &[ClusterAddress]) -> Vec<AddressRange> {
    let mut ranges: Vec<AddressRange> = cluster.iter().map(|c| c.range).collect();
    ranges.dedup();
    ranges
}

/// For each pool (name, addresses) that contains some of the cluster's own addresses, the
/// message of its `OverlapsCluster` condition. Addresses that do not parse take no part
/// (the `Valid` condition reports them).
pub fn pool_collisions<'a, A: AsRef<str> + 'a>(
    pools: impl IntoIterator<Item = (&'a str, &'a [A])>,
    cluster: &[ClusterAddress],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, addresses) in pools {
        let ranges: Vec<AddressRange> = addresses
            .iter()
            .filter_map(|a| parse_address(a.as_ref()).ok())
            .collect();
        let hits: Vec<&ClusterAddress> = cluster
            .iter()
            .filter(|c| ranges.iter().any(|r| r.overlaps(&c.range)))
            .collect();
        if hits.is_empty() {
            continue;
        }
        let mut named: Vec<String> = hits
            .iter()
            .take(NAMED_COLLISIONS)
            .map(|c| format!("{} ({})", show(&c.range), c.what))
            .collect();
        if hits.len() > NAMED_COLLISIONS {
            named.push(format!("and {} more", hits.len() - NAMED_COLLISIONS));
        }
        out.insert(
            name.to_string(),
            format!(
                "addresses of the cluster's own are never assigned from this pool: {}",
                named.join(", ")
            ),
        );
    }
    out
}

/// A single address as itself, else as the range or CIDR it is.
fn show(range: &AddressRange) -> String {
    if range.start() == range.end() {
        range.start().to_string()
    } else {
        range.to_string()
    }
}

/// Whether `ip` is one of the cluster's own addresses.
pub fn is_cluster_address(cluster: &[ClusterAddress], ip: IpAddr) -> bool {
    cluster.iter().any(|c| c.range.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_node(name: &str, addresses: &[(&str, &str)], pod_cidrs: &[&str]) -> Node {
        let addresses: Vec<_> = addresses
            .iter()
            .map(|(t, a)| json!({"type": t, "address": a}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": pod_cidrs},
            "status": {"addresses": addresses}
        }))
        .unwrap()
    }

    fn r(text: &str) -> AddressRange {
        parse_address(text).unwrap()
    }

    fn lab_cluster() -> Vec<ClusterAddress> {
        let nodes = [
            mk_node(
                "node-1",
                &[
                    ("InternalIP", "198.18.0.11"),
                    ("Hostname", "node-1"),
                    ("ExternalIP", "fd00:18::11"),
                ],
                &["10.244.1.0/24"],
            ),
            mk_node(
                "node-2",
                &[("InternalIP", "198.18.0.12"), ("InternalIP", "not-an-ip")],
                &["10.244.2.0/24", "bad"],
            ),
        ];
        let service: Vec<IpNet> = vec!["10.96.0.0/16".parse().unwrap()];
        build_cluster_addresses(&nodes, &service, &[r("198.18.0.1/32")])
    }

    #[test]
    fn the_cluster_addresses_are_node_addresses_pod_and_service_cidrs_and_reserved_ones() {
        let got: Vec<(String, String)> = lab_cluster()
            .into_iter()
            .map(|c| (c.range.to_string(), c.what))
            .collect();
        let want = [
            ("10.96.0.0/16", "the service CIDR"),
            ("10.244.1.0/24", "the pod CIDR of Node node-1"),
            ("10.244.2.0/24", "the pod CIDR of Node node-2"),
            ("198.18.0.1/32", "reserved by --reserved-addresses"),
            ("198.18.0.11/32", "InternalIP of Node node-1"),
            ("198.18.0.12/32", "InternalIP of Node node-2"),
            ("fd00:18::11/128", "ExternalIP of Node node-1"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(got_sorted, want_sorted);
    }

    #[test]
    fn the_legacy_single_pod_cidr_counts_when_the_list_is_absent() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "old"}, "spec": {"podCIDR": "10.244.9.0/24"}
        }))
        .unwrap();
        let got = build_cluster_addresses([&node], &[], &[]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].range, r("10.244.9.0/24"));
    }

    #[test]
    fn pools_colliding_with_the_cluster_are_named_with_what_they_hit() {
        let cluster = lab_cluster();
        // (pool addresses, the message's list, or None when the pool is clear)
        let rows: &[(&[&str], Option<&str>)] = &[
            (&["198.18.0.200-198.18.0.250"], None),
            (
                &["198.18.0.0/24"],
                Some("198.18.0.1 (reserved by --reserved-addresses), 198.18.0.11 (InternalIP of Node node-1), 198.18.0.12 (InternalIP of Node node-2)"),
            ),
            (&["10.96.0.10/32"], Some("10.96.0.0/16 (the service CIDR)")),
            (
                &["10.244.0.0/16"],
                Some("10.244.1.0/24 (the pod CIDR of Node node-1), 10.244.2.0/24 (the pod CIDR of Node node-2)"),
            ),
            (&["fd00:18::/120"], Some("fd00:18::11 (ExternalIP of Node node-1)")),
            (&["fd00:19::/120"], None),
            (&["not-an-address"], None),
        ];
        for (addresses, want) in rows {
            let got = pool_collisions([("p", *addresses)], &cluster);
            let want = want.map(|w| {
                format!("addresses of the cluster's own are never assigned from this pool: {w}")
            });
            assert_eq!(got.get("p").cloned(), want, "{addresses:?}");
        }
    }

    #[test]
    fn a_long_list_of_collisions_is_cut_short() {
        let nodes: Vec<Node> = (1..=20)
            .map(|i| {
                mk_node(
                    &format!("n{i}"),
                    &[("InternalIP", &format!("198.18.0.{i}"))],
                    &[],
                )
            })
            .collect();
        let cluster = build_cluster_addresses(&nodes, &[], &[]);
        let got = pool_collisions([("p", &["198.18.0.0/24"][..])], &cluster);
        assert!(got["p"].ends_with(", and 12 more"), "{}", got["p"]);
    }

    #[test]
    fn membership() {
        let cluster = lab_cluster();
        assert!(is_cluster_address(&cluster, "198.18.0.11".parse().unwrap()));
        assert!(is_cluster_address(&cluster, "10.96.200.1".parse().unwrap()));
        assert!(!is_cluster_address(
            &cluster,
            "198.18.0.200".parse().unwrap()
        ));
    }
}
