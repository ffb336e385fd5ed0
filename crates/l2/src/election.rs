//! Who answers for an address: pure election over the announcer's view.
//!
//! An IP's candidates are the live nodes that an `L2Advertisement` selecting one of the IP's
//! pools also selects, that are neither excluded nor `NetworkUnavailable` nor being deleted,
//! that have an interface to answer on, and — for each Service holding the IP that uses
//! `externalTrafficPolicy: Local` — that run one of its Ready endpoints. The owner is the candidate with
//! the smallest sha256(node + "#" + ip): every agent computes the same owner from the same view.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use berth_api::L2AdvertisementSpec;
use berth_core::AddressRange;
use sha2::{Digest, Sha256};

/// An IPPool as the announcer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ranges: Vec<AddressRange>,
}

impl Pool {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }
}

/// What the election needs to know of a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub labels: BTreeMap<String, String>,
    /// Labelled `node.kubernetes.io/exclude-from-external-load-balancers`.
    pub excluded: bool,
    /// Condition `NetworkUnavailable` is `True`.
    pub network_unavailable: bool,
    /// Has a `deletionTimestamp`.
    pub deleting: bool,
}

impl NodeFacts {
    fn eligible(&self) -> bool {
        !self.excluded && !self.network_unavailable && !self.deleting
    }
}

/// Interfaces a node answers on for one IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interfaces {
    /// An advertisement names no interface: every interface.
    Any,
    Named(BTreeSet<String>),
}

impl Interfaces {
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Interfaces::Any => true,
            Interfaces::Named(names) => names.contains(name),
        }
    }

    fn union(&mut self, other: &Interfaces) {
        match (&mut *self, other) {
            (Interfaces::Any, _) => {}
            (_, Interfaces::Any) => *self = Interfaces::Any,
            (Interfaces::Named(a), Interfaces::Named(b)) => a.extend(b.iter().cloned()),
        }
    }

    fn of(spec: &L2AdvertisementSpec) -> Interfaces {
        if spec.interfaces.is_empty() {
            Interfaces::Any
        } else {
            Interfaces::Named(spec.interfaces.iter().cloned().collect())
        }
    }

    /// Those of `self` that are up; `None` when none is.
    fn restrict_to(&self, up: &BTreeSet<String>) -> Option<Interfaces> {
        let names: BTreeSet<String> = match self {
            Interfaces::Any => up.clone(),
            Interfaces::Named(names) => names.intersection(up).cloned().collect(),
        };
        (!names.is_empty()).then_some(Interfaces::Named(names))
    }
}

/// The demand on one IP, merged over every Service that holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpDemand {
    /// `Some(nodes)` when a Service holding the IP uses `externalTrafficPolicy: Local`: only
    /// these nodes (with a Ready endpoint of every such Service) may answer. `None`: any node.
    pub endpoint_nodes: Option<BTreeSet<String>>,
}

/// Everything the election reads. `local` is the node computing; only its own interfaces can
/// be seen, so other nodes are assumed to have theirs up (a node whose LAN link is down drops
/// out of the live set instead).
#[derive(Debug, Clone, Copy)]
pub struct ElectionView<'a> {
    pub pools: &'a [Pool],
    pub advertisements: &'a [L2AdvertisementSpec],
    pub nodes: &'a BTreeMap<String, NodeFacts>,
    pub live: &'a BTreeSet<String>,
    pub local: &'a str,
    /// The local node's interfaces that are up.
    pub local_up: &'a BTreeSet<String>,
}

/// The outcome for one IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Election {
    /// The address lies in no IPPool: never answered.
    NotInPool,
    /// No L2Advertisement selects any of the address's pools.
    NotAdvertised,
    /// Advertised, but no node qualifies (none live, none selected, no local endpoint...).
    NoCandidate,
    Owner {
        node: String,
        /// Where the owner answers; for the local node only its interfaces that are up.
        interfaces: Interfaces,
    },
}

/// sha256(node + "#" + ip), the election's sort key.
pub fn election_key(node: &str, ip: IpAddr) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(node.as_bytes());
    hasher.update(b"#");
    hasher.update(ip.to_string().as_bytes());
    hasher.finalize().into()
}

impl ElectionView<'_> {
    /// Whether `ip` lies in any pool.
    pub fn in_pool(&self, ip: IpAddr) -> bool {
        self.pools.iter().any(|p| p.contains(ip))
    }

    /// The interfaces `node` may answer on for an IP in `pools`, before checking which are up;
    /// `None` when no advertisement selects both.
    fn advertised_interfaces(&self, pools: &[&Pool], node: &NodeFacts) -> Option<Interfaces> {
        let mut found: Option<Interfaces> = None;
        for adv in self.advertisements {
            let selects_pool = pools.iter().any(|p| adv.selects_pool(&p.name, &p.labels));
            if !selects_pool || !adv.selects_node(&node.labels) {
                continue;
            }
            let ifaces = Interfaces::of(adv);
            match &mut found {
                Some(acc) => acc.union(&ifaces),
                None => found = Some(ifaces),
            }
        }
        found
    }

    /// The pools holding `ip`, or why it is not elected at all.
    fn pools_of(&self, ip: IpAddr) -> Result<Vec<&Pool>, Election> {
        let pools: Vec<&Pool> = self.pools.iter().filter(|p| p.contains(ip)).collect();
        if pools.is_empty() {
            return Err(Election::NotInPool);
        }
        let advertised = self
            .advertisements
            .iter()
            .any(|adv| pools.iter().any(|p| adv.selects_pool(&p.name, &p.labels)));
        if !advertised {
            return Err(Election::NotAdvertised);
        }
        Ok(pools)
    }

    /// Where `name` would answer if elected; `None` when it is not a candidate.
    fn candidate(
        &self,
        name: &str,
        facts: &NodeFacts,
        pools: &[&Pool],
        demand: &IpDemand,
    ) -> Option<Interfaces> {
        if !self.live.contains(name) || !facts.eligible() {
            return None;
        }
        if let Some(nodes) = &demand.endpoint_nodes {
            if !nodes.contains(name) {
                return None;
            }
        }
        let interfaces = self.advertised_interfaces(pools, facts)?;
        if name == self.local {
            return interfaces.restrict_to(self.local_up);
        }
        Some(interfaces)
    }

    /// Elects the owner of `ip`: every known node is weighed.
    pub fn elect(&self, ip: IpAddr, demand: &IpDemand) -> Election {
        let pools = match self.pools_of(ip) {
            Ok(pools) => pools,
            Err(outcome) => return outcome,
        };
        let mut best: Option<([u8; 32], &str, Interfaces)> = None;
        for (name, facts) in self.nodes {
            let Some(interfaces) = self.candidate(name, facts, &pools, demand) else {
                continue;
            };
            let key = election_key(name, ip);
            let better = match &best {
                None => true,
                Some((k, n, _)) => (key, name.as_str()) < (*k, *n),
            };
            if better {
                best = Some((key, name, interfaces));
            }
        }
        match best {
            Some((_, node, interfaces)) => Election::Owner {
                node: node.to_string(),
                interfaces,
            },
            None => Election::NoCandidate,
        }
    }

    /// Elects the owner of `ip` as [`elect`](Self::elect) does, trying first the nodes of
    /// `order`: the first known nodes in election order ([`ElectionOrder`]) over the current
    /// Nodes. The first candidate among them is the owner, since every node left out
    /// of `order` sorts after all of them; when none is a candidate, every node is weighed.
    pub fn elect_in_order(&self, ip: IpAddr, demand: &IpDemand, order: &ElectionOrder) -> Election {
        let pools = match self.pools_of(ip) {
            Ok(pools) => pools,
            Err(outcome) => return outcome,
        };
        for name in &order.nodes {
            let Some(facts) = self.nodes.get(name) else {
                continue;
            };
            if let Some(interfaces) = self.candidate(name, facts, &pools, demand) {
                return Election::Owner {
                    node: name.clone(),
                    interfaces,
                };
            }
        }
        self.elect(ip, demand)
    }
}

/// The first nodes for one address in election order: by [`election_key`], then name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionOrder {
    pub nodes: Vec<String>,
    /// `nodes` holds every known node.
    complete: bool,
    top: usize,
}

impl ElectionOrder {
    /// The first `top` of `nodes` for `ip`.
    pub fn new<'a>(nodes: impl Iterator<Item = &'a String>, ip: IpAddr, top: usize) -> Self {
        let mut keyed: Vec<([u8; 32], &String)> =
            nodes.map(|name| (election_key(name, ip), name)).collect();
        let complete = keyed.len() <= top;
        if !complete && top > 0 {
            keyed.select_nth_unstable(top - 1);
        }
        keyed.truncate(top);
        keyed.sort_unstable();
        ElectionOrder {
            nodes: keyed.into_iter().map(|(_, name)| name.clone()).collect(),
            complete,
            top,
        }
    }

    /// A node that just became known: kept when it sorts before the last one kept (or when
    /// every node is kept), so `nodes` stays the first nodes in election order.
    pub fn admit(&mut self, name: &str, ip: IpAddr) {
        let key = election_key(name, ip);
        let before = |other: &String| (key, name) < (election_key(other, ip), other.as_str());
        let belongs = self.complete || self.nodes.last().is_some_and(before);
        if !belongs || self.nodes.iter().any(|n| n == name) {
            return;
        }
        let at = self
            .nodes
            .iter()
            .position(before)
            .unwrap_or(self.nodes.len());
        self.nodes.insert(at, name.to_string());
        if self.nodes.len() > self.top {
            self.nodes.pop();
            self.complete = false;
        }
    }

    /// A node that is gone; false when nothing is left to try first and the order must be
    /// computed again.
    pub fn remove(&mut self, name: &str) -> bool {
        self.nodes.retain(|n| n != name);
        self.complete || !self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::parse_address;

    fn pool(name: &str, labels: &[(&str, &str)], addresses: &[&str]) -> Pool {
        Pool {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ranges: addresses
                .iter()
                .map(|a| parse_address(a).expect("test address"))
                .collect(),
        }
    }

    fn node(labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..NodeFacts::default()
        }
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    struct Fixture {
        pools: Vec<Pool>,
        advertisements: Vec<L2AdvertisementSpec>,
        nodes: BTreeMap<String, NodeFacts>,
        live: BTreeSet<String>,
        local: String,
        local_up: BTreeSet<String>,
    }

    impl Fixture {
        /// Three nodes, all live, one pool 198.18.0.200-250 advertised everywhere.
        fn new() -> Self {
            Fixture {
                pools: vec![pool("default", &[], &["198.18.0.200-198.18.0.250"])],
                advertisements: vec![L2AdvertisementSpec::default()],
                nodes: ["node-1", "node-2", "node-3"]
                    .iter()
                    .map(|n| (n.to_string(), node(&[("kubernetes.io/hostname", n)])))
                    .collect(),
                live: names(&["node-1", "node-2", "node-3"]),
                local: "node-1".into(),
                local_up: names(&["eth0"]),
            }
        }

        fn view(&self) -> ElectionView<'_> {
            ElectionView {
                pools: &self.pools,
                advertisements: &self.advertisements,
                nodes: &self.nodes,
                live: &self.live,
                local: &self.local,
                local_up: &self.local_up,
            }
        }

        fn owner(&self, ip: &str) -> Option<String> {
            match self
                .view()
                .elect(ip.parse().expect("ip"), &IpDemand::default())
            {
                Election::Owner { node, .. } => Some(node),
                _ => None,
            }
        }
    }

    /// The node with the smallest key among `candidates`, computed independently.
    fn expected(candidates: &[&str], ip: &str) -> String {
        let ip: IpAddr = ip.parse().expect("ip");
        candidates
            .iter()
            .min_by_key(|n| election_key(n, ip))
            .map(|n| n.to_string())
            .expect("candidates")
    }

    #[test]
    fn the_key_is_sha256_of_node_hash_ip() {
        // `printf 'node-1#198.18.0.200' | sha256sum`
        let key = election_key("node-1", "198.18.0.200".parse().expect("ip"));
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "7b68126f060da44c4a1f4eac6c28ff744a0f9f1e98a7719b5bbe9ea31c3954d7"
        );
    }

    #[test]
    fn owner_is_the_smallest_key_and_owners_spread() {
        let f = Fixture::new();
        let mut owners = BTreeSet::new();
        for last in 200..=250 {
            let ip = format!("198.18.0.{last}");
            let owner = f.owner(&ip).expect("an owner");
            assert_eq!(owner, expected(&["node-1", "node-2", "node-3"], &ip));
            owners.insert(owner);
        }
        assert_eq!(owners.len(), 3, "51 addresses land on all three nodes");
    }

    #[test]
    fn every_node_computes_the_same_owner() {
        let mut f = Fixture::new();
        let ip = "198.18.0.201";
        let first = f.owner(ip);
        for local in ["node-2", "node-3"] {
            f.local = local.into();
            assert_eq!(f.owner(ip), first);
        }
    }

    #[test]
    fn addresses_outside_every_pool_are_never_elected() {
        let f = Fixture::new();
        for ip in ["198.18.0.199", "198.18.0.251", "10.96.0.10", "fd00::1"] {
            assert_eq!(
                f.view()
                    .elect(ip.parse().expect("ip"), &IpDemand::default()),
                Election::NotInPool,
                "{ip}"
            );
        }
    }

    #[test]
    fn a_pool_no_advertisement_selects_is_not_advertised() {
        let mut f = Fixture::new();
        f.pools
            .push(pool("quiet", &[("tier", "b")], &["198.18.0.100/30"]));
        f.advertisements = vec![L2AdvertisementSpec {
            ip_pools: vec!["default".into()],
            ..Default::default()
        }];
        let quiet = "198.18.0.101".parse().expect("ip");
        assert_eq!(
            f.view().elect(quiet, &IpDemand::default()),
            Election::NotAdvertised
        );
        // Selecting it by label advertises it.
        f.advertisements.push(L2AdvertisementSpec {
            ip_pool_selectors: vec![berth_testing_selector("tier", "b")],
            ..Default::default()
        });
        assert!(matches!(
            f.view().elect(quiet, &IpDemand::default()),
            Election::Owner { .. }
        ));
        f.advertisements.clear();
        assert_eq!(
            f.view().elect(quiet, &IpDemand::default()),
            Election::NotAdvertised
        );
    }

    fn berth_testing_selector(
        key: &str,
        value: &str,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
            match_expressions: None,
        }
    }

    /// Removing the owner by each disqualifying fact hands the IP to the next by key.
    #[test]
    fn each_disqualification_moves_the_ip_to_the_next_candidate() {
        let ip = "198.18.0.210";
        let all = ["node-1", "node-2", "node-3"];
        let first = expected(&all, ip);
        let rest: Vec<&str> = all.iter().copied().filter(|n| *n != first).collect();
        let second = expected(&rest, ip);
        type Breakage<'a> = Box<dyn Fn(&mut Fixture) + 'a>;
        let cases: Vec<(&str, Breakage)> = vec![
            (
                "not live",
                Box::new(|f: &mut Fixture| {
                    let owner = expected(&all, ip);
                    f.live.remove(&owner);
                }),
            ),
            (
                "excluded",
                Box::new(|f: &mut Fixture| {
                    let owner = expected(&all, ip);
                    f.nodes.get_mut(&owner).expect("node").excluded = true;
                }),
            ),
            (
                "network unavailable",
                Box::new(|f: &mut Fixture| {
                    let owner = expected(&all, ip);
                    f.nodes.get_mut(&owner).expect("node").network_unavailable = true;
                }),
            ),
            (
                "being deleted",
                Box::new(|f: &mut Fixture| {
                    let owner = expected(&all, ip);
                    f.nodes.get_mut(&owner).expect("node").deleting = true;
                }),
            ),
            (
                "not selected by any advertisement's nodeSelectors",
                Box::new(|f: &mut Fixture| {
                    let owner = expected(&all, ip);
                    f.advertisements = vec![L2AdvertisementSpec {
                        node_selectors: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                            match_labels: None,
                            match_expressions: Some(vec![
                                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                                    key: "kubernetes.io/hostname".into(),
                                    operator: "NotIn".into(),
                                    values: Some(vec![owner]),
                                },
                            ]),
                        }],
                        ..Default::default()
                    }];
                }),
            ),
            (
                "gone from the Node list",
                Box::new(|f: &mut Fixture| {
                    let owner = expected(&all, ip);
                    f.nodes.remove(&owner);
                }),
            ),
        ];
        for (what, break_owner) in cases {
            let mut f = Fixture::new();
            // Compute as the second node, so the local-interface rule plays no part.
            f.local = second.clone();
            assert_eq!(f.owner(ip), Some(first.clone()), "{what}: before");
            break_owner(&mut f);
            assert_eq!(f.owner(ip), Some(second.clone()), "{what}: after");
        }
    }

    #[test]
    fn no_candidate_when_nobody_qualifies() {
        let mut f = Fixture::new();
        f.live.clear();
        assert_eq!(
            f.view()
                .elect("198.18.0.200".parse().expect("ip"), &IpDemand::default()),
            Election::NoCandidate
        );
    }

    #[test]
    fn local_traffic_policy_limits_candidates_to_endpoint_nodes() {
        let f = Fixture::new();
        let ip: IpAddr = "198.18.0.220".parse().expect("ip");
        for endpoint_nodes in [vec!["node-2"], vec!["node-1", "node-3"], vec!["node-3"]] {
            let demand = IpDemand {
                endpoint_nodes: Some(names(&endpoint_nodes)),
            };
            let Election::Owner { node, .. } = f.view().elect(ip, &demand) else {
                panic!("no owner for {endpoint_nodes:?}");
            };
            assert_eq!(node, expected(&endpoint_nodes, "198.18.0.220"));
        }
        let none = IpDemand {
            endpoint_nodes: Some(BTreeSet::new()),
        };
        assert_eq!(f.view().elect(ip, &none), Election::NoCandidate);
    }

    #[test]
    fn interfaces_are_the_union_of_matching_advertisements_and_local_ones_must_be_up() {
        let mut f = Fixture::new();
        f.local_up = names(&["eth0", "eth1"]);
        f.advertisements = vec![
            L2AdvertisementSpec {
                interfaces: vec!["eth1".into()],
                ..Default::default()
            },
            L2AdvertisementSpec {
                interfaces: vec!["eth2".into()],
                ..Default::default()
            },
        ];
        // Only node-1 is live: it owns everything, on its up interfaces the advertisements name.
        f.live = names(&["node-1"]);
        let ip: IpAddr = "198.18.0.200".parse().expect("ip");
        assert_eq!(
            f.view().elect(ip, &IpDemand::default()),
            Election::Owner {
                node: "node-1".into(),
                interfaces: Interfaces::Named(names(&["eth1"])),
            }
        );
        // An advertisement without interfaces widens to every up interface.
        f.advertisements.push(L2AdvertisementSpec::default());
        assert_eq!(
            f.view().elect(ip, &IpDemand::default()),
            Election::Owner {
                node: "node-1".into(),
                interfaces: Interfaces::Named(names(&["eth0", "eth1"])),
            }
        );
        // No named interface up on the local node: it is no candidate.
        f.advertisements.pop();
        f.local_up = names(&["eth0"]);
        assert_eq!(
            f.view().elect(ip, &IpDemand::default()),
            Election::NoCandidate
        );
        // Peers' interfaces are not visible: they are taken as up.
        f.live = names(&["node-2"]);
        assert_eq!(
            f.view().elect(ip, &IpDemand::default()),
            Election::Owner {
                node: "node-2".into(),
                interfaces: Interfaces::Named(names(&["eth1", "eth2"])),
            }
        );
    }

    #[test]
    fn ipv6_addresses_are_elected_the_same_way() {
        let mut f = Fixture::new();
        f.pools.push(pool("v6", &[], &["fd00:198:18::/120"]));
        let ip = "fd00:198:18::5";
        assert_eq!(
            f.owner(ip),
            Some(expected(&["node-1", "node-2", "node-3"], ip))
        );
    }

    proptest::proptest! {
        /// Never two owners: whichever node computes, all agree, and the owner is a candidate.
        #[test]
        fn all_nodes_agree(
            last in 200u8..=250,
            live_mask in 1u8..8,
            excluded_mask in 0u8..8,
        ) {
            let mut f = Fixture::new();
            let all = ["node-1", "node-2", "node-3"];
            f.live = all.iter().enumerate().filter(|(i, _)| live_mask & (1 << i) != 0)
                .map(|(_, n)| n.to_string()).collect();
            for (i, n) in all.iter().enumerate() {
                f.nodes.get_mut(*n).expect("node").excluded = excluded_mask & (1 << i) != 0;
            }
            let ip = format!("198.18.0.{last}");
            let mut seen = BTreeSet::new();
            for local in all {
                f.local = local.into();
                seen.insert(f.owner(&ip));
            }
            proptest::prop_assert_eq!(seen.len(), 1);
            let candidates: Vec<&str> = all.iter().enumerate()
                .filter(|(i, _)| live_mask & (1 << i) != 0 && excluded_mask & (1 << i) == 0)
                .map(|(_, n)| *n).collect();
            let owner = seen.into_iter().next().flatten();
            if candidates.is_empty() {
                proptest::prop_assert_eq!(owner, None);
            } else {
                proptest::prop_assert_eq!(owner, Some(expected(&candidates, &ip)));
            }
        }
    }
}
