//! The apiserver's defaulting for the fields berth reads, so objects look as they would on a cluster.
//! Defaulting is not allocation: no clusterIP, nodePort or address is ever filled in here.

use super::resource::ResourceInfo;
use serde_json::{json, Value};

pub fn fill_defaults(info: &ResourceInfo, obj: &mut Value) {
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "services") => service(obj),
        ("", "pods") => pod(obj),
        ("apps", "deployments") => deployment(obj),
        ("apps", "replicasets") => replica_set(obj),
        ("discovery.k8s.io", "endpointslices") => {
            for port in obj["ports"].as_array_mut().into_iter().flatten() {
                default(port, "protocol", json!("TCP"));
            }
        }
        _ => {}
    }
}

fn default(obj: &mut Value, key: &str, value: Value) {
    if let Some(map) = obj.as_object_mut() {
        if map.get(key).is_none_or(Value::is_null) {
            map.insert(key.to_owned(), value);
        }
    }
}

fn service(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec") else {
        return;
    };
    default(spec, "type", json!("ClusterIP"));
    let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_owned();
    if ty == "ExternalName" {
        return;
    }
    default(spec, "sessionAffinity", json!("None"));
    default(spec, "internalTrafficPolicy", json!("Cluster"));
    if ty == "NodePort" || ty == "LoadBalancer" {
        default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    for port in spec["ports"].as_array_mut().into_iter().flatten() {
        default(port, "protocol", json!("TCP"));
        let target = port.get("port").cloned().unwrap_or(Value::Null);
        if !target.is_null() {
            default(port, "targetPort", target);
        }
    }
}

fn pod(obj: &mut Value) {
    if let Some(spec) = obj.get_mut("spec") {
        default(spec, "restartPolicy", json!("Always"));
        default(spec, "dnsPolicy", json!("ClusterFirst"));
        default(spec, "schedulerName", json!("default-scheduler"));
        default(spec, "terminationGracePeriodSeconds", json!(30));
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array_mut().into_iter().flatten() {
                for port in c["ports"].as_array_mut().into_iter().flatten() {
                    default(port, "protocol", json!("TCP"));
                }
            }
        }
    }
}

/// `SetDefaults_Deployment`: one replica, RollingUpdate with 25% surge and unavailability, ten
/// old ReplicaSets kept, a 600 s progress deadline, and the pod defaults in the template (so a
/// template read back from a ReplicaSet by `rollout undo` equals the Deployment's).
fn deployment(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec") else {
        return;
    };
    default(spec, "replicas", json!(1));
    default(spec, "revisionHistoryLimit", json!(10));
    default(spec, "progressDeadlineSeconds", json!(600));
    default(spec, "strategy", json!({}));
    let strategy = &mut spec["strategy"];
    default(strategy, "type", json!("RollingUpdate"));
    if strategy["type"] == "RollingUpdate" {
        default(strategy, "rollingUpdate", json!({}));
        default(
            &mut strategy["rollingUpdate"],
            "maxUnavailable",
            json!("25%"),
        );
        default(&mut strategy["rollingUpdate"], "maxSurge", json!("25%"));
    }
    if let Some(template) = spec.get_mut("template") {
        pod(template);
    }
}

fn replica_set(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec") else {
        return;
    };
    default(spec, "replicas", json!(1));
    if let Some(template) = spec.get_mut("template") {
        pod(template);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::built_ins;

    fn info(plural: &str) -> ResourceInfo {
        built_ins()
            .into_iter()
            .find(|r| r.plural == plural)
            .unwrap()
    }

    #[test]
    fn service_defaults_without_allocation() {
        let mut svc = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        fill_defaults(&info("services"), &mut svc);
        assert_eq!(
            svc["spec"]["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80})
        );
        assert_eq!(svc["spec"]["externalTrafficPolicy"], "Cluster");
        assert!(svc["spec"].get("clusterIP").is_none());
        assert!(svc["spec"]["ports"][0].get("nodePort").is_none());
    }

    #[test]
    fn explicit_values_are_kept() {
        let mut svc = json!({"spec": {"ports": [{"port": 80, "targetPort": "http", "protocol": "UDP"}], "sessionAffinity": "ClientIP"}});
        fill_defaults(&info("services"), &mut svc);
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
        assert_eq!(svc["spec"]["ports"][0]["protocol"], "UDP");
        assert_eq!(svc["spec"]["sessionAffinity"], "ClientIP");
        assert!(svc["spec"].get("externalTrafficPolicy").is_none());
    }

    #[test]
    fn deployment_defaults_as_upstream_sets_them() {
        let mut d = json!({"spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}}}});
        fill_defaults(&info("deployments"), &mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"],
            "TCP"
        );
        let mut recreate = json!({"spec": {"replicas": 0, "strategy": {"type": "Recreate"}}});
        fill_defaults(&info("deployments"), &mut recreate);
        assert_eq!(recreate["spec"]["replicas"], 0);
        assert_eq!(recreate["spec"]["strategy"], json!({"type": "Recreate"}));
        let mut rs = json!({"spec": {"template": {"spec": {"containers": []}}}});
        fill_defaults(&info("replicasets"), &mut rs);
        assert_eq!(rs["spec"]["replicas"], 1);
        assert_eq!(rs["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirst");
    }

    #[test]
    fn pod_defaults() {
        let mut pod =
            json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 8080}]}]}});
        fill_defaults(&info("pods"), &mut pod);
        assert_eq!(pod["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
    }
}
