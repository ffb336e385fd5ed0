//! Node ports as the allocation accepts them. A real API server refuses a `nodePort` (or
//! `healthCheckNodePort`) outside `--service-node-port-range` or already held by another Service,
//! and the Service keeps its old value; a lab or any API server that does not check stores the
//! request anyway. The agent therefore programs a node port only when it lies in its own
//! `--node-port-range` (the controller's, mirrored) and no other Service already has it programmed;
//! otherwise the port keeps the value it was last programmed with (none for a new Service).
//!
//! Why the agent decides from a flag rather than from a verdict the controller writes: the agent
//! programs Services whose ports were allocated by a stock API server, with berth's controller off
//! or down, and a per-Service verdict would cost an API write per Service. The limits: after an
//! agent restart there is no last programmed value, so a refused port leaves the Service port
//! without a node port; and of two Services claiming one port, the agent keeps the one it
//! programmed first (on a fresh list: the first by namespace and name), not necessarily the older.

use berth_core::PortRange;
use berth_datapath::ServicePort;

/// Which field a refused port came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePortField {
    NodePort,
    HealthCheckNodePort,
}

/// Why a requested node port was not programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    OutOfRange(PortRange),
    HeldByAnotherService,
}

/// One refused request and what is programmed instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The Service port's name (empty for a single unnamed port and for the health check).
    pub port_name: String,
    pub field: NodePortField,
    pub requested: u16,
    pub reason: RefusalReason,
    /// The last programmed value, kept.
    pub kept: Option<u16>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let field = match self.field {
            NodePortField::NodePort => "nodePort",
            NodePortField::HealthCheckNodePort => "healthCheckNodePort",
        };
        write!(f, "{field} {}: ", self.requested)?;
        match self.reason {
            RefusalReason::OutOfRange(range) => write!(
                f,
                "provided port is not in the valid range. The range of valid ports is {}-{}",
                range.first, range.last
            )?,
            RefusalReason::HeldByAnotherService => write!(f, "provided port is already allocated")?,
        }
        match self.kept {
            Some(kept) => write!(f, "; keeping {kept}"),
            None => write!(f, "; no node port programmed"),
        }
    }
}

/// Replaces, in one Service's `ports`, every node port the allocation would refuse by the value
/// in `previous` (the same Service's ports as last programmed, matched by name and protocol).
/// `held(port)` says whether another Service has `port` programmed.
pub fn admit_node_ports(
    ports: &mut [ServicePort],
    previous: &[ServicePort],
    range: PortRange,
    held: impl Fn(u16) -> bool,
) -> Vec<Refusal> {
    let verdict = |port: u16| {
        if !range.contains(port) {
            Some(RefusalReason::OutOfRange(range))
        } else if held(port) {
            Some(RefusalReason::HeldByAnotherService)
        } else {
            None
        }
    };
    let mut refusals = Vec::new();
    let previous_health = previous.iter().find_map(|p| p.health_check_node_port);
    let mut health_refused = false;
    for port in ports.iter_mut() {
        if let Some(requested) = port.node_port {
            if let Some(reason) = verdict(requested) {
                let kept = previous
                    .iter()
                    .find(|p| p.name.port == port.name.port && p.protocol == port.protocol)
                    .and_then(|p| p.node_port);
                port.node_port = kept;
                refusals.push(Refusal {
                    port_name: port.name.port.clone(),
                    field: NodePortField::NodePort,
                    requested,
                    reason,
                    kept,
                });
            }
        }
        if let Some(requested) = port.health_check_node_port {
            if let Some(reason) = verdict(requested) {
                port.health_check_node_port = previous_health;
                if !health_refused {
                    health_refused = true;
                    refusals.push(Refusal {
                        port_name: String::new(),
                        field: NodePortField::HealthCheckNodePort,
                        requested,
                        reason,
                        kept: previous_health,
                    });
                }
            }
        }
    }
    refusals
}

/// Whether `port` is a node port or health-check node port of one of `ports`.
pub fn uses_node_port(ports: &[ServicePort], port: u16) -> bool {
    ports
        .iter()
        .any(|p| p.node_port == Some(port) || p.health_check_node_port == Some(port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use berth_core::Protocol;
    use berth_datapath::ServicePortName;

    fn mk_port(name: &str, protocol: Protocol, node_port: Option<u16>) -> ServicePort {
        ServicePort {
            name: ServicePortName {
                namespace: "default".into(),
                name: "web".into(),
                port: name.into(),
            },
            protocol,
            port: 80,
            cluster_ips: vec!["10.96.0.10".parse().unwrap()],
            node_port,
            external_ips: Vec::new(),
            load_balancer_ingress: Vec::new(),
            source_ranges: Vec::new(),
            session_affinity: Default::default(),
            external_traffic_policy: Default::default(),
            internal_traffic_policy: Default::default(),
            health_check_node_port: None,
            endpoints: Default::default(),
        }
    }

    fn with_health(mut port: ServicePort, health: u16) -> ServicePort {
        port.health_check_node_port = Some(health);
        port
    }

    const RANGE: PortRange = PortRange::DEFAULT;

    fn node_ports(ports: &[ServicePort]) -> Vec<Option<u16>> {
        ports.iter().map(|p| p.node_port).collect()
    }

    #[test]
    fn table() {
        struct Row {
            name: &'static str,
            ports: Vec<ServicePort>,
            previous: Vec<ServicePort>,
            held: &'static [u16],
            want: Vec<Option<u16>>,
            reasons: Vec<RefusalReason>,
        }
        let tcp = Protocol::Tcp;
        let udp = Protocol::Udp;
        let rows = vec![
            Row {
                name: "in range, free: programmed",
                ports: vec![mk_port("http", tcp, Some(30080))],
                previous: vec![],
                held: &[],
                want: vec![Some(30080)],
                reasons: vec![],
            },
            Row {
                name: "both ends of the range are in it",
                ports: vec![
                    mk_port("a", tcp, Some(30000)),
                    mk_port("b", tcp, Some(32767)),
                ],
                previous: vec![],
                held: &[],
                want: vec![Some(30000), Some(32767)],
                reasons: vec![],
            },
            Row {
                name: "created out of range: no node port",
                ports: vec![mk_port("http", tcp, Some(40123))],
                previous: vec![],
                held: &[],
                want: vec![None],
                reasons: vec![RefusalReason::OutOfRange(RANGE)],
            },
            Row {
                name: "one past the range",
                ports: vec![mk_port("http", tcp, Some(32768))],
                previous: vec![],
                held: &[],
                want: vec![None],
                reasons: vec![RefusalReason::OutOfRange(RANGE)],
            },
            Row {
                name: "updated out of range: keeps the last good port",
                ports: vec![mk_port("http", tcp, Some(40123))],
                previous: vec![mk_port("http", tcp, Some(30080))],
                held: &[],
                want: vec![Some(30080)],
                reasons: vec![RefusalReason::OutOfRange(RANGE)],
            },
            Row {
                name: "held by another Service at create: none",
                ports: vec![mk_port("http", tcp, Some(30080))],
                previous: vec![],
                held: &[30080],
                want: vec![None],
                reasons: vec![RefusalReason::HeldByAnotherService],
            },
            Row {
                name: "updated to a held port: keeps the last good port",
                ports: vec![mk_port("http", tcp, Some(30081))],
                previous: vec![mk_port("http", tcp, Some(30080))],
                held: &[30081],
                want: vec![Some(30080)],
                reasons: vec![RefusalReason::HeldByAnotherService],
            },
            Row {
                name: "the last good value is matched by name and protocol",
                ports: vec![
                    mk_port("dns", tcp, Some(40053)),
                    mk_port("dns", udp, Some(30053)),
                ],
                previous: vec![
                    mk_port("dns", tcp, Some(30054)),
                    mk_port("dns", udp, Some(30053)),
                ],
                held: &[],
                want: vec![Some(30054), Some(30053)],
                reasons: vec![RefusalReason::OutOfRange(RANGE)],
            },
            Row {
                name: "a renamed port has no last good value",
                ports: vec![mk_port("web", tcp, Some(40080))],
                previous: vec![mk_port("http", tcp, Some(30080))],
                held: &[],
                want: vec![None],
                reasons: vec![RefusalReason::OutOfRange(RANGE)],
            },
            Row {
                name: "no node port requested: nothing refused",
                ports: vec![mk_port("http", tcp, None)],
                previous: vec![mk_port("http", tcp, Some(30080))],
                held: &[],
                want: vec![None],
                reasons: vec![],
            },
        ];
        for row in rows {
            let mut ports = row.ports;
            let held = row.held;
            let refusals =
                admit_node_ports(&mut ports, &row.previous, RANGE, |p| held.contains(&p));
            assert_eq!(node_ports(&ports), row.want, "{}", row.name);
            let reasons: Vec<RefusalReason> = refusals.iter().map(|r| r.reason).collect();
            assert_eq!(reasons, row.reasons, "{}", row.name);
        }
    }

    #[test]
    fn a_smaller_range_is_honoured() {
        let range = PortRange {
            first: 31000,
            last: 31999,
        };
        let mut ports = vec![mk_port("http", Protocol::Tcp, Some(30080))];
        let refusals = admit_node_ports(&mut ports, &[], range, |_| false);
        assert_eq!(ports[0].node_port, None);
        assert_eq!(
            refusals[0].to_string(),
            "nodePort 30080: provided port is not in the valid range. \
             The range of valid ports is 31000-31999; no node port programmed"
        );
    }

    #[test]
    fn health_check_node_port_keeps_its_last_good_value_once_per_service() {
        let previous = vec![
            with_health(mk_port("a", Protocol::Tcp, Some(30080)), 30100),
            with_health(mk_port("b", Protocol::Tcp, Some(30081)), 30100),
        ];
        let mut ports = vec![
            with_health(mk_port("a", Protocol::Tcp, Some(30080)), 40100),
            with_health(mk_port("b", Protocol::Tcp, Some(30081)), 40100),
        ];
        let refusals = admit_node_ports(&mut ports, &previous, RANGE, |_| false);
        assert!(ports
            .iter()
            .all(|p| p.health_check_node_port == Some(30100)));
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].field, NodePortField::HealthCheckNodePort);
        assert_eq!(
            refusals[0].to_string(),
            "healthCheckNodePort 40100: provided port is not in the valid range. \
             The range of valid ports is 30000-32767; keeping 30100"
        );
    }

    #[test]
    fn uses_node_port_sees_both_fields() {
        let ports = vec![with_health(mk_port("a", Protocol::Tcp, Some(30080)), 30100)];
        assert!(uses_node_port(&ports, 30080));
        assert!(uses_node_port(&ports, 30100));
        assert!(!uses_node_port(&ports, 30081));
    }
}
