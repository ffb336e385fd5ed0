//! The ReplicaSet controller's decisions (pure): how many pods to create, which to delete, and
//! the status to report.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::facts::{is_available, PodFacts, ReplicaSetFacts};

#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSetPlan {
    /// Pods to create from the template.
    pub create: usize,
    /// Pods to delete, by name, the ones least worth keeping first.
    pub delete: Vec<String>,
    /// The status to write (`replicas` counts pods not terminating).
    pub status: Value,
}

/// The pods a ReplicaSet controls: those naming it as their controller.
pub fn owned_pods<'a>(rs: &ReplicaSetFacts, pods: &'a [PodFacts]) -> Vec<&'a PodFacts> {
    pods.iter()
        .filter(|p| p.namespace == rs.namespace)
        .filter(|p| p.owner.as_ref().is_some_and(|(uid, _)| *uid == rs.uid))
        .collect()
}

/// upstream's `ActivePods` order, the pod to delete first first: unscheduled before scheduled,
/// not ready before ready, ready for less time before longer, newer before older.
fn deletion_order(a: &PodFacts, b: &PodFacts) -> Ordering {
    a.node
        .is_some()
        .cmp(&b.node.is_some())
        .then(a.ready_since.is_some().cmp(&b.ready_since.is_some()))
        .then(b.ready_since.cmp(&a.ready_since))
        .then(b.created.cmp(&a.created))
        .then(a.name.cmp(&b.name))
}

pub fn plan_replica_set(
    rs: &ReplicaSetFacts,
    pods: &[PodFacts],
    now: DateTime<Utc>,
) -> ReplicaSetPlan {
    let owned = owned_pods(rs, pods);
    let mut active: Vec<&PodFacts> = owned.iter().copied().filter(|p| !p.terminating).collect();
    let terminating = owned.len() - active.len();
    let want = usize::try_from(rs.replicas.max(0)).unwrap_or(0);
    let (create, delete) = match active.len().cmp(&want) {
        Ordering::Less => (want - active.len(), Vec::new()),
        Ordering::Equal => (0, Vec::new()),
        Ordering::Greater => {
            active.sort_by(|a, b| deletion_order(a, b));
            let extra = active.len() - want;
            (0, active[..extra].iter().map(|p| p.name.clone()).collect())
        }
    };
    let ready = active.iter().filter(|p| p.ready_since.is_some()).count();
    let available = active
        .iter()
        .filter(|p| is_available(p, rs.min_ready_seconds, now))
        .count();
    let labelled = active
        .iter()
        .filter(|p| {
            rs.template["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .all(|(k, v)| p.labels.get(k).map(String::as_str) == v.as_str())
        })
        .count();
    let mut status = json!({
        "replicas": active.len(),
        "fullyLabeledReplicas": labelled,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": rs.generation,
    });
    if terminating > 0 {
        status["terminatingReplicas"] = json!(terminating);
    }
    ReplicaSetPlan {
        create,
        delete,
        status,
    }
}

/// A pod of the ReplicaSet: its template, named `<rs>-<random>` by the API server, owned by it.
pub fn build_pod(rs: &ReplicaSetFacts) -> Value {
    let template = &rs.template;
    let mut metadata = json!({
        "generateName": format!("{}-", rs.name),
        "namespace": rs.namespace,
        "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs.name, "uid": rs.uid,
            "controller": true, "blockOwnerDeletion": true,
        }],
    });
    for key in ["labels", "annotations"] {
        if let Some(v) = template["metadata"].get(key).filter(|v| v.is_object()) {
            metadata[key] = v.clone();
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": template["spec"].clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::facts::Counts;
    use std::collections::BTreeMap;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    pub(crate) fn mk_rs(replicas: i32) -> ReplicaSetFacts {
        ReplicaSetFacts {
            name: "web-abc".into(),
            namespace: "default".into(),
            uid: "rs-1".into(),
            owner: Some(("d-1".into(), "Deployment".into())),
            created: Some(t(0)),
            generation: 3,
            replicas,
            min_ready_seconds: 0,
            template: json!({"metadata": {"labels": {"app": "web", "pod-template-hash": "abc"}},
                "spec": {"containers": [{"name": "echo", "image": "berth.dev/lab-echo"}]}}),
            selector: json!({"matchLabels": {"app": "web", "pod-template-hash": "abc"}}),
            revision: 1,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            status: Counts::default(),
            observed: Value::Null,
        }
    }

    /// A pod of `web-abc`: created at `created`, on a node when `node`, Ready since `ready`.
    fn mk_pod(name: &str, created: i64, node: bool, ready: Option<i64>) -> PodFacts {
        PodFacts {
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
            owner: Some(("rs-1".into(), "ReplicaSet".into())),
            created: Some(t(created)),
            node: node.then(|| "node1".to_owned()),
            ready_since: ready.map(t),
            terminating: false,
            labels: BTreeMap::from([
                ("app".into(), "web".into()),
                ("pod-template-hash".into(), "abc".into()),
            ]),
        }
    }

    #[test]
    fn creates_the_missing_pods() {
        let pods = vec![mk_pod("a", 0, true, Some(1))];
        let plan = plan_replica_set(&mk_rs(3), &pods, t(10));
        assert_eq!((plan.create, plan.delete.len()), (2, 0));
        assert_eq!(
            plan.status,
            json!({"replicas": 1, "fullyLabeledReplicas": 1, "readyReplicas": 1,
                "availableReplicas": 1, "observedGeneration": 3})
        );
    }

    #[test]
    fn deletes_the_least_useful_pods_first() {
        let pods = vec![
            mk_pod("old-ready", 0, true, Some(1)),
            mk_pod("new-ready", 5, true, Some(6)),
            mk_pod("not-ready", 1, true, None),
            mk_pod("unscheduled", 2, false, None),
        ];
        let plan = plan_replica_set(&mk_rs(1), &pods, t(10));
        assert_eq!(plan.create, 0);
        assert_eq!(plan.delete, ["unscheduled", "not-ready", "new-ready"]);
    }

    #[test]
    fn terminating_and_foreign_pods_do_not_count() {
        let mut dying = mk_pod("dying", 0, true, Some(1));
        dying.terminating = true;
        let mut foreign = mk_pod("foreign", 0, true, Some(1));
        foreign.owner = Some(("rs-2".into(), "ReplicaSet".into()));
        let mut elsewhere = mk_pod("elsewhere", 0, true, Some(1));
        elsewhere.namespace = "other".into();
        let plan = plan_replica_set(&mk_rs(1), &[dying, foreign, elsewhere], t(10));
        assert_eq!(plan.create, 1, "a terminating pod is replaced at once");
        assert_eq!(plan.status["replicas"], 0);
        assert_eq!(plan.status["terminatingReplicas"], 1);
    }

    #[test]
    fn available_waits_for_min_ready_seconds() {
        let mut rs = mk_rs(2);
        rs.min_ready_seconds = 5;
        let pods = vec![mk_pod("a", 0, true, Some(1)), mk_pod("b", 0, true, Some(8))];
        let plan = plan_replica_set(&rs, &pods, t(10));
        assert_eq!(plan.status["readyReplicas"], 2);
        assert_eq!(plan.status["availableReplicas"], 1);
    }

    #[test]
    fn pods_carry_the_template_and_an_owner_reference() {
        let pod = build_pod(&mk_rs(1));
        assert_eq!(pod["metadata"]["generateName"], "web-abc-");
        assert_eq!(pod["metadata"]["labels"]["pod-template-hash"], "abc");
        assert_eq!(
            pod["metadata"]["ownerReferences"][0],
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs-1",
                "controller": true, "blockOwnerDeletion": true})
        );
        assert_eq!(pod["spec"]["containers"][0]["name"], "echo");
    }

    #[test]
    fn zero_replicas_delete_everything() {
        let pods = vec![mk_pod("a", 0, true, Some(1)), mk_pod("b", 1, true, None)];
        let plan = plan_replica_set(&mk_rs(0), &pods, t(10));
        assert_eq!(plan.delete, ["b", "a"]);
    }
}
