//! The controller's metrics, registered into the registry it is given (`berth_endpoints_*` when
//! that is the `endpoints` sub-registry of the process's `berth` registry).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::error::ErrorCategory;

type Labels = [(&'static str, &'static str); 1];

#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    syncs: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    slice_changes: Family<Labels, Counter>,
    endpoints_changes: Family<Labels, Counter>,
    sync_duration: Histogram,
    pub(crate) queue_depth: Gauge,
}

impl Metrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            syncs: Family::default(),
            errors: Family::default(),
            slice_changes: Family::default(),
            endpoints_changes: Family::default(),
            sync_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            queue_depth: Gauge::default(),
        };
        registry.register(
            "syncs",
            "Service syncs, by result (changed, unchanged, waiting, error)",
            metrics.syncs.clone(),
        );
        registry.register(
            "errors",
            "Errors, by category (conflict, not_found, throttled, server, transport, invalid, rejected, watch)",
            metrics.errors.clone(),
        );
        for category in ErrorCategory::ALL {
            let _ = metrics
                .errors
                .get_or_create(&[("category", category.as_str())]);
        }
        registry.register(
            "slice_changes",
            "EndpointSlice writes, by operation (create, update, delete)",
            metrics.slice_changes.clone(),
        );
        registry.register(
            "endpoints_changes",
            "Endpoints writes, by operation (create, update, delete)",
            metrics.endpoints_changes.clone(),
        );
        registry.register_with_unit(
            "sync_duration",
            "Time to sync one Service, API writes included",
            Unit::Seconds,
            metrics.sync_duration.clone(),
        );
        registry.register(
            "queue_depth",
            "Services waiting to be synced",
            metrics.queue_depth.clone(),
        );
        metrics
    }

    pub(crate) fn sync(&self, result: &'static str, seconds: f64) {
        self.syncs.get_or_create(&[("result", result)]).inc();
        self.sync_duration.observe(seconds);
    }

    pub(crate) fn error(&self, category: ErrorCategory) {
        self.errors
            .get_or_create(&[("category", category.as_str())])
            .inc();
    }

    pub(crate) fn slice_change(&self, op: &'static str) {
        self.slice_changes.get_or_create(&[("op", op)]).inc();
    }

    pub(crate) fn endpoints_change(&self, op: &'static str) {
        self.endpoints_changes.get_or_create(&[("op", op)]).inc();
    }
}
