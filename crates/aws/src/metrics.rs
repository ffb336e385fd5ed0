//! The provider's metrics (prefix `berth_aws_`), registered into the binary's one registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub operation: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug, Default)]
pub struct AwsMetrics {
    calls: Family<CallLabels, Counter>,
    swept: Counter,
}

impl AwsMetrics {
    /// Registers `calls_total{operation,outcome}` (throttles are `outcome="throttled"`) and
    /// `swept_resources_total` into `registry` (the binary's `berth_aws_` sub-registry).
    pub fn register(registry: &mut Registry) -> Self {
        let m = AwsMetrics::default();
        registry.register(
            "berth_aws_calls",
            "ELBv2 API calls by operation and outcome",
            m.calls.clone(),
        );
        registry.register(
            "berth_aws_swept_resources",
            "Leaked load balancers and target groups removed by the sweep",
            m.swept.clone(),
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

    pub fn swept(&self, n: u64) {
        self.swept.inc_by(n);
    }
}
