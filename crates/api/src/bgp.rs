//! BGP announcing: `BGPPeer` (a router each selected node holds a session with),
//! `BGPAdvertisement` (which pools are announced, to which peers, with which attributes) and
//! `BFDProfile` (failure detection on the sessions). Field names follow MetalLB's where the
//! meaning is the same, so its users can carry their manifests over; pools are named as in
//! berth's `L2Advertisement` (`ipPools`, `ipPoolSelectors`).

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use berth_core::{dns1123_subdomain_problem, FieldErrors};

use crate::convert::validate_label_selector;
use crate::schema;

/// BGP's own hold-time rule (RFC 4271 4.2): zero (no keepalives) or at least three seconds.
pub const MIN_HOLD_TIME_SECS: u64 = 3;
/// The defaults berth renders when a peer leaves them out: failures are seen within 9 s
/// without BFD, not BGP's 90 s.
pub const DEFAULT_HOLD_TIME_SECS: u64 = 9;
pub const DEFAULT_KEEPALIVE_TIME_SECS: u64 = 3;
pub const DEFAULT_PEER_PORT: u16 = 179;
/// BFD on a directly connected peer: 100 ms x 3 detects a dead link or node in 300 ms.
pub const DEFAULT_BFD_INTERVAL_MS: u32 = 100;
pub const DEFAULT_BFD_MULTIPLIER: u32 = 3;
/// FRR's bounds for BFD intervals (ms) and the detection multiplier.
pub const MIN_BFD_INTERVAL_MS: u32 = 10;
pub const MAX_BFD_INTERVAL_MS: u32 = 60_000;
pub const MIN_BFD_MULTIPLIER: u32 = 2;
pub const MAX_BFD_MULTIPLIER: u32 = 255;
use crate::schema::MAX_COMMUNITIES;

/// A BGP router that the selected nodes peer with.
// Printer columns repeat `type_ = ...`, which the lint mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "BGPPeer",
    status = "BGPStatus",
    derive = "PartialEq",
    shortname = "bgpp",
    category = "berth",
    doc = "BGPPeer is a router that the selected nodes hold a BGP session with, announcing LoadBalancer IPs.",
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.peerAddress"),
    printcolumn(name = "ASN", type_ = "integer", json_path = ".spec.peerASN"),
    printcolumn(name = "My ASN", type_ = "integer", json_path = ".spec.myASN"),
    printcolumn(name = "BFD Profile", type_ = "string", json_path = ".spec.bfdProfile"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::peer_rules)]
pub struct BGPPeerSpec {
    /// The nodes' AS number.
    #[serde(rename = "myASN")]
    #[schemars(range(min = 1))]
    pub my_asn: u32,
    /// The router's AS number; equal to myASN for iBGP.
    #[serde(rename = "peerASN")]
    #[schemars(range(min = 1))]
    pub peer_asn: u32,
    /// The router's address, IPv4 or IPv6.
    #[schemars(schema_with = "schema::ip_address")]
    pub peer_address: String,
    /// The router's TCP port. Default 179.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub peer_port: Option<u16>,
    /// The nodes' address for the session; default: chosen by the kernel's route to the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_ip_address")]
    pub source_address: Option<String>,
    /// BGP hold time, `9s` when unset; `0s` or at least `3s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_seconds")]
    pub hold_time: Option<String>,
    /// BGP keepalive interval, `3s` when unset; less than the hold time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_seconds")]
    pub keepalive_time: Option<String>,
    /// How long the nodes wait between attempts to open a session that is down (FRR's connect
    /// retry timer); FRR's `120s` when unset; 1s to 65535s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_seconds")]
    pub connect_time: Option<String>,
    /// The BGP router id the nodes use; default: the node's own IPv4 address.
    #[serde(default, rename = "routerID", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_ipv4_address")]
    pub router_id: Option<String>,
    /// Nodes that hold a session with this peer, by label (ORed); empty: every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic_selector_list)]
    pub node_selectors: Vec<LabelSelector>,
    /// A Secret of type `kubernetes.io/basic-auth` whose `password` is the TCP MD5 password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<SecretRef>,
    /// The BFDProfile for this session; unset: no BFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_name")]
    pub bfd_profile: Option<String>,
    /// The eBGP peer is more than one hop away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebgp_multi_hop: Option<bool>,
    /// Graceful restart (RFC 4724): a restarting speaker's routes are kept by the router while
    /// the node still forwards. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_graceful_restart: Option<bool>,
}

/// A Secret by name, in the agent's namespace when `namespace` is unset.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretRef {
    #[schemars(schema_with = "schema::name")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_name")]
    pub namespace: Option<String>,
}

/// Which pools are announced over BGP, to which peers and from which nodes, with which
/// attributes. Every list is ORed within itself; an empty list selects everything.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "BGPAdvertisement",
    status = "BGPStatus",
    derive = "PartialEq",
    shortname = "bgpadv",
    category = "berth",
    doc = "BGPAdvertisement announces the addresses of some IPPools to some BGPPeers from some nodes.",
    printcolumn(name = "IP Pools", type_ = "string", json_path = ".spec.ipPools"),
    printcolumn(name = "Peers", type_ = "string", json_path = ".spec.peers"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BGPAdvertisementSpec {
    /// IPPools by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::pool_names")]
    pub ip_pools: Vec<String>,
    /// IPPools by label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic_selector_list)]
    pub ip_pool_selectors: Vec<LabelSelector>,
    /// Nodes that announce, by label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic_selector_list)]
    pub node_selectors: Vec<LabelSelector>,
    /// BGPPeers by name to announce to; empty: every peer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::pool_names")]
    pub peers: Vec<String>,
    /// Announce IPv4 addresses as the covering prefix of this length (default 32: one route per
    /// address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 32))]
    pub aggregation_length: Option<u8>,
    /// The same for IPv6 (default 128).
    #[serde(
        default,
        rename = "aggregationLengthV6",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 128))]
    pub aggregation_length_v6: Option<u8>,
    /// BGP LOCAL_PREF on the announcements (iBGP peers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_pref: Option<u32>,
    /// BGP communities on the announcements: `AS:value` (`64512:100`) or
    /// `large:global:local1:local2`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::communities")]
    pub communities: Vec<String>,
}

/// How fast a BGP session's failure is detected (BFD, RFC 5880), for peers that name it.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "BFDProfile",
    status = "BGPStatus",
    derive = "PartialEq",
    shortname = "bfdp",
    category = "berth",
    doc = "BFDProfile sets the BFD timers of the BGP sessions whose BGPPeer names it.",
    printcolumn(
        name = "Receive (ms)",
        type_ = "integer",
        json_path = ".spec.receiveInterval"
    ),
    printcolumn(
        name = "Transmit (ms)",
        type_ = "integer",
        json_path = ".spec.transmitInterval"
    ),
    printcolumn(
        name = "Multiplier",
        type_ = "integer",
        json_path = ".spec.detectMultiplier"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BFDProfileSpec {
    /// Slowest rate, in ms, at which this side wants control packets (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_BFD_INTERVAL_MS, max = MAX_BFD_INTERVAL_MS))]
    pub receive_interval: Option<u32>,
    /// Fastest rate, in ms, at which this side sends control packets (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_BFD_INTERVAL_MS, max = MAX_BFD_INTERVAL_MS))]
    pub transmit_interval: Option<u32>,
    /// Packets missed before the session is down (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_BFD_MULTIPLIER, max = MAX_BFD_MULTIPLIER))]
    pub detect_multiplier: Option<u32>,
    /// Echo packets (forwarded back by the peer's data plane) every this many ms, when
    /// echoMode is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_BFD_INTERVAL_MS, max = MAX_BFD_INTERVAL_MS))]
    pub echo_interval: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo_mode: Option<bool>,
    /// Wait for the peer to start the session instead of starting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive_mode: Option<bool>,
    /// For multi-hop sessions: the lowest TTL accepted on incoming packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 254))]
    pub minimum_ttl: Option<u32>,
}

/// Conditions of a BGP object (`Valid`, and for peers `Established` across the nodes).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct BGPStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::conditions_map)]
    pub conditions: Vec<Condition>,
}

/// `90s`, `1m30s`, `0s` as whole seconds; `None` for anything else.
pub fn parse_seconds(text: &str) -> Option<u64> {
    let (minutes, rest) = match text.split_once('m') {
        Some((m, rest)) => (m.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let seconds = match rest {
        "" if text.ends_with('m') => 0,
        _ => rest.strip_suffix('s')?.parse::<u64>().ok()?,
    };
    if rest.starts_with('+') || text.starts_with('+') {
        return None;
    }
    minutes.checked_mul(60)?.checked_add(seconds)
}

impl BGPPeerSpec {
    /// Every problem in the spec, with `spec.`-rooted paths.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = FieldErrors::default();
        if self.my_asn == 0 {
            errors.push("spec.myASN", Some("0"), "must be between 1 and 4294967295");
        }
        if self.peer_asn == 0 {
            errors.push(
                "spec.peerASN",
                Some("0"),
                "must be between 1 and 4294967295",
            );
        }
        if self.peer_address.parse::<IpAddr>().is_err() {
            errors.push(
                "spec.peerAddress",
                Some(&self.peer_address),
                "must be an IPv4 or IPv6 address",
            );
        }
        if self.peer_port == Some(0) {
            errors.push("spec.peerPort", Some("0"), "must be between 1 and 65535");
        }
        if let Some(source) = &self.source_address {
            if source.parse::<IpAddr>().is_err() {
                errors.push(
                    "spec.sourceAddress",
                    Some(source),
                    "must be an IPv4 or IPv6 address",
                );
            }
        }
        if let Some(id) = &self.router_id {
            if id.parse::<std::net::Ipv4Addr>().is_err() {
                errors.push("spec.routerID", Some(id), "must be an IPv4 address");
            }
        }
        self.validate_timers(&mut errors);
        for (i, selector) in self.node_selectors.iter().enumerate() {
            validate_label_selector(selector, &format!("spec.nodeSelectors[{i}]"), &mut errors);
        }
        if let Some(secret) = &self.password_secret {
            name_problem(&secret.name, "spec.passwordSecret.name", &mut errors);
            if let Some(ns) = &secret.namespace {
                name_problem(ns, "spec.passwordSecret.namespace", &mut errors);
            }
        }
        if let Some(profile) = &self.bfd_profile {
            name_problem(profile, "spec.bfdProfile", &mut errors);
        }
        if self.ebgp_multi_hop == Some(true) && self.my_asn == self.peer_asn {
            errors.push(
                "spec.ebgpMultiHop",
                Some("true"),
                "applies to eBGP only: myASN equals peerASN",
            );
        }
        errors.into_result()
    }

    fn validate_timers(&self, errors: &mut FieldErrors) {
        let hold = self.hold_time.as_deref().map(|t| (t, parse_seconds(t)));
        let keepalive = self
            .keepalive_time
            .as_deref()
            .map(|t| (t, parse_seconds(t)));
        if let Some((text, parsed)) = hold {
            match parsed {
                None => errors.push(
                    "spec.holdTime",
                    Some(text),
                    "must be a duration in seconds such as 9s or 1m30s",
                ),
                Some(s) if s != 0 && s < MIN_HOLD_TIME_SECS => {
                    errors.push("spec.holdTime", Some(text), "must be 0s or at least 3s")
                }
                Some(s) if s > u64::from(u16::MAX) => {
                    errors.push("spec.holdTime", Some(text), "must be at most 65535s")
                }
                Some(_) => {}
            }
        }
        if let Some(text) = self.connect_time.as_deref() {
            match parse_seconds(text) {
                None => errors.push(
                    "spec.connectTime",
                    Some(text),
                    "must be a duration in seconds such as 10s or 2m",
                ),
                Some(s) if !(1..=u64::from(u16::MAX)).contains(&s) => errors.push(
                    "spec.connectTime",
                    Some(text),
                    "must be between 1s and 65535s",
                ),
                Some(_) => {}
            }
        }
        if let Some((text, parsed)) = keepalive {
            match parsed {
                None => errors.push(
                    "spec.keepaliveTime",
                    Some(text),
                    "must be a duration in seconds such as 3s or 1m",
                ),
                Some(k) => {
                    let hold = hold.and_then(|(_, h)| h).unwrap_or(DEFAULT_HOLD_TIME_SECS);
                    if hold != 0 && k >= hold {
                        errors.push(
                            "spec.keepaliveTime",
                            Some(text),
                            format!("must be less than the hold time ({hold}s)"),
                        );
                    }
                }
            }
        }
    }

    /// Hold time in seconds, the default when unset or unreadable.
    pub fn hold_secs(&self) -> u64 {
        self.hold_time
            .as_deref()
            .and_then(parse_seconds)
            .unwrap_or(DEFAULT_HOLD_TIME_SECS)
    }

    /// Keepalive in seconds, the default (or a third of the hold time) when unset.
    pub fn keepalive_secs(&self) -> u64 {
        match self.keepalive_time.as_deref().and_then(parse_seconds) {
            Some(k) => k,
            None if self.hold_time.is_some() => self.hold_secs() / 3,
            None => DEFAULT_KEEPALIVE_TIME_SECS,
        }
    }

    /// The connect retry time in seconds when set and valid; `None` leaves FRR's default.
    pub fn connect_secs(&self) -> Option<u64> {
        self.connect_time
            .as_deref()
            .and_then(parse_seconds)
            .filter(|s| (1..=u64::from(u16::MAX)).contains(s))
    }

    pub fn graceful_restart(&self) -> bool {
        self.enable_graceful_restart.unwrap_or(true)
    }

    /// Whether a node with `labels` holds a session with this peer.
    pub fn selects_node(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.node_selectors.is_empty()
            || self
                .node_selectors
                .iter()
                .any(|s| crate::selector_matches(s, labels))
    }
}

impl BGPAdvertisementSpec {
    /// Every problem in the spec, with `spec.`-rooted paths.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = FieldErrors::default();
        for (i, name) in self.ip_pools.iter().enumerate() {
            name_problem(name, &format!("spec.ipPools[{i}]"), &mut errors);
        }
        for (i, name) in self.peers.iter().enumerate() {
            name_problem(name, &format!("spec.peers[{i}]"), &mut errors);
        }
        for (i, selector) in self.ip_pool_selectors.iter().enumerate() {
            validate_label_selector(selector, &format!("spec.ipPoolSelectors[{i}]"), &mut errors);
        }
        for (i, selector) in self.node_selectors.iter().enumerate() {
            validate_label_selector(selector, &format!("spec.nodeSelectors[{i}]"), &mut errors);
        }
        if let Some(len) = self.aggregation_length.filter(|l| *l > 32) {
            errors.push(
                "spec.aggregationLength",
                Some(&len.to_string()),
                "must be between 0 and 32",
            );
        }
        if let Some(len) = self.aggregation_length_v6.filter(|l| *l > 128) {
            errors.push(
                "spec.aggregationLengthV6",
                Some(&len.to_string()),
                "must be between 0 and 128",
            );
        }
        if self.communities.len() > MAX_COMMUNITIES {
            errors.push(
                "spec.communities",
                None,
                format!("must have at most {MAX_COMMUNITIES} items"),
            );
        }
        for (i, community) in self.communities.iter().enumerate() {
            if let Err(problem) = parse_community(community) {
                errors.push(format!("spec.communities[{i}]"), Some(community), problem);
            }
        }
        errors.into_result()
    }

    /// Whether the pool named `pool` with `labels` is announced by this advertisement.
    pub fn selects_pool(
        &self,
        pool: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        if self.ip_pools.is_empty() && self.ip_pool_selectors.is_empty() {
            return true;
        }
        self.ip_pools.iter().any(|p| p == pool)
            || self
                .ip_pool_selectors
                .iter()
                .any(|s| crate::selector_matches(s, labels))
    }

    /// Whether a node with `labels` announces for this advertisement.
    pub fn selects_node(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.node_selectors.is_empty()
            || self
                .node_selectors
                .iter()
                .any(|s| crate::selector_matches(s, labels))
    }

    /// Whether the peer named `peer` receives this advertisement.
    pub fn selects_peer(&self, peer: &str) -> bool {
        self.peers.is_empty() || self.peers.iter().any(|p| p == peer)
    }
}

/// A BGP community as FRR writes it: standard `AS:value` (16 bits each) or large
/// `global:local1:local2` (32 bits each), from `large:` form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Community {
    Standard(u16, u16),
    Large(u32, u32, u32),
}

impl std::fmt::Display for Community {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Community::Standard(a, b) => write!(f, "{a}:{b}"),
            Community::Large(a, b, c) => write!(f, "{a}:{b}:{c}"),
        }
    }
}

/// Parses `64512:100` or `large:64512:1:2`.
pub fn parse_community(text: &str) -> Result<Community, String> {
    if let Some(large) = text.strip_prefix("large:") {
        let parts: Vec<Option<u32>> = large.split(':').map(|p| p.parse().ok()).collect();
        return match parts.as_slice() {
            [Some(a), Some(b), Some(c)] => Ok(Community::Large(*a, *b, *c)),
            _ => Err(
                "a large community is large:<global>:<local1>:<local2>, each 0-4294967295".into(),
            ),
        };
    }
    let parts: Vec<Option<u16>> = text.split(':').map(|p| p.parse().ok()).collect();
    match parts.as_slice() {
        [Some(a), Some(b)] => Ok(Community::Standard(*a, *b)),
        _ => Err(
            "a community is <AS>:<value>, each 0-65535, or large:<global>:<local1>:<local2>".into(),
        ),
    }
}

impl BFDProfileSpec {
    /// Every problem in the spec, with `spec.`-rooted paths.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = FieldErrors::default();
        let intervals = [
            ("spec.receiveInterval", self.receive_interval),
            ("spec.transmitInterval", self.transmit_interval),
            ("spec.echoInterval", self.echo_interval),
        ];
        for (path, value) in intervals {
            if let Some(v) =
                value.filter(|v| !(MIN_BFD_INTERVAL_MS..=MAX_BFD_INTERVAL_MS).contains(v))
            {
                errors.push(
                    path,
                    Some(&v.to_string()),
                    format!("must be between {MIN_BFD_INTERVAL_MS} and {MAX_BFD_INTERVAL_MS} ms"),
                );
            }
        }
        if let Some(m) = self
            .detect_multiplier
            .filter(|m| !(MIN_BFD_MULTIPLIER..=MAX_BFD_MULTIPLIER).contains(m))
        {
            errors.push(
                "spec.detectMultiplier",
                Some(&m.to_string()),
                format!("must be between {MIN_BFD_MULTIPLIER} and {MAX_BFD_MULTIPLIER}"),
            );
        }
        if let Some(t) = self.minimum_ttl.filter(|t| !(1..=254).contains(t)) {
            errors.push(
                "spec.minimumTtl",
                Some(&t.to_string()),
                "must be between 1 and 254",
            );
        }
        errors.into_result()
    }
}

fn name_problem(name: &str, path: &str, errors: &mut FieldErrors) {
    if let Some(problem) = dns1123_subdomain_problem(name) {
        errors.push(path, Some(name), problem);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_peer() -> BGPPeerSpec {
        BGPPeerSpec {
            my_asn: 64512,
            peer_asn: 64513,
            peer_address: "198.18.0.1".into(),
            peer_port: None,
            source_address: None,
            hold_time: None,
            keepalive_time: None,
            connect_time: None,
            router_id: None,
            node_selectors: Vec::new(),
            password_secret: None,
            bfd_profile: None,
            ebgp_multi_hop: None,
            enable_graceful_restart: None,
        }
    }

    fn paths(errors: FieldErrors) -> Vec<String> {
        errors.iter().map(|e| e.path.clone()).collect()
    }

    #[test]
    fn seconds_parse_like_metallb_durations() {
        for (text, want) in [
            ("9s", Some(9)),
            ("0s", Some(0)),
            ("1m30s", Some(90)),
            ("2m", Some(120)),
            ("90", None),
            ("", None),
            ("s", None),
            ("1h", None),
            ("-3s", None),
            ("+3s", None),
            ("1.5s", None),
        ] {
            assert_eq!(parse_seconds(text), want, "{text}");
        }
    }

    #[test]
    fn a_minimal_peer_is_valid_with_berths_defaults() {
        let peer = mk_peer();
        assert!(peer.validate().is_ok());
        assert_eq!((peer.hold_secs(), peer.keepalive_secs()), (9, 3));
        assert!(peer.graceful_restart());
    }

    #[test]
    fn keepalive_follows_an_explicit_hold_time() {
        let peer = BGPPeerSpec {
            hold_time: Some("90s".into()),
            ..mk_peer()
        };
        assert_eq!((peer.hold_secs(), peer.keepalive_secs()), (90, 30));
    }

    #[test]
    fn peer_validation_reports_every_problem() {
        let peer = BGPPeerSpec {
            my_asn: 0,
            peer_asn: 0,
            peer_address: "router".into(),
            peer_port: Some(0),
            source_address: Some("10.0.0".into()),
            hold_time: Some("2s".into()),
            keepalive_time: Some("5s".into()),
            connect_time: Some("0s".into()),
            router_id: Some("fd00::1".into()),
            node_selectors: Vec::new(),
            password_secret: Some(SecretRef {
                name: "Bad".into(),
                namespace: None,
            }),
            bfd_profile: Some("UPPER".into()),
            ebgp_multi_hop: Some(true),
            enable_graceful_restart: None,
        };
        assert_eq!(
            paths(peer.validate().unwrap_err()),
            [
                "spec.myASN",
                "spec.peerASN",
                "spec.peerAddress",
                "spec.peerPort",
                "spec.sourceAddress",
                "spec.routerID",
                "spec.holdTime",
                "spec.connectTime",
                "spec.keepaliveTime",
                "spec.passwordSecret.name",
                "spec.bfdProfile",
                "spec.ebgpMultiHop",
            ]
        );
    }

    #[test]
    fn connect_time_is_frrs_default_unless_set_within_bounds() {
        assert_eq!(mk_peer().connect_secs(), None);
        for (text, secs, valid) in [
            ("1s", Some(1), true),
            ("2m", Some(120), true),
            ("65535s", Some(65_535), true),
            ("0s", None, false),
            ("65536s", None, false),
            ("soon", None, false),
        ] {
            let peer = BGPPeerSpec {
                connect_time: Some(text.into()),
                ..mk_peer()
            };
            assert_eq!(peer.connect_secs(), secs, "{text}");
            assert_eq!(peer.validate().is_ok(), valid, "{text}");
        }
    }

    #[test]
    fn hold_time_zero_disables_keepalive_checks() {
        let peer = BGPPeerSpec {
            hold_time: Some("0s".into()),
            keepalive_time: Some("30s".into()),
            ..mk_peer()
        };
        assert!(peer.validate().is_ok());
    }

    #[test]
    fn communities_standard_and_large() {
        assert_eq!(
            parse_community("64512:100"),
            Ok(Community::Standard(64512, 100))
        );
        assert_eq!(
            parse_community("large:4200000000:1:2"),
            Ok(Community::Large(4_200_000_000, 1, 2))
        );
        for bad in ["65536:1", "1:2:3", "large:1:2", "no-export", ""] {
            assert!(parse_community(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn advertisement_validation_and_selection() {
        let adv = BGPAdvertisementSpec {
            ip_pools: vec!["bgp".into()],
            peers: vec!["tor-a".into()],
            aggregation_length: Some(33),
            communities: vec!["64512:100".into(), "nonsense".into()],
            ..Default::default()
        };
        assert_eq!(
            paths(adv.validate().unwrap_err()),
            ["spec.aggregationLength", "spec.communities[1]"]
        );
        let labels = std::collections::BTreeMap::new();
        assert!(adv.selects_pool("bgp", &labels));
        assert!(!adv.selects_pool("l2", &labels));
        assert!(adv.selects_peer("tor-a"));
        assert!(!adv.selects_peer("tor-b"));
        assert!(BGPAdvertisementSpec::default().selects_peer("any"));
    }

    #[test]
    fn bfd_profile_bounds() {
        assert!(BFDProfileSpec::default().validate().is_ok());
        let bad = BFDProfileSpec {
            receive_interval: Some(5),
            transmit_interval: Some(60_001),
            detect_multiplier: Some(1),
            minimum_ttl: Some(0),
            ..Default::default()
        };
        assert_eq!(
            paths(bad.validate().unwrap_err()),
            [
                "spec.receiveInterval",
                "spec.transmitInterval",
                "spec.detectMultiplier",
                "spec.minimumTtl"
            ]
        );
    }
}
