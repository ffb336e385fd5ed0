//! moto (berth-testing's harness) and the real SDK client pointed at it.

use std::sync::Arc;

use aws_sdk_elasticloadbalancingv2 as elbv2;
use berth_aws::metrics::AwsMetrics;
use berth_aws::{RateLimits, SdkElbv2};
// Not every test that includes `common` starts moto.
#[allow(unused_imports)]
pub use berth_testing::moto::{start, Moto};

/// The real SDK client against `moto`, with its metrics.
pub fn client(moto: &Moto) -> (SdkElbv2, Arc<AwsMetrics>) {
    let creds = aws_credential_types::Credentials::new("testing", "testing", None, None, "test");
    let config = elbv2::Config::builder()
        .behavior_version(elbv2::config::BehaviorVersion::latest())
        .region(elbv2::config::Region::new("us-east-1"))
        .credentials_provider(creds)
        .http_client(berth_aws::sdk::https_client())
        .endpoint_url(&moto.url)
        .build();
    let metrics = Arc::new(AwsMetrics::default());
    // Generous limits: the tests and the benchmark count calls, they do not measure rates.
    let limits = RateLimits {
        describe: 1000,
        register: 1000,
        modify: 1000,
    };
    (
        SdkElbv2::new(elbv2::Client::from_conf(config), limits, metrics.clone()),
        metrics,
    )
}

/// The real EC2 subnet source against `moto`, counting into `metrics`.
pub fn ec2(moto: &Moto, metrics: Arc<AwsMetrics>) -> berth_aws::ec2::SdkEc2 {
    use aws_sdk_ec2 as ec2;
    let creds = aws_credential_types::Credentials::new("testing", "testing", None, None, "test");
    let config = ec2::Config::builder()
        .behavior_version(ec2::config::BehaviorVersion::latest())
        .region(ec2::config::Region::new("us-east-1"))
        .credentials_provider(creds)
        .http_client(berth_aws::sdk::https_client())
        .endpoint_url(&moto.url)
        .build();
    berth_aws::ec2::SdkEc2::new(ec2::Client::from_conf(config), metrics)
}
