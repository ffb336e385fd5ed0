//! The static channel: one node's FRR configuration, rendered by a pure function from the BGP
//! CRDs, the IPPools and the node's own facts. It changes only when peers, profiles,
//! advertisements or pools change; the addresses themselves travel as kernel routes
//! ([`crate::route`]), so a Service change never reloads FRR.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use berth_api::{
    parse_community, BFDProfileSpec, BGPAdvertisementSpec, BGPPeerSpec, Community,
    DEFAULT_BFD_INTERVAL_MS, DEFAULT_BFD_MULTIPLIER, DEFAULT_PEER_PORT,
};
use berth_core::AddressRange;
use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};

use crate::announce::PoolFacts;
use crate::route::BERTH_INTERFACE;

/// The route-map that picks berth's routes (those on [`BERTH_INTERFACE`]) out of the kernel's.
pub const ANNOUNCED_ROUTE_MAP: &str = "berth-announced";

/// The node's own facts the configuration needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpeakerNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The node's IPv4 address: the router id unless a peer sets `routerID`.
    pub router_id: Option<Ipv4Addr>,
}

/// Everything one node's configuration is rendered from. Lists are `(name, spec)` pairs.
#[derive(Clone, Debug)]
pub struct SpeakerInput<'a> {
    pub node: &'a SpeakerNode,
    pub peers: &'a [(String, BGPPeerSpec)],
    pub profiles: &'a [(String, BFDProfileSpec)],
    pub advertisements: &'a [(String, BGPAdvertisementSpec)],
    pub pools: &'a [PoolFacts],
    /// TCP MD5 passwords by peer name, read from the peers' Secrets.
    pub passwords: &'a BTreeMap<String, String>,
}

/// Why an object was left out of the configuration; becomes a condition on that object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub kind: &'static str,
    pub name: String,
    pub reason: String,
}

/// The rendered configuration and what could not be part of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RenderedConfig {
    pub text: String,
    /// Peers this node holds a session with, by name.
    pub peers: Vec<String>,
    pub skipped: Vec<Skipped>,
}

/// One peer's session, after defaults.
struct Session<'a> {
    name: &'a str,
    spec: &'a BGPPeerSpec,
    address: IpAddr,
}

/// Renders the FRR configuration (the `frr.conf` that `frr-reload.py` applies) for one node.
///
/// Decisions: peers are taken in name order; FRR holds one `router bgp` per VRF, so a peer whose
/// `myASN` differs from the one most selected peers use is skipped (a tie goes to the smaller
/// AS), as is one whose router id would differ from the first peer's, a peer naming a BFD profile that does not exist, and a peer without a readable
/// password Secret. No BGP instance is rendered without a router id (a node without IPv4).
pub fn render_frr_config(input: &SpeakerInput<'_>) -> RenderedConfig {
    let mut skipped = Vec::new();
    let profiles: BTreeMap<&str, &BFDProfileSpec> = input
        .profiles
        .iter()
        .filter(|(name, spec)| match spec.validate() {
            Ok(()) => true,
            Err(errors) => {
                skipped.push(skip("BFDProfile", name, errors.to_string()));
                false
            }
        })
        .map(|(n, s)| (n.as_str(), s))
        .collect();
    let sessions = choose_sessions(input, &profiles, &mut skipped);
    let advertisements: Vec<(&str, &BGPAdvertisementSpec)> = input
        .advertisements
        .iter()
        .filter(|(name, adv)| match adv.validate() {
            Ok(()) => adv.selects_node(&input.node.labels),
            Err(errors) => {
                skipped.push(skip("BGPAdvertisement", name, errors.to_string()));
                false
            }
        })
        .map(|(n, a)| (n.as_str(), a))
        .collect();
    let mut text = String::new();
    text.push_str("frr defaults traditional\n");
    let _ = writeln!(text, "hostname {}", input.node.name);
    text.push_str("!\n");
    let router_id = sessions
        .first()
        .and_then(|s| s.spec.router_id.as_deref())
        .and_then(|id| id.parse::<Ipv4Addr>().ok())
        .or(input.node.router_id);
    let Some(router_id) = router_id.filter(|_| !sessions.is_empty()) else {
        text.push_str("end\n");
        return RenderedConfig {
            text,
            peers: Vec::new(),
            skipped,
        };
    };
    let lists = render_prefix_lists(&mut text, &advertisements, input.pools);
    render_route_maps(&mut text, &sessions, &advertisements, &lists);
    render_router(&mut text, router_id, &sessions, input.passwords);
    render_bfd(&mut text, &sessions, &profiles);
    text.push_str("end\n");
    RenderedConfig {
        text,
        peers: sessions.iter().map(|s| s.name.to_string()).collect(),
        skipped,
    }
}

fn skip(kind: &'static str, name: &str, reason: impl Into<String>) -> Skipped {
    Skipped {
        kind,
        name: name.to_string(),
        reason: reason.into(),
    }
}

fn choose_sessions<'a>(
    input: &SpeakerInput<'a>,
    profiles: &BTreeMap<&str, &BFDProfileSpec>,
    skipped: &mut Vec<Skipped>,
) -> Vec<Session<'a>> {
    let mut peers: Vec<&(String, BGPPeerSpec)> = input
        .peers
        .iter()
        .filter(|(_, spec)| spec.selects_node(&input.node.labels))
        .collect();
    peers.sort_by(|a, b| a.0.cmp(&b.0));
    peers.retain(|(name, spec)| match spec.validate() {
        Ok(()) => true,
        Err(errors) => {
            skipped.push(skip("BGPPeer", name, errors.to_string()));
            false
        }
    });
    // The AS most of the selected peers give the node; a tie goes to the smaller number.
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for (_, spec) in &peers {
        *counts.entry(spec.my_asn).or_default() += 1;
    }
    let my_asn = counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(asn, _)| *asn);
    let mut sessions: Vec<Session<'a>> = Vec::new();
    let mut addresses = BTreeSet::new();
    for (name, spec) in peers {
        let Ok(address) = spec.peer_address.parse::<IpAddr>() else {
            continue;
        };
        if Some(spec.my_asn) != my_asn {
            skipped.push(skip(
                "BGPPeer",
                name,
                format!(
                    "myASN {} differs from {}, which most peers of this node use: a node speaks as one AS",
                    spec.my_asn,
                    my_asn.unwrap_or_default()
                ),
            ));
            continue;
        }
        if let Some(first) = sessions.first() {
            if spec.router_id.is_some() && first.spec.router_id != spec.router_id {
                skipped.push(skip(
                    "BGPPeer",
                    name,
                    format!("routerID differs from that of peer {}", first.name),
                ));
                continue;
            }
        }
        if !addresses.insert(address) {
            skipped.push(skip(
                "BGPPeer",
                name,
                format!("another peer already has the address {address}"),
            ));
            continue;
        }
        if let Some(profile) = &spec.bfd_profile {
            if !profiles.contains_key(profile.as_str()) {
                skipped.push(skip(
                    "BGPPeer",
                    name,
                    format!("BFDProfile {profile} does not exist"),
                ));
                continue;
            }
        }
        if spec.password_secret.is_some() && !input.passwords.contains_key(name) {
            skipped.push(skip("BGPPeer", name, "the password Secret cannot be read"));
            continue;
        }
        sessions.push(Session {
            name,
            spec,
            address,
        });
    }
    sessions
}

/// One prefix list per advertisement and family: the prefixes it may announce, which are its
/// pools' addresses at its aggregation length.
fn render_prefix_lists(
    text: &mut String,
    advertisements: &[(&str, &BGPAdvertisementSpec)],
    pools: &[PoolFacts],
) -> BTreeSet<String> {
    let mut written = BTreeSet::new();
    for (name, adv) in advertisements {
        let mut v4 = BTreeSet::new();
        let mut v6 = BTreeSet::new();
        for pool in pools
            .iter()
            .filter(|p| adv.selects_pool(&p.name, &p.labels))
        {
            for range in &pool.ranges {
                for net in range_cidrs(range) {
                    match net {
                        IpNet::V4(_) => {
                            v4.insert(prefix_entry(net, adv.aggregation_length.unwrap_or(32)))
                        }
                        IpNet::V6(_) => {
                            v6.insert(prefix_entry(net, adv.aggregation_length_v6.unwrap_or(128)))
                        }
                    };
                }
            }
        }
        for (keyword, family, entries) in [("ip", "v4", v4), ("ipv6", "v6", v6)] {
            if entries.is_empty() {
                continue;
            }
            written.insert(format!("berth-{name}-{family}"));
            for (i, entry) in entries.iter().enumerate() {
                let _ = writeln!(
                    text,
                    "{keyword} prefix-list berth-{name}-{family} seq {} permit {entry}",
                    (i + 1) * 5
                );
            }
            text.push_str("!\n");
        }
    }
    written
}

/// The smallest set of CIDRs covering an address range.
pub fn range_cidrs(range: &AddressRange) -> Vec<IpNet> {
    match (range.start(), range.end()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => Ipv4Subnets::new(a, b, 0).map(IpNet::V4).collect(),
        (IpAddr::V6(a), IpAddr::V6(b)) => Ipv6Subnets::new(a, b, 0).map(IpNet::V6).collect(),
        _ => Vec::new(),
    }
}

/// The prefix-list entry matching the routes announced from `net` at aggregation length `len`.
fn prefix_entry(net: IpNet, len: u8) -> String {
    use std::cmp::Ordering;
    match len.cmp(&net.prefix_len()) {
        Ordering::Greater => format!("{net} ge {len} le {len}"),
        Ordering::Equal => net.to_string(),
        Ordering::Less => IpNet::new(net.addr(), len)
            .map(|n| n.trunc().to_string())
            .unwrap_or_else(|_| net.to_string()),
    }
}

/// `berth-announced` picks berth's kernel routes; `berth-<peer>-out` lets each peer see only
/// what its advertisements announce, with their communities and local preference.
fn render_route_maps(
    text: &mut String,
    sessions: &[Session<'_>],
    advertisements: &[(&str, &BGPAdvertisementSpec)],
    lists: &BTreeSet<String>,
) {
    let _ = writeln!(text, "route-map {ANNOUNCED_ROUTE_MAP} permit 10");
    let _ = writeln!(text, " match interface {BERTH_INTERFACE}");
    text.push_str("exit\n!\n");
    for session in sessions {
        let mut seq = 0;
        for (adv_name, adv) in advertisements
            .iter()
            .filter(|(_, a)| a.selects_peer(session.name))
        {
            for (keyword, family) in [("ip", "v4"), ("ipv6", "v6")] {
                // A pool without this family has no list; FRR would match nothing anyway.
                if !lists.contains(&format!("berth-{adv_name}-{family}")) {
                    continue;
                }
                seq += 10;
                let _ = writeln!(text, "route-map berth-{}-out permit {seq}", session.name);
                let _ = writeln!(
                    text,
                    " match {keyword} address prefix-list berth-{adv_name}-{family}"
                );
                render_set(text, adv);
                text.push_str("exit\n");
            }
        }
        let _ = writeln!(text, "route-map berth-{}-out deny 65535", session.name);
        text.push_str("exit\n!\n");
    }
}

fn render_set(text: &mut String, adv: &BGPAdvertisementSpec) {
    let communities: Vec<Community> = adv
        .communities
        .iter()
        .filter_map(|c| parse_community(c).ok())
        .collect();
    let standard: Vec<String> = communities
        .iter()
        .filter(|c| matches!(c, Community::Standard(..)))
        .map(ToString::to_string)
        .collect();
    let large: Vec<String> = communities
        .iter()
        .filter(|c| matches!(c, Community::Large(..)))
        .map(ToString::to_string)
        .collect();
    if !standard.is_empty() {
        let _ = writeln!(text, " set community {} additive", standard.join(" "));
    }
    if !large.is_empty() {
        let _ = writeln!(text, " set large-community {} additive", large.join(" "));
    }
    if let Some(pref) = adv.local_pref {
        let _ = writeln!(text, " set local-preference {pref}");
    }
}

fn render_router(
    text: &mut String,
    router_id: Ipv4Addr,
    sessions: &[Session<'_>],
    passwords: &BTreeMap<String, String>,
) {
    let Some(first) = sessions.first() else {
        return;
    };
    let _ = writeln!(text, "router bgp {}", first.spec.my_asn);
    let _ = writeln!(text, " bgp router-id {router_id}");
    // berth's own route-maps are the policy; FRR's RFC 8212 default would block eBGP without one.
    text.push_str(" no bgp ebgp-requires-policy\n");
    text.push_str(" no bgp default ipv4-unicast\n");
    text.push_str(" bgp graceful-restart\n");
    for s in sessions {
        let a = s.address;
        let spec = s.spec;
        let _ = writeln!(text, " neighbor {a} remote-as {}", spec.peer_asn);
        let _ = writeln!(text, " neighbor {a} description berth:{}", s.name);
        if let Some(port) = spec.peer_port.filter(|p| *p != DEFAULT_PEER_PORT) {
            let _ = writeln!(text, " neighbor {a} port {port}");
        }
        let _ = writeln!(
            text,
            " neighbor {a} timers {} {}",
            spec.keepalive_secs(),
            spec.hold_secs()
        );
        if let Some(connect) = spec.connect_secs() {
            let _ = writeln!(text, " neighbor {a} timers connect {connect}");
        }
        if let Some(source) = &spec.source_address {
            let _ = writeln!(text, " neighbor {a} update-source {source}");
        }
        if spec.ebgp_multi_hop == Some(true) {
            let _ = writeln!(text, " neighbor {a} ebgp-multihop");
        }
        if let Some(password) = passwords.get(s.name) {
            let _ = writeln!(text, " neighbor {a} password {password}");
        }
        if !spec.graceful_restart() {
            let _ = writeln!(text, " neighbor {a} graceful-restart-disable");
        }
        if let Some(profile) = &spec.bfd_profile {
            let _ = writeln!(text, " neighbor {a} bfd");
            let _ = writeln!(text, " neighbor {a} bfd profile {profile}");
        }
    }
    for (family, v6) in [("ipv4", false), ("ipv6", true)] {
        let members: Vec<&Session<'_>> = sessions
            .iter()
            .filter(|s| s.address.is_ipv6() == v6)
            .collect();
        if members.is_empty() {
            continue;
        }
        text.push_str(" !\n");
        let _ = writeln!(text, " address-family {family} unicast");
        let _ = writeln!(
            text,
            "  redistribute kernel route-map {ANNOUNCED_ROUTE_MAP}"
        );
        for s in members {
            let _ = writeln!(text, "  neighbor {} activate", s.address);
            let _ = writeln!(
                text,
                "  neighbor {} route-map berth-{}-out out",
                s.address, s.name
            );
        }
        text.push_str(" exit-address-family\n");
    }
    text.push_str("exit\n!\n");
}

fn render_bfd(
    text: &mut String,
    sessions: &[Session<'_>],
    profiles: &BTreeMap<&str, &BFDProfileSpec>,
) {
    let used: BTreeSet<&str> = sessions
        .iter()
        .filter_map(|s| s.spec.bfd_profile.as_deref())
        .collect();
    if used.is_empty() {
        return;
    }
    text.push_str("bfd\n");
    for name in used {
        let Some(p) = profiles.get(name) else {
            continue;
        };
        let _ = writeln!(text, " profile {name}");
        let _ = writeln!(
            text,
            "  detect-multiplier {}",
            p.detect_multiplier.unwrap_or(DEFAULT_BFD_MULTIPLIER)
        );
        let _ = writeln!(
            text,
            "  receive-interval {}",
            p.receive_interval.unwrap_or(DEFAULT_BFD_INTERVAL_MS)
        );
        let _ = writeln!(
            text,
            "  transmit-interval {}",
            p.transmit_interval.unwrap_or(DEFAULT_BFD_INTERVAL_MS)
        );
        if p.echo_mode == Some(true) {
            text.push_str("  echo-mode\n");
            if let Some(echo) = p.echo_interval {
                let _ = writeln!(text, "  echo-interval {echo}");
            }
        }
        if p.passive_mode == Some(true) {
            text.push_str("  passive-mode\n");
        }
        if let Some(ttl) = p.minimum_ttl {
            let _ = writeln!(text, "  minimum-ttl {ttl}");
        }
        text.push_str(" exit\n");
    }
    text.push_str("exit\n!\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::parse_address;

    #[test]
    fn ranges_become_the_fewest_cidrs() {
        let cidrs = |a: &str| -> Vec<String> {
            range_cidrs(&parse_address(a).expect("range"))
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(cidrs("198.19.10.0/24"), ["198.19.10.0/24"]);
        assert_eq!(
            cidrs("198.19.10.1-198.19.10.6"),
            [
                "198.19.10.1/32",
                "198.19.10.2/31",
                "198.19.10.4/31",
                "198.19.10.6/32"
            ]
        );
        assert_eq!(cidrs("fd00::/120"), ["fd00::/120"]);
    }

    #[test]
    fn prefix_entries_follow_the_aggregation_length() {
        let net: IpNet = "198.19.10.0/25".parse().expect("net");
        assert_eq!(prefix_entry(net, 32), "198.19.10.0/25 ge 32 le 32");
        assert_eq!(prefix_entry(net, 25), "198.19.10.0/25");
        assert_eq!(prefix_entry(net, 24), "198.19.10.0/24");
    }
}
