//! The agents' Leases: this agent's own (built here, renewed and deleted by the run loop) and
//! everyone's as seen through one watch, reduced to when each stops being fresh and where its
//! membership socket listens.
//!
//! Freshness follows client-go's observed-time rule, never the writer's clock: a Lease is fresh
//! until its duration has passed, by this agent's own clock, since this agent last saw its
//! `renewTime` change (or first saw it). A peer whose clock runs ahead or behind can neither
//! keep a dead Lease fresh nor make a live one look expired; the price is that a Lease first
//! seen (at start, or after a relist that finds a new one) counts as fresh for one duration.
//!
//! The same renewals tell how far the writer's clock is from this agent's
//! ([`LeaseView::clock_offset_ms`]): `renewTime` is the writer's clock when it renewed, and the
//! moment this agent sees the change is its own clock a little later. Each sample is the true
//! offset minus that delay (the API request and the watch), never more; so the largest of the
//! last few samples is the estimate (NTP's minimum-delay filter, in one line). The membership
//! datagrams' stamps are judged against the sender's clock through it ([`crate::frame`]), so a
//! node whose clock is off stays a member.

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
    /// `renewTime` (else `acquireTime`) as written, in milliseconds since the Unix epoch of the
    /// writer's clock: compared only with itself, to see a renewal.
    pub renewed_ms: Option<i64>,
    /// `leaseDurationSeconds` in milliseconds; `None`: absent or not positive (never fresh).
    pub duration_ms: Option<i64>,
    pub endpoint: Option<SocketAddr>,
}

/// The node and the record of an agent Lease; `None` for any other Lease.
pub fn read_lease(object: &Lease) -> Option<(String, LeaseRecord)> {
    let name = object.metadata.name.as_deref()?;
    let spec = object.spec.as_ref();
    let holder = spec.and_then(|s| s.holder_identity.as_deref());
    let node = lease::agent_lease_node(name, holder)?;
    let renewed = spec
        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
        .map(|MicroTime(t)| t.as_millisecond());
    let duration_ms = spec
        .and_then(|s| s.lease_duration_seconds)
        .filter(|s| *s > 0)
        .map(|s| i64::from(s) * 1000);
    let endpoint = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotation::MEMBERSHIP_ENDPOINT))
        .and_then(|e| e.parse().ok());
    Some((
        node.to_string(),
        LeaseRecord {
            renewed_ms: renewed,
            duration_ms,
            endpoint,
        },
    ))
}

/// Renewals kept per Lease to estimate its writer's clock offset: with a renewal every third
/// of the duration, the last few cover one duration, so a stepped clock is followed within it.
const OFFSET_SAMPLES: usize = 4;

/// A Lease as this agent observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    record: LeaseRecord,
    /// When it stops being fresh by this agent's clock; `None`: never fresh.
    expires_ms: Option<i64>,
    /// `renewTime` minus this agent's clock when each of the last renewals was seen, oldest
    /// first.
    offsets_ms: Vec<i64>,
}

/// The writer's clock minus this agent's, from samples taken when renewals were seen (each is
/// the offset minus the delay before the renewal was seen): the largest, the least delayed.
pub fn estimate_offset_ms(samples: &[i64]) -> Option<i64> {
    samples.iter().copied().max()
}

/// Every agent Lease seen, by node.
#[derive(Debug, Clone, Default)]
pub struct LeaseView {
    records: BTreeMap<String, Observed>,
    /// Nodes listed during a relist in progress.
    relisting: Option<BTreeSet<String>>,
}

impl LeaseView {
    /// A Lease created or changed, seen at `now_ms` by this agent's clock; returns its node
    /// when it is an agent Lease. Its freshness starts over only when its renew time changed.
    pub fn apply(&mut self, object: &Lease, now_ms: i64) -> Option<String> {
        let (node, record) = read_lease(object)?;
        if let Some(listed) = self.relisting.as_mut() {
            listed.insert(node.clone());
        }
        let renewed = self.records.get(&node).is_none_or(|seen| {
            seen.record.renewed_ms != record.renewed_ms
                || seen.record.duration_ms != record.duration_ms
        });
        let seen = self.records.remove(&node);
        let expires_ms = if renewed {
            record
                .renewed_ms
                .and(record.duration_ms)
                .map(|d| now_ms.saturating_add(d))
        } else {
            seen.as_ref().and_then(|seen| seen.expires_ms)
        };
        let mut offsets_ms = seen.map(|seen| seen.offsets_ms).unwrap_or_default();
        if let (true, Some(written)) = (renewed, record.renewed_ms) {
            offsets_ms.push(written.saturating_sub(now_ms));
            if offsets_ms.len() > OFFSET_SAMPLES {
                offsets_ms.remove(0);
            }
        }
        self.records.insert(
            node.clone(),
            Observed {
                record,
                expires_ms,
                offsets_ms,
            },
        );
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
            Some(Observed {
                expires_ms: Some(end),
                ..
            }) if *end > now_ms => LeaseState::Fresh,
            Some(_) => LeaseState::Expired,
        }
    }

    /// How far `node`'s clock is ahead of this agent's (negative: behind), estimated from its
    /// renewals; `None` before a renewal time was seen.
    pub fn clock_offset_ms(&self, node: &str) -> Option<i64> {
        self.records
            .get(node)
            .and_then(|r| estimate_offset_ms(&r.offsets_ms))
    }

    pub fn endpoint(&self, node: &str) -> Option<SocketAddr> {
        self.records.get(node).and_then(|r| r.record.endpoint)
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
                    renewed_ms: Some(1_000),
                    duration_ms: Some(10_000),
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
        // A node name too long for the prefix: a hashed Lease name, read back by its holder.
        let long = format!("{}.example.com", "a".repeat(239));
        let hashed = build_lease(&long, "ns", Duration::from_secs(10), None, at(0));
        assert!(hashed.metadata.name.as_ref().unwrap().len() <= 253);
        assert_eq!(read_lease(&hashed).unwrap().0, long);
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
                renewed_ms: None,
                duration_ms: None,
                endpoint: None
            }
        );
    }

    #[test]
    fn the_view_tells_fresh_expired_and_absent() {
        let mut view = LeaseView::default();
        view.apply(
            &build_lease("a", "ns", Duration::from_secs(10), None, at(1_000)),
            1_000,
        );
        let mut stale = build_lease("b", "ns", Duration::from_secs(10), None, at(0));
        stale.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
        view.apply(&stale, 0);
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
        let lease = |node| build_lease(node, "ns", Duration::from_secs(10), None, at(0));
        view.apply(&lease("a"), 0);
        view.apply(&lease("b"), 0);
        view.begin_relist();
        view.apply(&lease("b"), 5_000);
        view.finish_relist();
        assert_eq!(view.nodes().collect::<Vec<_>>(), vec!["b"]);
        // Listed again unchanged: not a renewal.
        assert_eq!(view.state("b", 10_000), LeaseState::Expired);
    }

    #[test]
    fn freshness_is_observed_by_this_clock_whatever_the_writers_clock_says() {
        let ten = Duration::from_secs(10);
        // The writer's clock is an hour ahead: its renewals still last ten seconds here.
        let hour = 3_600_000;
        let mut view = LeaseView::default();
        view.apply(&build_lease("ahead", "ns", ten, None, at(hour)), 0);
        assert_eq!(view.state("ahead", 9_999), LeaseState::Fresh);
        assert_eq!(view.state("ahead", 10_000), LeaseState::Expired);
        // A renewal (a new renewTime) observed at 10 s: fresh until 20 s.
        view.apply(
            &build_lease("ahead", "ns", ten, None, at(hour + 10_000)),
            10_000,
        );
        assert_eq!(view.state("ahead", 19_999), LeaseState::Fresh);
        // The same renewTime seen again (an annotation changed, a relist) renews nothing.
        let mut annotated = build_lease("ahead", "ns", ten, None, at(hour + 10_000));
        annotated.metadata.annotations = Some(BTreeMap::from([(
            annotation::MEMBERSHIP_ENDPOINT.to_string(),
            "198.18.0.11:7947".to_string(),
        )]));
        view.apply(&annotated, 15_000);
        assert_eq!(view.state("ahead", 20_000), LeaseState::Expired);
        assert_eq!(
            view.endpoint("ahead"),
            Some("198.18.0.11:7947".parse().unwrap())
        );
        // The writer's clock is an hour behind: its live Lease is not taken as expired.
        view.apply(&build_lease("behind", "ns", ten, None, at(0)), hour);
        assert_eq!(view.state("behind", hour + 9_999), LeaseState::Fresh);
        assert_eq!(view.next_expiry(hour), Some(hour + 10_000));
        // A dead agent's Lease, first seen now, counts once for its duration, then never.
        view.apply(&build_lease("dead", "ns", ten, None, at(0)), 2 * hour);
        assert_eq!(view.state("dead", 2 * hour + 9_999), LeaseState::Fresh);
        assert_eq!(view.state("dead", 2 * hour + 10_000), LeaseState::Expired);
    }

    #[test]
    fn the_writers_clock_offset_is_the_least_delayed_of_its_last_renewals() {
        let ten = Duration::from_secs(10);
        let hour = 3_600_000;
        let mut view = LeaseView::default();
        assert_eq!(view.clock_offset_ms("a"), None);
        // The writer is an hour ahead; its renewals are seen 40 ms, 5 ms, 900 ms (a slow
        // watch) after it wrote them.
        for (written, seen) in [(hour, 40), (hour + 3_000, 3_005), (hour + 6_000, 6_900)] {
            view.apply(&build_lease("a", "ns", ten, None, at(written)), seen);
        }
        assert_eq!(view.clock_offset_ms("a"), Some(hour - 5));
        // The same renewal seen again (a relist, an annotation) is no new sample.
        view.apply(&build_lease("a", "ns", ten, None, at(hour + 6_000)), 20_000);
        assert_eq!(view.clock_offset_ms("a"), Some(hour - 5));
        // Its clock is stepped back to ours: followed once the older samples have left.
        for i in 1..=OFFSET_SAMPLES as i64 {
            view.apply(
                &build_lease("a", "ns", ten, None, at(30_000 + i * 3_000)),
                30_010 + i * 3_000,
            );
        }
        assert_eq!(view.clock_offset_ms("a"), Some(-10));
        // A writer behind this clock, and a Lease without a renewal time.
        view.apply(&build_lease("b", "ns", ten, None, at(1_000)), hour);
        assert_eq!(view.clock_offset_ms("b"), Some(1_000 - hour));
        let mut never = build_lease("c", "ns", ten, None, at(0));
        never.spec.as_mut().unwrap().renew_time = None;
        view.apply(&never, 0);
        assert_eq!(view.clock_offset_ms("c"), None);
        assert_eq!(estimate_offset_ms(&[]), None);
        assert_eq!(estimate_offset_ms(&[-3, 7, 2]), Some(7));
    }
}
