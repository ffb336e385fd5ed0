//! `berth controller` end to end: metrics, readiness, the admin endpoint and the controller,
//! stopped together by one token. The binary builds the client and binds the admin endpoint.

use berth_telemetry::{admin_router, serve_admin, DroppedLines, MetricsRegistry, Readiness};
use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{AllocationController, ControllerConfig, Error};

/// Everything `berth controller` needs, parsed by the binary.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: ControllerConfig,
    /// Reported as `berth_build_info`.
    pub version: String,
    /// `Some`: serve the `aws-nlb` class.
    pub aws: Option<crate::load_balancer::aws::AwsSettings>,
    /// Counts the log lines the process dropped, for `berth_log_lines_dropped_total`.
    pub log_drops: Option<DroppedLines>,
}

/// Runs until `shutdown` is cancelled (or the controller fails), serving the admin endpoint on
/// `admin`.
pub async fn run_controller(
    client: Client,
    admin: TcpListener,
    opts: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut registry = MetricsRegistry::new();
    registry.register_build_info(&opts.version);
    if let Some(dropped) = opts.log_drops.clone() {
        registry.register_log_drops(dropped);
    }
    let readiness = Readiness::new();
    let check = readiness.register("controller")?;
    let default_class = opts.config.default_class;
    let mut controller =
        AllocationController::new(client, opts.config, registry.sub_registry("controller"))
            .with_readiness(check);
    if let Some(aws) = opts.aws {
        let metrics = std::sync::Arc::new(berth_aws::metrics::AwsMetrics::register(
            registry.sub_registry("aws"),
        ));
        let sdk = berth_aws::SdkElbv2::from_env(
            aws.endpoint_url.as_deref(),
            berth_aws::CallTimeouts::default(),
            berth_aws::RateLimits::default(),
            metrics.clone(),
        )
        .await;
        // Subnets by tags for Services that name none, through EC2 with the same settings.
        let subnets = sdk.ec2();
        // Every AWS call is fenced by the leadership term, so a deposed leader stops calling
        // before a successor starts.
        let fenced = crate::load_balancer::Fenced::new(sdk, controller.term());
        let provider = berth_aws::NlbProvider::new(
            fenced,
            berth_aws::ProviderConfig {
                cluster_name: aws.cluster_name,
                default_subnets: aws.subnets,
                quotas: Default::default(),
            },
            aws.verify_after,
        )
        .with_metrics(metrics);
        let provider = match subnets {
            Some(ec2) => provider.with_subnet_source(std::sync::Arc::new(ec2)),
            None => provider,
        };
        controller = controller.with_aws(crate::load_balancer::aws_runner(
            std::sync::Arc::new(provider),
            crate::load_balancer::AwsLoopConfig {
                default_class,
                sweep_interval: aws.sweep_interval,
            },
        ));
    }
    let router = admin_router(registry.into_shared(), readiness);
    let admin = tokio::spawn(serve_admin(
        admin,
        router,
        shutdown.clone().cancelled_owned(),
    ));
    let result = controller.run(shutdown.clone()).await;
    shutdown.cancel();
    match admin.await {
        Ok(r) => r?,
        Err(e) => tracing::warn!(error = %e, "admin endpoint task ended abnormally"),
    }
    result
}
