//! The lab's workload controllers: what kube-controller-manager does for `apps/v1` on a real
//! cluster, small enough for the lab: Deployments roll out through ReplicaSets
//! ([`deployment`]), ReplicaSets keep their pods ([`replicaset`]), and the children of deleted
//! owners are collected ([`garbage`]). The lab kubelet then runs the pods and probes their
//! readiness, which is what a rolling update waits for.
//!
//! Decisions are pure over [`facts`]; [`Workloads::run`] watches Deployments, ReplicaSets and
//! Pods, and writes what the decisions say. Writes the watch has not shown yet are remembered
//! (upstream's "expectations"), so a lagging cache never makes a ReplicaSet create its pods
//! twice.

pub mod deployment;
pub mod facts;
pub mod garbage;
pub mod replicaset;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Client;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use facts::{DeploymentFacts, PodFacts, ReplicaSetFacts};

const FIELD_MANAGER: &str = "berth-lab-workloads";

#[derive(Debug, thiserror::Error)]
pub enum WorkloadsError {
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: {source}")]
    Object {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the {0} watch ended")]
    WatchEnded(&'static str),
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> WorkloadsError {
    let what = what.into();
    move |source| WorkloadsError::Api { what, source }
}

#[cfg(test)]
mod tests {
    use super::status_differs;
    use serde_json::json;

    #[test]
    fn a_status_is_written_only_when_it_changes() {
        let stored = json!({"replicas": 2, "readyReplicas": 2, "observedGeneration": 1,
            "terminatingReplicas": 1});
        let same = json!({"replicas": 2, "readyReplicas": 2, "availableReplicas": 0,
            "observedGeneration": 1, "terminatingReplicas": 1});
        assert!(
            !status_differs(&same, &stored),
            "a zero count left out is zero"
        );
        let more = json!({"replicas": 3, "readyReplicas": 2, "observedGeneration": 1,
            "terminatingReplicas": 1});
        assert!(status_differs(&more, &stored));
        let done = json!({"replicas": 2, "readyReplicas": 2, "observedGeneration": 1});
        assert!(
            status_differs(&done, &stored),
            "terminatingReplicas must go away"
        );
        assert!(status_differs(&done, &serde_json::Value::Null));
    }
}

#[derive(Debug, Clone)]
pub struct WorkloadsConfig {
    /// Time between rounds without a watch event (readiness ages into availability).
    pub resync: Duration,
    /// How long a write may stay unseen in the watch before it is no longer waited for.
    pub expectation_timeout: Duration,
}

impl Default for WorkloadsConfig {
    fn default() -> Self {
        WorkloadsConfig {
            resync: Duration::from_millis(500),
            expectation_timeout: Duration::from_secs(10),
        }
    }
}

/// Writes made for one owner that the watch has not shown yet.
#[derive(Debug, Clone)]
struct Expected {
    present: BTreeSet<String>,
    gone: BTreeSet<String>,
    /// ReplicaSet name -> the size written.
    sized: BTreeMap<String, i32>,
    until: Instant,
}

impl Expected {
    fn new(timeout: Duration) -> Self {
        Expected {
            present: BTreeSet::new(),
            gone: BTreeSet::new(),
            sized: BTreeMap::new(),
            until: Instant::now() + timeout,
        }
    }
}

pub struct Workloads {
    client: Client,
    config: WorkloadsConfig,
    /// By ReplicaSet uid: pods created and deleted.
    pod_writes: BTreeMap<String, Expected>,
    /// By Deployment uid: ReplicaSets created, resized and deleted.
    rs_writes: BTreeMap<String, Expected>,
}

impl Workloads {
    pub fn new(client: Client, config: WorkloadsConfig) -> Self {
        Workloads {
            client,
            config,
            pod_writes: BTreeMap::new(),
            rs_writes: BTreeMap::new(),
        }
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), WorkloadsError> {
        let (deployments, d_writer) = reflector::store::<Deployment>();
        let (replica_sets, rs_writer) = reflector::store::<ReplicaSet>();
        let (pods, pod_writer) = reflector::store::<Pod>();
        let cfg = watcher::Config::default;
        let mut d_events = reflector(d_writer, watcher(Api::all(self.client.clone()), cfg()))
            .default_backoff()
            .boxed();
        let mut rs_events = reflector(rs_writer, watcher(Api::all(self.client.clone()), cfg()))
            .default_backoff()
            .boxed();
        let mut pod_events = reflector(pod_writer, watcher(Api::all(self.client.clone()), cfg()))
            .default_backoff()
            .boxed();
        let mut listed = [false; 3];
        let mut tick = tokio::time::interval(self.config.resync);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                e = d_events.next() => note(e, &mut listed[0], "deployment")?,
                e = rs_events.next() => note(e, &mut listed[1], "replicaset")?,
                e = pod_events.next() => note(e, &mut listed[2], "pod")?,
                _ = tick.tick() => {}
            }
            if listed.iter().all(|l| *l) {
                self.round(&deployments, &replica_sets, &pods).await;
            }
        }
    }

    async fn round(
        &mut self,
        deployments: &Store<Deployment>,
        replica_sets: &Store<ReplicaSet>,
        pods: &Store<Pod>,
    ) {
        let now = chrono::Utc::now();
        let ds: Vec<DeploymentFacts> = deployments
            .state()
            .iter()
            .filter(|d| d.metadata.deletion_timestamp.is_none())
            .filter_map(|d| facts::deployment_facts(d))
            .collect();
        let rss: Vec<ReplicaSetFacts> = replica_sets
            .state()
            .iter()
            .filter_map(|rs| facts::replica_set_facts(rs))
            .collect();
        let pod_facts: Vec<PodFacts> = pods
            .state()
            .iter()
            .filter_map(|p| facts::pod_facts(p))
            .collect();
        let uids: BTreeSet<String> = ds.iter().map(|d| d.uid.clone()).collect();
        let orphans = garbage::plan_garbage(&uids, &rss, &pod_facts);
        for (ns, name) in &orphans.replica_sets {
            self.delete::<ReplicaSet>(ns, name).await;
        }
        for (ns, name) in &orphans.pods {
            self.delete::<Pod>(ns, name).await;
        }
        for d in &ds {
            if let Err(err) = self.deployment(d, &rss, now).await {
                tracing::warn!(namespace = %d.namespace, name = %d.name, error = %err, "deployment");
            }
        }
        for rs in &rss {
            if let Err(err) = self.replica_set(rs, &pod_facts, now).await {
                tracing::warn!(namespace = %rs.namespace, name = %rs.name, error = %err, "replicaset");
            }
        }
        self.forget_stale(&uids, &rss);
    }

    /// Drops expectations of owners that no longer exist.
    fn forget_stale(&mut self, deployments: &BTreeSet<String>, rss: &[ReplicaSetFacts]) {
        let rs_uids: BTreeSet<&str> = rss.iter().map(|rs| rs.uid.as_str()).collect();
        self.rs_writes.retain(|uid, _| deployments.contains(uid));
        self.pod_writes
            .retain(|uid, _| rs_uids.contains(uid.as_str()));
    }

    async fn deployment(
        &mut self,
        d: &DeploymentFacts,
        rss: &[ReplicaSetFacts],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), WorkloadsError> {
        let owned = deployment::owned_replica_sets(d, rss);
        if let Some(expected) = self.rs_writes.get(&d.uid) {
            let seen = expected
                .present
                .iter()
                .all(|n| owned.iter().any(|rs| &rs.name == n))
                && expected
                    .gone
                    .iter()
                    .all(|n| owned.iter().all(|rs| &rs.name != n))
                && expected
                    .sized
                    .iter()
                    .all(|(n, size)| owned.iter().any(|rs| &rs.name == n && rs.replicas == *size));
            if !seen && Instant::now() < expected.until {
                return Ok(());
            }
            self.rs_writes.remove(&d.uid);
        }
        let plan = deployment::plan_deployment(d, &owned, now);
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &d.namespace);
        let mut expected = Expected::new(self.config.expectation_timeout);
        if let Some(obj) = plan.create {
            let name = obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let rs: ReplicaSet = from_json(obj, "the new ReplicaSet")?;
            match api.create(&post_params(), &rs).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(e) => return Err(api_err(format!("creating ReplicaSet {name}"))(e)),
            }
            tracing::info!(namespace = %d.namespace, deployment = %d.name, replicaset = %name, "created ReplicaSet");
            expected.present.insert(name);
        }
        for s in &plan.scale {
            let patch = json!({"metadata": {"annotations": s.annotations}, "spec": {"replicas": s.replicas}});
            api.patch(&s.name, &patch_params(), &Patch::Merge(&patch))
                .await
                .map_err(api_err(format!("scaling ReplicaSet {}", s.name)))?;
            tracing::info!(namespace = %d.namespace, deployment = %d.name, replicaset = %s.name, replicas = s.replicas, "scaled ReplicaSet");
            expected.sized.insert(s.name.clone(), s.replicas);
        }
        for name in &plan.delete {
            self.delete::<ReplicaSet>(&d.namespace, name).await;
            expected.gone.insert(name.clone());
        }
        if !(expected.present.is_empty() && expected.sized.is_empty() && expected.gone.is_empty()) {
            self.rs_writes.insert(d.uid.clone(), expected);
        }
        let d_api: Api<Deployment> = Api::namespaced(self.client.clone(), &d.namespace);
        if let Some(revision) = &plan.revision {
            let patch = json!({"metadata": {"annotations": {facts::REVISION: revision}}});
            d_api
                .patch(&d.name, &patch_params(), &Patch::Merge(&patch))
                .await
                .map_err(api_err(format!("annotating Deployment {}", d.name)))?;
        }
        if status_differs(&plan.status, &d.observed) {
            d_api
                .patch_status(
                    &d.name,
                    &patch_params(),
                    &Patch::Merge(&json!({"status": plan.status})),
                )
                .await
                .map_err(api_err(format!(
                    "writing the status of Deployment {}",
                    d.name
                )))?;
        }
        Ok(())
    }

    async fn replica_set(
        &mut self,
        rs: &ReplicaSetFacts,
        pods: &[PodFacts],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), WorkloadsError> {
        if let Some(expected) = self.pod_writes.get(&rs.uid) {
            let owned = replicaset::owned_pods(rs, pods);
            let seen = expected
                .present
                .iter()
                .all(|n| owned.iter().any(|p| &p.name == n))
                && expected
                    .gone
                    .iter()
                    .all(|n| owned.iter().all(|p| &p.name != n || p.terminating));
            if !seen && Instant::now() < expected.until {
                return Ok(());
            }
            self.pod_writes.remove(&rs.uid);
        }
        let plan = replicaset::plan_replica_set(rs, pods, now);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &rs.namespace);
        let mut expected = Expected::new(self.config.expectation_timeout);
        for _ in 0..plan.create {
            let pod: Pod = from_json(replicaset::build_pod(rs), "a pod from the template")?;
            let created = api
                .create(&post_params(), &pod)
                .await
                .map_err(api_err(format!("creating a pod of ReplicaSet {}", rs.name)))?;
            if let Some(name) = created.metadata.name {
                expected.present.insert(name);
            }
        }
        for name in &plan.delete {
            self.delete::<Pod>(&rs.namespace, name).await;
            expected.gone.insert(name.clone());
        }
        if !(expected.present.is_empty() && expected.gone.is_empty()) {
            self.pod_writes.insert(rs.uid.clone(), expected);
        }
        if status_differs(&plan.status, &rs.observed) {
            let rs_api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &rs.namespace);
            let mut status = plan.status.clone();
            // A count that went back to zero is removed, not left behind.
            if status.get("terminatingReplicas").is_none() {
                status["terminatingReplicas"] = Value::Null;
            }
            rs_api
                .patch_status(
                    &rs.name,
                    &patch_params(),
                    &Patch::Merge(&json!({"status": status})),
                )
                .await
                .map_err(api_err(format!(
                    "writing the status of ReplicaSet {}",
                    rs.name
                )))?;
        }
        Ok(())
    }

    async fn delete<K>(&self, ns: &str, name: &str)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => tracing::warn!(namespace = %ns, name = %name, error = %err, "delete"),
        }
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

fn note<T>(
    event: Option<Result<watcher::Event<T>, watcher::Error>>,
    listed: &mut bool,
    what: &'static str,
) -> Result<(), WorkloadsError> {
    match event {
        Some(Ok(watcher::Event::InitDone)) => *listed = true,
        Some(Ok(_)) => {}
        Some(Err(err)) => tracing::warn!(error = %err, "{what} watch"),
        None => return Err(WorkloadsError::WatchEnded(what)),
    }
    Ok(())
}

fn from_json<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> Result<T, WorkloadsError> {
    serde_json::from_value(v).map_err(|source| WorkloadsError::Object {
        what: what.to_owned(),
        source,
    })
}

/// Whether writing `planned` would change what `current` says: each planned field against the
/// stored one, a missing count being zero, and a stored `terminatingReplicas` the plan drops.
pub fn status_differs(planned: &Value, current: &Value) -> bool {
    let Some(planned) = planned.as_object() else {
        return false;
    };
    let dropped = current
        .get("terminatingReplicas")
        .is_some_and(|t| t != &json!(0) && !planned.contains_key("terminatingReplicas"));
    dropped
        || planned.iter().any(|(k, v)| match current.get(k) {
            Some(c) => c != v,
            None => !(v == &json!(0) || v.is_null()),
        })
}
