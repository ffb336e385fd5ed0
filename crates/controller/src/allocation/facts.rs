//! A Service as allocation sees it: the raw object read once into plain data. Reading never
//! fails as a whole; a field berth cannot understand becomes a problem that the plan turns
//! into a condition and a Warning Event, so hostile input is reported, not crashed on.

use std::net::IpAddr;

use berth_api::names::{class, condition, finalizer as fin};

use berth_core::{IpFamily, IpFamilyPolicy, Protocol, TrafficPolicy};
use berth_ipam::{
    ClusterIpRequest, LbPort, NodePortRequest, ServiceKey, ServicePortSpec, ServiceView,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `spec.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

impl ServiceType {
    fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.unwrap_or("ClusterIP") {
            "ClusterIP" | "" => Ok(Self::ClusterIp),
            "NodePort" => Ok(Self::NodePort),
            "LoadBalancer" => Ok(Self::LoadBalancer),
            "ExternalName" => Ok(Self::ExternalName),
            other => Err(format!(
                "spec.type: Unsupported value: {other:?}: supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
            )),
        }
    }
}

/// Who serves a LoadBalancer Service's external address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbClass {
    /// Not a LoadBalancer Service.
    None,
    /// An IPPool address announced by the agents.
    L2,
    /// A cloud load balancer; its provider publishes the status.
    AwsNlb,
    /// A class berth does not serve: no address, no status.
    Foreign,
}

/// Node ports named by a Service's spec that its type does not use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaleNodePorts {
    pub health_check: Option<u16>,
    /// `spec.ports[].nodePort` values, in order.
    pub ports: Vec<u16>,
}

impl StaleNodePorts {
    pub fn is_empty(&self) -> bool {
        self.health_check.is_none() && self.ports.is_empty()
    }

    pub fn all(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports.iter().copied().chain(self.health_check)
    }
}

/// The finalizer-relevant facts of one Service (see [`super::cleanup`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanupFacts {
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// It carries `service.kubernetes.io/load-balancer-cleanup`.
    pub has_cleanup: bool,
    /// It carries the cloud provider's `berth.dev/load-balancer`.
    pub has_cloud: bool,
}

/// Everything allocation needs from one Service.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceFacts {
    pub key: ServiceKey,
    pub uid: String,
    pub resource_version: String,
    /// `metadata.creationTimestamp` as RFC 3339 text (sorts by time); empty when unset.
    pub created: String,
    pub type_: ServiceType,
    pub cluster_ips: ClusterIpRequest,
    /// `spec.ipFamilies` and `spec.ipFamilyPolicy` are unset, so the plan fills them.
    pub families_unset: bool,
    /// `spec.clusterIPs` is empty (perhaps with `spec.clusterIP` set), so the plan fills it.
    pub cluster_ips_unset: bool,
    /// Node-port needs; empty `ports` for ClusterIP and ExternalName Services.
    pub node_ports: NodePortRequest,
    /// Node ports the spec still names that its type no longer uses (`healthCheckNodePort`
    /// once not LoadBalancer with Local policy, `ports[].nodePort` once ClusterIP or
    /// ExternalName): a type change on a real cluster drops them from the spec, and until
    /// berth's write dropping them lands they stay held (see `plan_service`).
    pub stale_node_ports: StaleNodePorts,
    /// ClusterIPs an ExternalName Service still names: a change to ExternalName on a real
    /// cluster drops them (with `ipFamilies` and `ipFamilyPolicy`), and until berth's write
    /// dropping them lands they stay held (see `plan_service`).
    pub stale_cluster_ips: Vec<IpAddr>,
    pub lb_class: LbClass,
    /// What the LoadBalancer allocator needs (namespace labels are added by the caller).
    pub lb_view: ServiceView,
    /// Addresses in `status.loadBalancer.ingress[].ip`.
    pub ingress_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress` has entries (addresses or hostnames).
    pub has_ingress: bool,
    /// The status carries berth's `Allocated=True` condition: the ingress there is berth's,
    /// even when no pool holds its addresses any more (a restart after the pool went).
    pub allocated_by_berth: bool,
    /// Fields that could not be read, in the API server's words where it has them.
    pub problems: Vec<String>,
    /// What decides the load-balancer cleanup finalizer (see [`super::cleanup`]).
    pub cleanup: CleanupFacts,
}

/// Reads a Service; `default_class` is the controller's `--default-class`.
pub fn read_service(svc: &Service, default_class: Option<&str>) -> ServiceFacts {
    let meta = &svc.metadata;
    let key = ServiceKey::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    let spec = svc.spec.clone().unwrap_or_default();
    // Problems keep the order the fields are read in: type, cluster IPs, ports, health
    // check, requested addresses.
    let mut problems = Vec::new();
    let type_ = ServiceType::parse(spec.type_.as_deref()).unwrap_or_else(|p| {
        problems.push(p);
        ServiceType::ClusterIp
    });

    let cluster_ips = read_cluster_ips(svc, &mut problems);
    let families_unset =
        spec.ip_families.as_ref().is_none_or(Vec::is_empty) || spec.ip_family_policy.is_none();

    let etp = TrafficPolicy::from_spec(spec.external_traffic_policy.as_deref());
    let port_specs = read_ports(&spec, &mut problems);
    let lb_ports: Vec<LbPort> = port_specs
        .iter()
        .map(|p| LbPort::new(p.protocol, p.port))
        .collect();
    let (node_ports, stale_node_ports) =
        read_node_ports(&spec, type_, etp, port_specs, &mut problems);

    let cleanup = read_cleanup(meta);
    let lb_class = read_lb_class(&spec, type_, cleanup.deleting, default_class);
    let LbRequests {
        requested_ips,
        requested_pool,
        sharing_key,
        sharing_namespaces,
    } = read_lb_requests(svc, &lb_class, &mut problems);
    let lb_view = ServiceView {
        namespace: key.namespace.clone(),
        namespace_labels: Default::default(),
        labels: meta.labels.clone().unwrap_or_default(),
        requested_ips,
        requested_pool,
        sharing_key,
        sharing_namespaces,
        ports: lb_ports,
        external_traffic_policy: etp,
        selector: spec.selector.clone().unwrap_or_default(),
        families: cluster_ips.families.clone(),
    };

    let stale_cluster_ips = if type_ == ServiceType::ExternalName {
        cluster_ips.cluster_ips.clone()
    } else {
        Vec::new()
    };
    ServiceFacts {
        key,
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        created: meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        type_,
        cluster_ips,
        families_unset,
        cluster_ips_unset: spec.cluster_ips.as_ref().is_none_or(Vec::is_empty),
        node_ports,
        stale_node_ports,
        stale_cluster_ips,
        lb_class,
        lb_view,
        ingress_ips: ingress_ips(svc),
        has_ingress: ingress(svc).is_some_and(|i| !i.is_empty()),
        allocated_by_berth: allocated_by_berth(svc),
        problems,
        cleanup,
    }
}

/// `spec.ports`: a port berth cannot read is a problem and is left out.
fn read_ports(spec: &ServiceSpec, problems: &mut Vec<String>) -> Vec<ServicePortSpec> {
    let mut port_specs = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP").parse::<Protocol>() {
            Ok(proto) => proto,
            Err(_) => {
                problems.push(format!(
                    "spec.ports[{i}].protocol: Unsupported value: {:?}: supported values: \"SCTP\", \"TCP\", \"UDP\"",
                    p.protocol.as_deref().unwrap_or_default()
                ));
                continue;
            }
        };
        let Some(port) = u16::try_from(p.port).ok().filter(|v| *v > 0) else {
            problems.push(format!(
                "spec.ports[{i}].port: Invalid value: {}: must be between 1 and 65535, inclusive",
                p.port
            ));
            continue;
        };
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(n) => match u16::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    problems.push(format!(
                        "spec.ports[{i}].nodePort: Invalid value: {n}: must be between 1 and 65535, inclusive"
                    ));
                    continue;
                }
            },
        };
        port_specs.push(ServicePortSpec {
            port,
            protocol,
            node_port,
        });
    }
    port_specs
}

/// The node ports the Service's type needs, and those its spec names but the type no
/// longer uses.
fn read_node_ports(
    spec: &ServiceSpec,
    type_: ServiceType,
    etp: TrafficPolicy,
    port_specs: Vec<ServicePortSpec>,
    problems: &mut Vec<String>,
) -> (NodePortRequest, StaleNodePorts) {
    let wants_node_ports = matches!(type_, ServiceType::NodePort | ServiceType::LoadBalancer);
    let health_check = (type_ == ServiceType::LoadBalancer && etp == TrafficPolicy::Local).then(
        || match spec.health_check_node_port {
            None | Some(0) => None,
            Some(n) => u16::try_from(n).ok().or_else(|| {
                problems.push(format!(
                    "spec.healthCheckNodePort: Invalid value: {n}: must be between 1 and 65535, inclusive"
                ));
                None
            }),
        },
    );
    let stale_node_ports = StaleNodePorts {
        health_check: if health_check.is_none() {
            spec.health_check_node_port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
        } else {
            None
        },
        ports: if wants_node_ports {
            Vec::new()
        } else {
            port_specs.iter().filter_map(|p| p.node_port).collect()
        },
    };
    let node_ports = NodePortRequest {
        ports: if wants_node_ports {
            port_specs
        } else {
            Vec::new()
        },
        allocate_node_ports: type_ == ServiceType::NodePort
            || spec.allocate_load_balancer_node_ports != Some(false),
        health_check,
    };
    (node_ports, stale_node_ports)
}

/// Who serves the external address; `deleting` Services held by the cleanup finalizer
/// get none.
fn read_lb_class(
    spec: &ServiceSpec,
    type_: ServiceType,
    deleting: bool,
    default_class: Option<&str>,
) -> LbClass {
    match type_ {
        ServiceType::LoadBalancer => {
            match class::served_class(spec.load_balancer_class.as_deref(), default_class) {
                // Held by its cleanup finalizer: the address is released and the status
                // cleared (so no agent announces it) before the finalizer lets the Service go.
                Some(class::L2) if deleting => LbClass::None,
                Some(class::L2) => LbClass::L2,
                Some(_) => LbClass::AwsNlb,
                None => LbClass::Foreign,
            }
        }
        _ if spec.load_balancer_class.is_some()
            && class::served_class(spec.load_balancer_class.as_deref(), None).is_none() =>
        {
            LbClass::Foreign
        }
        _ => LbClass::None,
    }
}

/// What the annotations (and `spec.loadBalancerIP`) ask of the LoadBalancer allocator.
struct LbRequests {
    requested_ips: Vec<IpAddr>,
    requested_pool: Option<String>,
    sharing_key: Option<String>,
    sharing_namespaces: Vec<String>,
}

fn read_lb_requests(svc: &Service, lb_class: &LbClass, problems: &mut Vec<String>) -> LbRequests {
    let annotations = svc.metadata.annotations.clone().unwrap_or_default();
    let load_balancer_ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref());
    let requested_ips = if *lb_class == LbClass::L2 {
        match berth_api::requested_ips_with_spec(&annotations, load_balancer_ip) {
            Ok(r) => r.map(|r| r.ips).unwrap_or_default(),
            Err(e) => {
                problems.push(e.to_string());
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    LbRequests {
        requested_ips,
        requested_pool: berth_api::ip_pool(&annotations).map(|a| a.value.to_string()),
        sharing_key: berth_api::sharing_key(&annotations).map(|a| a.value.to_string()),
        sharing_namespaces: berth_api::sharing_namespaces(&annotations),
    }
}

fn ingress(svc: &Service) -> Option<&Vec<LoadBalancerIngress>> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
}

/// Addresses in `status.loadBalancer.ingress[].ip`; hostnames and unreadable text are left out.
fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    ingress(svc)
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// The status carries berth's `Allocated=True` condition.
fn allocated_by_berth(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == condition::ALLOCATED && c.status == "True")
        })
}

fn read_cleanup(meta: &ObjectMeta) -> CleanupFacts {
    let has_finalizer = |name: &str| {
        meta.finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == name))
    };
    CleanupFacts {
        deleting: meta.deletion_timestamp.is_some(),
        has_cleanup: has_finalizer(fin::LOAD_BALANCER_CLEANUP),
        has_cloud: has_finalizer(fin::LOAD_BALANCER),
    }
}

fn read_cluster_ips(svc: &Service, problems: &mut Vec<String>) -> ClusterIpRequest {
    let spec = svc.spec.clone().unwrap_or_default();
    let mut req = ClusterIpRequest {
        has_selector: spec.selector.as_ref().is_some_and(|s| !s.is_empty()),
        ..ClusterIpRequest::default()
    };
    if let Some(policy) = spec.ip_family_policy.as_deref() {
        match policy.parse::<IpFamilyPolicy>() {
            Ok(p) => req.policy = Some(p),
            Err(_) => problems.push(format!(
                "spec.ipFamilyPolicy: Unsupported value: {policy:?}: supported values: \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\""
            )),
        }
    }
    for (i, fam) in spec.ip_families.iter().flatten().enumerate() {
        match fam.parse::<IpFamily>() {
            Ok(f) => req.families.push(f),
            Err(_) => problems.push(format!(
                "spec.ipFamilies[{i}]: Unsupported value: {fam:?}: supported values: \"IPv4\", \"IPv6\""
            )),
        }
    }
    let listed: Vec<String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(list), _) if !list.is_empty() => list.clone(),
        (_, Some(one)) if !one.is_empty() => vec![one.clone()],
        _ => Vec::new(),
    };
    for (i, text) in listed.iter().enumerate() {
        if text == "None" {
            if i == 0 {
                req.headless = true;
            } else {
                problems.push(format!(
                    "spec.clusterIPs[{i}]: Invalid value: \"None\": may only be set for the first entry"
                ));
            }
            continue;
        }
        match text.parse::<IpAddr>() {
            Ok(ip) => req.cluster_ips.push(ip),
            Err(_) => problems.push(format!(
                "spec.clusterIPs[{i}]: Invalid value: {text:?}: must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
            )),
        }
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn load_balancer_facts() {
        let svc = mk_svc(json!({
            "metadata": {"namespace": "ns", "name": "web", "uid": "u1",
                "annotations": {"berth.dev/load-balancer-ips": "198.18.0.210", "berth.dev/sharing-key": "k"}},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.210"}]}}
        }));
        let f = read_service(&svc, Some(class::L2));
        assert_eq!(f.lb_class, LbClass::L2);
        assert_eq!(f.node_ports.health_check, Some(Some(31000)));
        assert_eq!(f.node_ports.ports.len(), 2);
        assert_eq!(f.node_ports.ports[0].node_port, Some(30080));
        assert_eq!(
            f.lb_view.requested_ips,
            vec!["198.18.0.210".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(f.lb_view.sharing_key.as_deref(), Some("k"));
        assert_eq!(f.ingress_ips.len(), 1);
        assert!(f.problems.is_empty());
    }

    #[test]
    fn classes() {
        let lb = |class: Option<&str>| {
            let mut v = json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"}});
            if let Some(c) = class {
                v["spec"]["loadBalancerClass"] = json!(c);
            }
            mk_svc(v)
        };
        assert_eq!(
            read_service(&lb(None), Some(class::L2)).lb_class,
            LbClass::L2
        );
        assert_eq!(read_service(&lb(None), None).lb_class, LbClass::Foreign);
        assert_eq!(
            read_service(&lb(Some("example.com/other")), Some(class::L2)).lb_class,
            LbClass::Foreign
        );
        assert_eq!(
            read_service(&lb(Some(class::AWS_NLB)), Some(class::L2)).lb_class,
            LbClass::AwsNlb
        );
        let cip = mk_svc(json!({"metadata": {"name": "a"}, "spec": {}}));
        assert_eq!(read_service(&cip, Some(class::L2)).lb_class, LbClass::None);
    }

    #[test]
    fn hostile_fields_become_problems() {
        let svc = mk_svc(json!({
            "metadata": {"name": "a", "annotations": {"berth.dev/load-balancer-ips": "nonsense"}},
            "spec": {"type": "Weird", "clusterIPs": ["10.0.0.1", "None", "x"], "ipFamilies": ["IPv5"],
                "ipFamilyPolicy": "Maybe", "ports": [{"port": 70000}, {"port": 1, "protocol": "ICMP"},
                {"port": 2, "nodePort": -4}]}
        }));
        let f = read_service(&svc, Some(class::L2));
        assert_eq!(f.type_, ServiceType::ClusterIp);
        assert_eq!(f.problems.len(), 8, "{:?}", f.problems);
        assert!(f.problems[0].starts_with("spec.type: Unsupported value: \"Weird\""));
    }

    #[test]
    fn headless_and_cluster_ip_fallback() {
        let svc = mk_svc(json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "None"}}));
        assert!(read_service(&svc, None).cluster_ips.headless);
        let svc = mk_svc(json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.96.0.9"}}));
        assert_eq!(
            read_service(&svc, None).cluster_ips.cluster_ips,
            vec!["10.96.0.9".parse::<IpAddr>().unwrap()]
        );
    }
}
