//! The ELBv2 operations berth calls, behind one small trait: [`crate::sdk`] is the real
//! client (aws-sdk-elasticloadbalancingv2), [`crate::memory`] an in-memory fake that enforces
//! the AWS rules berth must not rely on moto for.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use crate::model::{
    HealthCheck, ListenerSpec, ListenerTls, LoadBalancerSpec, Target, TargetGroupSpec, TgProtocol,
};
use crate::observed::{Listener, LoadBalancer, Tags, TargetGroup};

/// DescribeTags takes at most this many ARNs.
pub const TAGS_PER_CALL: usize = 20;
/// DescribeLoadBalancers and DescribeTargetGroups take at most this many ARNs or names.
pub const NAMES_PER_CALL: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiErrorKind {
    /// The named resource does not exist (`LoadBalancerNotFound`, `TargetGroupNotFound`, ...).
    NotFound,
    /// AWS asked to slow down (`Throttling`).
    Throttled,
    /// The resource is still used by another (`ResourceInUse`).
    InUse,
    /// Another resource already has the name.
    Duplicate,
    /// A network failure, a timeout or a 5xx: worth retrying.
    Transient,
    /// Anything else: a request AWS refuses as it is.
    Invalid,
}

/// A failed ELBv2 call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation}: {code}: {message}")]
pub struct ApiError {
    pub operation: &'static str,
    pub kind: ApiErrorKind,
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(
        operation: &'static str,
        kind: ApiErrorKind,
        code: &str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            operation,
            kind,
            code: code.to_string(),
            message: message.into(),
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ApiErrorKind::NotFound
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbQuery {
    Arns(Vec<String>),
    Names(Vec<String>),
    /// Every load balancer of the account and region, a page at a time.
    All {
        marker: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TgQuery {
    LoadBalancer(String),
    Names(Vec<String>),
    All { marker: Option<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_marker: Option<String>,
    /// Resources of the page left out because berth never makes their kind (an ALB's HTTP
    /// target group, a Lambda one): someone else's, yet they count against the quotas.
    pub skipped: usize,
}

/// The ELBv2 calls berth makes. Every method is one API call.
pub trait Elbv2: Send + Sync {
    fn describe_load_balancers(
        &self,
        query: LbQuery,
    ) -> impl Future<Output = ApiResult<Page<LoadBalancer>>> + Send;
    fn describe_target_groups(
        &self,
        query: TgQuery,
    ) -> impl Future<Output = ApiResult<Page<TargetGroup>>> + Send;
    /// At most [`TAGS_PER_CALL`] ARNs.
    fn describe_tags(
        &self,
        arns: Vec<String>,
    ) -> impl Future<Output = ApiResult<BTreeMap<String, Tags>>> + Send;
    fn describe_listeners(
        &self,
        load_balancer_arn: String,
    ) -> impl Future<Output = ApiResult<Vec<Listener>>> + Send;
    fn describe_target_health(
        &self,
        target_group_arn: String,
    ) -> impl Future<Output = ApiResult<BTreeSet<Target>>> + Send;
    fn describe_load_balancer_attributes(
        &self,
        arn: String,
    ) -> impl Future<Output = ApiResult<BTreeMap<String, String>>> + Send;
    fn describe_target_group_attributes(
        &self,
        arn: String,
    ) -> impl Future<Output = ApiResult<BTreeMap<String, String>>> + Send;
    fn create_load_balancer(
        &self,
        spec: LoadBalancerSpec,
    ) -> impl Future<Output = ApiResult<LoadBalancer>> + Send;
    fn create_target_group(
        &self,
        spec: TargetGroupSpec,
        vpc_id: Option<String>,
    ) -> impl Future<Output = ApiResult<TargetGroup>> + Send;
    fn create_listener(
        &self,
        load_balancer_arn: String,
        spec: ListenerSpec,
        target_group_arn: String,
        tags: Tags,
    ) -> impl Future<Output = ApiResult<Listener>> + Send;
    fn set_subnets(
        &self,
        arn: String,
        subnets: BTreeSet<String>,
    ) -> impl Future<Output = ApiResult<()>> + Send;
    fn modify_load_balancer_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> impl Future<Output = ApiResult<()>> + Send;
    fn modify_target_group(
        &self,
        arn: String,
        health_check: HealthCheck,
    ) -> impl Future<Output = ApiResult<()>> + Send;
    fn modify_target_group_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> impl Future<Output = ApiResult<()>> + Send;
    /// `protocol`: a new protocol (`None`: unchanged); `tls`: a TLS listener with this
    /// certificate and policy, else a plain one.
    fn modify_listener(
        &self,
        arn: String,
        protocol: Option<TgProtocol>,
        tls: Option<ListenerTls>,
        target_group_arn: String,
    ) -> impl Future<Output = ApiResult<()>> + Send;
    fn register_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> impl Future<Output = ApiResult<()>> + Send;
    fn deregister_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> impl Future<Output = ApiResult<()>> + Send;
    fn delete_listener(&self, arn: String) -> impl Future<Output = ApiResult<()>> + Send;
    fn delete_load_balancer(&self, arn: String) -> impl Future<Output = ApiResult<()>> + Send;
    fn delete_target_group(&self, arn: String) -> impl Future<Output = ApiResult<()>> + Send;
    fn add_tags(&self, arn: String, tags: Tags) -> impl Future<Output = ApiResult<()>> + Send;
    fn remove_tags(
        &self,
        arn: String,
        keys: Vec<String>,
    ) -> impl Future<Output = ApiResult<()>> + Send;
}
