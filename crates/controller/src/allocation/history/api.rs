//! The API server of the histories: Services, IPPools and Namespaces with resourceVersions, a
//! log of the watch events they caused, and the writes of a job sent as `run_job` sends them.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

use berth_api::IPPool;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::runtime::watcher::Event;
use serde_json::{json, Value};

use super::Fault;
use crate::allocation::fresh::Holding;
use crate::allocation::write::{build_status_patch, JobOutcome, Write, WriteJob, WrittenSpec};
use crate::error::ErrorCategory;
use crate::load_balancer::build_l2_ingress;

/// One watch event, of any kind the leader follows.
#[derive(Clone)]
pub(super) enum Logged {
    Service(Event<Arc<Service>>),
    Pool(Event<IPPool>),
    Namespace(Event<Namespace>),
}

#[derive(Default)]
pub(super) struct Api {
    services: BTreeMap<String, Value>,
    pools: BTreeMap<String, Value>,
    namespaces: BTreeMap<String, Value>,
    version: u64,
    pub(super) log: Vec<Logged>,
    pub(super) faults: VecDeque<Fault>,
    pub(super) provider_delete_fails: bool,
    /// The last Warning Event (reason, message) each Service's writes carried.
    pub(super) warnings: BTreeMap<String, (&'static str, String)>,
}

/// An RFC 7386 merge patch: `null` removes a field, objects merge, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in fields {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn service(v: &Value) -> Service {
    serde_json::from_value(v.clone()).expect("a Service")
}

impl Api {
    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    pub(super) fn list(&self) -> (Vec<Service>, Vec<IPPool>, Vec<Namespace>) {
        (
            self.services.values().map(service).collect(),
            self.pools
                .values()
                .map(|v| serde_json::from_value(v.clone()).expect("an IPPool"))
                .collect(),
            self.namespaces
                .values()
                .map(|v| serde_json::from_value(v.clone()).expect("a Namespace"))
                .collect(),
        )
    }

    fn log_service(&mut self, name: &str) {
        let svc = service(&self.services[name]);
        self.log.push(Logged::Service(Event::Apply(Arc::new(svc))));
    }

    pub(super) fn create(&mut self, name: &str, object: Value) {
        assert!(!self.services.contains_key(name), "{name} exists");
        let mut v = object;
        let version = self.next_version();
        // Creation order is adoption order: one second apart.
        let created = format!(
            "2026-01-01T00:{:02}:{:02}Z",
            self.version / 60,
            self.version % 60
        );
        merge(
            &mut v,
            &json!({"metadata": {"name": name, "namespace": "default",
                "uid": format!("uid-{name}-{version}"), "resourceVersion": version,
                "creationTimestamp": created, "generation": 1}}),
        );
        self.services.insert(name.to_string(), v);
        self.log_service(name);
    }

    /// As the API server deletes: with finalizers the object only gains a
    /// `deletionTimestamp`, and goes when a write removes the last one.
    pub(super) fn delete(&mut self, name: &str) {
        let version = self.next_version();
        let v = self.services.get_mut(name).expect("a Service to delete");
        if v.pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
        {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T01:00:00Z");
            v["metadata"]["resourceVersion"] = json!(version);
            self.log_service(name);
            return;
        }
        self.remove(name);
    }

    pub(super) fn remove(&mut self, name: &str) {
        let v = self.services.remove(name).expect("a Service to delete");
        self.log
            .push(Logged::Service(Event::Delete(Arc::new(service(&v)))));
    }

    pub(super) fn exists(&self, name: &str) -> bool {
        self.services.contains_key(name)
    }

    pub(super) fn finalizers(&self, name: &str) -> Vec<String> {
        self.get(name)
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn recreate(&mut self, name: &str, object: Value) {
        self.services.remove(name).expect("a Service to delete");
        self.create(name, object);
    }

    /// A merge patch of the object (`status: false`: its spec and metadata) or of its status.
    pub(super) fn patch(&mut self, name: &str, patch: &Value, status: bool) {
        let version = self.next_version();
        let v = self.services.get_mut(name).expect("a Service to patch");
        let part = if status { "status" } else { "spec" };
        if let Some(p) = patch.get(part) {
            merge(v.get_mut(part).unwrap_or(&mut Value::Null), p);
            if v.get(part).is_none() {
                v[part] = p.clone();
            }
        }
        if !status {
            for field in ["labels", "annotations"] {
                if let Some(map) = patch.pointer(&format!("/metadata/{field}")) {
                    merge(&mut v["metadata"][field], map);
                }
            }
            if let Some(finalizers) = patch.pointer("/metadata/finalizers") {
                v["metadata"]["finalizers"] = finalizers.clone();
            }
        }
        v["metadata"]["resourceVersion"] = json!(version);
        self.log_service(name);
    }

    pub(super) fn put_pool(&mut self, name: &str, spec: Value) {
        let version = self.next_version();
        let pool = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": name, "resourceVersion": version}, "spec": spec});
        self.pools.insert(name.to_string(), pool.clone());
        let pool = serde_json::from_value(pool).expect("an IPPool");
        self.log.push(Logged::Pool(Event::Apply(pool)));
    }

    pub(super) fn delete_pool(&mut self, name: &str) {
        let pool = self.pools.remove(name).expect("a pool to delete");
        let pool = serde_json::from_value(pool).expect("an IPPool");
        self.log.push(Logged::Pool(Event::Delete(pool)));
    }

    pub(super) fn put_namespace(&mut self, name: &str, labels: Value) {
        let version = self.next_version();
        let ns = json!({"metadata": {"name": name, "labels": labels, "resourceVersion": version}});
        self.namespaces.insert(name.to_string(), ns.clone());
        let ns = serde_json::from_value(ns).expect("a Namespace");
        self.log.push(Logged::Namespace(Event::Apply(ns)));
    }

    /// A write carrying `version` (a merge patch with `metadata.resourceVersion`) of `part`;
    /// the object as written, or how it failed.
    fn write(
        &mut self,
        name: &str,
        part: &str,
        patch: &Value,
        which: Write,
    ) -> Result<Value, JobOutcome> {
        match self.faults.pop_front() {
            Some(Fault::Server) => {
                return Err(JobOutcome::Retry {
                    category: ErrorCategory::Server,
                });
            }
            Some(Fault::NotLeading) => return Err(JobOutcome::NotLeading),
            Some(Fault::Conflict) => return Err(JobOutcome::Rejected { write: which }),
            Some(Fault::Pass) | None => {}
        }
        let Some(current) = self.services.get(name) else {
            return Err(JobOutcome::Gone);
        };
        let carried = patch.pointer("/metadata/resourceVersion");
        if carried.is_some_and(|c| {
            !c.is_null() && Some(c) != current.pointer("/metadata/resourceVersion")
        }) {
            return Err(JobOutcome::Rejected { write: which });
        }
        let version = self.next_version();
        let v = self.services.get_mut(name).expect("checked above");
        if v.get(part).is_none() {
            v[part] = json!({});
        }
        if let Some(p) = patch.get(part) {
            merge(&mut v[part], p);
        }
        if let Some(finalizers) = patch.pointer("/metadata/finalizers") {
            v["metadata"]["finalizers"] = finalizers.clone();
        }
        v["metadata"]["resourceVersion"] = json!(version);
        let written = v.clone();
        let done = v.pointer("/metadata/deletionTimestamp").is_some()
            && v.pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
        if done {
            self.remove(name);
        } else {
            self.log_service(name);
        }
        Ok(written)
    }

    /// Sends a job's writes as `run_job` does: the spec, then the provider, then the status
    /// guarded by the version the spec write returned (or the one decided from). Returns the
    /// outcome, the spec write's answer, and how many writes were taken.
    pub(super) fn run_job(&mut self, job: &WriteJob) -> (JobOutcome, Option<WrittenSpec>, usize) {
        let name = job.key.name.clone();
        if let Some((reason, message)) = &job.failure {
            self.warnings
                .insert(name.clone(), (reason, message.clone()));
        }
        let mut written = Vec::new();
        let mut taken = 0;
        let mut spec = None;
        let mut version = job.svc.metadata.resource_version.clone();
        if let Some(patch) = &job.spec_patch {
            match self.write(&name, "spec", patch, Write::Spec) {
                Ok(v) => {
                    taken += 1;
                    version = v["metadata"]["resourceVersion"].as_str().map(str::to_owned);
                    written.extend(version.clone());
                    spec = Some(WrittenSpec {
                        base_version: job.svc.metadata.resource_version.clone(),
                        svc: Arc::new(service(&v)),
                    });
                }
                Err(outcome) => return (outcome, None, taken),
            }
        }
        let mut lb_failed = false;
        let ingress = match &job.ingress {
            Some(ips) if ips.is_empty() => {
                lb_failed = self.provider_delete_fails;
                (!lb_failed).then(Vec::new)
            }
            Some(ips) => Some(build_l2_ingress(ips)),
            None => None,
        };
        if ingress.is_some() || job.conditions.is_some() {
            let patch = build_status_patch(
                version.as_deref(),
                ingress.as_deref(),
                job.conditions.as_deref(),
            );
            match self.write(&name, "status", &patch, Write::Status) {
                Ok(v) => {
                    taken += 1;
                    written.extend(v["metadata"]["resourceVersion"].as_str().map(str::to_owned));
                }
                Err(outcome) => return (outcome, spec, taken),
            }
        }
        let outcome = if lb_failed {
            JobOutcome::Retry {
                category: ErrorCategory::Provider,
            }
        } else {
            JobOutcome::Done { written }
        };
        (outcome, spec, taken)
    }

    fn get(&self, name: &str) -> &Value {
        self.services
            .get(name)
            .unwrap_or_else(|| panic!("no Service {name}"))
    }

    pub(super) fn ingress(&self, name: &str) -> Vec<String> {
        self.get(name)
            .pointer("/status/loadBalancer/ingress")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["ip"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn cluster_ip(&self, name: &str) -> Option<String> {
        self.get(name)
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    pub(super) fn node_ports(&self, name: &str) -> Vec<Option<i32>> {
        self.get(name)
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .map(|ports| {
                ports
                    .iter()
                    .map(|p| p["nodePort"].as_i64().and_then(|n| i32::try_from(n).ok()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn health_check(&self, name: &str) -> Option<i32> {
        self.get(name)
            .pointer("/spec/healthCheckNodePort")
            .and_then(Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
    }

    /// What the Service's object names, as the allocators would hold it.
    pub(super) fn named(&self, name: &str) -> Holding {
        let v = self.get(name);
        let ips = |pointer: &str| -> Vec<IpAddr> {
            v.pointer(pointer)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|s| s.as_str()?.parse().ok()).collect())
                .unwrap_or_default()
        };
        let mut node_ports: Vec<u16> = self
            .node_ports(name)
            .into_iter()
            .flatten()
            .chain(self.health_check(name))
            .filter_map(|p| u16::try_from(p).ok())
            .collect();
        node_ports.sort_unstable();
        node_ports.dedup();
        let mut lb_ips: Vec<IpAddr> = self
            .ingress(name)
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect();
        lb_ips.sort_unstable();
        Holding {
            cluster_ips: ips("/spec/clusterIPs"),
            node_ports,
            lb_ips,
        }
    }

    /// Per pool (IPv4, `addresses` as `a-b` ranges or one CIDR), the distinct addresses the
    /// Services' statuses name in it: what its assigned count must say.
    pub(super) fn named_per_pool(&self) -> BTreeMap<String, u128> {
        let mut named: Vec<IpAddr> = self
            .services
            .keys()
            .flat_map(|n| self.ingress(n))
            .filter_map(|s| s.parse().ok())
            .collect();
        named.sort_unstable();
        named.dedup();
        self.pools
            .iter()
            .map(|(name, pool)| {
                let ranges: Vec<berth_core::AddressRange> = pool["spec"]["addresses"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|t| berth_core::parse_address(t.as_str()?).ok())
                            .collect()
                    })
                    .unwrap_or_default();
                let n = named
                    .iter()
                    .filter(|ip| ranges.iter().any(|r| r.contains(**ip)))
                    .count();
                (name.clone(), n as u128)
            })
            .collect()
    }

    /// The Services that exist.
    pub(super) fn service_names(&self) -> Vec<String> {
        self.services.keys().cloned().collect()
    }

    pub(super) fn has_service(&self, name: &str) -> bool {
        self.services.contains_key(name)
    }

    pub(super) fn has_pool(&self, name: &str) -> bool {
        self.pools.contains_key(name)
    }

    /// The Service's object.
    pub(super) fn service(&self, name: &str) -> Service {
        service(self.get(name))
    }

    /// Each pool's address ranges.
    pub(super) fn pool_ranges(&self) -> BTreeMap<String, Vec<berth_core::AddressRange>> {
        self.pools
            .iter()
            .map(|(name, pool)| {
                let ranges = pool["spec"]["addresses"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|t| berth_core::parse_address(t.as_str()?).ok())
                            .collect()
                    })
                    .unwrap_or_default();
                (name.clone(), ranges)
            })
            .collect()
    }

    /// The `berth.dev/Allocated` condition's status and message.
    pub(super) fn allocated(&self, name: &str) -> Option<(String, String)> {
        let conditions = self.get(name).pointer("/status/conditions")?.as_array()?;
        conditions
            .iter()
            .find(|c| c["type"] == berth_api::names::condition::ALLOCATED)
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_owned(),
                    c["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
    }

    /// The reason of the `berth.dev/Allocated` condition, "" when absent.
    pub(super) fn allocated_reason(&self, name: &str) -> String {
        self.get(name)
            .pointer("/status/conditions")
            .and_then(|c| c.as_array())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c["type"] == berth_api::names::condition::ALLOCATED)
            })
            .and_then(|c| c["reason"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// The SIGKILL test's rule: no ClusterIP, node port or LoadBalancer address is named by
    /// two Services, except an address named by Services of one sharing key.
    pub(super) fn assert_no_value_named_twice(&self, row: &str) {
        // value -> (the group that may name it, the Service naming it)
        let mut named: BTreeMap<String, (String, String)> = BTreeMap::new();
        for name in self.services.keys() {
            if self
                .allocated(name)
                .is_some_and(|(status, _)| status == "False")
            {
                // Refused: its spec names what it asked for, as it was written.
                continue;
            }
            let sharing = self
                .get(name)
                .pointer("/metadata/annotations/berth.dev~1sharing-key")
                .and_then(Value::as_str)
                .map_or_else(|| name.clone(), |k| format!("sharing {k}"));
            let own = self
                .cluster_ip(name)
                .filter(|ip| ip != "None")
                .map(|ip| format!("ip {ip}"))
                .into_iter()
                .chain(
                    self.node_ports(name)
                        .into_iter()
                        .flatten()
                        .chain(self.health_check(name))
                        .map(|p| format!("port {p}")),
                )
                .map(|v| (v, name.clone()))
                .chain(
                    self.ingress(name)
                        .into_iter()
                        .map(|ip| (format!("lb {ip}"), sharing.clone())),
                );
            let mut own: Vec<(String, String)> = own.collect();
            own.sort();
            own.dedup();
            for (value, group) in own {
                if let Some((other_group, other)) =
                    named.insert(value.clone(), (group.clone(), name.clone()))
                {
                    assert_eq!(
                        other_group, group,
                        "{row}: {value} named by {other} and {name}"
                    );
                }
            }
        }
    }
}
