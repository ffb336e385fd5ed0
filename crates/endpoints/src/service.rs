//! The parts of a Service that endpoint computation reads, with the API
//! server's defaults applied so callers may pass undefaulted objects.

use std::collections::BTreeMap;
use std::net::IpAddr;

use berth_core::IpFamily;
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::hints::Distribution;
use crate::LABEL_HEADLESS;

pub(crate) const DEFAULT_PROTOCOL: &str = "TCP";
const CLUSTER_IP_NONE: &str = "None";

/// Where a Service port sends traffic on a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    Number(i32),
    Name(&'a str),
}

/// One Service port with defaults applied (protocol TCP, targetPort = port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PortSpec<'a> {
    pub name: &'a str,
    pub protocol: &'a str,
    pub target: Target<'a>,
    pub app_protocol: Option<&'a str>,
}

impl<'a> PortSpec<'a> {
    pub(crate) fn new(port: &'a ServicePort) -> Self {
        // The API server defaults an unset, zero or empty targetPort to the port itself.
        let target = match &port.target_port {
            Some(IntOrString::Int(n)) if *n != 0 => Target::Number(*n),
            Some(IntOrString::String(name)) if !name.is_empty() => Target::Name(name),
            _ => Target::Number(port.port),
        };
        PortSpec {
            name: port.name.as_deref().unwrap_or(""),
            protocol: port.protocol.as_deref().unwrap_or(DEFAULT_PROTOCOL),
            target,
            app_protocol: port.app_protocol.as_deref(),
        }
    }
}

/// A Service that gets endpoints: one with a selector and not of type ExternalName.
#[derive(Debug, Clone)]
pub(crate) struct ServiceView<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub labels: Option<&'a BTreeMap<String, String>>,
    pub selector: &'a BTreeMap<String, String>,
    pub publish_not_ready: bool,
    pub ports: Vec<PortSpec<'a>>,
    pub cluster_ip: Option<&'a str>,
    pub ip_families: Vec<IpFamily>,
    /// The topology hints its endpoints get (`spec.trafficDistribution`).
    pub distribution: Distribution,
}

pub(crate) fn namespace_of(ns: Option<&str>) -> &str {
    ns.unwrap_or("default")
}

impl<'a> ServiceView<'a> {
    /// `None` when the Service receives no endpoints from a controller: no
    /// selector (its endpoints are written by hand), or type ExternalName.
    pub(crate) fn new(service: &'a Service) -> Option<Self> {
        let spec = service.spec.as_ref()?;
        if spec.type_.as_deref() == Some("ExternalName") {
            return None;
        }
        // An empty selector is not stored by the API server, so it means "no selector".
        let selector = spec.selector.as_ref().filter(|s| !s.is_empty())?;
        let mut ip_families = Vec::new();
        for family in spec.ip_families.iter().flatten() {
            if let Ok(f) = family.parse::<IpFamily>() {
                if !ip_families.contains(&f) {
                    ip_families.push(f);
                }
            }
        }
        Some(ServiceView {
            namespace: namespace_of(service.metadata.namespace.as_deref()),
            name: service.metadata.name.as_deref().unwrap_or(""),
            uid: service.metadata.uid.as_deref().unwrap_or(""),
            labels: service.metadata.labels.as_ref(),
            selector,
            publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false),
            ports: spec.ports.iter().flatten().map(PortSpec::new).collect(),
            cluster_ip: spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty()),
            ip_families,
            distribution: Distribution::of(spec.traffic_distribution.as_deref(), |key| {
                service.metadata.annotations.as_ref()?.get(key).cloned()
            }),
        })
    }

    pub(crate) fn selects(&self, pod: &Pod) -> bool {
        if namespace_of(pod.metadata.namespace.as_deref()) != self.namespace {
            return false;
        }
        let labels = pod.metadata.labels.as_ref();
        self.selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }

    /// `clusterIP: None`: a headless Service may have no ports at all.
    pub(crate) fn is_cluster_ip_none(&self) -> bool {
        self.cluster_ip == Some(CLUSTER_IP_NONE)
    }

    /// Upstream labels a Service without an allocated cluster IP as headless,
    /// including one whose IP is still empty.
    pub(crate) fn is_headless(&self) -> bool {
        self.cluster_ip.is_none() || self.is_cluster_ip_none()
    }

    fn cluster_ip_family(&self) -> Option<IpFamily> {
        self.cluster_ip
            .filter(|_| !self.is_cluster_ip_none())
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .map(IpFamily::of)
    }

    /// Address types of the slices, sorted: `ipFamilies`, else the family of the
    /// cluster IP, else (an old headless Service) both.
    pub(crate) fn address_families(&self) -> Vec<IpFamily> {
        let mut families = if !self.ip_families.is_empty() {
            self.ip_families.clone()
        } else if let Some(f) = self.cluster_ip_family() {
            vec![f]
        } else {
            vec![IpFamily::V4, IpFamily::V6]
        };
        families.sort();
        families
    }

    /// The single family of an Endpoints object: the primary `ipFamilies`
    /// entry, else the cluster IP's, else (headless) the pod's own first IP.
    pub(crate) fn endpoints_family(&self, pod_first_ip: Option<&IpAddr>) -> IpFamily {
        self.ip_families
            .first()
            .copied()
            .or_else(|| self.cluster_ip_family())
            .or_else(|| pod_first_ip.copied().map(IpFamily::of))
            .unwrap_or(IpFamily::V4)
    }

    /// Service labels plus the headless marker, as both Endpoints and slices carry.
    pub(crate) fn object_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.cloned().unwrap_or_default();
        if self.is_headless() {
            labels.insert(LABEL_HEADLESS.to_owned(), String::new());
        } else {
            labels.remove(LABEL_HEADLESS);
        }
        labels
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ServiceSpec;

    use super::*;

    fn mk_service(cluster_ip: Option<&str>, families: &[&str]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([("app".into(), "x".into())])),
                cluster_ip: cluster_ip.map(Into::into),
                ip_families: Some(families.iter().map(|f| (*f).to_owned()).collect())
                    .filter(|f: &Vec<String>| !f.is_empty()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn families_fall_back_to_cluster_ip_then_both() {
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let v4: IpAddr = "10.0.0.1".parse().unwrap();

        let svc = mk_service(Some("10.96.0.1"), &["IPv6", "IPv4", "IPv6"]);
        let view = ServiceView::new(&svc).unwrap();
        assert_eq!(view.address_families(), vec![IpFamily::V4, IpFamily::V6]);
        assert_eq!(view.endpoints_family(Some(&v4)), IpFamily::V6);

        let svc = mk_service(Some("fd00:96::1"), &[]);
        let view = ServiceView::new(&svc).unwrap();
        assert_eq!(view.address_families(), vec![IpFamily::V6]);
        assert_eq!(view.endpoints_family(Some(&v4)), IpFamily::V6);
        assert!(!view.is_headless());

        let svc = mk_service(Some("None"), &[]);
        let view = ServiceView::new(&svc).unwrap();
        assert_eq!(view.address_families(), vec![IpFamily::V4, IpFamily::V6]);
        assert_eq!(view.endpoints_family(Some(&v6)), IpFamily::V6);
        assert!(view.is_headless() && view.is_cluster_ip_none());
    }

    #[test]
    fn empty_selector_means_no_selector() {
        let mut svc = mk_service(Some("10.96.0.1"), &["IPv4"]);
        if let Some(spec) = svc.spec.as_mut() {
            spec.selector = Some(BTreeMap::new());
        }
        assert!(ServiceView::new(&svc).is_none());
    }
}
