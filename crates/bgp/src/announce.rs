//! Which prefixes this node announces: a pure function of the node's own state, the Services'
//! LoadBalancer IPs and endpoints, the IPPools and the BGPAdvertisements. Every node decides for
//! itself, so there is no election: the router spreads traffic over all announcing nodes (ECMP).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use berth_api::BGPAdvertisementSpec;
use berth_core::AddressRange;
use ipnet::IpNet;

/// What decides whether this node may announce at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Ready, not being deleted, not labelled `node.kubernetes.io/exclude-from-external-load-balancers`.
    pub eligible: bool,
}

/// An IPPool as the announcer needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ranges: Vec<AddressRange>,
}

/// A LoadBalancer Service as the announcer needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFacts {
    /// `namespace/name`.
    pub key: String,
    /// The LoadBalancer ingress IPs (`ipMode: VIP`).
    pub ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`.
    pub local_policy: bool,
    /// A ready endpoint of the Service runs on this node.
    pub local_ready_endpoint: bool,
}

/// Why a prefix is announced: the Services and advertisements behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Announcement {
    pub services: BTreeSet<String>,
    pub advertisements: BTreeSet<String>,
}

/// The prefixes this node announces, each with its reasons.
///
/// - Nothing when the node is not eligible.
/// - An IP is announced when an IPPool contains it and an advertisement selects that pool and
///   this node; IPs outside every pool are never announced.
/// - `externalTrafficPolicy: Local` Services only from nodes with a ready local endpoint, so the
///   router never sends their traffic to a node that would drop it.
/// - The prefix is the IP widened to the advertisement's aggregation length (32 / 128 by
///   default); one IP can yield several prefixes when advertisements aggregate differently.
/// - An IP shared by several Services is announced when any of them qualifies.
pub fn compute_announcements(
    node: &NodeState,
    services: &[ServiceFacts],
    pools: &[PoolFacts],
    advertisements: &[(String, BGPAdvertisementSpec)],
) -> BTreeMap<IpNet, Announcement> {
    let mut out: BTreeMap<IpNet, Announcement> = BTreeMap::new();
    if !node.eligible {
        return out;
    }
    let mine: Vec<&(String, BGPAdvertisementSpec)> = advertisements
        .iter()
        .filter(|(_, adv)| adv.validate().is_ok() && adv.selects_node(&node.labels))
        .collect();
    for service in services {
        if service.local_policy && !service.local_ready_endpoint {
            continue;
        }
        for ip in &service.ips {
            let Some(pool) = pools
                .iter()
                .find(|p| p.ranges.iter().any(|r| r.contains(*ip)))
            else {
                continue;
            };
            for (name, adv) in &mine {
                if !adv.selects_pool(&pool.name, &pool.labels) {
                    continue;
                }
                let Some(prefix) = aggregate(*ip, adv) else {
                    continue;
                };
                let entry = out.entry(prefix).or_default();
                entry.services.insert(service.key.clone());
                entry.advertisements.insert(name.clone());
            }
        }
    }
    out
}

/// `ip` widened to the advertisement's aggregation length for its family.
pub fn aggregate(ip: IpAddr, adv: &BGPAdvertisementSpec) -> Option<IpNet> {
    let len = match ip {
        IpAddr::V4(_) => adv.aggregation_length.unwrap_or(32),
        IpAddr::V6(_) => adv.aggregation_length_v6.unwrap_or(128),
    };
    IpNet::new(ip, len).ok().map(|net| net.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::parse_address;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn mk_node(eligible: bool, labels: &[(&str, &str)]) -> NodeState {
        NodeState {
            name: "node1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            eligible,
        }
    }

    fn mk_pool(name: &str, addresses: &[&str]) -> PoolFacts {
        PoolFacts {
            name: name.into(),
            labels: BTreeMap::new(),
            ranges: addresses
                .iter()
                .map(|a| parse_address(a).expect("test address"))
                .collect(),
        }
    }

    fn mk_service(key: &str, ips: &[&str], local: bool, ready: bool) -> ServiceFacts {
        ServiceFacts {
            key: key.into(),
            ips: ips.iter().map(|ip| ip.parse().expect("test ip")).collect(),
            local_policy: local,
            local_ready_endpoint: ready,
        }
    }

    fn mk_adv(pools: &[&str]) -> BGPAdvertisementSpec {
        BGPAdvertisementSpec {
            ip_pools: pools.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        }
    }

    fn prefixes(out: &BTreeMap<IpNet, Announcement>) -> Vec<String> {
        out.keys().map(ToString::to_string).collect()
    }

    fn pools() -> Vec<PoolFacts> {
        vec![
            mk_pool("bgp", &["198.19.10.0/24", "fd00:19:10::/120"]),
            mk_pool("l2", &["198.18.0.200-198.18.0.250"]),
        ]
    }

    /// One row per decision: (node eligible, service, advertisement) -> announced prefixes.
    #[test]
    fn decisions() {
        let cluster = mk_service("a/cluster", &["198.19.10.5"], false, false);
        let local_ready = mk_service("a/local-ready", &["198.19.10.6"], true, true);
        let local_none = mk_service("a/local-none", &["198.19.10.7"], true, false);
        let outside = mk_service("a/outside", &["203.0.113.9"], false, false);
        let l2 = mk_service("a/l2", &["198.18.0.201"], false, false);
        let dual = mk_service("a/dual", &["198.19.10.8", "fd00:19:10::8"], false, false);
        let rows: Vec<(&str, bool, &ServiceFacts, BGPAdvertisementSpec, Vec<&str>)> = vec![
            (
                "cluster policy: every eligible node",
                true,
                &cluster,
                mk_adv(&["bgp"]),
                vec!["198.19.10.5/32"],
            ),
            (
                "ineligible node announces nothing",
                false,
                &cluster,
                mk_adv(&["bgp"]),
                vec![],
            ),
            (
                "local policy with a ready local endpoint",
                true,
                &local_ready,
                mk_adv(&["bgp"]),
                vec!["198.19.10.6/32"],
            ),
            (
                "local policy without one",
                true,
                &local_none,
                mk_adv(&["bgp"]),
                vec![],
            ),
            ("an IP in no pool", true, &outside, mk_adv(&[]), vec![]),
            (
                "a pool no advertisement selects",
                true,
                &l2,
                mk_adv(&["bgp"]),
                vec![],
            ),
            (
                "an empty pool list selects every pool",
                true,
                &l2,
                mk_adv(&[]),
                vec!["198.18.0.201/32"],
            ),
            (
                "both families",
                true,
                &dual,
                mk_adv(&["bgp"]),
                vec!["198.19.10.8/32", "fd00:19:10::8/128"],
            ),
            (
                "aggregation",
                true,
                &dual,
                BGPAdvertisementSpec {
                    aggregation_length: Some(24),
                    aggregation_length_v6: Some(120),
                    ..mk_adv(&["bgp"])
                },
                vec!["198.19.10.0/24", "fd00:19:10::/120"],
            ),
        ];
        for (what, eligible, service, adv, want) in rows {
            let out = compute_announcements(
                &mk_node(eligible, &[]),
                std::slice::from_ref(service),
                &pools(),
                &[("adv".into(), adv)],
            );
            assert_eq!(prefixes(&out), want, "{what}");
        }
    }

    #[test]
    fn node_selectors_choose_the_advertisement() {
        let adv = BGPAdvertisementSpec {
            node_selectors: vec![LabelSelector {
                match_labels: Some([("bgp".to_string(), "yes".to_string())].into()),
                ..Default::default()
            }],
            ..mk_adv(&["bgp"])
        };
        let service = mk_service("a/s", &["198.19.10.5"], false, false);
        let run = |labels: &[(&str, &str)]| {
            prefixes(&compute_announcements(
                &mk_node(true, labels),
                std::slice::from_ref(&service),
                &pools(),
                &[("adv".into(), adv.clone())],
            ))
        };
        assert_eq!(run(&[("bgp", "yes")]), ["198.19.10.5/32"]);
        assert!(run(&[("bgp", "no")]).is_empty());
    }

    #[test]
    fn shared_ips_and_reasons_are_merged() {
        let services = [
            mk_service("a/one", &["198.19.10.5"], true, false),
            mk_service("a/two", &["198.19.10.5"], false, false),
            mk_service("b/three", &["198.19.10.5"], false, false),
        ];
        let advs = [
            ("first".to_string(), mk_adv(&["bgp"])),
            ("second".to_string(), mk_adv(&[])),
            (
                "invalid".to_string(),
                BGPAdvertisementSpec {
                    communities: vec!["nonsense".into()],
                    ..mk_adv(&[])
                },
            ),
        ];
        let out = compute_announcements(&mk_node(true, &[]), &services, &pools(), &advs);
        let net: IpNet = "198.19.10.5/32".parse().expect("prefix");
        let why = &out[&net];
        assert_eq!(out.len(), 1);
        assert_eq!(
            why.services.iter().map(String::as_str).collect::<Vec<_>>(),
            ["a/two", "b/three"]
        );
        assert_eq!(
            why.advertisements
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["first", "second"]
        );
    }
}
