//! The real ELBv2 client: aws-sdk-elasticloadbalancingv2 behind [`Elbv2`], with client-side
//! rate limits per operation class (the AWS Load Balancer Controller's defaults: Describe 50/s,
//! Register/Deregister 4/s, everything else that changes state 3/s), the SDK's standard retry
//! with backoff, and a metric per call.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2 as elbv2;
use aws_sdk_elasticloadbalancingv2::types as t;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::elbv2::{ApiError, ApiErrorKind, ApiResult, Elbv2, LbQuery, Page, TgQuery};
use crate::metrics::AwsMetrics;
use crate::model::{
    HcPort, HcProtocol, HealthCheck, ListenerSpec, ListenerTls, LoadBalancerSpec, Scheme, Target,
    TargetGroupSpec, TargetType, TgProtocol,
};
use crate::observed::{Listener, LoadBalancer, Tags, TargetGroup};
use crate::sdk_error::api_error;

/// Requests per second per operation class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    pub describe: u32,
    pub register: u32,
    pub modify: u32,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            describe: 50,
            register: 4,
            modify: 3,
        }
    }
}

/// How long one ELBv2 call may take. Without them a server that accepts a connection and
/// never answers holds a reconcile, or the sweep, for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTimeouts {
    /// Connecting to the endpoint.
    pub connect: Duration,
    /// One attempt, from sending the request to the end of the answer.
    pub attempt: Duration,
    /// The whole call, retries and their backoff included.
    pub operation: Duration,
}

impl Default for CallTimeouts {
    fn default() -> Self {
        CallTimeouts {
            connect: Duration::from_millis(3100),
            attempt: Duration::from_secs(10),
            operation: Duration::from_secs(30),
        }
    }
}

impl CallTimeouts {
    /// The SDK's form.
    pub fn sdk_config(&self) -> aws_config::timeout::TimeoutConfig {
        aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(self.connect)
            .read_timeout(self.attempt)
            .operation_attempt_timeout(self.attempt)
            .operation_timeout(self.operation)
            .build()
    }
}

#[derive(Debug, Clone, Copy)]
enum Class {
    Describe,
    Register,
    Modify,
}

fn limiter(per_second: u32) -> DefaultDirectRateLimiter {
    let rate = NonZeroU32::new(per_second.max(1)).unwrap_or(NonZeroU32::MIN);
    RateLimiter::direct(Quota::per_second(rate))
}

/// aws-sdk-elasticloadbalancingv2, rate limited and metered.
pub struct SdkElbv2 {
    client: elbv2::Client,
    describe: DefaultDirectRateLimiter,
    register: DefaultDirectRateLimiter,
    modify: DefaultDirectRateLimiter,
    metrics: Arc<AwsMetrics>,
    /// What the client was built from, when built by [`Self::from_loader`].
    sdk_config: Option<aws_config::SdkConfig>,
}

impl std::fmt::Debug for SdkElbv2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdkElbv2").finish_non_exhaustive()
    }
}

impl SdkElbv2 {
    pub fn new(client: elbv2::Client, limits: RateLimits, metrics: Arc<AwsMetrics>) -> Self {
        SdkElbv2 {
            client,
            describe: limiter(limits.describe),
            register: limiter(limits.register),
            modify: limiter(limits.modify),
            metrics,
            sdk_config: None,
        }
    }

    /// A client from the standard AWS chain (environment, profile, web identity, instance
    /// metadata); `endpoint_url` overrides the endpoint, for tests against a local server.
    pub async fn from_env(
        endpoint_url: Option<&str>,
        timeouts: CallTimeouts,
        limits: RateLimits,
        metrics: Arc<AwsMetrics>,
    ) -> Self {
        Self::from_loader(
            aws_config::defaults(aws_config::BehaviorVersion::latest()),
            endpoint_url,
            timeouts,
            limits,
            metrics,
        )
        .await
    }

    /// A client from `loader` (where credentials and region come from) with berth's HTTP
    /// client, retries and timeouts: what [`Self::from_env`] builds, for any loader.
    pub async fn from_loader(
        loader: aws_config::ConfigLoader,
        endpoint_url: Option<&str>,
        timeouts: CallTimeouts,
        limits: RateLimits,
        metrics: Arc<AwsMetrics>,
    ) -> Self {
        let mut loader = loader
            .http_client(https_client())
            .retry_config(
                aws_config::retry::RetryConfig::standard()
                    .with_max_attempts(5)
                    .with_initial_backoff(Duration::from_millis(200))
                    .with_max_backoff(Duration::from_secs(20)),
            )
            .timeout_config(timeouts.sdk_config());
        if let Some(url) = endpoint_url {
            loader = loader.endpoint_url(url);
        }
        let config = loader.load().await;
        let mut sdk = Self::new(elbv2::Client::new(&config), limits, metrics);
        sdk.sdk_config = Some(config);
        sdk
    }

    /// EC2 with the same configuration (credentials, region, endpoint, retries, timeouts), for
    /// subnet discovery; `None` for a client built from a bare ELBv2 client ([`Self::new`]).
    pub fn ec2(&self) -> Option<crate::ec2::SdkEc2> {
        let config = self.sdk_config.as_ref()?;
        Some(crate::ec2::SdkEc2::new(
            aws_sdk_ec2::Client::new(config),
            self.metrics.clone(),
        ))
    }

    async fn admit(&self, class: Class) {
        match class {
            Class::Describe => self.describe.until_ready().await,
            Class::Register => self.register.until_ready().await,
            Class::Modify => self.modify.until_ready().await,
        }
    }

    /// One ELBv2 call: admitted by its class's rate limit, then counted by its outcome. The
    /// request is built before admission (building sends nothing).
    async fn call<T>(
        &self,
        class: Class,
        operation: &'static str,
        request: impl std::future::Future<Output = ApiResult<T>>,
    ) -> ApiResult<T> {
        self.admit(class).await;
        let result = request.await;
        self.record(operation, &result);
        result
    }

    fn record<T>(&self, operation: &'static str, result: &ApiResult<T>) {
        let outcome = match result {
            Ok(_) => "success",
            Err(e) if e.kind == ApiErrorKind::NotFound => "not_found",
            Err(e) if e.kind == ApiErrorKind::Throttled => "throttled",
            Err(_) => "error",
        };
        self.metrics.call(operation, outcome);
    }
}

/// The SDK's HTTPS client on rustls with ring, the crypto kube's client uses too: one rustls
/// provider per process, so neither client has to pick one at run time.
pub fn https_client() -> elbv2::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

fn required<T>(operation: &'static str, what: &str, v: Option<T>) -> ApiResult<T> {
    v.ok_or_else(|| {
        ApiError::new(
            operation,
            ApiErrorKind::Invalid,
            "IncompleteResponse",
            format!("the response has no {what}"),
        )
    })
}

fn port(operation: &'static str, v: Option<i32>) -> ApiResult<u16> {
    let p = required(operation, "port", v)?;
    u16::try_from(p).map_err(|_| {
        ApiError::new(
            operation,
            ApiErrorKind::Invalid,
            "IncompleteResponse",
            format!("port {p} out of range"),
        )
    })
}

fn tg_protocol(p: &t::ProtocolEnum) -> Option<TgProtocol> {
    TgProtocol::parse(p.as_str())
}

fn sdk_protocol(p: TgProtocol) -> t::ProtocolEnum {
    t::ProtocolEnum::from(p.as_str())
}

fn load_balancer(op: &'static str, lb: &t::LoadBalancer) -> ApiResult<LoadBalancer> {
    Ok(LoadBalancer {
        arn: required(op, "LoadBalancerArn", lb.load_balancer_arn())?.to_string(),
        name: required(op, "LoadBalancerName", lb.load_balancer_name())?.to_string(),
        dns_name: lb.dns_name().unwrap_or_default().to_string(),
        scheme: lb
            .scheme()
            .and_then(|s| Scheme::parse(s.as_str()))
            .unwrap_or(Scheme::Internal),
        subnets: lb
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_string))
            .collect(),
        vpc_id: lb.vpc_id().map(str::to_string),
    })
}

/// A target group as berth reads it, or `None` for one berth never makes: an ALB's HTTP(S),
/// a TLS or GENEVE target group, a Lambda or ALB target type, a health-check port that is
/// neither a number nor `traffic-port`. Most accounts have such target groups beside berth's;
/// they are someone else's, so they are skipped here, before anything could fail on them.
fn target_group(tg: &t::TargetGroup) -> Option<TargetGroup> {
    let protocol = tg.protocol().and_then(tg_protocol)?;
    let port = tg.port().and_then(|p| u16::try_from(p).ok())?;
    let target_type = match tg.target_type() {
        None => TargetType::Instance,
        Some(t) => TargetType::parse(t.as_str())?,
    };
    let hc_protocol = match tg.health_check_protocol() {
        None => HcProtocol::Tcp,
        Some(p) => HcProtocol::parse(p.as_str())?,
    };
    let http = hc_protocol != HcProtocol::Tcp;
    let hc_port = match tg.health_check_port() {
        None | Some("traffic-port") => HcPort::TrafficPort,
        Some(p) => HcPort::Port(p.parse().ok()?),
    };
    let small = |v: Option<i32>| v.and_then(|n| u16::try_from(n).ok()).unwrap_or_default();
    let tiny = |v: Option<i32>| v.and_then(|n| u8::try_from(n).ok()).unwrap_or_default();
    Some(TargetGroup {
        arn: tg.target_group_arn()?.to_string(),
        name: tg.target_group_name()?.to_string(),
        protocol,
        port,
        target_type,
        health_check: HealthCheck {
            protocol: hc_protocol,
            port: hc_port,
            path: if http {
                tg.health_check_path().map(str::to_string)
            } else {
                None
            },
            interval_seconds: small(tg.health_check_interval_seconds()),
            timeout_seconds: small(tg.health_check_timeout_seconds()),
            healthy_threshold: tiny(tg.healthy_threshold_count()),
            unhealthy_threshold: tiny(tg.unhealthy_threshold_count()),
            matcher: if http {
                tg.matcher().and_then(|m| m.http_code()).map(str::to_string)
            } else {
                None
            },
        },
        load_balancer_arns: tg.load_balancer_arns().to_vec(),
    })
}

/// The target groups of a Describe answer that berth could have made; the rest are logged
/// and left out.
fn target_groups(tgs: &[t::TargetGroup]) -> Vec<TargetGroup> {
    tgs.iter()
        .filter_map(|tg| {
            let read = target_group(tg);
            if read.is_none() {
                tracing::debug!(
                    arn = tg.target_group_arn().unwrap_or_default(),
                    protocol = ?tg.protocol(),
                    target_type = ?tg.target_type(),
                    "skipping a target group berth never makes"
                );
            }
            read
        })
        .collect()
}

/// A listener's protocol as the diff compares it: a TLS listener terminates TLS in front of a
/// TCP target group, so it reads as `TCP` with its TLS settings beside.
fn listener_protocol(p: Option<&t::ProtocolEnum>) -> Option<TgProtocol> {
    match p? {
        t::ProtocolEnum::Tls => Some(TgProtocol::Tcp),
        p => tg_protocol(p),
    }
}

fn listener_tls(l: &t::Listener) -> Option<ListenerTls> {
    if l.protocol() != Some(&t::ProtocolEnum::Tls) {
        return None;
    }
    Some(ListenerTls {
        certificate: l
            .certificates()
            .iter()
            .find(|c| c.is_default() != Some(false))
            .and_then(|c| c.certificate_arn())
            .unwrap_or_default()
            .to_string(),
        policy: l.ssl_policy().unwrap_or_default().to_string(),
    })
}

fn listener_sdk_protocol(protocol: TgProtocol, tls: Option<&ListenerTls>) -> t::ProtocolEnum {
    match tls {
        Some(_) => t::ProtocolEnum::Tls,
        None => sdk_protocol(protocol),
    }
}

fn certificates(tls: &ListenerTls) -> Vec<t::Certificate> {
    vec![t::Certificate::builder()
        .certificate_arn(&tls.certificate)
        .build()]
}

fn sdk_tags(tags: &Tags) -> Vec<t::Tag> {
    tags.iter()
        .map(|(k, v)| t::Tag::builder().key(k).value(v).build())
        .collect()
}

fn sdk_targets(targets: &[Target]) -> Vec<t::TargetDescription> {
    targets
        .iter()
        .map(|x| {
            t::TargetDescription::builder()
                .id(&x.id)
                .port(i32::from(x.port))
                .build()
        })
        .collect()
}

fn forward(target_group_arn: String) -> t::Action {
    t::Action::builder()
        .r#type(t::ActionTypeEnum::Forward)
        .target_group_arn(target_group_arn)
        .build()
}

impl Elbv2 for SdkElbv2 {
    async fn describe_load_balancers(&self, query: LbQuery) -> ApiResult<Page<LoadBalancer>> {
        const OP: &str = "DescribeLoadBalancers";
        let mut req = self.client.describe_load_balancers();
        req = match query {
            LbQuery::Arns(a) => req.set_load_balancer_arns(Some(a)),
            LbQuery::Names(n) => req.set_names(Some(n)),
            LbQuery::All { marker } => req.set_marker(marker).page_size(400),
        };
        self.call(Class::Describe, OP, async {
            match req.send().await {
                Ok(out) => out
                    .load_balancers()
                    .iter()
                    .filter(|lb| {
                        lb.r#type()
                            .is_none_or(|t| *t == t::LoadBalancerTypeEnum::Network)
                    })
                    .map(|lb| load_balancer(OP, lb))
                    .collect::<ApiResult<Vec<_>>>()
                    .map(|items| Page {
                        items,
                        next_marker: out.next_marker().map(str::to_string),
                        skipped: 0,
                    }),
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn describe_target_groups(&self, query: TgQuery) -> ApiResult<Page<TargetGroup>> {
        const OP: &str = "DescribeTargetGroups";
        let mut req = self.client.describe_target_groups();
        req = match query {
            TgQuery::LoadBalancer(a) => req.load_balancer_arn(a),
            TgQuery::Names(n) => req.set_names(Some(n)),
            TgQuery::All { marker } => req.set_marker(marker).page_size(400),
        };
        self.call(Class::Describe, OP, async {
            match req.send().await {
                Ok(out) => {
                    let items = target_groups(out.target_groups());
                    Ok(Page {
                        skipped: out.target_groups().len() - items.len(),
                        items,
                        next_marker: out.next_marker().map(str::to_string),
                    })
                }
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn describe_tags(&self, arns: Vec<String>) -> ApiResult<BTreeMap<String, Tags>> {
        const OP: &str = "DescribeTags";
        self.call(Class::Describe, OP, async {
            match self
                .client
                .describe_tags()
                .set_resource_arns(Some(arns))
                .send()
                .await
            {
                Ok(out) => Ok(out
                    .tag_descriptions()
                    .iter()
                    .filter_map(|d| {
                        let tags = d
                            .tags()
                            .iter()
                            .filter_map(|t| {
                                Some((
                                    t.key()?.to_string(),
                                    t.value().unwrap_or_default().to_string(),
                                ))
                            })
                            .collect();
                        Some((d.resource_arn()?.to_string(), tags))
                    })
                    .collect()),
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn describe_listeners(&self, load_balancer_arn: String) -> ApiResult<Vec<Listener>> {
        const OP: &str = "DescribeListeners";
        self.call(Class::Describe, OP, async {
            match self
                .client
                .describe_listeners()
                .load_balancer_arn(load_balancer_arn)
                .send()
                .await
            {
                Ok(out) => out
                    .listeners()
                    .iter()
                    .map(|l| {
                        Ok(Listener {
                            arn: required(OP, "ListenerArn", l.listener_arn())?.to_string(),
                            load_balancer_arn: l
                                .load_balancer_arn()
                                .unwrap_or_default()
                                .to_string(),
                            port: port(OP, l.port())?,
                            // A protocol berth never makes (a QUIC listener added by hand)
                            // is a difference to repair, not a reason to fail.
                            protocol: listener_protocol(l.protocol()),
                            tls: listener_tls(l),
                            target_group_arn: l
                                .default_actions()
                                .iter()
                                .find_map(|a| a.target_group_arn())
                                .map(str::to_string),
                        })
                    })
                    .collect(),
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn describe_target_health(
        &self,
        target_group_arn: String,
    ) -> ApiResult<BTreeSet<Target>> {
        const OP: &str = "DescribeTargetHealth";
        self.call(Class::Describe, OP, async {
            match self
                .client
                .describe_target_health()
                .target_group_arn(target_group_arn)
                .send()
                .await
            {
                Ok(out) => out
                    .target_health_descriptions()
                    .iter()
                    .filter_map(|d| d.target())
                    .map(|x| {
                        Ok(Target {
                            id: x.id().unwrap_or_default().to_string(),
                            port: port(OP, x.port())?,
                        })
                    })
                    .collect(),
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn describe_load_balancer_attributes(
        &self,
        arn: String,
    ) -> ApiResult<BTreeMap<String, String>> {
        const OP: &str = "DescribeLoadBalancerAttributes";
        self.call(Class::Describe, OP, async {
            match self
                .client
                .describe_load_balancer_attributes()
                .load_balancer_arn(arn)
                .send()
                .await
            {
                Ok(out) => Ok(out
                    .attributes()
                    .iter()
                    .filter_map(|a| Some((a.key()?.to_string(), a.value()?.to_string())))
                    .collect()),
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn describe_target_group_attributes(
        &self,
        arn: String,
    ) -> ApiResult<BTreeMap<String, String>> {
        const OP: &str = "DescribeTargetGroupAttributes";
        self.call(Class::Describe, OP, async {
            match self
                .client
                .describe_target_group_attributes()
                .target_group_arn(arn)
                .send()
                .await
            {
                Ok(out) => Ok(out
                    .attributes()
                    .iter()
                    .filter_map(|a| Some((a.key()?.to_string(), a.value()?.to_string())))
                    .collect()),
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn create_load_balancer(&self, spec: LoadBalancerSpec) -> ApiResult<LoadBalancer> {
        const OP: &str = "CreateLoadBalancer";
        let req = self
            .client
            .create_load_balancer()
            .name(&spec.name)
            .r#type(t::LoadBalancerTypeEnum::Network)
            .scheme(t::LoadBalancerSchemeEnum::from(spec.scheme.as_str()))
            .set_subnets(Some(spec.subnets.iter().cloned().collect()))
            .set_tags(Some(sdk_tags(&spec.tags)));
        self.call(Class::Modify, OP, async {
            match req.send().await {
                Ok(out) => match out.load_balancers().first() {
                    Some(lb) => load_balancer(OP, lb),
                    None => Err(ApiError::new(
                        OP,
                        ApiErrorKind::Invalid,
                        "IncompleteResponse",
                        "no load balancer in the response",
                    )),
                },
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn create_target_group(
        &self,
        spec: TargetGroupSpec,
        vpc_id: Option<String>,
    ) -> ApiResult<TargetGroup> {
        const OP: &str = "CreateTargetGroup";
        let hc = &spec.health_check;
        let mut req = self
            .client
            .create_target_group()
            .name(&spec.name)
            .protocol(sdk_protocol(spec.protocol))
            .port(i32::from(spec.port))
            .set_vpc_id(vpc_id)
            .target_type(t::TargetTypeEnum::from(spec.target_type.as_str()))
            .health_check_protocol(t::ProtocolEnum::from(hc.protocol.as_str()))
            .health_check_port(hc.port.to_string())
            .health_check_interval_seconds(i32::from(hc.interval_seconds))
            .health_check_timeout_seconds(i32::from(hc.timeout_seconds))
            .healthy_threshold_count(i32::from(hc.healthy_threshold))
            .unhealthy_threshold_count(i32::from(hc.unhealthy_threshold))
            .set_tags(Some(sdk_tags(&spec.tags)));
        if let Some(path) = &hc.path {
            req = req.health_check_path(path);
        }
        if let Some(codes) = &hc.matcher {
            req = req.matcher(t::Matcher::builder().http_code(codes).build());
        }
        self.call(Class::Modify, OP, async {
            match req.send().await {
                Ok(out) => match out.target_groups().first().and_then(target_group) {
                    Some(tg) => Ok(tg),
                    None => Err(ApiError::new(
                        OP,
                        ApiErrorKind::Invalid,
                        "IncompleteResponse",
                        "no target group berth can read in the response",
                    )),
                },
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn create_listener(
        &self,
        load_balancer_arn: String,
        spec: ListenerSpec,
        target_group_arn: String,
        tags: Tags,
    ) -> ApiResult<Listener> {
        const OP: &str = "CreateListener";
        let req = self
            .client
            .create_listener()
            .load_balancer_arn(&load_balancer_arn)
            .protocol(listener_sdk_protocol(spec.protocol, spec.tls.as_ref()))
            .set_certificates(spec.tls.as_ref().map(certificates))
            .set_ssl_policy(spec.tls.as_ref().map(|t| t.policy.clone()))
            .port(i32::from(spec.port))
            .default_actions(forward(target_group_arn.clone()))
            .set_tags(Some(sdk_tags(&tags)));
        self.call(Class::Modify, OP, async {
            match req.send().await {
                Ok(out) => match out.listeners().first().and_then(|l| l.listener_arn()) {
                    Some(arn) => Ok(Listener {
                        arn: arn.to_string(),
                        load_balancer_arn,
                        port: spec.port,
                        protocol: Some(spec.protocol),
                        target_group_arn: Some(target_group_arn),
                        tls: spec.tls,
                    }),
                    None => Err(ApiError::new(
                        OP,
                        ApiErrorKind::Invalid,
                        "IncompleteResponse",
                        "no listener in the response",
                    )),
                },
                Err(e) => Err(api_error(OP, e)),
            }
        })
        .await
    }

    async fn set_subnets(&self, arn: String, subnets: BTreeSet<String>) -> ApiResult<()> {
        const OP: &str = "SetSubnets";
        self.call(Class::Modify, OP, async {
            self.client
                .set_subnets()
                .load_balancer_arn(arn)
                .set_subnets(Some(subnets.into_iter().collect()))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn modify_load_balancer_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> ApiResult<()> {
        const OP: &str = "ModifyLoadBalancerAttributes";
        let attrs = attributes
            .into_iter()
            .map(|(k, v)| t::LoadBalancerAttribute::builder().key(k).value(v).build())
            .collect();
        self.call(Class::Modify, OP, async {
            self.client
                .modify_load_balancer_attributes()
                .load_balancer_arn(arn)
                .set_attributes(Some(attrs))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn modify_target_group(&self, arn: String, hc: HealthCheck) -> ApiResult<()> {
        const OP: &str = "ModifyTargetGroup";
        let mut req = self
            .client
            .modify_target_group()
            .target_group_arn(arn)
            .health_check_protocol(t::ProtocolEnum::from(hc.protocol.as_str()))
            .health_check_port(hc.port.to_string())
            .health_check_interval_seconds(i32::from(hc.interval_seconds))
            .health_check_timeout_seconds(i32::from(hc.timeout_seconds))
            .healthy_threshold_count(i32::from(hc.healthy_threshold))
            .unhealthy_threshold_count(i32::from(hc.unhealthy_threshold));
        if let Some(path) = &hc.path {
            req = req.health_check_path(path);
        }
        if let Some(codes) = &hc.matcher {
            req = req.matcher(t::Matcher::builder().http_code(codes).build());
        }
        self.call(Class::Modify, OP, async {
            req.send().await.map(|_| ()).map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn modify_target_group_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> ApiResult<()> {
        const OP: &str = "ModifyTargetGroupAttributes";
        let attrs = attributes
            .into_iter()
            .map(|(k, v)| t::TargetGroupAttribute::builder().key(k).value(v).build())
            .collect();
        self.call(Class::Modify, OP, async {
            self.client
                .modify_target_group_attributes()
                .target_group_arn(arn)
                .set_attributes(Some(attrs))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn modify_listener(
        &self,
        arn: String,
        protocol: Option<TgProtocol>,
        tls: Option<ListenerTls>,
        target_group_arn: String,
    ) -> ApiResult<()> {
        const OP: &str = "ModifyListener";
        self.call(Class::Modify, OP, async {
            self.client
                .modify_listener()
                .listener_arn(arn)
                .set_protocol(protocol.map(|p| listener_sdk_protocol(p, tls.as_ref())))
                .set_certificates(tls.as_ref().map(certificates))
                .set_ssl_policy(tls.as_ref().map(|t| t.policy.clone()))
                .default_actions(forward(target_group_arn))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn register_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> ApiResult<()> {
        const OP: &str = "RegisterTargets";
        self.call(Class::Register, OP, async {
            self.client
                .register_targets()
                .target_group_arn(target_group_arn)
                .set_targets(Some(sdk_targets(&targets)))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn deregister_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> ApiResult<()> {
        const OP: &str = "DeregisterTargets";
        self.call(Class::Register, OP, async {
            self.client
                .deregister_targets()
                .target_group_arn(target_group_arn)
                .set_targets(Some(sdk_targets(&targets)))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn delete_listener(&self, arn: String) -> ApiResult<()> {
        const OP: &str = "DeleteListener";
        self.call(Class::Modify, OP, async {
            self.client
                .delete_listener()
                .listener_arn(arn)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn delete_load_balancer(&self, arn: String) -> ApiResult<()> {
        const OP: &str = "DeleteLoadBalancer";
        self.call(Class::Modify, OP, async {
            self.client
                .delete_load_balancer()
                .load_balancer_arn(arn)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn delete_target_group(&self, arn: String) -> ApiResult<()> {
        const OP: &str = "DeleteTargetGroup";
        self.call(Class::Modify, OP, async {
            self.client
                .delete_target_group()
                .target_group_arn(arn)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn add_tags(&self, arn: String, tags: Tags) -> ApiResult<()> {
        const OP: &str = "AddTags";
        self.call(Class::Modify, OP, async {
            self.client
                .add_tags()
                .resource_arns(arn)
                .set_tags(Some(sdk_tags(&tags)))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }

    async fn remove_tags(&self, arn: String, keys: Vec<String>) -> ApiResult<()> {
        const OP: &str = "RemoveTags";
        self.call(Class::Modify, OP, async {
            self.client
                .remove_tags()
                .resource_arns(arn)
                .set_tag_keys(Some(keys))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| api_error(OP, e))
        })
        .await
    }
}
