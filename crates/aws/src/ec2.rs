//! The real [`SubnetSource`]: aws-sdk-ec2's DescribeSubnets, filtered by the role tag, paged,
//! metered like the ELBv2 calls.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_sdk_ec2 as ec2;
use futures::future::BoxFuture;

use crate::elbv2::{ApiError, ApiErrorKind};
use crate::metrics::AwsMetrics;
use crate::sdk_error::api_error;
use crate::subnets::{SubnetFacts, SubnetSource};

/// Pages DescribeSubnets may take before the listing is given up (1,000 subnets each).
const MAX_PAGES: usize = 50;

pub struct SdkEc2 {
    client: ec2::Client,
    metrics: Arc<AwsMetrics>,
}

impl std::fmt::Debug for SdkEc2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdkEc2").finish_non_exhaustive()
    }
}

impl SdkEc2 {
    pub fn new(client: ec2::Client, metrics: Arc<AwsMetrics>) -> Self {
        SdkEc2 { client, metrics }
    }

    async fn describe(&self, role_tag: &str) -> Result<Vec<SubnetFacts>, ApiError> {
        const OP: &str = "DescribeSubnets";
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let result = self
                .client
                .describe_subnets()
                .filters(
                    ec2::types::Filter::builder()
                        .name("tag-key")
                        .values(role_tag)
                        .build(),
                )
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| api_error(OP, e));
            self.metrics.call(
                OP,
                match &result {
                    Ok(_) => "success",
                    Err(e) if e.kind == ApiErrorKind::Throttled => "throttled",
                    Err(_) => "error",
                },
            );
            let page = result?;
            for s in page.subnets() {
                let (Some(id), Some(vpc), Some(zone)) =
                    (s.subnet_id(), s.vpc_id(), s.availability_zone())
                else {
                    continue;
                };
                let tags: BTreeMap<String, String> = s
                    .tags()
                    .iter()
                    .filter_map(|t| {
                        Some((
                            t.key()?.to_string(),
                            t.value().unwrap_or_default().to_string(),
                        ))
                    })
                    .collect();
                out.push(SubnetFacts {
                    id: id.to_string(),
                    vpc_id: vpc.to_string(),
                    zone: zone.to_string(),
                    available_addresses: s.available_ip_address_count().unwrap_or(0),
                    tags,
                });
            }
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_string()),
                _ => return Ok(out),
            }
        }
        Err(ApiError {
            operation: OP,
            kind: ApiErrorKind::Transient,
            code: "TooManyPages".into(),
            message: format!("more than {MAX_PAGES} pages"),
        })
    }
}

impl SubnetSource for SdkEc2 {
    fn describe_subnets<'a>(
        &'a self,
        role_tag: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SubnetFacts>, ApiError>> {
        Box::pin(self.describe(role_tag))
    }
}
