//! The lab's garbage collector for workloads (pure): ReplicaSets whose controlling Deployment
//! is gone and Pods whose controlling ReplicaSet is gone are deleted, as the cluster's garbage
//! collector does after `kubectl delete deployment` (background propagation). Objects of other
//! owners and owner kinds are left alone.

use std::collections::BTreeSet;

use super::facts::{PodFacts, ReplicaSetFacts};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Orphans {
    /// (namespace, name)
    pub replica_sets: Vec<(String, String)>,
    pub pods: Vec<(String, String)>,
}

pub fn plan_garbage(
    deployment_uids: &BTreeSet<String>,
    replica_sets: &[ReplicaSetFacts],
    pods: &[PodFacts],
) -> Orphans {
    let rs_uids: BTreeSet<&str> = replica_sets.iter().map(|rs| rs.uid.as_str()).collect();
    Orphans {
        replica_sets: replica_sets
            .iter()
            .filter(|rs| {
                rs.owner.as_ref().is_some_and(|(uid, kind)| {
                    kind == "Deployment" && !deployment_uids.contains(uid)
                })
            })
            .map(|rs| (rs.namespace.clone(), rs.name.clone()))
            .collect(),
        pods: pods
            .iter()
            .filter(|p| !p.terminating)
            .filter(|p| {
                p.owner.as_ref().is_some_and(|(uid, kind)| {
                    kind == "ReplicaSet" && !rs_uids.contains(uid.as_str())
                })
            })
            .map(|p| (p.namespace.clone(), p.name.clone()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::facts::Counts;
    use serde_json::Value;
    use std::collections::BTreeMap;

    fn mk_rs(name: &str, uid: &str, owner: Option<(&str, &str)>) -> ReplicaSetFacts {
        ReplicaSetFacts {
            name: name.into(),
            namespace: "default".into(),
            uid: uid.into(),
            owner: owner.map(|(u, k)| (u.into(), k.into())),
            created: None,
            generation: 1,
            replicas: 1,
            min_ready_seconds: 0,
            template: Value::Null,
            selector: Value::Null,
            revision: 1,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            status: Counts::default(),
            observed: Value::Null,
        }
    }

    fn mk_pod(name: &str, owner: Option<(&str, &str)>, terminating: bool) -> PodFacts {
        PodFacts {
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
            owner: owner.map(|(u, k)| (u.into(), k.into())),
            created: None,
            node: None,
            ready_since: None,
            terminating,
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn children_of_deleted_owners_are_collected() {
        let deployments = BTreeSet::from(["d-live".to_owned()]);
        let rss = vec![
            mk_rs("live", "rs-live", Some(("d-live", "Deployment"))),
            mk_rs("orphan", "rs-orphan", Some(("d-gone", "Deployment"))),
            mk_rs("standalone", "rs-alone", None),
            mk_rs("other-kind", "rs-other", Some(("x", "Rollout"))),
        ];
        let pods = vec![
            mk_pod("kept", Some(("rs-live", "ReplicaSet")), false),
            mk_pod("orphan", Some(("rs-gone", "ReplicaSet")), false),
            mk_pod("already-going", Some(("rs-gone", "ReplicaSet")), true),
            mk_pod("bare", None, false),
            mk_pod("job", Some(("j", "Job")), false),
        ];
        let orphans = plan_garbage(&deployments, &rss, &pods);
        let d = |n: &str| ("default".to_owned(), n.to_owned());
        assert_eq!(orphans.replica_sets, [d("orphan")]);
        assert_eq!(orphans.pods, [d("orphan")]);
    }
}
