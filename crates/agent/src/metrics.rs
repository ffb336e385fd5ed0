//! The agent's metrics, registered once into the process registry as `berth_agent_*`, and
//! kube-proxy's own (`kubeproxy_*`, see [`KubeProxyMetrics`]) beside them.

use berth_datapath::backend::SyncKind;
use berth_telemetry::MetricsRegistry;
use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

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
    pub kube_proxy: KubeProxyMetrics,
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
            kube_proxy: KubeProxyMetrics::default(),
        }
    }
}

impl AgentMetrics {
    /// Metrics registered under `berth_agent_`, and kube-proxy's under `kubeproxy_`.
    pub fn register(registry: &mut MetricsRegistry) -> Self {
        let metrics = AgentMetrics::default();
        metrics
            .kube_proxy
            .register_into(registry.kube_proxy_registry());
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

/// One family's apply in one sync.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FamilyOutcome {
    /// `IPv4` or `IPv6`, kube-proxy's `ip_family` label values.
    pub family: &'static str,
    /// `iptables` or `nftables`.
    pub backend: &'static str,
    pub seconds: f64,
    /// `None` when the apply failed.
    pub kind: Option<SyncKind>,
    /// Rules in berth's chains of each table, as planned.
    pub rules_by_table: Vec<(&'static str, usize)>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    pub ip_family: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyTableLabels {
    pub ip_family: &'static str,
    pub table: &'static str,
}

type FamilyHistograms = Family<FamilyLabels, Histogram, fn() -> Histogram>;

/// kube-proxy's `SyncProxyRulesLatency` buckets: 1 ms doubling 15 times (to ~16 s).
fn kube_proxy_sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// kube-proxy's `NetworkProgrammingLatency` buckets, its `merge` included (which starts with 0):
/// 0, 0.25 s, 0.5 s, 1-59 s by 1 s, 60-115 s by 5 s, 120-300 s by 30 s.
pub fn kube_proxy_programming_buckets() -> Vec<f64> {
    let linear =
        |start: f64, step: f64, count: u32| (0..count).map(move |i| start + step * f64::from(i));
    std::iter::once(0.0)
        .chain(linear(0.25, 0.25, 2))
        .chain(linear(1.0, 1.0, 59))
        .chain(linear(60.0, 5.0, 12))
        .chain(linear(120.0, 30.0, 7))
        .collect()
}

fn kube_proxy_programming_histogram() -> Histogram {
    Histogram::new(kube_proxy_programming_buckets())
}

/// kube-proxy's metrics (`pkg/proxy/metrics`), with its names, types, labels and buckets, so
/// dashboards and alerts written for kube-proxy read berth after a migration. One family's sync
/// is its apply: berth plans every family together, kube-proxy runs one proxier per family.
#[derive(Debug, Clone)]
pub struct KubeProxyMetrics {
    pub sync_duration: FamilyHistograms,
    pub sync_full_duration: FamilyHistograms,
    pub sync_partial_duration: FamilyHistograms,
    pub last_timestamp: Family<FamilyLabels, Gauge<f64, AtomicU64>>,
    pub network_programming: FamilyHistograms,
    pub iptables_rules: Family<FamilyTableLabels, Gauge>,
    pub iptables_restore_failures: Family<FamilyLabels, Counter>,
    pub nftables_sync_failures: Family<FamilyLabels, Counter>,
}

impl Default for KubeProxyMetrics {
    fn default() -> Self {
        KubeProxyMetrics {
            sync_duration: Family::new_with_constructor(kube_proxy_sync_histogram),
            sync_full_duration: Family::new_with_constructor(kube_proxy_sync_histogram),
            sync_partial_duration: Family::new_with_constructor(kube_proxy_sync_histogram),
            last_timestamp: Family::default(),
            network_programming: Family::new_with_constructor(kube_proxy_programming_histogram),
            iptables_rules: Family::default(),
            iptables_restore_failures: Family::default(),
            nftables_sync_failures: Family::default(),
        }
    }
}

impl KubeProxyMetrics {
    /// Registers into a `kubeproxy_`-prefixed registry, under kube-proxy's names and help texts.
    pub fn register_into(&self, registry: &mut Registry) {
        registry.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        registry.register(
            "sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            self.sync_full_duration.clone(),
        );
        registry.register(
            "sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            self.sync_partial_duration.clone(),
        );
        registry.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            self.last_timestamp.clone(),
        );
        registry.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            self.network_programming.clone(),
        );
        registry.register(
            "sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            self.iptables_rules.clone(),
        );
        // Counters gain `_total` when encoded.
        registry.register(
            "sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            self.iptables_restore_failures.clone(),
        );
        registry.register(
            "sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            self.nftables_sync_failures.clone(),
        );
    }

    /// Records one family's apply at `now`: durations and the timestamp when it succeeded, the
    /// backend's failure counter (created at zero on success, so alerts see it), and on iptables
    /// the rules of each table.
    pub(crate) fn observe_family(&self, outcome: &FamilyOutcome, now: DateTime<Utc>) {
        let labels = FamilyLabels {
            ip_family: outcome.family,
        };
        let failures = match outcome.backend {
            "nftables" => &self.nftables_sync_failures,
            _ => &self.iptables_restore_failures,
        };
        let Some(kind) = outcome.kind else {
            failures.get_or_create(&labels).inc();
            return;
        };
        failures.get_or_create(&labels).inc_by(0);
        self.sync_duration
            .get_or_create(&labels)
            .observe(outcome.seconds);
        let by_kind = match kind {
            SyncKind::Full => &self.sync_full_duration,
            SyncKind::Partial => &self.sync_partial_duration,
        };
        by_kind.get_or_create(&labels).observe(outcome.seconds);
        // Milliseconds are exact in an f64 for the next few hundred thousand years.
        #[allow(clippy::cast_precision_loss)]
        let seconds = now.timestamp_millis() as f64 / 1000.0;
        self.last_timestamp.get_or_create(&labels).set(seconds);
        if outcome.backend == "iptables" {
            for (table, rules) in &outcome.rules_by_table {
                let labels = FamilyTableLabels {
                    ip_family: outcome.family,
                    table,
                };
                self.iptables_rules
                    .get_or_create(&labels)
                    .set(i64::try_from(*rules).unwrap_or(i64::MAX));
            }
        }
    }

    pub(crate) fn observe_network_programming(&self, family: &'static str, seconds: f64) {
        self.network_programming
            .get_or_create(&FamilyLabels { ip_family: family })
            .observe(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programming_buckets_are_kube_proxys() {
        let buckets = kube_proxy_programming_buckets();
        assert_eq!(buckets.len(), 81);
        assert_eq!(&buckets[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert!(buckets.contains(&59.0) && buckets.contains(&115.0) && !buckets.contains(&116.0));
        assert_eq!(buckets.last(), Some(&300.0));
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
    }
}
