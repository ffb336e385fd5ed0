//! What exists in AWS, as plain data: the client adapters fill these, the diff reads them.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{HealthCheck, ListenerTls, Scheme, Target, TargetType, TgProtocol};

pub type Tags = BTreeMap<String, String>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancer {
    pub arn: String,
    pub name: String,
    pub dns_name: String,
    pub scheme: Scheme,
    pub subnets: BTreeSet<String>,
    pub vpc_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGroup {
    pub arn: String,
    pub name: String,
    pub protocol: TgProtocol,
    pub port: u16,
    pub target_type: TargetType,
    pub health_check: HealthCheck,
    pub load_balancer_arns: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub arn: String,
    pub load_balancer_arn: String,
    pub port: u16,
    /// `None`: a protocol berth never makes (a listener someone added by hand), which the
    /// diff replaces like any other difference rather than failing on it.
    pub protocol: Option<TgProtocol>,
    /// The target group of its default forward action.
    pub target_group_arn: Option<String>,
    /// A TLS listener's default certificate and policy (its `protocol` is then `TCP`).
    pub tls: Option<ListenerTls>,
}

/// A load balancer of the Service's, with what the diff compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedLoadBalancer {
    pub lb: LoadBalancer,
    pub tags: Tags,
    /// Read only when the Service manages attributes.
    pub attributes: Option<BTreeMap<String, String>>,
    pub listeners: Vec<Listener>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedTargetGroup {
    pub tg: TargetGroup,
    pub tags: Tags,
    pub attributes: Option<BTreeMap<String, String>>,
    pub targets: BTreeSet<Target>,
}

/// Everything of one Service's found in AWS (only resources carrying its tags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub load_balancers: Vec<ObservedLoadBalancer>,
    pub target_groups: Vec<ObservedTargetGroup>,
}
