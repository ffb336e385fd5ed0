//! The facts the workload controllers decide from, read out of Deployments, ReplicaSets and Pods.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

/// The annotation that numbers a Deployment's rollouts on its ReplicaSets (and itself), as
/// `kubectl rollout history|undo` read it.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The label that ties a ReplicaSet and its pods to one pod template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The uid of the controller in `ownerReferences`, and its kind.
    pub owner: Option<(String, String)>,
    pub created: Option<DateTime<Utc>>,
    pub node: Option<String>,
    /// When the Ready condition last turned True; `None` while not Ready.
    pub ready_since: Option<DateTime<Utc>>,
    pub terminating: bool,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSetFacts {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub owner: Option<(String, String)>,
    pub created: Option<DateTime<Utc>>,
    pub generation: i64,
    pub replicas: i32,
    pub min_ready_seconds: i32,
    pub template: Value,
    pub selector: Value,
    pub revision: i64,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub status: Counts,
    /// The status as stored, to tell whether a planned one changes anything.
    pub observed: Value,
}

/// A ReplicaSet's or Deployment's observed counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub replicas: i32,
    pub ready: i32,
    pub available: i32,
    pub observed_generation: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Strategy {
    Recreate,
    RollingUpdate {
        max_surge: IntOrString,
        max_unavailable: IntOrString,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_update: Option<String>,
    pub last_transition: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentFacts {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub generation: i64,
    pub replicas: i32,
    pub selector: Value,
    pub template: Value,
    pub strategy: Strategy,
    pub min_ready_seconds: i32,
    pub revision_history_limit: i32,
    pub paused: bool,
    pub progress_deadline_seconds: i32,
    pub annotations: BTreeMap<String, String>,
    pub status: Counts,
    pub conditions: Vec<Condition>,
    /// The status as stored.
    pub observed: Value,
}

/// A `metav1.Time` as chrono's (whole seconds, as the API server keeps them).
fn chrono_of(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), 0).unwrap_or(DateTime::UNIX_EPOCH)
}

/// A time as the API server writes it (RFC 3339, whole seconds, `Z`).
pub fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn controller_of(meta: &ObjectMeta) -> Option<(String, String)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r: &&OwnerReference| r.controller == Some(true))
        .map(|r| (r.uid.clone(), r.kind.clone()))
}

fn identity(meta: &ObjectMeta) -> Option<(String, String, String)> {
    Some((
        meta.name.clone()?,
        meta.namespace.clone()?,
        meta.uid.clone()?,
    ))
}

/// A Pod's facts; `None` without a name, namespace or uid.
pub fn pod_facts(pod: &Pod) -> Option<PodFacts> {
    let meta = &pod.metadata;
    let (name, namespace, uid) = identity(meta)?;
    let status = pod.status.as_ref();
    let ready_since = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .map(|c| {
            c.last_transition_time
                .as_ref()
                .map_or(DateTime::UNIX_EPOCH, chrono_of)
        });
    Some(PodFacts {
        name,
        namespace,
        uid,
        owner: controller_of(meta),
        created: meta.creation_timestamp.as_ref().map(chrono_of),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ready_since,
        terminating: meta.deletion_timestamp.is_some(),
        labels: meta.labels.clone().unwrap_or_default(),
    })
}

fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn revision_of(meta: &ObjectMeta) -> i64 {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(REVISION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn replica_set_facts(rs: &ReplicaSet) -> Option<ReplicaSetFacts> {
    let meta = &rs.metadata;
    let (name, namespace, uid) = identity(meta)?;
    let spec = rs.spec.as_ref()?;
    let status = rs.status.as_ref();
    Some(ReplicaSetFacts {
        name,
        namespace,
        uid,
        owner: controller_of(meta),
        created: meta.creation_timestamp.as_ref().map(chrono_of),
        generation: meta.generation.unwrap_or(0),
        replicas: spec.replicas.unwrap_or(1),
        min_ready_seconds: spec.min_ready_seconds.unwrap_or(0),
        template: spec.template.as_ref().map_or(Value::Null, json_of),
        selector: json_of(&spec.selector),
        revision: revision_of(meta),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        status: Counts {
            replicas: status.map_or(0, |s| s.replicas),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            available: status.and_then(|s| s.available_replicas).unwrap_or(0),
            observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        },
        observed: status.map_or(Value::Null, json_of),
    })
}

/// upstream's defaults for a strategy left out or half given: RollingUpdate, 25% and 25%.
fn strategy_of(d: &Deployment) -> Strategy {
    let strategy = d.spec.as_ref().and_then(|s| s.strategy.as_ref());
    if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
        return Strategy::Recreate;
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let quarter = || IntOrString::String("25%".to_owned());
    Strategy::RollingUpdate {
        max_surge: rolling
            .and_then(|r| r.max_surge.clone())
            .unwrap_or_else(quarter),
        max_unavailable: rolling
            .and_then(|r| r.max_unavailable.clone())
            .unwrap_or_else(quarter),
    }
}

pub fn deployment_facts(d: &Deployment) -> Option<DeploymentFacts> {
    let meta = &d.metadata;
    let (name, namespace, uid) = identity(meta)?;
    let spec = d.spec.as_ref()?;
    let status = d.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| Condition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                    last_update: c.last_update_time.as_ref().map(|t| stamp(chrono_of(t))),
                    last_transition: c.last_transition_time.as_ref().map(|t| stamp(chrono_of(t))),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(DeploymentFacts {
        name,
        namespace,
        uid,
        generation: meta.generation.unwrap_or(0),
        replicas: spec.replicas.unwrap_or(1),
        selector: json_of(&spec.selector),
        template: json_of(&spec.template),
        strategy: strategy_of(d),
        min_ready_seconds: spec.min_ready_seconds.unwrap_or(0),
        revision_history_limit: spec.revision_history_limit.unwrap_or(10),
        paused: spec.paused.unwrap_or(false),
        progress_deadline_seconds: spec.progress_deadline_seconds.unwrap_or(600),
        annotations: meta.annotations.clone().unwrap_or_default(),
        status: Counts {
            replicas: status.and_then(|s| s.replicas).unwrap_or(0),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            available: status.and_then(|s| s.available_replicas).unwrap_or(0),
            observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        },
        conditions,
        observed: status.map_or(Value::Null, json_of),
    })
}

/// Whether a pod has been Ready for `min_ready_seconds` at `now`: upstream's "available".
pub fn is_available(pod: &PodFacts, min_ready_seconds: i32, now: DateTime<Utc>) -> bool {
    pod.ready_since.is_some_and(|since| {
        since + chrono::Duration::seconds(i64::from(min_ready_seconds.max(0))) <= now
    })
}
