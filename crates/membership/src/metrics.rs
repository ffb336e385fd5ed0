//! `berth_membership_*`: changes of the live set, crash detection time, refused datagrams.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use crate::frame::Refusal;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabels {
    /// `up` (a node became live) or `down`.
    pub change: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// Before authentication: `size`, `version`, `unknown_source`, `rate_limited`, `backlog`;
    /// after: `malformed`, `bad_tag`, `wrong_recipient`, `stale` or `replayed`.
    pub reason: &'static str,
}

fn wake_delay_histogram() -> Histogram {
    // 1 ms to ~1 s: a heartbeat is every 40 ms, a peer is dropped after 250 ms.
    Histogram::new(exponential_buckets(0.001, 2.0, 11))
}

fn detection_histogram() -> Histogram {
    // 50 ms to ~50 s.
    Histogram::new(exponential_buckets(0.05, 2.0, 11))
}

/// Clones share their values, so the run loop and tests can hold the same metrics.
#[derive(Debug, Clone)]
pub struct MembershipMetrics {
    pub changes: Family<ChangeLabels, Counter>,
    pub live_nodes: Gauge,
    pub detection: Histogram,
    pub refused: Family<RefusalLabels, Counter>,
    /// How late the run loop woke for its timers: its thread's (or process's) stalls.
    pub wake_delay: Histogram,
    /// The largest offset between a peer's clock and this node's, in seconds.
    pub clock_offset: Gauge<f64, AtomicU64>,
}

impl Default for MembershipMetrics {
    fn default() -> Self {
        MembershipMetrics {
            changes: Family::default(),
            live_nodes: Gauge::default(),
            detection: detection_histogram(),
            refused: Family::default(),
            wake_delay: wake_delay_histogram(),
            clock_offset: Gauge::default(),
        }
    }
}

impl MembershipMetrics {
    /// Registers into `registry`, which the caller prefixes (`berth_membership_` from the
    /// process registry's `sub_registry("membership")`).
    pub fn register(&self, membership: &mut Registry) {
        membership.register(
            "changes",
            "Nodes entering (up) or leaving (down) the set of live agents",
            self.changes.clone(),
        );
        membership.register(
            "live_nodes",
            "Nodes whose agent is live, as this agent sees it",
            self.live_nodes.clone(),
        );
        membership.register_with_unit(
            "detection",
            "From the last datagram heard from a peer to SWIM declaring it down",
            Unit::Seconds,
            self.detection.clone(),
        );
        membership.register(
            "refused_messages",
            "Membership datagrams dropped, by reason (size, version, unknown source, rate, backlog, authentication, freshness, replay)",
            self.refused.clone(),
        );
        membership.register_with_unit(
            "wake_delay",
            "How late the membership loop woke for a timer (heartbeat, probe, expiry)",
            Unit::Seconds,
            self.wake_delay.clone(),
        );
        membership.register_with_unit(
            "peer_clock_offset",
            "The largest difference between a peer agent's clock and this one's, estimated from their Lease renewals (membership datagrams are judged by the sender's clock)",
            Unit::Seconds,
            self.clock_offset.clone(),
        );
        // Every reason shows, at zero, from the start.
        for reason in Refusal::ALL {
            let _ = self.refused.get_or_create(&RefusalLabels {
                reason: reason.label(),
            });
        }
    }

    pub fn refused_total(&self) -> u64 {
        Refusal::ALL.iter().map(|r| self.refused_count(*r)).sum()
    }

    pub fn refused_count(&self, reason: Refusal) -> u64 {
        self.refused
            .get_or_create(&RefusalLabels {
                reason: reason.label(),
            })
            .get()
    }

    pub(crate) fn refuse(&self, reason: Refusal) {
        self.refused
            .get_or_create(&RefusalLabels {
                reason: reason.label(),
            })
            .inc();
    }

    pub(crate) fn change(&self, up: bool, count: usize) {
        self.changes
            .get_or_create(&ChangeLabels {
                change: if up { "up" } else { "down" },
            })
            .inc_by(count as u64);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn every_metric_is_registered_under_the_membership_prefix() {
        let metrics = MembershipMetrics::default();
        let mut registry = Registry::with_prefix("berth");
        metrics.register(registry.sub_registry_with_prefix("membership"));
        metrics.change(true, 2);
        metrics.refuse(Refusal::BadTag);
        metrics.detection.observe(0.7);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap_or_default();
        for line in [
            "berth_membership_changes_total{change=\"up\"} 2",
            "berth_membership_refused_messages_total{reason=\"bad_tag\"} 1",
            "berth_membership_refused_messages_total{reason=\"replayed\"} 0",
            "berth_membership_detection_seconds_count 1",
            "berth_membership_live_nodes 0",
            "berth_membership_wake_delay_seconds_count 0",
            "berth_membership_peer_clock_offset_seconds 0.0",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert_eq!(metrics.refused_total(), 1);
    }
}
