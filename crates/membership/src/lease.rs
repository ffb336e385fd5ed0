//! The agents' Leases: this agent's own (built here, renewed and deleted by the run loop) and
//! everyone's as seen through one watch, reduced to when each stops being fresh and where its
//! membership socket listens.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use berth_api::names::{annotation, lease};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use crate::live::LeaseState;

/// This agent's Lease as it is renewed: held by the node, with the membership endpoint.
pub fn build_lease(
    node: &str,
    namespace: &str,
    duration: Duration,
    endpoint: Option<SocketAddr>,
    now: Timestamp,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(lease::agent_lease_name(node)),
            namespace: Some(namespace.to_string()),
            annotations: endpoint.map(|e| {
                BTreeMap::from([(annotation::MEMBERSHIP_ENDPOINT.to_string(), e.to_string())])
            }),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// What one agent Lease says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// When it stops being fresh, in milliseconds since the Unix epoch; `None`: never fresh
    /// (no renew time or no duration).
    pub expires_ms: Option<i64>,
    pub endpoint: Option<SocketAddr>,
}

/// The node and the record of an agent Lease; `None` for any other Lease.
pub fn read_lease(object: &Lease) -> Option<(String, LeaseRecord)> {
    let name = object.metadata.name.as_deref()?;
    let node = lease::node_of_agent_lease(name)?;
    let spec = object.spec.as_ref();
    let renewed = spec
        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
        .map(|MicroTime(t)| t.as_millisecond());
    let duration_ms = spec
        .and_then(|s| s.lease_duration_seconds)
        .filter(|s| *s > 0)
        .map(|s| i64::from(s) * 1000);
    let expires_ms = renewed.zip(duration_ms).map(|(r, d)| r.saturating_add(d));
    let endpoint = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotation::MEMBERSHIP_ENDPOINT))
        .and_then(|e| e.parse().ok());
    Some((
        node.to_string(),
        LeaseRecord {
            expires_ms,
            endpoint,
        },
    ))
}

/// Every agent Lease seen, by node.
#[derive(Debug, Clone, Default)]
pub struct LeaseView {
    records: BTreeMap<String, LeaseRecord>,
    /// Nodes listed during a relist in progress.
    relisting: Option<BTreeSet<String>>,
}

impl LeaseView {
    /// A Lease created or changed; returns its node when it is an agent Lease.
    pub fn apply(&mut self, object: &Lease) -> Option<String> {
        let (node, record) = read_lease(object)?;
        if let Some(listed) = self.relisting.as_mut() {
            listed.insert(node.clone());
        }
        self.records.insert(node.clone(), record);
        Some(node)
    }

    pub fn delete(&mut self, object: &Lease) {
        if let Some((node, _)) = read_lease(object) {
            self.records.remove(&node);
        }
    }

    /// A relist starts: what it does not name is gone when it finishes.
    pub fn begin_relist(&mut self) {
        self.relisting = Some(BTreeSet::new());
    }

    pub fn finish_relist(&mut self) {
        if let Some(listed) = self.relisting.take() {
            self.records.retain(|node, _| listed.contains(node));
        }
    }

    pub fn state(&self, node: &str, now_ms: i64) -> LeaseState {
        match self.records.get(node) {
            None => LeaseState::Absent,
            Some(LeaseRecord {
                expires_ms: Some(end),
                ..
            }) if *end > now_ms => LeaseState::Fresh,
            Some(_) => LeaseState::Expired,
        }
    }

    pub fn endpoint(&self, node: &str) -> Option<SocketAddr> {
        self.records.get(node).and_then(|r| r.endpoint)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.records.keys().map(String::as_str)
    }

    /// The next moment a fresh Lease expires, to look again then.
    pub fn next_expiry(&self, now_ms: i64) -> Option<i64> {
        self.records
            .values()
            .filter_map(|r| r.expires_ms)
            .filter(|end| *end > now_ms)
            .min()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).unwrap()
    }

    #[test]
    fn an_agent_lease_reads_back_as_built() {
        let endpoint: SocketAddr = "198.18.0.11:7947".parse().unwrap();
        let built = build_lease(
            "node-a",
            "berth-system",
            Duration::from_secs(10),
            Some(endpoint),
            at(1_000),
        );
        assert_eq!(built.metadata.name.as_deref(), Some("berth-agent-node-a"));
        assert_eq!(
            read_lease(&built),
            Some((
                "node-a".to_string(),
                LeaseRecord {
                    expires_ms: Some(11_000),
                    endpoint: Some(endpoint),
                }
            ))
        );
        let without = build_lease(
            "node-a",
            "berth-system",
            Duration::from_secs(10),
            None,
            at(1_000),
        );
        assert_eq!(read_lease(&without).unwrap().1.endpoint, None);
    }

    #[test]
    fn other_leases_and_broken_fields_are_handled() {
        let mut controller = build_lease("x", "ns", Duration::from_secs(10), None, at(0));
        controller.metadata.name = Some("berth-controller".into());
        assert_eq!(read_lease(&controller), None);
        let mut no_spec = build_lease("node-b", "ns", Duration::from_secs(10), None, at(0));
        no_spec.spec = None;
        no_spec.metadata.annotations = Some(BTreeMap::from([(
            annotation::MEMBERSHIP_ENDPOINT.to_string(),
            "not an address".to_string(),
        )]));
        assert_eq!(
            read_lease(&no_spec).unwrap().1,
            LeaseRecord {
                expires_ms: None,
                endpoint: None
            }
        );
    }

    #[test]
    fn the_view_tells_fresh_expired_and_absent() {
        let mut view = LeaseView::default();
        view.apply(&build_lease(
            "a",
            "ns",
            Duration::from_secs(10),
            None,
            at(1_000),
        ));
        let mut stale = build_lease("b", "ns", Duration::from_secs(10), None, at(0));
        stale.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
        view.apply(&stale);
        assert_eq!(view.state("a", 10_999), LeaseState::Fresh);
        assert_eq!(view.state("a", 11_000), LeaseState::Expired);
        assert_eq!(view.state("b", 0), LeaseState::Expired);
        assert_eq!(view.state("c", 0), LeaseState::Absent);
        assert_eq!(view.next_expiry(5_000), Some(11_000));
        assert_eq!(view.next_expiry(11_000), None);
        view.delete(&build_lease(
            "a",
            "ns",
            Duration::from_secs(10),
            None,
            at(0),
        ));
        assert_eq!(view.state("a", 0), LeaseState::Absent);
    }

    #[test]
    fn a_relist_forgets_what_it_does_not_name() {
        let mut view = LeaseView::default();
        view.apply(&build_lease(
            "a",
            "ns",
            Duration::from_secs(10),
            None,
            at(0),
        ));
        view.apply(&build_lease(
            "b",
            "ns",
            Duration::from_secs(10),
            None,
            at(0),
        ));
        view.begin_relist();
        view.apply(&build_lease(
            "b",
            "ns",
            Duration::from_secs(10),
            None,
            at(0),
        ));
        view.finish_relist();
        assert_eq!(view.nodes().collect::<Vec<_>>(), vec!["b"]);
    }
}
