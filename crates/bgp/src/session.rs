//! Session state: what this node's FRR says about each peer, turned into one `BGPSessionState`
//! record per peer with an `Established` condition that says why a session is down. Pure: the
//! agent hands in FRR's `show bgp neighbors json`, the kernel's TCP MD5 counters and the
//! peers the configuration kept or left out, and writes what comes back.
//!
//! Decisions where the design leaves room:
//! - A wrong password leaves no trace in BGP: the TCP segments are dropped before bgpd sees
//!   them. The kernel counts them (`TCPMD5Failure`, `TCPMD5NotFound`, `TCPMD5Unexpected` in
//!   `/proc/net/netstat`), per network namespace, not per peer: a rise since the last look is
//!   pinned on every session that is down and has no other explanation, and the verdict stays
//!   until that session is up (the router's next connection attempt may be minutes away).
//! - A NOTIFICATION is read from FRR's `lastErrorCodeSubcode`: `0202` (OPEN, Bad Peer AS) is
//!   `BadPeerAS`, whichever side sent it; any other is `Notification` with FRR's words. It is
//!   only believed while the session is down.
//! - A peer left out of the configuration gets a record too (`NotConfigured`, with the reason),
//!   so a missing Secret or BFDProfile is visible where the sessions are.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use berth_api::names::condition::{reason, ESTABLISHED, FALSE, TRUE};
use berth_api::names::label;
use berth_api::{bounded, set_condition, BGPSessionState, BGPSessionStateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// FRR's state name for an up session.
pub const STATE_ESTABLISHED: &str = "Established";
/// `bgpState` of a peer that is not in FRR's configuration.
pub const STATE_NOT_CONFIGURED: &str = "NotConfigured";
/// `bgpState` when FRR did not answer.
pub const STATE_UNKNOWN: &str = "Unknown";

/// One neighbor as FRR reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NeighborFacts {
    /// `bgpState`: Idle, Connect, Active, OpenSent, OpenConfirm, Established.
    pub state: String,
    /// `lastErrorCodeSubcode`: the last NOTIFICATION's code and subcode, four hex digits.
    pub last_error: Option<String>,
    /// `lastNotificationReason`, FRR's words for it.
    pub last_notification: Option<String>,
    /// `peerBfdInfo.status` (Up, Down, Init, AdminDown) when BFD is on for the peer.
    pub bfd: Option<String>,
}

/// FRR's `show bgp neighbors json` by neighbor address. Keys that are not addresses (VRF
/// fields, interface peers) are skipped.
pub fn parse_neighbors(json: &str) -> Result<BTreeMap<IpAddr, NeighborFacts>, serde_json::Error> {
    let value: Value = serde_json::from_str(json)?;
    let mut out = BTreeMap::new();
    let Some(map) = value.as_object() else {
        return Ok(out);
    };
    for (key, n) in map {
        let Ok(address) = key.parse::<IpAddr>() else {
            continue;
        };
        let text = |field: &str| n.get(field).and_then(Value::as_str).map(str::to_string);
        out.insert(
            address,
            NeighborFacts {
                state: text("bgpState").unwrap_or_else(|| STATE_UNKNOWN.to_string()),
                last_error: text("lastErrorCodeSubcode"),
                last_notification: text("lastNotificationReason"),
                bfd: n
                    .get("peerBfdInfo")
                    .and_then(|b| b.get("status"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
            },
        );
    }
    Ok(out)
}

/// The kernel's TCP MD5 failures in this network namespace (`TCPMD5NotFound`,
/// `TCPMD5Unexpected` and `TCPMD5Failure` of `/proc/net/netstat`), summed; `None` when the
/// counters are absent.
pub fn parse_md5_failures(netstat: &str) -> Option<u64> {
    let mut lines = netstat.lines();
    while let Some(header) = lines.next() {
        let values = lines.next()?;
        if !header.starts_with("TcpExt:") {
            continue;
        }
        let mut total = None;
        for (name, value) in header.split_whitespace().zip(values.split_whitespace()) {
            if matches!(
                name,
                "TCPMD5NotFound" | "TCPMD5Unexpected" | "TCPMD5Failure"
            ) {
                let n: u64 = value.parse().ok()?;
                total = Some(total.unwrap_or(0) + n);
            }
        }
        return total;
    }
    None
}

/// A peer as the configuration treated it on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerEntry {
    pub name: String,
    pub address: String,
    /// `None`: in FRR's configuration; `Some(reason)`: left out, and why.
    pub left_out: Option<String>,
}

/// What the last pass concluded, carried to the next (the sticky password verdict).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionMemory {
    /// The MD5 counter's last value.
    pub md5_failures: Option<u64>,
    /// Peers currently judged to fail authentication.
    pub auth_failing: BTreeSet<String>,
}

/// One peer's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionReport {
    pub peer: String,
    pub address: String,
    pub bgp_state: String,
    pub bfd_state: Option<String>,
    pub established: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Every peer's verdict from FRR's view (`None`: FRR did not answer) and the MD5 counter, and
/// the memory for the next pass.
pub fn compute_sessions(
    peers: &[PeerEntry],
    neighbors: Option<&BTreeMap<IpAddr, NeighborFacts>>,
    md5_failures: Option<u64>,
    memory: &SessionMemory,
) -> (Vec<SessionReport>, SessionMemory) {
    let md5_rose = match (memory.md5_failures, md5_failures) {
        (Some(before), Some(now)) => now > before,
        _ => false,
    };
    let mut next = SessionMemory {
        md5_failures: md5_failures.or(memory.md5_failures),
        auth_failing: BTreeSet::new(),
    };
    let mut out = Vec::new();
    for peer in peers {
        let report =
            |bgp_state: &str, bfd: Option<String>, reason, message: String| SessionReport {
                peer: peer.name.clone(),
                address: peer.address.clone(),
                bgp_state: bgp_state.to_string(),
                bfd_state: bfd,
                established: reason == reason::ESTABLISHED,
                reason,
                message,
            };
        if let Some(why) = &peer.left_out {
            out.push(report(
                STATE_NOT_CONFIGURED,
                None,
                reason::NOT_CONFIGURED,
                format!("left out of this node's FRR configuration: {why}"),
            ));
            continue;
        }
        let Some(neighbors) = neighbors else {
            out.push(report(
                STATE_UNKNOWN,
                None,
                reason::FRR_UNAVAILABLE,
                "FRR did not answer `show bgp neighbors`".to_string(),
            ));
            continue;
        };
        let facts = peer
            .address
            .parse::<IpAddr>()
            .ok()
            .and_then(|a| neighbors.get(&a));
        let Some(facts) = facts else {
            out.push(report(
                STATE_UNKNOWN,
                None,
                reason::CONNECTING,
                "not in FRR's neighbors yet: the configuration is being applied".to_string(),
            ));
            continue;
        };
        let bfd = facts.bfd.clone();
        if facts.state == STATE_ESTABLISHED {
            out.push(report(
                &facts.state,
                bfd,
                reason::ESTABLISHED,
                "the BGP session is established".to_string(),
            ));
            continue;
        }
        let notification = facts.last_error.as_deref().filter(|c| !c.is_empty());
        let (why, message) = if md5_rose || memory.auth_failing.contains(&peer.name) {
            next.auth_failing.insert(peer.name.clone());
            (
                reason::AUTHENTICATION_FAILURE,
                "TCP MD5 signatures do not match: the password differs from the router's, or one side has none".to_string(),
            )
        } else if notification == Some("0202") {
            (
                reason::BAD_PEER_AS,
                format!(
                    "OPEN refused: {} (check peerASN and myASN against the router)",
                    facts.last_notification.as_deref().unwrap_or("Bad Peer AS")
                ),
            )
        } else if let Some(code) = notification {
            (
                reason::NOTIFICATION,
                format!(
                    "last NOTIFICATION {code}: {}",
                    facts.last_notification.as_deref().unwrap_or("unknown")
                ),
            )
        } else {
            (
                reason::CONNECTING,
                format!("the session is in state {}", facts.state),
            )
        };
        out.push(report(&facts.state, bfd, why, message));
    }
    (out, next)
}

/// The record's name: `bgp-` and 24 hex digits of sha256(node "/" peer), so one node's record
/// of one peer always has the same name, whatever the lengths of the names.
pub fn session_record_name(node: &str, peer: &str) -> String {
    let digest = Sha256::digest(format!("{node}/{peer}"));
    let mut name = String::from("bgp-");
    for byte in &digest[..12] {
        let _ = write!(name, "{byte:02x}");
    }
    name
}

/// The record of `node`'s session with `report.peer`, in `namespace` (the agent's own). The
/// condition keeps `previous`'s transition time when its status did not change.
pub fn build_session_state(
    node: &str,
    namespace: &str,
    report: &SessionReport,
    previous: Option<&BGPSessionStateSpec>,
    now: Time,
) -> BGPSessionState {
    let mut labels = BTreeMap::new();
    labels.insert(label::BGP_PEER.to_string(), report.peer.clone());
    if berth_core::dns1123_label_problem(node).is_none() {
        labels.insert(label::NODE.to_string(), node.to_string());
    }
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    set_condition(
        &mut conditions,
        Condition {
            type_: ESTABLISHED.to_string(),
            status: if report.established { TRUE } else { FALSE }.to_string(),
            reason: report.reason.to_string(),
            message: bounded(&report.message, 1024),
            observed_generation: None,
            last_transition_time: now,
        },
    );
    BGPSessionState {
        metadata: ObjectMeta {
            name: Some(session_record_name(node, &report.peer)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: BGPSessionStateSpec {
            node: node.to_string(),
            peer: report.peer.clone(),
            peer_address: report.address.clone(),
            bgp_state: report.bgp_state.clone(),
            bfd_state: report.bfd_state.clone(),
            conditions,
        },
    }
}

/// Reasons that are a misconfiguration someone must fix, and so a Warning Event on the BGPPeer
/// when a node's session turns to one of them.
pub const WARNING_REASONS: [&str; 3] = [
    reason::BAD_PEER_AS,
    reason::AUTHENTICATION_FAILURE,
    reason::NOT_CONFIGURED,
];

/// The Warning Event due when `node`'s session with a peer went from `before` (a condition
/// reason, `None` for a new record) to `report`: only on a change into one of
/// [`WARNING_REASONS`]. Events about a cluster-scoped BGPPeer live in `default`, as upstream
/// records them.
pub fn build_session_event(
    node: &str,
    before: Option<&str>,
    report: &SessionReport,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<k8s_openapi::api::events::v1::Event> {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    if before == Some(report.reason) || !WARNING_REASONS.contains(&report.reason) {
        return None;
    }
    Some(k8s_openapi::api::events::v1::Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{:x}",
                session_record_name(node, &report.peer),
                now.as_nanosecond()
            )),
            namespace: Some("default".to_string()),
            ..ObjectMeta::default()
        },
        action: Some("Peer".into()),
        reason: Some(report.reason.to_string()),
        note: Some(bounded(
            &format!("node {node}: {}", report.message),
            berth_api::MAX_EVENT_NOTE,
        )),
        type_: Some("Warning".into()),
        event_time: Some(MicroTime(now)),
        regarding: Some(ObjectReference {
            api_version: Some(berth_api::names::API_VERSION.into()),
            kind: Some(berth_api::names::KIND_BGP_PEER.into()),
            name: Some(report.peer.clone()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(berth_api::names::event::AGENT_COMPONENT.into()),
        reporting_instance: Some(node.to_string()),
        ..Default::default()
    })
}

/// Whether two records say the same, transition times aside: a write is due only when not.
pub fn same_observation(a: &BGPSessionStateSpec, b: &BGPSessionStateSpec) -> bool {
    let strip = |s: &BGPSessionStateSpec| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

/// Whether `record` is `node`'s, under the name it would give it.
pub fn is_own_session_record(node: &str, record: &BGPSessionState) -> bool {
    record.spec.node == node
        && record.metadata.name.as_deref() == Some(&*session_record_name(node, &record.spec.peer))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ESTABLISHED_JSON: &str = r#"{"198.18.0.1":{"remoteAs":64513,"bgpState":"Established",
        "lastResetDueTo":"No AFI/SAFI activated for peer","lastResetCode":30,
        "peerBfdInfo":{"type":"single hop","status":"Up"}}}"#;
    const BAD_AS_JSON: &str = r#"{"198.18.0.1":{"remoteAs":64514,"bgpState":"Idle",
        "lastErrorCodeSubcode":"0202","lastNotificationReason":"OPEN Message Error/Bad Peer AS",
        "lastResetDueTo":"BGP Notification send"}}"#;
    const CONNECT_JSON: &str = r#"{"198.18.0.1":{"bgpState":"Connect",
        "lastResetDueTo":"Waiting for peer OPEN","authenticationEnabled":1}}"#;
    const CEASE_JSON: &str = r#"{"198.18.0.1":{"bgpState":"Active",
        "lastErrorCodeSubcode":"0602","lastNotificationReason":"Cease/Administrative Shutdown"}}"#;
    const NETSTAT: &str = "TcpExt: SyncookiesSent TCPMD5NotFound TCPMD5Unexpected TCPMD5Failure\n\
        TcpExt: 0 1 2 3\nIpExt: InNoRoutes\nIpExt: 0\n";

    fn mk_peer(left_out: Option<&str>) -> PeerEntry {
        PeerEntry {
            name: "tor".into(),
            address: "198.18.0.1".into(),
            left_out: left_out.map(str::to_string),
        }
    }

    #[test]
    fn frr_and_kernel_texts_parse() {
        let n = parse_neighbors(ESTABLISHED_JSON).expect("json");
        let facts = &n[&"198.18.0.1".parse::<IpAddr>().expect("ip")];
        assert_eq!(facts.state, "Established");
        assert_eq!(facts.bfd.as_deref(), Some("Up"));
        let n = parse_neighbors(r#"{"vrfId":0,"fd00::1":{"bgpState":"Active"}}"#).expect("json");
        assert_eq!(n.len(), 1);
        assert!(parse_neighbors("% BGP instance not found").is_err());
        assert_eq!(parse_md5_failures(NETSTAT), Some(6));
        assert_eq!(parse_md5_failures("TcpExt: A\nTcpExt: 1\n"), None);
        assert_eq!(parse_md5_failures(""), None);
    }

    /// One row per verdict: (what, peer, FRR's answer, MD5 counter before and now, remembered
    /// auth failure) -> (reason, established).
    #[test]
    fn verdicts() {
        type Row<'a> = (
            &'a str,
            PeerEntry,
            Option<&'a str>,
            (Option<u64>, Option<u64>),
            bool,
            &'a str,
        );
        let rows: Vec<Row> = vec![
            (
                "up",
                mk_peer(None),
                Some(ESTABLISHED_JSON),
                (Some(1), Some(1)),
                false,
                reason::ESTABLISHED,
            ),
            (
                "up despite MD5 noise",
                mk_peer(None),
                Some(ESTABLISHED_JSON),
                (Some(1), Some(9)),
                true,
                reason::ESTABLISHED,
            ),
            (
                "bad AS",
                mk_peer(None),
                Some(BAD_AS_JSON),
                (Some(1), Some(1)),
                false,
                reason::BAD_PEER_AS,
            ),
            (
                "MD5 failures rose",
                mk_peer(None),
                Some(CONNECT_JSON),
                (Some(1), Some(4)),
                false,
                reason::AUTHENTICATION_FAILURE,
            ),
            (
                "MD5 remembered",
                mk_peer(None),
                Some(CONNECT_JSON),
                (Some(4), Some(4)),
                true,
                reason::AUTHENTICATION_FAILURE,
            ),
            (
                "first look at the counter",
                mk_peer(None),
                Some(CONNECT_JSON),
                (None, Some(4)),
                false,
                reason::CONNECTING,
            ),
            (
                "other notification",
                mk_peer(None),
                Some(CEASE_JSON),
                (Some(1), Some(1)),
                false,
                reason::NOTIFICATION,
            ),
            (
                "connecting",
                mk_peer(None),
                Some(CONNECT_JSON),
                (Some(1), Some(1)),
                false,
                reason::CONNECTING,
            ),
            (
                "not in FRR yet",
                mk_peer(None),
                Some("{}"),
                (None, None),
                false,
                reason::CONNECTING,
            ),
            (
                "FRR silent",
                mk_peer(None),
                None,
                (None, None),
                false,
                reason::FRR_UNAVAILABLE,
            ),
            (
                "left out",
                mk_peer(Some("BFDProfile fast does not exist")),
                None,
                (None, None),
                false,
                reason::NOT_CONFIGURED,
            ),
        ];
        for (what, peer, json, (before, now), remembered, want) in rows {
            let neighbors = json.map(|j| parse_neighbors(j).expect("json"));
            let memory = SessionMemory {
                md5_failures: before,
                auth_failing: if remembered {
                    ["tor".to_string()].into()
                } else {
                    BTreeSet::new()
                },
            };
            let (reports, next) = compute_sessions(
                std::slice::from_ref(&peer),
                neighbors.as_ref(),
                now,
                &memory,
            );
            assert_eq!(reports.len(), 1, "{what}");
            assert_eq!(reports[0].reason, want, "{what}");
            assert_eq!(
                reports[0].established,
                want == reason::ESTABLISHED,
                "{what}"
            );
            assert_eq!(
                next.auth_failing.contains("tor"),
                want == reason::AUTHENTICATION_FAILURE,
                "{what}: remembered for the next pass"
            );
        }
    }

    #[test]
    fn warnings_only_on_a_change_into_a_misconfiguration() {
        let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let mk = |why: &'static str| SessionReport {
            peer: "tor".into(),
            address: "198.18.0.1".into(),
            bgp_state: "Idle".into(),
            bfd_state: None,
            established: why == reason::ESTABLISHED,
            reason: why,
            message: "why".into(),
        };
        let event = build_session_event(
            "node-1",
            Some(reason::CONNECTING),
            &mk(reason::BAD_PEER_AS),
            now,
        )
        .expect("an Event");
        assert_eq!(event.reason.as_deref(), Some("BadPeerAS"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.note.as_deref(), Some("node node-1: why"));
        let regarding = event.regarding.expect("regarding");
        assert_eq!(
            (regarding.kind.as_deref(), regarding.name.as_deref()),
            (Some("BGPPeer"), Some("tor"))
        );
        assert!(build_session_event("node-1", None, &mk(reason::NOT_CONFIGURED), now).is_some());
        assert!(
            build_session_event("node-1", None, &mk(reason::AUTHENTICATION_FAILURE), now).is_some()
        );
        // No repeat, and nothing for a healthy or settling session.
        assert!(build_session_event(
            "node-1",
            Some(reason::BAD_PEER_AS),
            &mk(reason::BAD_PEER_AS),
            now
        )
        .is_none());
        for fine in [
            reason::ESTABLISHED,
            reason::CONNECTING,
            reason::FRR_UNAVAILABLE,
            reason::NOTIFICATION,
        ] {
            assert!(
                build_session_event("node-1", None, &mk(fine), now).is_none(),
                "{fine}"
            );
        }
    }

    #[test]
    fn records_keep_transition_times_and_names() {
        let t = |s| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"));
        let (down, _) = compute_sessions(
            &[mk_peer(None)],
            Some(&parse_neighbors(CONNECT_JSON).expect("json")),
            None,
            &SessionMemory::default(),
        );
        let first = build_session_state("node-1", "berth-system", &down[0], None, t(10));
        assert_eq!(
            first.metadata.name,
            Some(session_record_name("node-1", "tor"))
        );
        assert!(is_own_session_record("node-1", &first));
        assert!(!is_own_session_record("node-2", &first));
        assert_eq!(first.spec.bgp_state, "Connect");
        // Same status, later: the transition time stays and nothing is due.
        let again =
            build_session_state("node-1", "berth-system", &down[0], Some(&first.spec), t(20));
        assert_eq!(again.spec.conditions[0].last_transition_time, t(10));
        assert!(same_observation(&first.spec, &again.spec));
        let (up, _) = compute_sessions(
            &[mk_peer(None)],
            Some(&parse_neighbors(ESTABLISHED_JSON).expect("json")),
            None,
            &SessionMemory::default(),
        );
        let upped = build_session_state("node-1", "berth-system", &up[0], Some(&first.spec), t(30));
        assert_eq!(upped.spec.conditions[0].last_transition_time, t(30));
        assert_eq!(upped.spec.conditions[0].status, TRUE);
        assert_eq!(upped.spec.bfd_state.as_deref(), Some("Up"));
        assert!(!same_observation(&first.spec, &upped.spec));
        assert_ne!(
            session_record_name("a", "bc"),
            session_record_name("ab", "c")
        );
    }
}
