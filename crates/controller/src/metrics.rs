//! The controller's metrics, registered once into the process registry (no globals).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::error::ErrorCategory;

type Labels2 = Vec<(&'static str, String)>;
type StaticLabels = Vec<(&'static str, &'static str)>;

fn mk_histogram() -> Histogram {
    // 100 µs to ~6.5 s.
    Histogram::new(exponential_buckets(0.0001, 3.0, 11))
}

/// Handles on every metric; clones share state.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// `pool`, `family`, `state` (assigned | available).
    pub pool_addresses: Family<Labels2, Gauge>,
    /// `result` (ok | failed).
    pub allocations: Family<StaticLabels, Counter>,
    /// Values claimed by two Services (adoption or request).
    pub conflicts: Counter,
    /// One observation per Service decision.
    pub reconcile_duration: Family<StaticLabels, Histogram, fn() -> Histogram>,
    /// `category`: one of [`ErrorCategory`]'s labels.
    pub errors: Family<StaticLabels, Counter>,
    /// Writes sent to the API server, by `kind` (spec, status, event, pool_status).
    pub writes: Family<StaticLabels, Counter>,
    /// 1 while this replica leads.
    pub leader: Gauge,
    /// Services known to the allocation loop.
    pub services: Gauge,
    /// Events recorded and not yet sent.
    pub events_queued: Gauge,
    /// LoadBalancer addresses Services keep although no IPPool contains them any more.
    pub kept_addresses: Gauge,
}

impl Metrics {
    /// Registers into `registry`, which the binary hands over already prefixed
    /// (`berth_controller_`).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            pool_addresses: Family::default(),
            allocations: Family::default(),
            conflicts: Counter::default(),
            reconcile_duration: Family::new_with_constructor(mk_histogram),
            errors: Family::default(),
            writes: Family::default(),
            leader: Gauge::default(),
            services: Gauge::default(),
            events_queued: Gauge::default(),
            kept_addresses: Gauge::default(),
        };
        let r = registry;
        r.register(
            "pool_addresses",
            "IPPool addresses by pool, family and state (assigned, available)",
            m.pool_addresses.clone(),
        );
        r.register(
            "allocations",
            "Allocation decisions by result",
            m.allocations.clone(),
        );
        r.register(
            "conflicts",
            "Addresses or ports claimed by a Service while another holds them",
            m.conflicts.clone(),
        );
        r.register_with_unit(
            "reconcile_duration",
            "Time to decide one object's allocations",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        r.register("errors", "Errors by category", m.errors.clone());
        for category in ErrorCategory::ALL {
            let _ = m
                .errors
                .get_or_create(&vec![("category", category.as_str())]);
        }
        r.register(
            "api_writes",
            "Writes sent to the API server by kind",
            m.writes.clone(),
        );
        r.register(
            "leader",
            "1 while this replica is the leader",
            m.leader.clone(),
        );
        r.register(
            "services",
            "Services known to the allocation loop",
            m.services.clone(),
        );
        r.register(
            "events_queued",
            "Events recorded and not yet sent",
            m.events_queued.clone(),
        );
        r.register(
            "kept_addresses",
            "LoadBalancer addresses Services keep although no IPPool contains them any more",
            m.kept_addresses.clone(),
        );
        m
    }

    pub fn error(&self, category: ErrorCategory) {
        self.errors
            .get_or_create(&vec![("category", category.as_str())])
            .inc();
    }

    pub fn write(&self, kind: &'static str) {
        self.writes.get_or_create(&vec![("kind", kind)]).inc();
    }
}

/// Records the elapsed time into the reconcile histogram when dropped, so every exit path
/// of a decision is measured.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    kind: &'static str,
    start: std::time::Instant,
}

impl<'a> ReconcileTimer<'a> {
    pub fn start(metrics: &'a Metrics, kind: &'static str) -> Self {
        Self {
            metrics,
            kind,
            start: std::time::Instant::now(),
        }
    }
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .get_or_create(&vec![("kind", self.kind)])
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_prefixed_and_encoded() {
        let mut registry = Registry::with_prefix("berth_controller");
        let m = Metrics::new(&mut registry);
        m.error(ErrorCategory::Conflict);
        m.conflicts.inc();
        drop(ReconcileTimer::start(&m, "service"));
        m.pool_addresses
            .get_or_create(&vec![
                ("pool", "a".into()),
                ("family", "IPv4".into()),
                ("state", "assigned".into()),
            ])
            .set(3);
        let text = berth_telemetry::encode_registry(&registry).unwrap();
        assert!(
            text.contains("berth_controller_errors_total{category=\"conflict\"} 1"),
            "{text}"
        );
        assert!(text.contains("berth_controller_conflicts_total 1"));
        assert!(
            text.contains("berth_controller_reconcile_duration_seconds_count{kind=\"service\"} 1")
        );
        assert!(text.contains(
            "berth_controller_pool_addresses{pool=\"a\",family=\"IPv4\",state=\"assigned\"} 3"
        ));
    }
}
