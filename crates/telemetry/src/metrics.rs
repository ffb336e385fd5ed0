//! The process's one metrics registry. Components register into it at startup (through
//! [`MetricsRegistry::sub_registry`] or a plain `&mut Registry`), then it is frozen into a
//! [`SharedRegistry`] that the admin router encodes on every scrape.

use std::sync::Arc;

use prometheus_client::encoding::text::{encode, encode_eof};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};

use crate::Error;

/// Every metric name starts with `berth_`.
pub const METRIC_PREFIX: &str = "berth";

/// The content type Prometheus negotiates for the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The prefix of kube-proxy's metric names, which the agent publishes too.
pub const KUBE_PROXY_PREFIX: &str = "kubeproxy";

/// A `berth_`-prefixed registry under construction, and beside it one for the metrics berth
/// publishes under kube-proxy's own names (`kubeproxy_`), so dashboards and alerts written for
/// kube-proxy keep working.
#[derive(Debug)]
pub struct MetricsRegistry {
    registry: Registry,
    kube_proxy: Registry,
}

impl Default for MetricsRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsRegistry {
    pub fn new() -> Self {
        MetricsRegistry {
            registry: Registry::with_prefix(METRIC_PREFIX),
            kube_proxy: Registry::with_prefix(KUBE_PROXY_PREFIX),
        }
    }

    /// The registry whose metrics are named `kubeproxy_...`, as kube-proxy names them: only for
    /// metrics that mean what kube-proxy's mean (same type, labels and buckets).
    pub fn kube_proxy_registry(&mut self) -> &mut Registry {
        &mut self.kube_proxy
    }

    /// Registers `metric` as `berth_<name>`. The caller keeps a clone of the metric to update it;
    /// prometheus-client metrics share their state between clones.
    pub fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.registry.register(name, help, metric);
    }

    /// Registers `metric` as `berth_<name>_<unit>`.
    pub fn register_with_unit(&mut self, name: &str, help: &str, unit: Unit, metric: impl Metric) {
        self.registry.register_with_unit(name, help, unit, metric);
    }

    /// A registry whose metrics are named `berth_<component>_...`, for a crate that takes a plain
    /// `&mut Registry` and so needs no dependency on this one.
    pub fn sub_registry(&mut self, component: &str) -> &mut Registry {
        self.registry.sub_registry_with_prefix(component)
    }

    /// Records `berth_build_info{version="..."} 1`, so dashboards can tell which build answered.
    pub fn register_build_info(&mut self, version: &str) {
        let info = Info::new(vec![("version".to_owned(), version.to_owned())]);
        self.registry
            .register("build", "Build information about this berth binary", info);
    }

    /// Registers `berth_log_lines_dropped_total`: log lines dropped because the output stalled
    /// and the log queue was full (see [`crate::init_tracing`]).
    pub fn register_log_drops(&mut self, dropped: crate::DroppedLines) {
        self.registry.register(
            "log_lines_dropped",
            "Log lines dropped because the log output stalled and the queue in front of it was full",
            dropped,
        );
    }

    /// Ends registration: the result is cheap to clone into HTTP handlers.
    pub fn into_shared(self) -> SharedRegistry {
        SharedRegistry(Arc::new((self.registry, self.kube_proxy)))
    }
}

/// A registry that no longer accepts registrations, shared with the admin router.
#[derive(Debug, Clone)]
pub struct SharedRegistry(Arc<(Registry, Registry)>);

impl SharedRegistry {
    /// The OpenMetrics text exposition of berth's metrics then the `kubeproxy_` ones, ending
    /// with `# EOF`.
    pub fn encode(&self) -> Result<String, Error> {
        let (berth, kube_proxy) = &*self.0;
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, berth)
            .and_then(|()| prometheus_client::encoding::text::encode_registry(&mut out, kube_proxy))
            .and_then(|()| encode_eof(&mut out))
            .map_err(Error::EncodeMetrics)?;
        Ok(out)
    }
}

/// Encodes any prometheus-client registry as OpenMetrics text; components use it in their own tests.
pub fn encode_registry(registry: &Registry) -> Result<String, Error> {
    let mut out = String::new();
    encode(&mut out, registry).map_err(Error::EncodeMetrics)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;

    use super::*;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct ResultLabels {
        result: String,
    }

    #[test]
    fn empty_registry_encodes_to_eof_only() {
        let out = MetricsRegistry::new().into_shared().encode().unwrap();
        assert_eq!(out, "# EOF\n");
    }

    #[test]
    fn metrics_are_prefixed_with_berth() {
        let mut metrics = MetricsRegistry::new();
        let syncs = Counter::<u64>::default();
        metrics.register("syncs", "Datapath syncs", syncs.clone());
        syncs.inc_by(3);
        let out = metrics.into_shared().encode().unwrap();
        assert!(out.contains("# TYPE berth_syncs counter\n"), "{out}");
        assert!(
            out.contains("# HELP berth_syncs Datapath syncs.\n"),
            "{out}"
        );
        assert!(out.contains("berth_syncs_total 3\n"), "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
    }

    #[test]
    fn sub_registries_nest_the_component_name() {
        let mut metrics = MetricsRegistry::new();
        let family = Family::<ResultLabels, Counter>::default();
        family
            .get_or_create(&ResultLabels {
                result: "ok".to_owned(),
            })
            .inc();
        metrics
            .sub_registry("ipam")
            .register("allocations", "Allocations by result", family);
        let out = metrics.into_shared().encode().unwrap();
        assert!(
            out.contains("berth_ipam_allocations_total{result=\"ok\"} 1\n"),
            "{out}"
        );
    }

    #[test]
    fn units_are_appended_to_the_name() {
        let mut metrics = MetricsRegistry::new();
        let gauge = Gauge::<i64>::default();
        gauge.set(42);
        metrics.register_with_unit("sync_duration", "Last sync", Unit::Seconds, gauge);
        let out = metrics.into_shared().encode().unwrap();
        assert!(out.contains("berth_sync_duration_seconds 42\n"), "{out}");
    }

    #[test]
    fn updates_after_sharing_are_visible_on_the_next_encode() {
        let mut metrics = MetricsRegistry::new();
        let gauge = Gauge::<i64>::default();
        metrics.register("services", "Services seen", gauge.clone());
        let shared = metrics.into_shared();
        assert!(shared.encode().unwrap().contains("berth_services 0\n"));
        gauge.set(7);
        assert!(shared
            .clone()
            .encode()
            .unwrap()
            .contains("berth_services 7\n"));
    }

    #[test]
    fn build_info_carries_the_version_label() {
        let mut metrics = MetricsRegistry::new();
        metrics.register_build_info("1.2.3");
        let out = metrics.into_shared().encode().unwrap();
        assert!(
            out.contains("berth_build_info{version=\"1.2.3\"} 1\n"),
            "{out}"
        );
    }

    #[test]
    fn kube_proxy_names_sit_beside_berths_before_one_eof() {
        let mut metrics = MetricsRegistry::new();
        metrics.register("syncs", "Datapath syncs", Counter::<u64>::default());
        let gauge = Gauge::<i64>::default();
        gauge.set(5);
        metrics.kube_proxy_registry().register(
            "sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            gauge,
        );
        let out = metrics.into_shared().encode().unwrap();
        assert!(out.contains("berth_syncs_total 0\n"), "{out}");
        assert!(
            out.contains("kubeproxy_sync_proxy_rules_iptables_total 5\n"),
            "{out}"
        );
        assert_eq!(out.matches("# EOF").count(), 1, "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
    }

    #[test]
    fn encode_registry_works_on_a_plain_registry() {
        let mut registry = Registry::default();
        registry.register("plain", "A plain counter", Counter::<u64>::default());
        let out = encode_registry(&registry).unwrap();
        assert!(out.contains("plain_total 0\n"), "{out}");
    }
}
