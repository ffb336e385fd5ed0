//! Rollouts replayed round by round: the Deployment and ReplicaSet planners act on a little
//! in-memory cluster whose pods turn Ready one round after they are created (or never, for a
//! broken template), and every round is checked against upstream's promises: never more than
//! `replicas + maxSurge` pods, never fewer than `replicas - maxUnavailable` available.

use super::*;
use crate::workloads::facts::PodFacts;
use crate::workloads::replicaset::{build_pod, owned_pods, plan_replica_set};

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
}

fn mk_template(image: &str) -> Value {
    json!({"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "echo", "image": image}]}})
}

fn mk_deployment(replicas: i32, strategy: Strategy) -> DeploymentFacts {
    DeploymentFacts {
        name: "web".into(),
        namespace: "default".into(),
        uid: "d-1".into(),
        generation: 1,
        replicas,
        selector: json!({"matchLabels": {"app": "web"}}),
        template: mk_template("v1"),
        strategy,
        min_ready_seconds: 0,
        revision_history_limit: 10,
        paused: false,
        progress_deadline_seconds: 600,
        annotations: BTreeMap::new(),
        status: Counts::default(),
        conditions: Vec::new(),
        observed: Value::Null,
    }
}

fn rolling(surge: i32, unavailable: i32) -> Strategy {
    Strategy::RollingUpdate {
        max_surge: IntOrString::Int(surge),
        max_unavailable: IntOrString::Int(unavailable),
    }
}

/// The little cluster: ReplicaSets and pods as facts, a clock, and which images never get Ready.
struct Cluster {
    d: DeploymentFacts,
    rss: Vec<ReplicaSetFacts>,
    pods: Vec<PodFacts>,
    now: i64,
    next: usize,
    broken_image: Option<&'static str>,
}

impl Cluster {
    fn new(d: DeploymentFacts) -> Self {
        Cluster {
            d,
            rss: Vec::new(),
            pods: Vec::new(),
            now: 0,
            next: 0,
            broken_image: None,
        }
    }

    fn owned(&self) -> Vec<&ReplicaSetFacts> {
        owned_replica_sets(&self.d, &self.rss)
    }

    /// One round of both controllers; pods created in earlier rounds turn Ready.
    fn round(&mut self) -> DeploymentPlan {
        self.now += 1;
        let now = t(self.now);
        for pod in &mut self.pods {
            let image = self
                .rss
                .iter()
                .find(|rs| Some(&rs.uid) == pod.owner.as_ref().map(|(u, _)| u))
                .map(|rs| rs.template["spec"]["containers"][0]["image"].clone());
            let broken = image.is_some_and(|i| Some(i.as_str().unwrap_or("")) == self.broken_image);
            if pod.ready_since.is_none() && !broken && pod.created < Some(now) {
                pod.ready_since = Some(now);
            }
        }
        // Deleted pods are gone by the next round (the kubelet stops them).
        self.pods.retain(|p| !p.terminating);
        for rs in &mut self.rss {
            let plan = plan_replica_set(rs, &self.pods, now);
            rs.status = Counts {
                replicas: plan.status["replicas"].as_i64().unwrap() as i32,
                ready: plan.status["readyReplicas"].as_i64().unwrap() as i32,
                available: plan.status["availableReplicas"].as_i64().unwrap() as i32,
                observed_generation: rs.generation,
            };
            for name in &plan.delete {
                if let Some(p) = self.pods.iter_mut().find(|p| &p.name == name) {
                    p.terminating = true;
                }
            }
            for _ in 0..plan.create {
                let pod = build_pod(rs);
                self.next += 1;
                self.pods.push(PodFacts {
                    name: format!(
                        "{}{}",
                        pod["metadata"]["generateName"].as_str().unwrap(),
                        self.next
                    ),
                    namespace: rs.namespace.clone(),
                    uid: format!("pod-{}", self.next),
                    owner: Some((rs.uid.clone(), "ReplicaSet".into())),
                    created: Some(now),
                    node: Some("node1".into()),
                    ready_since: None,
                    terminating: false,
                    labels: BTreeMap::new(),
                });
            }
        }
        let owned: Vec<ReplicaSetFacts> = self.owned().into_iter().cloned().collect();
        let refs: Vec<&ReplicaSetFacts> = owned.iter().collect();
        let plan = plan_deployment(&self.d, &refs, now);
        if let Some(obj) = &plan.create {
            self.next += 1;
            self.rss.push(ReplicaSetFacts {
                name: obj["metadata"]["name"].as_str().unwrap().into(),
                namespace: "default".into(),
                uid: format!("rs-{}", self.next),
                owner: Some((self.d.uid.clone(), "Deployment".into())),
                created: Some(now),
                generation: 1,
                replicas: obj["spec"]["replicas"].as_i64().unwrap() as i32,
                min_ready_seconds: 0,
                template: obj["spec"]["template"].clone(),
                selector: obj["spec"]["selector"].clone(),
                revision: obj["metadata"]["annotations"][REVISION]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap(),
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
                status: Counts::default(),
                observed: Value::Null,
            });
        }
        for s in &plan.scale {
            let rs = self.rss.iter_mut().find(|rs| rs.name == s.name).unwrap();
            rs.replicas = s.replicas;
            if let Some(r) = s.annotations.get(REVISION) {
                rs.revision = r.parse().unwrap();
            }
        }
        self.rss.retain(|rs| !plan.delete.contains(&rs.name));
        if let Some(r) = &plan.revision {
            self.d.annotations.insert(REVISION.into(), r.clone());
        }
        self.d.status = Counts {
            replicas: plan.status["replicas"].as_i64().unwrap() as i32,
            ready: plan.status["readyReplicas"].as_i64().unwrap() as i32,
            available: plan.status["availableReplicas"].as_i64().unwrap() as i32,
            observed_generation: self.d.generation,
        };
        plan
    }

    fn live_pods(&self) -> usize {
        self.pods.iter().filter(|p| !p.terminating).count()
    }

    fn available(&self) -> usize {
        self.pods
            .iter()
            .filter(|p| !p.terminating && p.ready_since.is_some())
            .count()
    }

    /// Rounds until the rollout is complete (at most `limit`), checking the bounds each round.
    fn roll(&mut self, limit: usize, surge: i32, unavailable: i32) -> usize {
        let replicas = self.d.replicas;
        for n in 1..=limit {
            let plan = self.round();
            assert!(
                self.live_pods() as i32 <= replicas + surge,
                "round {n}: {} pods > {replicas} + {surge}",
                self.live_pods()
            );
            assert!(
                self.available() as i32 >= replicas - unavailable,
                "round {n}: {} available < {replicas} - {unavailable}: {:?}",
                self.available(),
                self.sizes()
            );
            if plan.status["conditions"][1]["reason"] == "NewReplicaSetAvailable" {
                return n;
            }
        }
        panic!("no complete rollout within {limit} rounds: {:?}", self.rss);
    }

    fn sizes(&self) -> Vec<(i64, i32)> {
        let mut v: Vec<(i64, i32)> = self
            .rss
            .iter()
            .map(|rs| (rs.revision, rs.replicas))
            .collect();
        v.sort();
        v
    }
}

/// A Deployment already rolled out at revision 1 with 3 ready pods.
fn settled(strategy: Strategy) -> Cluster {
    let mut c = Cluster::new(mk_deployment(3, strategy));
    // Creation is allowed to make every pod at once: nothing is available yet anyway.
    for _ in 0..10 {
        c.round();
    }
    assert_eq!(c.sizes(), [(1, 3)]);
    assert_eq!(c.available(), 3);
    c
}

#[test]
fn a_new_deployment_gets_a_replica_set_with_the_template_hash() {
    let d = mk_deployment(3, rolling(1, 0));
    let plan = plan_deployment(&d, &[], t(0));
    let rs = plan.create.unwrap();
    let hash = template_hash(&d.template);
    assert_eq!(rs["metadata"]["name"], format!("web-{hash}"));
    assert_eq!(rs["spec"]["replicas"], 3);
    assert_eq!(
        rs["spec"]["selector"]["matchLabels"],
        json!({"app": "web", "pod-template-hash": hash})
    );
    assert_eq!(
        rs["spec"]["template"]["metadata"]["labels"]["pod-template-hash"],
        json!(hash)
    );
    assert_eq!(rs["metadata"]["annotations"][REVISION], "1");
    assert_eq!(rs["metadata"]["ownerReferences"][0]["uid"], "d-1");
    assert_eq!(plan.revision.as_deref(), Some("1"));
    assert!(
        hash.bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
        "{hash}"
    );
}

#[test]
fn surge_and_unavailable_follow_upstream_rounding() {
    let pct = |s: &str| IntOrString::String(s.into());
    let strategy = |a, b| Strategy::RollingUpdate {
        max_surge: a,
        max_unavailable: b,
    };
    // 25% of 3: surge rounds up to 1, unavailable down to 0.
    assert_eq!(
        surge_and_unavailable(&strategy(pct("25%"), pct("25%")), 3),
        (1, 0)
    );
    assert_eq!(
        surge_and_unavailable(&strategy(pct("25%"), pct("25%")), 10),
        (3, 2)
    );
    assert_eq!(
        surge_and_unavailable(&strategy(IntOrString::Int(0), IntOrString::Int(0)), 3),
        (0, 1)
    );
    assert_eq!(
        surge_and_unavailable(&strategy(IntOrString::Int(0), IntOrString::Int(5)), 3),
        (0, 3)
    );
    assert_eq!(surge_and_unavailable(&Strategy::Recreate, 4), (0, 4));
}

#[test]
fn rolling_update_with_surge_never_drops_below_replicas() {
    let mut c = settled(rolling(1, 0));
    c.d.template = mk_template("v2");
    c.d.generation = 2;
    let rounds = c.roll(40, 1, 0);
    assert_eq!(c.sizes(), [(1, 0), (2, 3)]);
    assert!(
        rounds >= 3,
        "one pod at a time takes several rounds, took {rounds}"
    );
    assert_eq!(c.d.annotations[REVISION], "2");
}

#[test]
fn rolling_update_without_surge_replaces_one_at_a_time() {
    let mut c = settled(rolling(0, 1));
    c.d.template = mk_template("v2");
    c.roll(40, 0, 1);
    assert_eq!(c.sizes(), [(1, 0), (2, 3)]);
}

#[test]
fn default_percentages_roll_three_replicas() {
    let quarter = || IntOrString::String("25%".into());
    let mut c = settled(Strategy::RollingUpdate {
        max_surge: quarter(),
        max_unavailable: quarter(),
    });
    c.d.template = mk_template("v2");
    c.roll(40, 1, 0);
    assert_eq!(c.sizes(), [(1, 0), (2, 3)]);
}

#[test]
fn a_template_that_never_gets_ready_stops_the_rollout_with_old_pods_serving() {
    let mut c = settled(rolling(1, 0));
    c.broken_image = Some("v2");
    c.d.template = mk_template("v2");
    for _ in 0..20 {
        c.round();
        assert!(c.available() >= 3, "old pods keep serving");
    }
    assert_eq!(c.sizes(), [(1, 3), (2, 1)], "one surge pod, nothing more");
}

#[test]
fn recreate_stops_every_old_pod_before_starting_new_ones() {
    let mut c = settled(Strategy::Recreate);
    c.d.template = mk_template("v2");
    let mut saw_gap = false;
    for _ in 0..20 {
        c.round();
        let first = c.rss[0].uid.clone();
        let owned_by = |p: &PodFacts| p.owner.as_ref().unwrap().0.clone();
        let old = c
            .pods
            .iter()
            .filter(|p| owned_by(p) == first && !p.terminating)
            .count();
        let new = c.pods.iter().filter(|p| owned_by(p) != first).count();
        assert!(old == 0 || new == 0, "old and new pods at once");
        saw_gap |= old == 0 && new == 0;
    }
    assert!(saw_gap);
    assert_eq!(c.sizes(), [(1, 0), (2, 3)]);
}

#[test]
fn undo_reuses_the_old_replica_set_and_bumps_its_revision() {
    let mut c = settled(rolling(1, 0));
    c.d.template = mk_template("v2");
    c.roll(40, 1, 0);
    // `kubectl rollout undo` writes revision 1's template back.
    c.d.template = mk_template("v1");
    c.roll(40, 1, 0);
    assert_eq!(c.rss.len(), 2, "no third ReplicaSet");
    assert_eq!(c.sizes(), [(2, 0), (3, 3)]);
    assert_eq!(c.d.annotations[REVISION], "3");
}

#[test]
fn scaling_without_a_template_change_resizes_the_one_replica_set() {
    let mut c = settled(rolling(1, 0));
    c.d.replicas = 5;
    c.round();
    assert_eq!(c.sizes(), [(1, 5)]);
    c.d.replicas = 1;
    c.round();
    assert_eq!(c.sizes(), [(1, 1)]);
}

#[test]
fn old_replica_sets_beyond_the_history_limit_are_deleted() {
    let mut c = settled(rolling(1, 0));
    c.d.revision_history_limit = 1;
    for image in ["v2", "v3", "v4"] {
        c.d.template = mk_template(image);
        c.roll(40, 1, 0);
        c.round();
    }
    assert_eq!(c.sizes(), [(3, 0), (4, 3)]);
}

#[test]
fn status_is_what_rollout_status_waits_for() {
    let mut c = settled(rolling(1, 0));
    let plan = c.round();
    assert_eq!(plan.status["observedGeneration"], 1);
    assert_eq!(
        (
            &plan.status["replicas"],
            &plan.status["updatedReplicas"],
            &plan.status["availableReplicas"]
        ),
        (&json!(3), &json!(3), &json!(3))
    );
    assert_eq!(plan.status["conditions"][0]["type"], "Available");
    assert_eq!(plan.status["conditions"][0]["status"], "True");
    assert_eq!(
        plan.status["conditions"][1]["reason"],
        "NewReplicaSetAvailable"
    );
    c.d.template = mk_template("v2");
    c.d.generation = 2;
    let plan = c.round();
    assert_eq!(plan.status["conditions"][1]["reason"], "ReplicaSetUpdated");
}

#[test]
fn condition_times_move_only_on_change() {
    let mut c = settled(rolling(1, 0));
    let first = c.round().status;
    c.d.conditions = first["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| Condition {
            type_: v["type"].as_str().unwrap().into(),
            status: v["status"].as_str().unwrap().into(),
            reason: v["reason"].as_str().unwrap().into(),
            message: v["message"].as_str().unwrap().into(),
            last_update: v["lastUpdateTime"].as_str().map(Into::into),
            last_transition: v["lastTransitionTime"].as_str().map(Into::into),
        })
        .collect();
    c.now += 100;
    let later = c.round().status;
    assert_eq!(
        first["conditions"], later["conditions"],
        "a steady state writes nothing new"
    );
}

#[test]
fn a_stalled_rollout_exceeds_its_deadline() {
    let mut c = settled(rolling(1, 0));
    c.broken_image = Some("v2");
    c.d.template = mk_template("v2");
    c.d.progress_deadline_seconds = 5;
    c.d.conditions = vec![Condition {
        type_: "Progressing".into(),
        status: "True".into(),
        reason: "ReplicaSetUpdated".into(),
        message: String::new(),
        last_update: Some(crate::workloads::facts::stamp(t(0))),
        last_transition: None,
    }];
    let plan = c.round();
    assert_eq!(
        plan.status["conditions"][1]["reason"],
        "ProgressDeadlineExceeded"
    );
    assert_eq!(plan.status["conditions"][1]["status"], "False");
}

#[test]
fn a_paused_deployment_is_left_as_it_is() {
    let mut c = settled(rolling(1, 0));
    c.d.paused = true;
    c.d.template = mk_template("v2");
    let plan = c.round();
    assert!(plan.create.is_none() && plan.scale.is_empty());
    assert_eq!(plan.status["conditions"][1]["reason"], "DeploymentPaused");
}

#[test]
fn pods_of_other_owners_are_not_counted() {
    let c = settled(rolling(1, 0));
    let rs = &c.rss[0];
    assert_eq!(owned_pods(rs, &c.pods).len(), 3);
    let mut other = mk_deployment(1, rolling(1, 0));
    other.uid = "d-2".into();
    assert!(owned_replica_sets(&other, &c.rss).is_empty());
}
