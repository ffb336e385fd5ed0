//! NodePorts from `--node-port-range`. A port number belongs to one owner, who may use it
//! for TCP and UDP alike.

use std::collections::HashMap;
use std::sync::Arc;

use berth_core::{FieldError, FieldErrorKind, FieldErrors, PortRange, Protocol};
use rand::rngs::SmallRng;

use crate::band::{pick_random, static_band};
use crate::error::{Error, PortField};
use crate::hash::FxHashMap;
use crate::offsets::OffsetSet;
use crate::types::{adopt_in_order, OwnerKey};

/// One entry of `spec.ports` as node-port allocation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServicePortSpec {
    /// `port` (the Service port).
    pub port: u16,
    pub protocol: Protocol,
    /// `nodePort`, `None` when unset (0).
    pub node_port: Option<u16>,
}

/// What a Service needs from the node-port range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePortRequest {
    /// Empty for ClusterIP/ExternalName Services (which then hold no node ports).
    pub ports: Vec<ServicePortSpec>,
    /// `allocateLoadBalancerNodePorts` (true for NodePort Services): false keeps requested
    /// ports but assigns none.
    pub allocate_node_ports: bool,
    /// `Some(requested)` when a `healthCheckNodePort` is needed (LoadBalancer with
    /// `externalTrafficPolicy: Local`); the inner value is a requested port, if any.
    pub health_check: Option<Option<u16>>,
}

/// The node ports a Service holds, per `spec.ports` index, and its health-check port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePortAssignment {
    pub node_ports: Vec<Option<u16>>,
    pub health_check_node_port: Option<u16>,
}

/// NodePort allocator over one range, with the API server's static band
/// (`min(max(16, size/32), 128)`) and random dynamic allocation.
#[derive(Debug, Clone)]
pub struct NodePortAllocator<K: OwnerKey> {
    range: PortRange,
    band: u128,
    /// Offsets from `range.first`.
    used: OffsetSet,
    /// Holder per offset; owners are shared with `by_owner`, so no key is cloned per port.
    holders: Vec<Option<Arc<K>>>,
    by_owner: FxHashMap<K, (Arc<K>, Vec<u16>)>,
    rng: SmallRng,
}

impl<K: OwnerKey> NodePortAllocator<K> {
    pub fn new(range: PortRange, rng: SmallRng) -> Self {
        let size = u128::from(range.size());
        Self {
            range,
            band: static_band(size, 16, 128, 32),
            used: OffsetSet::for_size(size),
            holders: vec![None; range.size() as usize],
            by_owner: FxHashMap::default(),
            rng,
        }
    }

    pub fn range(&self) -> PortRange {
        self.range
    }

    /// A new free port for `owner` (each call takes another one).
    pub fn allocate(&mut self, owner: &K) -> Result<u16, Error> {
        let size = u128::from(self.range.size());
        let offset =
            pick_random(&self.used, size, self.band, &mut self.rng).ok_or(Error::PortRangeFull)?;
        self.used.insert(offset);
        // offset < size <= 65536 - first, so the sum is a valid port.
        let port = self.range.first + offset as u16;
        self.record(owner, port);
        Ok(port)
    }

    /// Reserves `port` for `owner`; succeeds without change if the owner already holds it.
    /// Errors carry no field path; [`Error::at_field`] adds one
    /// (`spec.ports[0].nodePort: Invalid value: 40000: ...`).
    pub fn allocate_specific(&mut self, owner: &K, port: u16) -> Result<(), Error> {
        let at = PortField { path: None, port };
        if !self.range.contains(port) {
            return Err(Error::PortNotInRange {
                at,
                range: self.range,
            });
        }
        match self.owner_of(port) {
            Some(holder) if holder == owner => Ok(()),
            Some(_) => Err(Error::PortAlreadyAllocated { at }),
            None => {
                self.used.insert(u128::from(port - self.range.first));
                self.record(owner, port);
                Ok(())
            }
        }
    }

    /// Records a port found on an existing Service while rebuilding state; oldest first.
    pub fn adopt(&mut self, owner: &K, port: u16) -> Result<(), Error> {
        self.allocate_specific(owner, port)
    }

    /// Adopts `(owner, port)` pairs in the order given (oldest Service first); returns the
    /// refused ones with the reason.
    pub fn adopt_all<I>(&mut self, existing: I) -> Vec<(K, u16, Error)>
    where
        I: IntoIterator<Item = (K, u16)>,
    {
        adopt_in_order(existing, |owner, port| self.adopt(owner, port))
    }

    /// Frees `port`; returns whether it was held. Freeing a free port does nothing. The
    /// owner stays known (cheaply) until [`Self::release_owner`].
    pub fn release(&mut self, port: u16) -> bool {
        let Some(owner) = self.slot(port).and_then(Option::take) else {
            return false;
        };
        self.used.remove(u128::from(port - self.range.first));
        if let Some((_, ports)) = self.by_owner.get_mut(&*owner) {
            ports.retain(|p| *p != port);
        }
        true
    }

    /// Frees every port `owner` holds and forgets the owner; returns the ports (ascending).
    pub fn release_owner(&mut self, owner: &K) -> Vec<u16> {
        let ports = self.ports_of(owner);
        for p in &ports {
            self.release(*p);
        }
        self.by_owner.remove(owner);
        ports
    }

    fn slot(&mut self, port: u16) -> Option<&mut Option<Arc<K>>> {
        let offset = port.checked_sub(self.range.first)?;
        self.holders.get_mut(usize::from(offset))
    }

    pub fn owner_of(&self, port: u16) -> Option<&K> {
        let offset = port.checked_sub(self.range.first)?;
        self.holders.get(usize::from(offset))?.as_deref()
    }

    /// The ports `owner` holds, ascending.
    pub fn ports_of(&self, owner: &K) -> Vec<u16> {
        let mut ports = self
            .by_owner
            .get(owner)
            .map(|(_, p)| p.clone())
            .unwrap_or_default();
        ports.sort_unstable();
        ports
    }

    pub fn used(&self) -> u32 {
        self.used.len() as u32
    }

    pub fn free(&self) -> u32 {
        self.range.size() - self.used()
    }

    /// Makes `owner` hold exactly the node ports its Service needs, as the API server does
    /// on create: a requested `nodePort` is reserved; entries sharing a Service `port`
    /// number (TCP and UDP on 53, say) share one node port; others get a random one
    /// (unless `allocate_node_ports` is false); a health-check port is reserved or
    /// allocated when needed. Ports the owner held that are no longer used are released.
    /// All or nothing: on error the owner keeps what it held before.
    pub fn assign_service(
        &mut self,
        owner: &K,
        req: &NodePortRequest,
    ) -> Result<NodePortAssignment, Error> {
        if let Some(dup) = duplicate_node_port(&req.ports) {
            return Err(Error::Invalid(FieldErrors(vec![dup])));
        }
        let before = self.ports_of(owner);
        let mut taken: Vec<u16> = Vec::new();
        let result = self.assign_inner(owner, req, &mut taken);
        match result {
            Ok(assignment) => {
                let keep: Vec<u16> = assignment
                    .node_ports
                    .iter()
                    .flatten()
                    .chain(assignment.health_check_node_port.iter())
                    .copied()
                    .collect();
                for p in before.iter().filter(|p| !keep.contains(p)) {
                    self.release(*p);
                }
                Ok(assignment)
            }
            Err(e) => {
                for p in taken.iter().filter(|p| !before.contains(p)) {
                    self.release(*p);
                }
                Err(e)
            }
        }
    }

    fn assign_inner(
        &mut self,
        owner: &K,
        req: &NodePortRequest,
        taken: &mut Vec<u16>,
    ) -> Result<NodePortAssignment, Error> {
        let mut by_service_port: HashMap<u16, u16> = HashMap::new();
        let mut node_ports = Vec::with_capacity(req.ports.len());
        for (i, sp) in req.ports.iter().enumerate() {
            let path = || format!("spec.ports[{i}].nodePort");
            let wanted = sp
                .node_port
                .or_else(|| by_service_port.get(&sp.port).copied())
                .or_else(|| {
                    // A later entry for the same Service port may name the node port.
                    req.ports
                        .iter()
                        .find(|other| other.port == sp.port && other.node_port.is_some())
                        .and_then(|other| other.node_port)
                });
            let port = match wanted {
                Some(p) => {
                    self.allocate_specific(owner, p)
                        .map_err(|e| e.at_field(path()))?;
                    p
                }
                None if req.allocate_node_ports => self.allocate(owner)?,
                None => {
                    node_ports.push(None);
                    continue;
                }
            };
            taken.push(port);
            by_service_port.entry(sp.port).or_insert(port);
            node_ports.push(Some(port));
        }
        let health_check_node_port = match req.health_check {
            None => None,
            Some(Some(p)) => {
                if node_ports.contains(&Some(p)) {
                    return Err(Error::HealthCheckPort {
                        port: p,
                        reason: "provided port is already allocated".into(),
                    });
                }
                self.allocate_specific(owner, p)
                    .map_err(|e| Error::HealthCheckPort {
                        port: p,
                        reason: e.to_string(),
                    })?;
                taken.push(p);
                Some(p)
            }
            Some(None) => {
                let p = self
                    .allocate(owner)
                    .map_err(|_| Error::HealthCheckPortRangeFull)?;
                taken.push(p);
                Some(p)
            }
        };
        Ok(NodePortAssignment {
            node_ports,
            health_check_node_port,
        })
    }

    fn record(&mut self, owner: &K, port: u16) {
        let key = match self.by_owner.get_mut(owner) {
            Some((key, ports)) => {
                ports.push(port);
                key.clone()
            }
            None => {
                let key = Arc::new(owner.clone());
                self.by_owner
                    .insert(owner.clone(), (key.clone(), vec![port]));
                key
            }
        };
        if let Some(slot) = self.slot(port) {
            *slot = Some(key);
        }
    }
}

/// The API server rejects one node port used twice for the same protocol.
fn duplicate_node_port(ports: &[ServicePortSpec]) -> Option<FieldError> {
    ports.iter().enumerate().find_map(|(i, sp)| {
        let np = sp.node_port?;
        ports[..i]
            .iter()
            .any(|o| o.node_port == Some(np) && o.protocol == sp.protocol)
            .then(|| FieldError {
                path: format!("spec.ports[{i}].nodePort"),
                kind: FieldErrorKind::Duplicate {
                    value: np.to_string(),
                },
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn mk_alloc(range: &str) -> NodePortAllocator<String> {
        NodePortAllocator::new(range.parse().unwrap(), SmallRng::seed_from_u64(3))
    }

    fn sp(port: u16, protocol: Protocol, node_port: Option<u16>) -> ServicePortSpec {
        ServicePortSpec {
            port,
            protocol,
            node_port,
        }
    }

    fn o(s: &str) -> String {
        s.to_string()
    }

    #[test]
    fn apiserver_wording() {
        let mut a = mk_alloc("30000-32767");
        let req = |np| NodePortRequest {
            ports: vec![sp(80, Protocol::Tcp, Some(np))],
            allocate_node_ports: true,
            health_check: None,
        };
        assert_eq!(
            a.assign_service(&o("a"), &req(40000)).unwrap_err().to_string(),
            "spec.ports[0].nodePort: Invalid value: 40000: provided port is not in the valid range. The range of valid ports is 30000-32767"
        );
        a.assign_service(&o("a"), &req(30080)).unwrap();
        assert_eq!(
            a.assign_service(&o("b"), &req(30080))
                .unwrap_err()
                .to_string(),
            "spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated"
        );
        assert_eq!(
            a.allocate_specific(&o("b"), 30080).unwrap_err().to_string(),
            "provided port is already allocated"
        );
    }

    #[test]
    fn one_port_number_serves_tcp_and_udp_of_one_service() {
        let mut a = mk_alloc("30000-32767");
        let req = NodePortRequest {
            ports: vec![
                sp(53, Protocol::Tcp, None),
                sp(53, Protocol::Udp, Some(30053)),
                sp(80, Protocol::Tcp, None),
            ],
            allocate_node_ports: true,
            health_check: None,
        };
        let got = a.assign_service(&o("dns"), &req).unwrap();
        assert_eq!(got.node_ports[0], Some(30053));
        assert_eq!(got.node_ports[1], Some(30053));
        let p80 = got.node_ports[2].unwrap();
        assert_ne!(p80, 30053);
        assert_eq!(a.used(), 2);
        // Idempotent on retry with the written values.
        let again = NodePortRequest {
            ports: vec![
                sp(53, Protocol::Tcp, Some(30053)),
                sp(53, Protocol::Udp, Some(30053)),
                sp(80, Protocol::Tcp, Some(p80)),
            ],
            ..req
        };
        assert_eq!(a.assign_service(&o("dns"), &again).unwrap(), got);
        assert_eq!(a.used(), 2);
    }

    #[test]
    fn duplicate_node_port_for_one_protocol_is_rejected() {
        let mut a = mk_alloc("30000-32767");
        let req = NodePortRequest {
            ports: vec![
                sp(80, Protocol::Tcp, Some(30080)),
                sp(81, Protocol::Tcp, Some(30080)),
            ],
            allocate_node_ports: true,
            health_check: None,
        };
        assert_eq!(
            a.assign_service(&o("a"), &req).unwrap_err().to_string(),
            "spec.ports[1].nodePort: Duplicate value: 30080"
        );
    }

    #[test]
    fn no_automatic_ports_when_disabled_but_requests_kept() {
        let mut a = mk_alloc("30000-32767");
        let req = NodePortRequest {
            ports: vec![
                sp(80, Protocol::Tcp, None),
                sp(443, Protocol::Tcp, Some(30443)),
            ],
            allocate_node_ports: false,
            health_check: None,
        };
        let got = a.assign_service(&o("lb"), &req).unwrap();
        assert_eq!(got.node_ports, vec![None, Some(30443)]);
        assert_eq!(a.ports_of(&o("lb")), vec![30443]);
    }

    #[test]
    fn health_check_port_is_distinct_kept_and_released() {
        let mut a = mk_alloc("30000-32767");
        let mut req = NodePortRequest {
            ports: vec![sp(80, Protocol::Tcp, Some(30080))],
            allocate_node_ports: true,
            health_check: Some(None),
        };
        let got = a.assign_service(&o("lb"), &req).unwrap();
        let hc = got.health_check_node_port.unwrap();
        assert_ne!(hc, 30080);
        req.health_check = Some(Some(hc));
        assert_eq!(
            a.assign_service(&o("lb"), &req).unwrap(),
            got,
            "kept on retry"
        );
        assert_eq!(a.used(), 2);
        req.health_check = Some(Some(30080));
        assert_eq!(
            a.assign_service(&o("lb"), &req).unwrap_err().to_string(),
            "failed to allocate requested HealthCheck NodePort 30080: provided port is already allocated"
        );
        req.health_check = None;
        a.assign_service(&o("lb"), &req).unwrap();
        assert_eq!(
            a.ports_of(&o("lb")),
            vec![30080],
            "health-check port released"
        );
        // Type change to ClusterIP: no ports at all.
        req.ports.clear();
        a.assign_service(&o("lb"), &req).unwrap();
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn adopt_all_keeps_the_oldest_claimant() {
        let mut a = mk_alloc("30000-32767");
        let refused = a.adopt_all(vec![
            (o("old"), 30080),
            (o("young"), 30080),
            (o("old"), 30081),
        ]);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0, o("young"));
        assert_eq!(
            refused[0].2.to_string(),
            "provided port is already allocated"
        );
        assert_eq!(a.ports_of(&o("old")), vec![30080, 30081]);
    }

    #[test]
    fn failure_rolls_back_and_full_range_reports() {
        let mut a = mk_alloc("30000-30001");
        a.allocate_specific(&o("x"), 30001).unwrap();
        let req = NodePortRequest {
            ports: vec![sp(80, Protocol::Tcp, None), sp(81, Protocol::Tcp, None)],
            allocate_node_ports: true,
            health_check: None,
        };
        assert_eq!(
            a.assign_service(&o("a"), &req).unwrap_err().to_string(),
            "failed to allocate a nodePort: range is full"
        );
        assert_eq!(a.used(), 1, "the port taken before the failure is released");
        assert_eq!(a.release_owner(&o("x")), vec![30001]);
        assert!(!a.release(30001));
        assert_eq!(a.free(), 2);
    }
}
