//! The Deployment controller's decisions (pure), after upstream's `pkg/controller/deployment`:
//! which ReplicaSet holds the current template (created when none does, reused on `rollout
//! undo`), how far each ReplicaSet is scaled this round (RollingUpdate within maxSurge and
//! maxUnavailable, counting only available pods; Recreate), which old ReplicaSets are cleaned
//! up past `revisionHistoryLimit`, and the status `kubectl rollout status` waits on.
//!
//! Decisions where upstream leaves room or the lab does less:
//! - One step per round: a round that scales the new ReplicaSet up does not scale old ones
//!   down; the next round (on the next event) does, from the counts then observed.
//! - A ReplicaSet whose template equals the Deployment's (ignoring `pod-template-hash`) is the
//!   new one; no hash collisions are handled (`collisionCount` stays unset).
//! - Proportional scaling of several ReplicaSets during a rollout is not done: a change of
//!   `replicas` mid-rollout is absorbed by the rolling step.
//! - A paused Deployment is neither rolled nor scaled; its status is still reported.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};

use super::facts::{
    Condition, Counts, DeploymentFacts, ReplicaSetFacts, Strategy, POD_TEMPLATE_HASH, REVISION,
};

/// One ReplicaSet's new size (and annotations to set), by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scale {
    pub name: String,
    pub replicas: i32,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentPlan {
    /// A new ReplicaSet to create (the whole object).
    pub create: Option<Value>,
    pub scale: Vec<Scale>,
    /// Old ReplicaSets past the history limit, by name.
    pub delete: Vec<String>,
    /// The Deployment's `deployment.kubernetes.io/revision`, when it must change.
    pub revision: Option<String>,
    pub status: Value,
}

/// The ReplicaSets a Deployment controls.
pub fn owned_replica_sets<'a>(
    d: &DeploymentFacts,
    all: &'a [ReplicaSetFacts],
) -> Vec<&'a ReplicaSetFacts> {
    all.iter()
        .filter(|rs| rs.namespace == d.namespace)
        .filter(|rs| rs.owner.as_ref().is_some_and(|(uid, _)| *uid == d.uid))
        .collect()
}

/// upstream's `ComputeHash` in spirit: FNV-1a (32 bits) over the template's JSON, written with
/// `SafeEncodeString`'s alphabet (no vowels, no look-alike digits), so names stay readable.
pub fn template_hash(template: &Value) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in without_hash(template).to_string().bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    hash.to_string()
        .bytes()
        .map(|b| char::from(ALPHABET[usize::from(b) % ALPHABET.len()]))
        .collect()
}

/// The template without `pod-template-hash` (and without a labels map that held only it).
fn without_hash(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(labels) = t["metadata"]["labels"].as_object_mut() {
        labels.remove(POD_TEMPLATE_HASH);
        if labels.is_empty() {
            if let Some(meta) = t["metadata"].as_object_mut() {
                meta.remove("labels");
            }
        }
    }
    t
}

/// `intstr.GetScaledValueFromIntOrPercent`: a count, or a percentage of `total` rounded up or
/// down.
pub fn scaled(value: &IntOrString, total: i32, round_up: bool) -> i32 {
    match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let percent: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let product = percent * i64::from(total);
            let v = if round_up {
                (product + 99).div_euclid(100)
            } else {
                product.div_euclid(100)
            };
            i32::try_from(v).unwrap_or(0)
        }
    }
}

/// `(maxSurge, maxUnavailable)` resolved against `replicas`; both zero becomes one unavailable,
/// as upstream does, so a rollout can always move.
pub fn surge_and_unavailable(strategy: &Strategy, replicas: i32) -> (i32, i32) {
    match strategy {
        Strategy::Recreate => (0, replicas),
        Strategy::RollingUpdate {
            max_surge,
            max_unavailable,
        } => {
            let surge = scaled(max_surge, replicas, true).max(0);
            let unavailable = scaled(max_unavailable, replicas, false).max(0);
            if surge == 0 && unavailable == 0 {
                (0, 1)
            } else {
                (surge, unavailable.min(replicas))
            }
        }
    }
}

/// The ReplicaSet to create for a template no ReplicaSet holds yet.
pub fn build_replica_set(d: &DeploymentFacts, hash: &str, replicas: i32, revision: i64) -> Value {
    let mut template = d.template.clone();
    template["metadata"]["labels"][POD_TEMPLATE_HASH] = json!(hash);
    let mut selector = d.selector.clone();
    selector["matchLabels"][POD_TEMPLATE_HASH] = json!(hash);
    let (surge, _) = surge_and_unavailable(&d.strategy, d.replicas);
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{}-{hash}", d.name),
            "namespace": d.namespace,
            "labels": template["metadata"]["labels"].clone(),
            "annotations": {
                REVISION: revision.to_string(),
                "deployment.kubernetes.io/desired-replicas": d.replicas.to_string(),
                "deployment.kubernetes.io/max-replicas": (d.replicas + surge).to_string(),
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": d.name, "uid": d.uid,
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "replicas": replicas,
            "minReadySeconds": d.min_ready_seconds,
            "selector": selector,
            "template": template,
        },
    })
}

/// What one round decides for a Deployment and the ReplicaSets it owns.
pub fn plan_deployment(
    d: &DeploymentFacts,
    owned: &[&ReplicaSetFacts],
    now: DateTime<Utc>,
) -> DeploymentPlan {
    let hash = template_hash(&d.template);
    let wanted = without_hash(&d.template);
    let mut current: Option<&ReplicaSetFacts> = None;
    for rs in owned {
        if without_hash(&rs.template) == wanted
            && current.is_none_or(|c| (rs.created, &rs.name) < (c.created, &c.name))
        {
            current = Some(rs);
        }
    }
    let old: Vec<&ReplicaSetFacts> = owned
        .iter()
        .copied()
        .filter(|rs| current.is_none_or(|c| c.uid != rs.uid))
        .collect();
    let max_old_revision = old.iter().map(|rs| rs.revision).max().unwrap_or(0);
    let mut plan = DeploymentPlan {
        create: None,
        scale: Vec::new(),
        delete: Vec::new(),
        revision: None,
        status: Value::Null,
    };
    let revision = match current {
        Some(rs) if rs.revision > max_old_revision => rs.revision,
        _ => max_old_revision + 1,
    };
    if d.annotations.get(REVISION) != Some(&revision.to_string()) && !d.paused {
        plan.revision = Some(revision.to_string());
    }
    if !d.paused {
        let (surge, unavailable) = surge_and_unavailable(&d.strategy, d.replicas);
        let new_size = current.map_or(0, |rs| rs.replicas);
        let target = new_replicas(d, new_size, &old, surge);
        match current {
            None => plan.create = Some(build_replica_set(d, &hash, target, revision)),
            Some(rs) => {
                let revision_moves = rs.revision != revision;
                if target != rs.replicas || revision_moves {
                    let mut annotations = BTreeMap::new();
                    annotations.insert(REVISION.to_owned(), revision.to_string());
                    plan.scale.push(Scale {
                        name: rs.name.clone(),
                        replicas: target,
                        annotations,
                    });
                }
            }
        }
        // Old ReplicaSets shrink only in a round where the new one did not grow.
        if plan.create.is_none() && plan.scale.iter().all(|s| s.replicas <= new_size) {
            plan.scale
                .extend(scale_down_old(d, current, &old, unavailable));
        }
        plan.delete = history_to_delete(d, &old);
    }
    plan.status = build_status(d, current, owned, now);
    plan
}

/// The new ReplicaSet's size this round.
fn new_replicas(d: &DeploymentFacts, current: i32, old: &[&ReplicaSetFacts], surge: i32) -> i32 {
    let old_pods: i32 = old
        .iter()
        .map(|rs| rs.replicas.max(rs.status.replicas))
        .sum();
    match d.strategy {
        // Only once every old pod is gone.
        Strategy::Recreate if old_pods > 0 => 0,
        Strategy::Recreate => d.replicas,
        Strategy::RollingUpdate { .. } => {
            if old_pods == 0 || current > d.replicas {
                return d.replicas;
            }
            let total: i32 = current + old.iter().map(|rs| rs.replicas).sum::<i32>();
            let room = d.replicas + surge - total;
            if room <= 0 {
                current
            } else {
                (current + room).min(d.replicas)
            }
        }
    }
}

/// Old ReplicaSets scaled down as far as `maxUnavailable` allows: first their pods that are not
/// available (they serve nobody), then available ones, oldest ReplicaSet first.
fn scale_down_old(
    d: &DeploymentFacts,
    current: Option<&ReplicaSetFacts>,
    old: &[&ReplicaSetFacts],
    max_unavailable: i32,
) -> Vec<Scale> {
    let mut sizes: Vec<(&ReplicaSetFacts, i32)> = old
        .iter()
        .filter(|rs| rs.replicas > 0)
        .map(|rs| (*rs, rs.replicas))
        .collect();
    if sizes.is_empty() {
        return Vec::new();
    }
    sizes.sort_by_key(|(rs, _)| (rs.created, rs.name.clone()));
    if d.strategy == Strategy::Recreate {
        return sizes
            .into_iter()
            .map(|(rs, _)| Scale {
                name: rs.name.clone(),
                replicas: 0,
                annotations: BTreeMap::new(),
            })
            .collect();
    }
    let min_available = d.replicas - max_unavailable;
    let new_spec = current.map_or(0, |rs| rs.replicas);
    let new_unavailable = (new_spec - current.map_or(0, |rs| rs.status.available)).max(0);
    let all_spec: i32 = new_spec + sizes.iter().map(|(_, n)| n).sum::<i32>();
    let mut budget = all_spec - min_available - new_unavailable;
    if budget <= 0 {
        return Vec::new();
    }
    // Unhealthy old replicas first.
    for (rs, size) in sizes.iter_mut() {
        let unhealthy = (*size - rs.status.available).max(0);
        let cut = unhealthy.min(budget);
        *size -= cut;
        budget -= cut;
    }
    // Then available ones, while enough stay available overall.
    let available: i32 = current.map_or(0, |rs| rs.status.available)
        + sizes
            .iter()
            .map(|(rs, size)| rs.status.available.min(*size))
            .sum::<i32>();
    let mut can_cut = (available - min_available).min(budget).max(0);
    for (_, size) in sizes.iter_mut() {
        let cut = (*size).min(can_cut);
        *size -= cut;
        can_cut -= cut;
    }
    sizes
        .into_iter()
        .filter(|(rs, size)| *size != rs.replicas)
        .map(|(rs, size)| Scale {
            name: rs.name.clone(),
            replicas: size,
            annotations: BTreeMap::new(),
        })
        .collect()
}

/// Old, empty ReplicaSets beyond `revisionHistoryLimit`, lowest revision first.
fn history_to_delete(d: &DeploymentFacts, old: &[&ReplicaSetFacts]) -> Vec<String> {
    let mut empty: Vec<&&ReplicaSetFacts> = old
        .iter()
        .filter(|rs| rs.replicas == 0 && rs.status.replicas == 0)
        .collect();
    let limit = usize::try_from(d.revision_history_limit.max(0)).unwrap_or(0);
    if empty.len() <= limit {
        return Vec::new();
    }
    empty.sort_by_key(|rs| (rs.revision, rs.created));
    let extra = empty.len() - limit;
    empty[..extra].iter().map(|rs| rs.name.clone()).collect()
}

fn build_status(
    d: &DeploymentFacts,
    current: Option<&ReplicaSetFacts>,
    owned: &[&ReplicaSetFacts],
    now: DateTime<Utc>,
) -> Value {
    let sum = |f: fn(&Counts) -> i32| owned.iter().map(|rs| f(&rs.status)).sum::<i32>();
    let replicas = sum(|c| c.replicas);
    let ready = sum(|c| c.ready);
    let available = sum(|c| c.available);
    let updated = current.map_or(0, |rs| rs.status.replicas);
    let spec_total: i32 = owned.iter().map(|rs| rs.replicas).sum();
    let unavailable = (spec_total.max(d.replicas) - available).max(0);
    let (_, max_unavailable) = surge_and_unavailable(&d.strategy, d.replicas);
    let stamp = super::facts::stamp(now);
    let rs_name = current.map_or_else(
        || format!("{}-{}", d.name, template_hash(&d.template)),
        |rs| rs.name.clone(),
    );
    let complete = updated == d.replicas
        && replicas == d.replicas
        && available >= d.replicas
        && current.is_some_and(|rs| rs.status.observed_generation >= rs.generation);
    let available_condition = if available >= d.replicas - max_unavailable {
        (
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".to_owned(),
        )
    } else {
        (
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".to_owned(),
        )
    };
    let previous = d.conditions.iter().find(|c| c.type_ == "Progressing");
    let progressing = if d.paused {
        (
            "Unknown",
            "DeploymentPaused",
            "Deployment is paused".to_owned(),
        )
    } else if complete {
        (
            "True",
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
        )
    } else if deadline_passed(d, previous, now) {
        (
            "False",
            "ProgressDeadlineExceeded",
            format!("ReplicaSet \"{rs_name}\" has timed out progressing."),
        )
    } else {
        (
            "True",
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{rs_name}\" is progressing."),
        )
    };
    // A rollout that moved (other counts than last time) renews Progressing's update time, so
    // the deadline counts from the last progress, as upstream's does.
    let moved = d.status.replicas != replicas
        || d.status.available != available
        || d.status.observed_generation != d.generation;
    let conditions = vec![
        condition(d, "Available", available_condition, &stamp, false),
        condition(d, "Progressing", progressing, &stamp, moved),
    ];
    json!({
        "observedGeneration": d.generation,
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "unavailableReplicas": unavailable,
        "conditions": conditions,
    })
}

fn deadline_passed(d: &DeploymentFacts, previous: Option<&Condition>, now: DateTime<Utc>) -> bool {
    if previous.is_some_and(|c| c.reason == "ProgressDeadlineExceeded") {
        return true;
    }
    previous
        .and_then(|c| c.last_update.as_deref())
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .is_some_and(|t| {
            t.with_timezone(&Utc)
                + chrono::Duration::seconds(i64::from(d.progress_deadline_seconds))
                < now
        })
}

/// A condition whose times move only on a real change: `lastTransitionTime` when the status
/// changes, `lastUpdateTime` when anything about it changes (or `renew`).
fn condition(
    d: &DeploymentFacts,
    type_: &str,
    (status, reason, message): (&str, &str, String),
    now: &str,
    renew: bool,
) -> Value {
    let previous = d.conditions.iter().find(|c| c.type_ == type_);
    let same_status = previous.is_some_and(|c| c.status == status);
    let same_all =
        same_status && previous.is_some_and(|c| c.reason == reason && c.message == message);
    let keep = |t: Option<&String>| t.cloned().unwrap_or_else(|| now.to_owned());
    let transition = if same_status {
        keep(previous.and_then(|c| c.last_transition.as_ref()))
    } else {
        now.to_owned()
    };
    let update = if same_all && !renew {
        keep(previous.and_then(|c| c.last_update.as_ref()))
    } else {
        now.to_owned()
    };
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastUpdateTime": update, "lastTransitionTime": transition,
    })
}

#[cfg(test)]
#[path = "deployment_tests.rs"]
mod tests;
