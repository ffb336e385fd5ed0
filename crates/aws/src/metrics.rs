//! The provider's metrics, registered into the binary's one registry under its `berth_aws_`
//! prefix: `berth_aws_calls_total{operation,outcome}` (throttles are `outcome="throttled"`),
//! `berth_aws_swept_resources_total{kind}`, `berth_aws_owned_resources{kind}`,
//! `berth_aws_region_target_groups` and
//! `berth_aws_reconcile_duration_seconds{action}`.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub operation: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `load_balancer` or `target_group`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `apply`, `cleanup` (the Service is being deleted) or `release` (no longer served).
    pub action: &'static str,
}

/// The kinds the sweep counts.
pub const SWEPT_LOAD_BALANCER: &str = "load_balancer";
pub const SWEPT_TARGET_GROUP: &str = "target_group";

type HistogramFamily = Family<ActionLabels, Histogram, fn() -> Histogram>;

fn mk_histogram() -> Histogram {
    // 10 ms to ~3 min: a reconcile makes one to a few dozen AWS calls, each retried with backoff.
    Histogram::new(exponential_buckets(0.01, 3.0, 10))
}

#[derive(Debug)]
pub struct AwsMetrics {
    calls: Family<CallLabels, Counter>,
    swept: Family<KindLabels, Counter>,
    reconcile_duration: HistogramFamily,
    owned: Family<KindLabels, Gauge>,
    region_target_groups: Gauge,
}

impl Default for AwsMetrics {
    fn default() -> Self {
        AwsMetrics {
            calls: Family::default(),
            swept: Family::default(),
            owned: Family::default(),
            region_target_groups: Gauge::default(),
            reconcile_duration: Family::new_with_constructor(mk_histogram),
        }
    }
}

impl AwsMetrics {
    /// Registers into `registry`, which the binary hands over already prefixed (`berth_aws`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = AwsMetrics::default();
        registry.register(
            "calls",
            "ELBv2 API calls by operation and outcome",
            m.calls.clone(),
        );
        registry.register(
            "swept_resources",
            "Leaked load balancers and target groups removed by the sweep, by kind",
            m.swept.clone(),
        );
        registry.register(
            "owned_resources",
            "Load balancers and target groups tagged with this cluster, by kind, as the last sweep listed them",
            m.owned.clone(),
        );
        registry.register(
            "region_target_groups",
            "Target groups in the region, every owner's, as the last sweep listed them (the quota is per region)",
            m.region_target_groups.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time to reconcile one Service's load balancer, by action",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        m
    }

    pub fn call(&self, operation: &'static str, outcome: &'static str) {
        self.calls
            .get_or_create(&CallLabels { operation, outcome })
            .inc();
    }

    /// Calls made so far with this operation and outcome.
    pub fn count(&self, operation: &'static str, outcome: &'static str) -> u64 {
        self.calls
            .get_or_create(&CallLabels { operation, outcome })
            .get()
    }

    /// Calls made so far, all operations and outcomes.
    pub fn total(&self) -> u64 {
        crate::memory::ALL_OPERATIONS
            .iter()
            .flat_map(|op| {
                ["success", "not_found", "throttled", "error"].map(|o| self.count(op, o))
            })
            .sum()
    }

    /// Mutating calls made so far.
    pub fn mutating(&self) -> u64 {
        crate::memory::ALL_OPERATIONS
            .iter()
            .filter(|op| crate::memory::is_mutating(op))
            .flat_map(|op| {
                ["success", "not_found", "throttled", "error"].map(|o| self.count(op, o))
            })
            .sum()
    }

    /// The sweep removed `n` leaked resources of `kind` ([`SWEPT_LOAD_BALANCER`],
    /// [`SWEPT_TARGET_GROUP`]).
    pub fn swept(&self, kind: &'static str, n: u64) {
        self.swept.get_or_create(&KindLabels { kind }).inc_by(n);
    }

    /// What the last listing found: this cluster's resources by kind, and the region's target
    /// groups.
    pub fn listed(&self, load_balancers: usize, target_groups: usize, region_target_groups: usize) {
        let set = |kind, n: usize| {
            self.owned
                .get_or_create(&KindLabels { kind })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set(SWEPT_LOAD_BALANCER, load_balancers);
        set(SWEPT_TARGET_GROUP, target_groups);
        self.region_target_groups
            .set(i64::try_from(region_target_groups).unwrap_or(i64::MAX));
    }

    /// This cluster's resources of `kind` as last listed.
    pub fn owned(&self, kind: &'static str) -> i64 {
        self.owned.get_or_create(&KindLabels { kind }).get()
    }

    /// The region's target groups as last listed.
    pub fn region_target_groups(&self) -> i64 {
        self.region_target_groups.get()
    }

    /// Resources of `kind` the sweep removed so far.
    pub fn swept_count(&self, kind: &'static str) -> u64 {
        self.swept.get_or_create(&KindLabels { kind }).get()
    }

    /// Reconciles timed so far with this action.
    pub fn reconciles(&self, action: &'static str) -> u64 {
        // A histogram exposes no count; its encoding does.
        let mut registry = Registry::default();
        registry.register("r", "", self.reconcile_duration.clone());
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
            return 0;
        }
        let prefix = format!("r_count{{action=\"{action}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Starts timing one reconcile; the time is recorded when the guard is dropped, so every
    /// exit (success, error, or a reconcile abandoned at the end of a term) is measured.
    pub fn reconcile_timer(&self, action: &'static str) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            action,
            start: Instant::now(),
        }
    }
}

/// Records the elapsed time into `berth_aws_reconcile_duration_seconds` when dropped.
pub struct ReconcileTimer<'a> {
    metrics: &'a AwsMetrics,
    action: &'static str,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .get_or_create(&ActionLabels {
                action: self.action,
            })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry)
            .unwrap_or_else(|e| panic!("{e}"));
        text
    }

    #[test]
    fn names_carry_the_binary_prefix_once() {
        let mut root = Registry::with_prefix("berth");
        let m = AwsMetrics::register(root.sub_registry_with_prefix("aws"));
        m.call("DescribeTags", "success");
        m.swept(SWEPT_TARGET_GROUP, 2);
        drop(m.reconcile_timer("apply"));
        let text = encoded(&root);
        for line in [
            "berth_aws_calls_total{operation=\"DescribeTags\",outcome=\"success\"} 1",
            "berth_aws_swept_resources_total{kind=\"target_group\"} 2",
            "berth_aws_reconcile_duration_seconds_count{action=\"apply\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn the_timer_records_on_every_exit() {
        let m = AwsMetrics::default();
        let work = |fail: bool| -> Result<(), ()> {
            let _timer = m.reconcile_timer("cleanup");
            if fail {
                return Err(());
            }
            Ok(())
        };
        assert!(work(false).is_ok());
        assert!(work(true).is_err());
        // A future dropped mid-way (an abandoned reconcile) is measured too.
        let mut abandoned = Box::pin(async {
            let _timer = m.reconcile_timer("cleanup");
            std::future::pending::<()>().await;
        });
        assert!(poll_once(abandoned.as_mut()).is_pending());
        assert_eq!(m.reconciles("cleanup"), 2);
        drop(abandoned);
        assert_eq!(m.reconciles("cleanup"), 3);
        assert_eq!(m.reconciles("apply"), 0);
    }

    fn poll_once(
        f: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> std::task::Poll<()> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.poll(&mut cx)
    }
}
