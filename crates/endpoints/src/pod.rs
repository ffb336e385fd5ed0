//! Which pods back a Service, and what each one contributes.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Container, Pod, ServicePort};

use crate::error::Error;
use crate::service::{namespace_of, PortSpec, ServiceView, Target, DEFAULT_PROTOCOL};
use berth_core::IpFamily;

const SIDECAR_RESTART_POLICY: &str = "Always";

/// A pod that passed the Service's filters, with the facts the builders need.
#[derive(Debug, Clone)]
pub(crate) struct PodView<'a> {
    pub pod: &'a Pod,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
    pub node_name: Option<&'a str>,
    /// Set only when the pod's hostname is published for this Service.
    pub hostname: Option<&'a str>,
    pub ready: bool,
    pub terminating: bool,
    /// Valid pod IPs in the pod's order, with the text the pod reported.
    pub ips: Vec<(&'a str, IpAddr)>,
}

impl PodView<'_> {
    pub(crate) fn ips_of(&self, family: IpFamily) -> impl Iterator<Item = &str> + '_ {
        self.ips
            .iter()
            .filter(move |(_, ip)| IpFamily::of(*ip) == family)
            .map(|(text, _)| *text)
    }
}

fn is_terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded") | Some("Failed"))
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The pod's IPs as reported: `podIPs`, or `podIP` alone when the list is
/// empty (the API server derives one from the other).
fn reported_ips(pod: &Pod) -> Vec<&str> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<&str> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .filter(|ip| !ip.is_empty())
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    status
        .pod_ip
        .as_deref()
        .filter(|ip| !ip.is_empty())
        .into_iter()
        .collect()
}

/// The pods of `service` that belong in its endpoints: selected, in its
/// namespace, not Succeeded/Failed, with at least one valid IP, and not
/// terminating unless `include_terminating`. Unparsable IPs are reported.
pub(crate) fn select_pods<'a>(
    service: &ServiceView<'_>,
    pods: &'a [Pod],
    include_terminating: bool,
    skipped: &mut Vec<Error>,
) -> Vec<PodView<'a>> {
    let mut selected = Vec::new();
    for pod in pods {
        if !service.selects(pod) || is_terminal(pod) {
            continue;
        }
        let terminating = pod.metadata.deletion_timestamp.is_some();
        if terminating && !include_terminating {
            continue;
        }
        let namespace = namespace_of(pod.metadata.namespace.as_deref());
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let mut ips = Vec::new();
        for text in reported_ips(pod) {
            match text.parse::<IpAddr>() {
                Ok(ip) => ips.push((text, ip)),
                Err(source) => skipped.push(Error::InvalidPodIp {
                    namespace: namespace.to_owned(),
                    pod: name.to_owned(),
                    ip: text.to_owned(),
                    source,
                }),
            }
        }
        if ips.is_empty() {
            continue;
        }
        let spec = pod.spec.as_ref();
        let hostname = spec
            .and_then(|s| s.hostname.as_deref())
            .filter(|h| !h.is_empty())
            .filter(|_| {
                spec.and_then(|s| s.subdomain.as_deref()) == Some(service.name)
                    && namespace == service.namespace
            });
        selected.push(PodView {
            pod,
            namespace,
            name,
            uid: pod.metadata.uid.as_deref(),
            node_name: spec
                .and_then(|s| s.node_name.as_deref())
                .filter(|n| !n.is_empty()),
            hostname,
            ready: is_ready(pod),
            terminating,
            ips,
        });
    }
    selected
}

fn named_port<'c>(
    containers: impl Iterator<Item = &'c Container>,
    name: &str,
    protocol: &str,
) -> Option<i32> {
    containers
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| {
            p.name.as_deref() == Some(name)
                && p.protocol.as_deref().unwrap_or(DEFAULT_PROTOCOL) == protocol
        })
        .map(|p| p.container_port)
}

pub(crate) fn resolve_port(pod: &Pod, port: &PortSpec<'_>) -> Option<i32> {
    let name = match port.target {
        Target::Number(n) => return Some(n),
        Target::Name(name) => name,
    };
    let spec = pod.spec.as_ref()?;
    named_port(spec.containers.iter(), name, port.protocol).or_else(|| {
        // Sidecars (init containers that keep running) serve traffic too.
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY));
        named_port(sidecars, name, port.protocol)
    })
}

/// The container port a Service port reaches on `pod`: the number itself, or a
/// named port matched by name and protocol on the containers, then on sidecar
/// init containers (`restartPolicy: Always`). `None` when the name is not found.
pub fn find_port(pod: &Pod, service_port: &ServicePort) -> Option<i32> {
    resolve_port(pod, &PortSpec::new(service_port))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, PodSpec};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    fn mk_container(
        name: &str,
        ports: &[(&str, i32, Option<&str>)],
        restart: Option<&str>,
    ) -> Container {
        Container {
            name: name.into(),
            restart_policy: restart.map(Into::into),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p, proto)| ContainerPort {
                        name: Some((*n).into()),
                        container_port: *p,
                        protocol: proto.map(Into::into),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn mk_pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: Some(init),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn mk_port(target: Option<IntOrString>, protocol: Option<&str>) -> ServicePort {
        ServicePort {
            port: 80,
            target_port: target,
            protocol: protocol.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn numeric_and_defaulted_targets() {
        let pod = mk_pod(vec![], vec![]);
        assert_eq!(
            find_port(&pod, &mk_port(Some(IntOrString::Int(8080)), None)),
            Some(8080)
        );
        assert_eq!(find_port(&pod, &mk_port(None, None)), Some(80));
        assert_eq!(
            find_port(&pod, &mk_port(Some(IntOrString::Int(0)), None)),
            Some(80)
        );
        assert_eq!(
            find_port(
                &pod,
                &mk_port(Some(IntOrString::String(String::new())), None)
            ),
            Some(80)
        );
    }

    #[test]
    fn named_targets_match_name_and_protocol() {
        let pod = mk_pod(
            vec![
                mk_container("a", &[("dns", 5353, Some("UDP"))], None),
                mk_container("b", &[("dns", 5354, None), ("http", 8080, None)], None),
            ],
            vec![],
        );
        let named = |name: &str, proto: Option<&str>| {
            find_port(
                &pod,
                &mk_port(Some(IntOrString::String(name.into())), proto),
            )
        };
        assert_eq!(named("dns", Some("UDP")), Some(5353));
        assert_eq!(named("dns", None), Some(5354));
        assert_eq!(named("dns", Some("SCTP")), None);
        assert_eq!(named("http", Some("TCP")), Some(8080));
        assert_eq!(named("grpc", None), None);
    }

    #[test]
    fn sidecars_serve_but_plain_init_containers_do_not() {
        let pod = mk_pod(
            vec![mk_container("app", &[("http", 8080, None)], None)],
            vec![
                mk_container("setup", &[("admin", 9000, None)], None),
                mk_container("once", &[("admin", 9001, None)], Some("OnFailure")),
                mk_container(
                    "proxy",
                    &[("admin", 9002, None), ("http", 15000, None)],
                    Some("Always"),
                ),
            ],
        );
        let named =
            |name: &str| find_port(&pod, &mk_port(Some(IntOrString::String(name.into())), None));
        assert_eq!(named("admin"), Some(9002));
        // Regular containers are searched first.
        assert_eq!(named("http"), Some(8080));
    }
}
