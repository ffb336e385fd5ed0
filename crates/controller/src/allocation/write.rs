//! One Service's decision as writes, in plain data: the spec merge patch, the conditions and
//! the status patch, the job that carries them, and how the job ended. Spec patches carry the
//! resourceVersion the decision was made from, so a value set meanwhile by someone else is
//! never overwritten (the API server answers 409 and the Service is decided again).

use std::net::IpAddr;
use std::sync::Arc;

use berth_api::names::{condition as cond, finalizer as fin};
use berth_api::set_condition;
use berth_ipam::ServiceKey;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{json, Value};

use crate::allocation::cleanup::FinalizerChange;
use crate::allocation::plan::{Allocation, SpecFill};
use crate::error::ErrorCategory;

/// The merge patch that fills empty spec fields and drops unused node ports (and an
/// ExternalName Service's ClusterIPs), and adds or removes the load-balancer cleanup
/// finalizer, or `None` when there is nothing to write.
pub fn build_spec_patch(
    svc: &Service,
    fill: &SpecFill,
    finalizer: Option<FinalizerChange>,
) -> Option<Value> {
    if fill.is_empty() && finalizer.is_none() {
        return None;
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert(
        "resourceVersion".into(),
        json!(svc.metadata.resource_version),
    );
    if let Some(change) = finalizer {
        // A merge patch replaces the list: everyone else's finalizers are sent as read, and the
        // resourceVersion makes a concurrent change a conflict, not a loss.
        let mut finalizers: Vec<String> = svc
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != fin::LOAD_BALANCER_CLEANUP)
            .collect();
        if change == FinalizerChange::Add {
            finalizers.push(fin::LOAD_BALANCER_CLEANUP.to_string());
        }
        metadata.insert("finalizers".into(), json!(finalizers));
    }
    if fill.is_empty() {
        return Some(json!({ "metadata": metadata }));
    }
    let mut spec = serde_json::Map::new();
    if let Some(ips) = &fill.cluster_ips {
        let texts: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        if let Some(first) = texts.first() {
            spec.insert("clusterIP".into(), json!(first));
        }
        spec.insert("clusterIPs".into(), json!(texts));
    }
    if let Some(fams) = &fill.ip_families {
        let names: Vec<&str> = fams.iter().map(|f| f.as_str()).collect();
        spec.insert("ipFamilies".into(), json!(names));
    }
    if let Some(policy) = fill.ip_family_policy {
        spec.insert("ipFamilyPolicy".into(), json!(policy.as_str()));
    }
    if fill.drop_cluster_ips {
        // null removes a field in a merge patch.
        for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            spec.insert(field.into(), Value::Null);
        }
    }
    if fill.node_ports.iter().any(Option::is_some) || fill.drop_node_ports {
        // A merge patch replaces the whole list, so every entry is sent as read, with only
        // the empty nodePorts filled in.
        let ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(ports.len());
        for (i, p) in ports.iter().enumerate() {
            let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
            if let Some(map) = v.as_object_mut() {
                if fill.drop_node_ports {
                    map.remove("nodePort");
                } else if let Some(Some(n)) = fill.node_ports.get(i) {
                    map.insert("nodePort".into(), json!(n));
                }
            }
            out.push(v);
        }
        spec.insert("ports".into(), Value::Array(out));
    }
    if let Some(hc) = fill.health_check_node_port {
        spec.insert("healthCheckNodePort".into(), json!(hc));
    } else if fill.drop_health_check_node_port {
        // null removes the field in a merge patch.
        spec.insert("healthCheckNodePort".into(), Value::Null);
    }
    Some(json!({
        "metadata": metadata,
        "spec": spec,
    }))
}

/// The `berth.dev/Allocated` conditions after this decision, or `None` when unchanged.
pub fn build_conditions(svc: &Service, out: &Allocation, now: Time) -> Option<Vec<Condition>> {
    let result = out.result.as_ref()?;
    let (status, reason, message) = match result {
        Ok(()) => (cond::TRUE, cond::reason::ALLOCATED, String::new()),
        Err(f) => (cond::FALSE, f.reason, f.message.clone()),
    };
    let mut conditions = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let changed = set_condition(
        &mut conditions,
        Condition {
            type_: cond::ALLOCATED.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: svc.metadata.generation,
            last_transition_time: now,
        },
    );
    changed.then_some(conditions)
}

/// Whether the published ingress differs from the desired addresses (as VIPs).
pub fn ingress_differs(svc: &Service, desired: &[IpAddr]) -> bool {
    let current = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default();
    current.len() != desired.len()
        || current.iter().zip(desired).any(|(c, d)| {
            c.ip.as_deref() != Some(d.to_string().as_str())
                || c.ip_mode.as_deref().is_some_and(|m| m != "VIP")
                || c.hostname.is_some()
        })
}

/// The status merge patch, guarded by the resourceVersion the decision was made from (or
/// that the spec write returned): a decision about an older version of the Service must not
/// land on a newer one, which may have changed type or already name other addresses.
pub fn build_status_patch(
    resource_version: Option<&str>,
    ingress: Option<&[LoadBalancerIngress]>,
    conditions: Option<&[Condition]>,
) -> Value {
    let mut status = serde_json::Map::new();
    if let Some(ingress) = ingress {
        let value = if ingress.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(ingress).unwrap_or(Value::Null)
        };
        status.insert("loadBalancer".into(), json!({ "ingress": value }));
    }
    if let Some(c) = conditions {
        status.insert(
            "conditions".into(),
            serde_json::to_value(c).unwrap_or(Value::Null),
        );
    }
    json!({
        "metadata": {"resourceVersion": resource_version},
        "status": status,
    })
}

/// The writes for one Service, decided synchronously by the loop, sent by `apply::run_job`.
pub struct WriteJob {
    pub key: ServiceKey,
    pub svc: Arc<Service>,
    pub spec_patch: Option<Value>,
    pub conditions: Option<Vec<Condition>>,
    /// Desired ingress addresses when they differ from the published ones.
    pub ingress: Option<Vec<IpAddr>>,
    pub nodes: Vec<String>,
    /// Warning Event (reason, message) for a newly failed allocation.
    pub failure: Option<(&'static str, String)>,
    pub new_lb_ips: Vec<IpAddr>,
}

impl WriteJob {
    pub fn is_empty(&self) -> bool {
        self.spec_patch.is_none() && self.conditions.is_none() && self.ingress.is_none()
    }
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Everything was written; `written` are the resourceVersions of the Service that this
    /// job's writes produced, in order, so their watch echoes can be told from others' changes.
    Done { written: Vec<String> },
    /// The Service is gone; its delete event releases it.
    Gone,
    /// Not leading any more: nothing was (or will be) written.
    NotLeading,
    /// The API server refused `write` as conflicting (409): the Service changed since the
    /// version it carried. Nothing of it was written, nor of the writes after it; tried
    /// again like any conflict.
    Rejected { write: Write },
    /// Failed; `category` says when it is tried again and is the metric label.
    Retry { category: ErrorCategory },
}

/// One of a job's two writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Spec,
    Status,
}

/// The Service as the spec write returned it, and the version the decision was made from.
/// The loop decides a retry from it when its cache has not moved on: decided again from the
/// older version, the written values would be assigned afresh and the written ones freed for
/// others while the Service still names them.
#[derive(Debug, Clone)]
pub struct WrittenSpec {
    pub base_version: Option<String>,
    pub svc: Arc<Service>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::plan::Failure;
    use berth_core::IpFamily;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn mk_svc(v: Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn spec_patch_fills_only_empty_node_ports_and_carries_the_version() {
        let svc = mk_svc(json!({"metadata": {"name": "a", "resourceVersion": "42"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]}}));
        let fill = SpecFill {
            cluster_ips: Some(vec!["10.96.0.9".parse().unwrap()]),
            ip_families: Some(vec![IpFamily::V4]),
            node_ports: vec![None, Some(31000)],
            ..SpecFill::default()
        };
        let p = build_spec_patch(&svc, &fill, None).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(p["spec"]["clusterIP"], "10.96.0.9");
        assert_eq!(p["spec"]["ipFamilies"], json!(["IPv4"]));
        assert_eq!(p["spec"]["ports"][0]["nodePort"], 30080);
        assert_eq!(p["spec"]["ports"][1]["nodePort"], 31000);
        assert!(build_spec_patch(&svc, &SpecFill::default(), None).is_none());
    }

    #[test]
    fn spec_patch_drops_node_ports_a_type_change_left_unused() {
        let svc = mk_svc(json!({"metadata": {"name": "a", "resourceVersion": "7"},
            "spec": {"type": "ClusterIP", "healthCheckNodePort": 30090,
                     "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]}}));
        let fill = SpecFill {
            drop_node_ports: true,
            drop_health_check_node_port: true,
            ..SpecFill::default()
        };
        assert!(!fill.is_empty());
        let p = build_spec_patch(&svc, &fill, None).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        // Present as null (a merge patch's removal), not merely absent.
        assert!(p["spec"]["healthCheckNodePort"].is_null());
        assert!(p["spec"]
            .as_object()
            .unwrap()
            .contains_key("healthCheckNodePort"));
        let ports = p["spec"]["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 2);
        assert!(ports.iter().all(|e| e.get("nodePort").is_none()));
        assert_eq!(ports[1]["protocol"], "UDP");
    }

    #[test]
    fn spec_patch_drops_the_cluster_ips_of_an_external_name_service() {
        let svc = mk_svc(json!({"metadata": {"name": "a", "resourceVersion": "9"},
            "spec": {"type": "ExternalName", "externalName": "example.invalid",
                     "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"],
                     "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}}));
        let fill = SpecFill {
            drop_cluster_ips: true,
            ..SpecFill::default()
        };
        assert!(!fill.is_empty());
        let p = build_spec_patch(&svc, &fill, None).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"resourceVersion": "9"},
                "spec": {"clusterIP": null, "clusterIPs": null, "ipFamilies": null, "ipFamilyPolicy": null}})
        );
    }

    #[test]
    fn spec_patch_adds_and_removes_the_cleanup_finalizer_keeping_the_others() {
        let svc = mk_svc(json!({"metadata": {"name": "a", "resourceVersion": "4",
            "finalizers": ["example.com/keep"]}}));
        let p = build_spec_patch(&svc, &SpecFill::default(), Some(FinalizerChange::Add)).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"resourceVersion": "4", "finalizers":
                ["example.com/keep", "service.kubernetes.io/load-balancer-cleanup"]}})
        );
        let svc = mk_svc(json!({"metadata": {"name": "a", "resourceVersion": "5",
            "finalizers": ["service.kubernetes.io/load-balancer-cleanup", "example.com/keep"]}}));
        let p =
            build_spec_patch(&svc, &SpecFill::default(), Some(FinalizerChange::Remove)).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"resourceVersion": "5", "finalizers": ["example.com/keep"]}})
        );
    }

    #[test]
    fn conditions_change_only_on_news() {
        let svc = mk_svc(json!({"metadata": {"name": "a", "generation": 3}}));
        let failed = Allocation {
            fill: SpecFill::default(),
            ingress: None,
            result: Some(Err(Failure {
                reason: "RangeFull",
                message: "range is full".into(),
            })),
            new_lb_ips: vec![],
            kept: None,
            finalizer: None,
        };
        let c = build_conditions(&svc, &failed, at(1)).unwrap();
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_str()),
            ("False", "RangeFull")
        );
        assert_eq!(c[0].observed_generation, Some(3));
        let mut again = svc.clone();
        again.status = Some(serde_json::from_value(json!({"conditions": c})).unwrap());
        assert!(build_conditions(&again, &failed, at(2)).is_none());
        let ok = Allocation {
            result: Some(Ok(())),
            ..failed.clone()
        };
        let c = build_conditions(&again, &ok, at(3)).unwrap();
        assert_eq!(
            (c[0].status.as_str(), c[0].last_transition_time.clone()),
            ("True", at(3))
        );
        let none = Allocation {
            result: None,
            ..failed
        };
        assert!(build_conditions(&svc, &none, at(4)).is_none());
    }

    #[test]
    fn ingress_comparison_and_status_patch() {
        let svc = mk_svc(json!({"metadata": {"name": "a"},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP"}]}}}));
        let ip: IpAddr = "198.18.0.200".parse().unwrap();
        assert!(!ingress_differs(&svc, &[ip]));
        assert!(ingress_differs(&svc, &[]));
        assert!(ingress_differs(&svc, &["198.18.0.201".parse().unwrap()]));
        let cleared = build_status_patch(Some("7"), Some(&[]), None);
        assert_eq!(
            cleared,
            json!({"metadata": {"resourceVersion": "7"},
                "status": {"loadBalancer": {"ingress": null}}})
        );
    }
}
