//! The apiserver's printers for the built-in kinds the lab serves (upstream's
//! pkg/printers/internalversion): column definitions and the cells of one object, always in the
//! wide form, as the apiserver generates them (kubectl hides priority-1 columns unless `-o wide`).

use super::age::since;
use super::text::str_at;
use crate::columns::Column;
use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// The printer for one built-in kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Printer {
    Service,
    Pod,
    Node,
    Endpoints,
    EndpointSlice,
    Event,
    Lease,
    ServiceCidr,
    Namespace,
    ConfigMap,
    Deployment,
    ReplicaSet,
}

impl Printer {
    /// The printer for a built-in (group, plural), if upstream has one. Both Event groups print
    /// the stored core Event.
    pub fn of(group: &str, plural: &str) -> Option<Self> {
        Some(match (group, plural) {
            ("", "services") => Self::Service,
            ("", "pods") => Self::Pod,
            ("", "nodes") => Self::Node,
            ("", "endpoints") => Self::Endpoints,
            ("discovery.k8s.io", "endpointslices") => Self::EndpointSlice,
            ("", "events") | ("events.k8s.io", "events") => Self::Event,
            ("coordination.k8s.io", "leases") => Self::Lease,
            ("networking.k8s.io", "servicecidrs") => Self::ServiceCidr,
            ("", "namespaces") => Self::Namespace,
            ("", "configmaps") => Self::ConfigMap,
            ("apps", "deployments") => Self::Deployment,
            ("apps", "replicasets") => Self::ReplicaSet,
            _ => return None,
        })
    }

    pub fn columns(self) -> Vec<Column> {
        let c = Column::new;
        let name = || Column::name();
        let age = || c("Age", "string", 0, CREATED);
        match self {
            Self::Service => vec![
                name(),
                c("Type", "string", 0, "type determines how the Service is exposed."),
                c("Cluster-IP", "string", 0, "clusterIP is the IP address of the service."),
                c("External-IP", "string", 0, "externalIPs and the load balancer's ingress points."),
                c("Port(s)", "string", 0, "The list of ports that are exposed by this service."),
                age(),
                c("Selector", "string", 1, "Route service traffic to pods with label keys and values matching this selector."),
            ],
            Self::Pod => vec![
                name(),
                c("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
                c("Status", "string", 0, "The aggregate status of the containers in this pod."),
                c("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
                age(),
                c("IP", "string", 1, "podIP address allocated to the pod."),
                c("Node", "string", 1, "NodeName is a request to schedule this pod onto a specific node."),
                c("Nominated Node", "string", 1, "nominatedNodeName is set only when this pod preempts other pods on the node."),
                c("Readiness Gates", "string", 1, "If specified, all readiness gates will be evaluated for pod readiness."),
            ],
            Self::Node => vec![
                name(),
                c("Status", "string", 0, "The status of the node"),
                c("Roles", "string", 0, "The roles of the node"),
                age(),
                c("Version", "string", 0, "Kubelet Version reported by the node."),
                c("Internal-IP", "string", 1, "List of addresses reachable to the node."),
                c("External-IP", "string", 1, "List of addresses reachable to the node."),
                c("OS-Image", "string", 1, "OS Image reported by the node."),
                c("Kernel-Version", "string", 1, "Kernel Version reported by the node."),
                c("Container-Runtime", "string", 1, "ContainerRuntime Version reported by the node."),
            ],
            Self::Endpoints => vec![
                name(),
                c("Endpoints", "string", 0, "The set of all endpoints is the union of all subsets."),
                age(),
            ],
            Self::EndpointSlice => vec![
                name(),
                c("AddressType", "string", 0, "addressType specifies the type of address carried by this EndpointSlice."),
                c("Ports", "string", 0, "ports specifies the list of network ports exposed by each endpoint in this slice."),
                c("Endpoints", "string", 0, "endpoints is a list of unique endpoints in this slice."),
                age(),
            ],
            Self::Event => vec![
                c("Last Seen", "string", 0, "The time at which the most recent occurrence of this event was recorded."),
                c("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in the future"),
                c("Reason", "string", 0, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
                c("Object", "string", 0, "The object that this event is about."),
                c("Subobject", "string", 1, "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement."),
                c("Source", "string", 1, "The component reporting this event."),
                c("Message", "string", 0, "A human-readable description of the status of this operation."),
                c("First Seen", "string", 1, "The time at which the event was first recorded."),
                c("Count", "string", 1, "The number of times this event has occurred."),
                Column { priority: 1, ..name() },
            ],
            Self::Lease => vec![name(), c("Holder", "string", 0, "The holder of the lease"), age()],
            Self::ServiceCidr => vec![
                name(),
                c("CIDRs", "string", 0, "CIDRs defines the IP blocks in CIDR notation (e.g. \"192.168.0.0/24\" or \"2001:db8::/64\") from which to assign service cluster IPs. Max of two CIDRs is allowed, one of each IP family. This field is immutable."),
                age(),
            ],
            Self::Namespace => vec![
                name(),
                c("Status", "string", 0, "The status of the namespace"),
                age(),
            ],
            Self::ConfigMap => vec![
                name(),
                c("Data", "integer", 0, "Data contains the configuration data."),
                age(),
            ],
            Self::Deployment => vec![
                name(),
                c("Ready", "string", 0, "Number of the pod with ready state"),
                c("Up-to-date", "integer", 0, "Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
                c("Available", "integer", 0, "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
                age(),
                c("Containers", "string", 1, "Names of each container in the template."),
                c("Images", "string", 1, "Images referenced by each container in the template."),
                c("Selector", "string", 1, "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment."),
            ],
            Self::ReplicaSet => vec![
                name(),
                c("Desired", "integer", 0, "Replicas is the number of desired pods."),
                c("Current", "integer", 0, "Replicas is the most recently observed number of replicas."),
                c("Ready", "integer", 0, "The number of ready replicas for this replica set."),
                age(),
                c("Containers", "string", 1, "Names of each container in the template."),
                c("Images", "string", 1, "Images referenced by each container in the template."),
                c("Selector", "string", 1, "Label selector for pods. Pods that match this selector are counted by this replica set."),
            ],
        }
    }

    /// The wide cells of one stored object.
    pub fn cells(self, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
        let name = json!(str_at(&obj["metadata"]["name"]));
        let age = json!(since(obj["metadata"]["creationTimestamp"].as_str(), now));
        match self {
            Self::Service => {
                let spec = &obj["spec"];
                let cluster_ip = spec["clusterIPs"][0]
                    .as_str()
                    .or_else(|| spec["clusterIP"].as_str())
                    .filter(|s| !s.is_empty())
                    .unwrap_or("<none>");
                vec![
                    name,
                    json!(str_at(&spec["type"])),
                    json!(cluster_ip),
                    json!(service_external_ip(obj)),
                    json!(or_none(service_ports(&spec["ports"]))),
                    age,
                    json!(format_labels(&spec["selector"])),
                ]
            }
            Self::Pod => super::pod::pod_cells(obj, name, age, now),
            Self::Node => node_cells(obj, name, age),
            Self::Endpoints => vec![name, json!(format_endpoints(&obj["subsets"])), age],
            Self::EndpointSlice => vec![
                name,
                json!(str_at(&obj["addressType"])),
                json!(slice_ports(&obj["ports"])),
                json!(slice_endpoints(&obj["endpoints"])),
                age,
            ],
            Self::Event => event_cells(obj, name, now),
            Self::Lease => vec![name, json!(str_at(&obj["spec"]["holderIdentity"])), age],
            Self::ServiceCidr => {
                let cidrs: Vec<&str> = obj["spec"]["cidrs"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                vec![name, json!(cidrs.join(",")), age]
            }
            Self::Namespace => vec![name, json!(str_at(&obj["status"]["phase"])), age],
            Self::ConfigMap => {
                let len = |v: &Value| v.as_object().map_or(0, Map::len);
                vec![
                    name,
                    json!(len(&obj["data"]) + len(&obj["binaryData"])),
                    age,
                ]
            }
            Self::Deployment | Self::ReplicaSet => workload_cells(self, obj, name, age),
        }
    }
}

/// `printDeployment` and `printReplicaSet`: counts from status against `spec.replicas` (1 when
/// unset), then the template's containers and images and the selector in its string form.
fn workload_cells(printer: Printer, obj: &Value, name: Value, age: Value) -> Vec<Value> {
    let desired = obj["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = |field: &str| obj["status"][field].as_i64().unwrap_or(0);
    let containers = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let joined = |field: &str| {
        containers
            .iter()
            .map(|c| str_at(&c[field]))
            .collect::<Vec<_>>()
            .join(",")
    };
    let selector = crate::scale::selector_string(&obj["spec"]["selector"]);
    let mut cells = vec![name];
    if printer == Printer::Deployment {
        cells.extend([
            json!(format!("{}/{desired}", status("readyReplicas"))),
            json!(status("updatedReplicas")),
            json!(status("availableReplicas")),
        ]);
    } else {
        cells.extend([
            json!(desired),
            json!(status("replicas")),
            json!(status("readyReplicas")),
        ]);
    }
    cells.extend([
        age,
        json!(joined("name")),
        json!(joined("image")),
        json!(or_none(selector)),
    ]);
    cells
}

/// `creationTimestamp`'s description, shared by every Age column.
pub const CREATED: &str =
    "CreationTimestamp is a timestamp representing the server time when this object was created.";

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn or_none(s: String) -> String {
    if s.is_empty() {
        "<none>".to_owned()
    } else {
        s
    }
}

/// `labels.FormatLabels`: sorted `k=v` pairs, `<none>` for none.
fn format_labels(map: &Value) -> String {
    let pairs: Vec<String> = map
        .as_object()
        .map(|m| {
            // serde_json's map is sorted by key, as FormatLabels sorts.
            m.iter()
                .map(|(k, v)| format!("{k}={}", str_at(v)))
                .collect()
        })
        .unwrap_or_default();
    or_none(pairs.join(","))
}

/// `makePortString`: `80/TCP`, or `80:30080/TCP` with a node port.
fn service_ports(ports: &Value) -> String {
    ports
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| {
                    let port = p["port"].as_i64().unwrap_or_default();
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64().filter(|n| *n > 0) {
                        Some(node_port) => format!("{port}:{node_port}/{proto}"),
                        None => format!("{port}/{proto}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// `getServiceExternalIP` in its wide form (the load balancer list is never clipped).
fn service_external_ip(svc: &Value) -> String {
    let external_ips = strings(&svc["spec"]["externalIPs"]);
    match str_at(&svc["spec"]["type"]) {
        "ClusterIP" | "NodePort" => or_none(external_ips.join(",")),
        "LoadBalancer" => {
            let ingress: BTreeSet<&str> = svc["status"]["loadBalancer"]["ingress"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|i| {
                            i["ip"]
                                .as_str()
                                .filter(|s| !s.is_empty())
                                .or_else(|| i["hostname"].as_str().filter(|s| !s.is_empty()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut all: Vec<&str> = ingress.into_iter().collect();
            all.extend(external_ips);
            if all.is_empty() {
                "<pending>".to_owned()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => str_at(&svc["spec"]["externalName"]).to_owned(),
        _ => "<unknown>".to_owned(),
    }
}

/// A list of at most three entries, then `+ N more...`; `empty` when there is nothing.
fn list_with_more(all: &[String], empty: &str) -> String {
    const MAX: usize = 3;
    let shown = all.iter().take(MAX).cloned().collect::<Vec<_>>().join(",");
    if all.len() > MAX {
        format!("{shown} + {} more...", all.len() - MAX)
    } else if shown.is_empty() {
        empty.to_owned()
    } else {
        shown
    }
}

/// `formatEndpoints` over every port: `ip:port` per address and port.
fn format_endpoints(subsets: &Value) -> String {
    let Some(subsets) = subsets.as_array().filter(|s| !s.is_empty()) else {
        return "<none>".to_owned();
    };
    let mut all = Vec::new();
    for ss in subsets {
        let addresses: Vec<&str> = ss["addresses"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x["ip"].as_str()).collect())
            .unwrap_or_default();
        match ss["ports"].as_array().filter(|p| !p.is_empty()) {
            // Headless Services may have no ports.
            None => all.extend(addresses.iter().map(|ip| (*ip).to_owned())),
            Some(ports) => {
                for port in ports {
                    let port = port["port"].as_i64().unwrap_or_default();
                    for ip in &addresses {
                        all.push(join_host_port(ip, port));
                    }
                }
            }
        }
    }
    list_with_more(&all, "<none>")
}

/// `net.JoinHostPort`: IPv6 addresses in brackets.
fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `formatDiscoveryPorts`: the port number, else its name, else `*`.
fn slice_ports(ports: &Value) -> String {
    let all: Vec<String> = ports
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| match (p["port"].as_i64(), p["name"].as_str()) {
                    (Some(n), _) => n.to_string(),
                    (None, Some(name)) => name.to_owned(),
                    (None, None) => "*".to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    list_with_more(&all, "<unset>")
}

/// `formatDiscoveryEndpoints`: every address of every endpoint.
fn slice_endpoints(endpoints: &Value) -> String {
    let all: Vec<String> = endpoints
        .as_array()
        .map(|eps| {
            eps.iter()
                .flat_map(|e| strings(&e["addresses"]))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    list_with_more(&all, "<unset>")
}

fn node_cells(obj: &Value, name: Value, age: Value) -> Vec<Value> {
    let status = &obj["status"];
    let mut state = Vec::new();
    if let Some(ready) = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
    {
        state.push(if ready["status"] == "True" {
            "Ready"
        } else {
            "NotReady"
        });
    }
    if state.is_empty() {
        state.push("Unknown");
    }
    if obj["spec"]["unschedulable"].as_bool() == Some(true) {
        state.push("SchedulingDisabled");
    }
    // `findNodeRoles`: node-role.kubernetes.io/<role> labels and the kubernetes.io/role value.
    let mut roles = BTreeSet::new();
    if let Some(labels) = obj["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_owned());
                }
            } else if k == "kubernetes.io/role" && !str_at(v).is_empty() {
                roles.insert(str_at(v).to_owned());
            }
        }
    }
    let address = |kind: &str| {
        status["addresses"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["type"] == kind))
            .and_then(|a| a["address"].as_str())
            .unwrap_or("<none>")
            .to_owned()
    };
    let info = &status["nodeInfo"];
    let unknown = |v: &Value| {
        v.as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("<unknown>")
            .to_owned()
    };
    vec![
        name,
        json!(state.join(",")),
        json!(or_none(roles.into_iter().collect::<Vec<_>>().join(","))),
        age,
        json!(str_at(&info["kubeletVersion"])),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(unknown(&info["osImage"])),
        json!(unknown(&info["kernelVersion"])),
        json!(unknown(&info["containerRuntimeVersion"])),
    ]
}

/// `printEvent` on the stored core Event: new-style Events (eventTime, series, reporting
/// controller) fill the columns that old-style ones fill with timestamps, count and source.
fn event_cells(obj: &Value, name: Value, now: DateTime<Utc>) -> Vec<Value> {
    let present = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let first = present(&obj["firstTimestamp"]).or_else(|| present(&obj["eventTime"]));
    let first_seen = since(first.as_deref(), now);
    let mut last_seen = match present(&obj["lastTimestamp"]) {
        Some(t) => since(Some(&t), now),
        None => first_seen.clone(),
    };
    let mut count = obj["count"].as_i64().unwrap_or_default();
    if obj["series"].is_object() {
        last_seen = since(obj["series"]["lastObservedTime"].as_str(), now);
        count = obj["series"]["count"].as_i64().unwrap_or_default();
    } else if count == 0 {
        // Singleton events of the new API carry no count.
        count = 1;
    }
    let involved = &obj["involvedObject"];
    let kind = str_at(&involved["kind"]).to_lowercase();
    let target = match str_at(&involved["name"]) {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    // `formatEventSource`: the reporting controller and instance stand in for an empty source.
    let first_non_empty =
        |a: &Value, b: &Value| present(a).or_else(|| present(b)).unwrap_or_default();
    let component = first_non_empty(&obj["source"]["component"], &obj["reportingComponent"]);
    let instance = first_non_empty(&obj["source"]["host"], &obj["reportingInstance"]);
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last_seen),
        json!(str_at(&obj["type"])),
        json!(str_at(&obj["reason"])),
        json!(target),
        json!(str_at(&involved["fieldPath"])),
        json!(source),
        json!(str_at(&obj["message"]).trim()),
        json!(first_seen),
        json!(count),
        name,
    ]
}
