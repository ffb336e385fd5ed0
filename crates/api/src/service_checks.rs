//! What one Service may ask of every node, decided by pure functions that the agent (which
//! programs or skips) and the controller (which reports, since agents cannot write Services)
//! both run, so that the condition a user reads says exactly what the nodes did.
//!
//! - **Entries dropped alone**: an `externalIPs` entry outside `--external-ip-cidrs` or that
//!   does not parse, a `loadBalancerSourceRanges` entry that does not parse. The rest of the
//!   Service is programmed.
//! - **Bounds on size**: ports per Service, endpoints per Service port, and endpoints summed
//!   over the ports (each is a chain and its rules on every node). Past any of them the
//!   Service gets no datapath at all.

use std::fmt;
use std::net::IpAddr;

use berth_core::Protocol;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::ServiceSpec;

/// What an administrator allows Services to ask of every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServicePolicy {
    /// `--external-ip-cidrs`: `spec.externalIPs` are programmed only inside these. Empty (the
    /// default) allows none, as the API server's `DenyServiceExternalIPs` admission plugin:
    /// an external IP is any address on every node, the API server's or a database's included.
    pub external_ip_cidrs: Vec<IpNet>,
    /// How large one Service may be.
    pub bounds: ServiceBounds,
}

impl ServicePolicy {
    /// Every external IP allowed (kube-proxy's behaviour), default bounds: for tests and for
    /// clusters that guard `spec.externalIPs` by admission instead.
    pub fn allow_all() -> Self {
        Self {
            external_ip_cidrs: ["0.0.0.0/0", "::/0"]
                .iter()
                .filter_map(|c| c.parse().ok())
                .collect(),
            bounds: ServiceBounds::default(),
        }
    }

    fn allows(&self, ip: IpAddr) -> bool {
        self.external_ip_cidrs.iter().any(|c| c.contains(&ip))
    }

    fn allowed_text(&self) -> String {
        if self.external_ip_cidrs.is_empty() {
            "none".into()
        } else {
            self.external_ip_cidrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// One entry of a Service left out of its datapath, and why, in the API server's words
/// (`spec.externalIPs[0]: Invalid value: "010.0.0.5": must be a valid IP address`). The rest of
/// the Service is programmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub field: String,
    pub value: String,
    pub detail: String,
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: Invalid value: {:?}: {}",
            self.field, self.value, self.detail
        )
    }
}

/// `spec.externalIPs` that parse and that the policy allows; the others are `Dropped`.
pub fn filter_external_ips(
    values: &[String],
    policy: &ServicePolicy,
    dropped: &mut Vec<Dropped>,
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (i, value) in values.iter().enumerate() {
        let drop = |detail: String| Dropped {
            field: format!("spec.externalIPs[{i}]"),
            value: value.clone(),
            detail,
        };
        // Rust's parser refuses leading zeros (`010.0.0.5`), which Go once read as octal.
        match value.parse::<IpAddr>() {
            Err(_) => dropped.push(drop("must be a valid IP address".into())),
            Ok(ip) if !policy.allows(ip) => dropped.push(drop(format!(
                "not inside the external IP CIDRs this cluster allows ({})",
                policy.allowed_text()
            ))),
            Ok(ip) => out.push(ip),
        }
    }
    out
}

/// `spec.loadBalancerSourceRanges` that parse; the others are `Dropped`. `None` when entries
/// were given and none parses: the load balancer must then stay closed, not open to all.
pub fn filter_source_ranges(values: &[String], dropped: &mut Vec<Dropped>) -> Option<Vec<IpNet>> {
    let mut out = Vec::new();
    for (i, value) in values.iter().enumerate() {
        match parse_cidr(value.trim()) {
            Some(net) => out.push(net),
            None => dropped.push(Dropped {
                field: format!("spec.loadBalancerSourceRanges[{i}]"),
                value: value.clone(),
                detail: "must be a valid CIDR".into(),
            }),
        }
    }
    (values.is_empty() || !out.is_empty()).then_some(out)
}

/// A CIDR whose address the standard parser reads: `ipnet` takes `010.0.0.0/8` for
/// `10.0.0.0/8`, which others read as octal (`8.0.0.0/8`); an ambiguous range is refused.
fn parse_cidr(text: &str) -> Option<IpNet> {
    let (addr, len) = text.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    IpNet::new(addr, len).ok()
}

/// Every entry of the Service that the agents leave out under `policy`, in field order:
/// `externalIPs` first, then `loadBalancerSourceRanges` (read for LoadBalancer Services only,
/// as the agents do).
pub fn dropped_entries(spec: &ServiceSpec, policy: &ServicePolicy) -> Vec<Dropped> {
    let mut dropped = Vec::new();
    filter_external_ips(
        spec.external_ips.as_deref().unwrap_or_default(),
        policy,
        &mut dropped,
    );
    if spec.type_.as_deref() == Some("LoadBalancer") {
        filter_source_ranges(
            spec.load_balancer_source_ranges
                .as_deref()
                .unwrap_or_default(),
            &mut dropped,
        );
    }
    dropped
}

/// How large one Service may be before every node refuses it. The defaults sit far above what
/// Kubernetes itself is tested with (250 endpoints per Service in its scalability thresholds)
/// and below what would make one Service a real share of an agent's 512 MiB (docs/security.md
/// gives the measurements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceBounds {
    /// `--max-service-ports`: entries of `spec.ports`.
    pub max_ports: usize,
    /// `--max-endpoints-per-service-port`: endpoints of one port, ready or not.
    pub max_endpoints_per_port: usize,
    /// `--max-service-endpoints`: endpoints summed over the Service's ports (one chain each on
    /// every node).
    pub max_endpoints: usize,
}

impl ServiceBounds {
    pub const DEFAULT_MAX_PORTS: usize = 1_000;
    pub const DEFAULT_MAX_ENDPOINTS_PER_PORT: usize = 5_000;
    pub const DEFAULT_MAX_ENDPOINTS: usize = 20_000;

    /// No bound at all (for tests and benchmarks that measure an unbounded Service).
    pub const UNBOUNDED: ServiceBounds = ServiceBounds {
        max_ports: usize::MAX,
        max_endpoints_per_port: usize::MAX,
        max_endpoints: usize::MAX,
    };
}

impl Default for ServiceBounds {
    fn default() -> Self {
        ServiceBounds {
            max_ports: Self::DEFAULT_MAX_PORTS,
            max_endpoints_per_port: Self::DEFAULT_MAX_ENDPOINTS_PER_PORT,
            max_endpoints: Self::DEFAULT_MAX_ENDPOINTS,
        }
    }
}

/// One port of a Service and how many endpoints it has, as a bound check reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSize<'a> {
    pub name: &'a str,
    pub protocol: Protocol,
    pub endpoints: usize,
}

/// The first bound a Service passes, in the API server's words for a list that is too long
/// (`spec.ports: Too many: 5000: must have at most 1000 items`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooLarge {
    Ports {
        count: usize,
        max: usize,
    },
    PortEndpoints {
        port: String,
        protocol: Protocol,
        count: usize,
        max: usize,
    },
    Endpoints {
        count: usize,
        max: usize,
    },
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, count, max, flag) = match self {
            TooLarge::Ports { count, max } => {
                ("spec.ports".to_string(), count, max, "--max-service-ports")
            }
            TooLarge::PortEndpoints {
                port,
                protocol,
                count,
                max,
            } => (
                format!("endpoints of port {port:?} ({})", protocol.as_str()),
                count,
                max,
                "--max-endpoints-per-service-port",
            ),
            TooLarge::Endpoints { count, max } => (
                "endpoints of all ports together".to_string(),
                count,
                max,
                "--max-service-endpoints",
            ),
        };
        write!(
            f,
            "{what}: Too many: {count}: must have at most {max} items ({flag} of berth agent); \
             no node programs this Service"
        )
    }
}

/// Whether a Service of these ports fits `bounds`: ports first, then each port's endpoints in
/// order, then their sum. Pure, so the agent and the controller answer alike.
pub fn check_service_size(bounds: &ServiceBounds, ports: &[PortSize<'_>]) -> Result<(), TooLarge> {
    if ports.len() > bounds.max_ports {
        return Err(TooLarge::Ports {
            count: ports.len(),
            max: bounds.max_ports,
        });
    }
    if let Some(port) = ports
        .iter()
        .find(|p| p.endpoints > bounds.max_endpoints_per_port)
    {
        return Err(TooLarge::PortEndpoints {
            port: port.name.to_string(),
            protocol: port.protocol,
            count: port.endpoints,
            max: bounds.max_endpoints_per_port,
        });
    }
    let total = ports
        .iter()
        .fold(0usize, |sum, p| sum.saturating_add(p.endpoints));
    if total > bounds.max_endpoints {
        return Err(TooLarge::Endpoints {
            count: total,
            max: bounds.max_endpoints,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, endpoints: usize) -> PortSize<'_> {
        PortSize {
            name,
            protocol: Protocol::Tcp,
            endpoints,
        }
    }

    fn bounds(ports: usize, per_port: usize, total: usize) -> ServiceBounds {
        ServiceBounds {
            max_ports: ports,
            max_endpoints_per_port: per_port,
            max_endpoints: total,
        }
    }

    #[test]
    fn size_rows() {
        let b = bounds(2, 3, 5);
        let rows: Vec<(&str, Vec<PortSize<'_>>, Result<(), TooLarge>)> = vec![
            ("no port", vec![], Ok(())),
            ("at every bound", vec![port("a", 3), port("b", 2)], Ok(())),
            (
                "one port too many",
                vec![port("a", 0), port("b", 0), port("c", 0)],
                Err(TooLarge::Ports { count: 3, max: 2 }),
            ),
            (
                "ports are checked before endpoints",
                vec![port("a", 99), port("b", 0), port("c", 0)],
                Err(TooLarge::Ports { count: 3, max: 2 }),
            ),
            (
                "the first port over its bound is named",
                vec![port("a", 1), port("b", 4)],
                Err(TooLarge::PortEndpoints {
                    port: "b".into(),
                    protocol: Protocol::Tcp,
                    count: 4,
                    max: 3,
                }),
            ),
            (
                "each port within, the sum over",
                vec![port("a", 3), port("b", 3)],
                Err(TooLarge::Endpoints { count: 6, max: 5 }),
            ),
        ];
        for (row, ports, want) in rows {
            assert_eq!(check_service_size(&b, &ports), want, "{row}");
        }
    }

    #[test]
    fn unbounded_takes_anything_and_the_sum_cannot_overflow() {
        let ports = vec![port("a", usize::MAX), port("b", usize::MAX)];
        assert_eq!(
            check_service_size(&ServiceBounds::UNBOUNDED, &ports),
            Ok(())
        );
    }

    #[test]
    fn too_large_speaks_the_api_servers_words() {
        assert_eq!(
            TooLarge::Ports {
                count: 5000,
                max: 1000
            }
            .to_string(),
            "spec.ports: Too many: 5000: must have at most 1000 items (--max-service-ports of \
             berth agent); no node programs this Service"
        );
        let text = TooLarge::PortEndpoints {
            port: "p1".into(),
            protocol: Protocol::Udp,
            count: 6000,
            max: 5000,
        }
        .to_string();
        assert!(
            text.starts_with("endpoints of port \"p1\" (UDP): Too many: 6000"),
            "{text}"
        );
    }

    fn mk_spec(kind: &str, external: &[&str], ranges: &[&str]) -> ServiceSpec {
        let strings = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect());
        ServiceSpec {
            type_: Some(kind.into()),
            external_ips: strings(external),
            load_balancer_source_ranges: strings(ranges),
            ..ServiceSpec::default()
        }
    }

    #[test]
    fn dropped_entries_rows() {
        let policy = ServicePolicy {
            external_ip_cidrs: vec!["192.0.2.0/24".parse().unwrap()],
            bounds: ServiceBounds::default(),
        };
        let text = |spec: &ServiceSpec, policy: &ServicePolicy| -> Vec<String> {
            dropped_entries(spec, policy)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert!(text(&mk_spec("ClusterIP", &["192.0.2.5"], &[]), &policy).is_empty());
        assert_eq!(
            text(
                &mk_spec("LoadBalancer", &["192.0.2.5", "198.18.0.2", "010.0.0.5"], &["10.0.0.0/8", "010.0.0.0/8"]),
                &policy
            ),
            [
                "spec.externalIPs[1]: Invalid value: \"198.18.0.2\": not inside the external IP CIDRs this cluster allows (192.0.2.0/24)",
                "spec.externalIPs[2]: Invalid value: \"010.0.0.5\": must be a valid IP address",
                "spec.loadBalancerSourceRanges[1]: Invalid value: \"010.0.0.0/8\": must be a valid CIDR",
            ]
        );
        // Source ranges count only on LoadBalancer Services, as the agents read them.
        assert!(text(&mk_spec("NodePort", &[], &["bad"]), &policy).is_empty());
        assert_eq!(
            text(&mk_spec("ClusterIP", &["192.0.2.5"], &[]), &ServicePolicy::default()),
            ["spec.externalIPs[0]: Invalid value: \"192.0.2.5\": not inside the external IP CIDRs this cluster allows (none)"]
        );
    }
}
