//! UDP conntrack cleanup. UDP has no connection teardown, so conntrack keeps steering a client's
//! packets to an endpoint that is gone (or keeps an entry made while the Service rejected) until
//! it times out; kube-proxy deletes those entries, and so does berth after a successful sync.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use berth_core::{IpFamily, Protocol};
use berth_datapath::ServicePort;

use crate::Error;

/// One `conntrack -D` filter; all are for UDP.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConntrackFlow {
    /// Entries to a Service address (any port) that were NATed to an endpoint that is gone.
    ServiceToEndpoint {
        service_ip: IpAddr,
        endpoint_ip: IpAddr,
    },
    /// Entries to a node port that were NATed to an endpoint that is gone.
    NodePortToEndpoint { node_port: u16, endpoint_ip: IpAddr },
    /// Every entry to a Service address whose endpoints went from some to none or none to some.
    ServiceIp { service_ip: IpAddr },
    /// Every entry to a node port, in one family, on the same transitions.
    NodePort { node_port: u16, family: IpFamily },
}

fn family_arg(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    }
}

impl ConntrackFlow {
    /// The arguments of the `conntrack` command that deletes these entries.
    pub fn args(&self) -> Vec<String> {
        let (family, filter): (IpFamily, Vec<String>) = match self {
            ConntrackFlow::ServiceToEndpoint {
                service_ip,
                endpoint_ip,
            } => (
                IpFamily::of(*service_ip),
                vec![
                    "--orig-dst".into(),
                    service_ip.to_string(),
                    "--dst-nat".into(),
                    endpoint_ip.to_string(),
                ],
            ),
            ConntrackFlow::NodePortToEndpoint {
                node_port,
                endpoint_ip,
            } => (
                IpFamily::of(*endpoint_ip),
                vec![
                    "--orig-port-dst".into(),
                    node_port.to_string(),
                    "--dst-nat".into(),
                    endpoint_ip.to_string(),
                ],
            ),
            ConntrackFlow::ServiceIp { service_ip } => (
                IpFamily::of(*service_ip),
                vec!["--orig-dst".into(), service_ip.to_string()],
            ),
            ConntrackFlow::NodePort { node_port, family } => (
                *family,
                vec!["--orig-port-dst".into(), node_port.to_string()],
            ),
        };
        let mut args = vec![
            "-D".to_string(),
            "-f".into(),
            family_arg(family).into(),
            "-p".into(),
            "udp".into(),
        ];
        args.extend(filter);
        args
    }
}

/// Endpoints that can receive traffic: ready ones, or serving ones during termination fallback.
fn usable(port: &ServicePort) -> BTreeSet<(IpAddr, u16)> {
    port.endpoints
        .iter()
        .filter(|ep| ep.ready || ep.serving)
        .map(|ep| (ep.ip, ep.port))
        .collect()
}

/// Addresses a client may have sent the Service's traffic to.
fn frontend_ips(port: &ServicePort) -> Vec<IpAddr> {
    let mut ips = port.cluster_ips.clone();
    ips.extend(port.external_ips.iter().copied());
    for family in [IpFamily::V4, IpFamily::V6] {
        ips.extend(port.load_balancer_vips(family));
    }
    ips
}

/// The entries to clear when one Service's ports go from `old` to `new` (either may be empty: a
/// Service added or removed). Only UDP ports produce any.
pub fn plan_conntrack_cleanup(old: &[ServicePort], new: &[ServicePort]) -> Vec<ConntrackFlow> {
    let mut flows = BTreeSet::new();
    for before in old.iter().filter(|p| p.protocol == Protocol::Udp) {
        let after = new
            .iter()
            .find(|p| p.protocol == Protocol::Udp && p.name == before.name);
        let was = usable(before);
        let now = after.map(usable).unwrap_or_default();
        for (endpoint_ip, _) in was.difference(&now) {
            for service_ip in frontend_ips(before) {
                if IpFamily::of(service_ip) == IpFamily::of(*endpoint_ip) {
                    flows.insert(ConntrackFlow::ServiceToEndpoint {
                        service_ip,
                        endpoint_ip: *endpoint_ip,
                    });
                }
            }
            if let Some(node_port) = before.node_port {
                flows.insert(ConntrackFlow::NodePortToEndpoint {
                    node_port,
                    endpoint_ip: *endpoint_ip,
                });
            }
        }
        if !was.is_empty() && now.is_empty() {
            add_frontends(&mut flows, before);
        }
    }
    for after in new.iter().filter(|p| p.protocol == Protocol::Udp) {
        let before = old
            .iter()
            .find(|p| p.protocol == Protocol::Udp && p.name == after.name);
        if before.map(usable).unwrap_or_default().is_empty() && !usable(after).is_empty() {
            add_frontends(&mut flows, after);
        }
    }
    flows.into_iter().collect()
}

fn add_frontends(flows: &mut BTreeSet<ConntrackFlow>, port: &ServicePort) {
    let ips = frontend_ips(port);
    let mut families = BTreeSet::new();
    for service_ip in ips {
        families.insert(IpFamily::of(service_ip));
        flows.insert(ConntrackFlow::ServiceIp { service_ip });
    }
    if let Some(node_port) = port.node_port {
        for family in families {
            flows.insert(ConntrackFlow::NodePort { node_port, family });
        }
    }
}

/// Deletes conntrack entries.
pub trait Conntrack {
    fn delete(&mut self, flow: &ConntrackFlow) -> Result<(), Error>;
}

/// Runs `conntrack -D ...`. When the binary is missing it logs that once and skips cleanup: the
/// entries then only expire on their own.
#[derive(Debug, Default)]
pub struct CommandConntrack {
    missing_logged: bool,
}

impl CommandConntrack {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Conntrack for CommandConntrack {
    fn delete(&mut self, flow: &ConntrackFlow) -> Result<(), Error> {
        let args = flow.args();
        let command = format!("conntrack {}", args.join(" "));
        let output = match Command::new("conntrack").args(&args).output() {
            Ok(output) => output,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                if !self.missing_logged {
                    self.missing_logged = true;
                    tracing::warn!("conntrack is not installed: stale UDP flows are not cleared");
                }
                return Ok(());
            }
            Err(source) => return Err(Error::Conntrack { command, source }),
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        // conntrack exits 1 when nothing matched, which is the common and harmless case.
        if output.status.success() || stderr.contains("0 flow entries have been deleted") {
            Ok(())
        } else {
            Err(Error::ConntrackCommand {
                command,
                status: output.status.to_string(),
                stderr: stderr.trim().to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn arguments_name_the_family_and_udp() {
        let flow = ConntrackFlow::ServiceToEndpoint {
            service_ip: "10.96.0.10".parse().unwrap(),
            endpoint_ip: "10.244.1.5".parse().unwrap(),
        };
        assert_eq!(
            flow.args().join(" "),
            "-D -f ipv4 -p udp --orig-dst 10.96.0.10 --dst-nat 10.244.1.5"
        );
        let flow = ConntrackFlow::NodePort {
            node_port: 30053,
            family: IpFamily::V6,
        };
        assert_eq!(
            flow.args().join(" "),
            "-D -f ipv6 -p udp --orig-port-dst 30053"
        );
        let flow = ConntrackFlow::NodePortToEndpoint {
            node_port: 30053,
            endpoint_ip: "fd00::5".parse().unwrap(),
        };
        assert_eq!(
            flow.args().join(" "),
            "-D -f ipv6 -p udp --orig-port-dst 30053 --dst-nat fd00::5"
        );
    }
}
