//! The agent's metrics, registered once into the process registry as `berth_agent_*`.

use berth_datapath::backend::SyncKind;
use berth_telemetry::MetricsRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Unit;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `full` or `partial`.
    pub kind: &'static str,
}

fn kind_label(kind: SyncKind) -> KindLabels {
    KindLabels {
        kind: match kind {
            SyncKind::Full => "full",
            SyncKind::Partial => "partial",
        },
    }
}

fn sync_histogram() -> Histogram {
    // 0.5 ms to ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn latency_histogram() -> Histogram {
    // 1 ms to ~65 s, four buckets per doubling: a quantile interpolated within a bucket is off by
    // at most 19%, where doubling buckets let "1.1 s" and "2 s" look alike against a 1 s target.
    Histogram::new(exponential_buckets(0.001, 2f64.powf(0.25), 65))
}

/// Clones share their values, so the sync loop and tests can hold the same metrics.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    pub sync_duration: Family<KindLabels, Histogram, fn() -> Histogram>,
    pub rules: Gauge,
    pub restore_failures: Counter,
    pub network_programming: Histogram,
    pub health_check_servers: Gauge,
    pub conntrack_failures: Counter,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics {
            sync_duration: Family::new_with_constructor(sync_histogram),
            rules: Gauge::default(),
            restore_failures: Counter::default(),
            network_programming: latency_histogram(),
            health_check_servers: Gauge::default(),
            conntrack_failures: Counter::default(),
        }
    }
}

impl AgentMetrics {
    /// Metrics registered under `berth_agent_`.
    pub fn register(registry: &mut MetricsRegistry) -> Self {
        let metrics = AgentMetrics::default();
        let agent = registry.sub_registry("agent");
        agent.register_with_unit(
            "sync_duration",
            "Time to apply one datapath sync, by kind (full or partial)",
            Unit::Seconds,
            metrics.sync_duration.clone(),
        );
        agent.register(
            "rules",
            "Rules in the berth chains after the last successful sync",
            metrics.rules.clone(),
        );
        agent.register(
            "restore_failures",
            "Datapath syncs that failed",
            metrics.restore_failures.clone(),
        );
        agent.register_with_unit(
            "network_programming_duration",
            "From an EndpointSlice's last-change-trigger-time to the sync that programmed it",
            Unit::Seconds,
            metrics.network_programming.clone(),
        );
        agent.register(
            "health_check_servers",
            "Health-check node-port servers running",
            metrics.health_check_servers.clone(),
        );
        agent.register(
            "conntrack_cleanup_failures",
            "conntrack deletions that failed",
            metrics.conntrack_failures.clone(),
        );
        metrics
    }

    pub fn observe_sync(&self, kind: SyncKind, seconds: f64) {
        self.sync_duration
            .get_or_create(&kind_label(kind))
            .observe(seconds);
    }
}
