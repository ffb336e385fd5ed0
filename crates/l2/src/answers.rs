//! What this node answers for, computed from the index: the table the responders read, and the
//! difference between two tables (what the announcer must start or stop announcing).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use berth_core::AddressRange;

use crate::election::Interfaces;

/// A Service by namespace and name.
pub type ServiceKey = (String, String);

/// The decision for one address held by at least one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpAnswer {
    /// This node owns the address and answers on these interfaces.
    Owned(Interfaces),
    /// Another node owns it (or nobody: `None`).
    Elsewhere { owner: Option<String> },
    /// No L2Advertisement selects its pool.
    NotAdvertised,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpEntry {
    pub answer: IpAnswer,
    /// The Services holding the address, in order.
    pub services: BTreeSet<ServiceKey>,
}

/// Why a request for an address is not answered; tests and metrics read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The address lies in no IPPool.
    NotInPool,
    /// In a pool, but no LoadBalancer Service holds it.
    NotOurs,
    /// Its pool is selected by no L2Advertisement.
    NotAdvertised,
    /// Another node was elected (or none could be).
    NotElected { owner: Option<String> },
    /// This node owns it, but not on the interface the request came in on.
    InterfaceNotSelected,
}

/// The table a responder consults, one snapshot per change of the view.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    pub(crate) pools: Vec<AddressRange>,
    pub(crate) ips: BTreeMap<IpAddr, IpEntry>,
}

/// An address this node owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned<'a> {
    pub ip: IpAddr,
    pub interfaces: &'a Interfaces,
    pub services: &'a BTreeSet<ServiceKey>,
}

impl Answers {
    /// Whether a request for `ip` arriving on `interface` is answered, and if not, why.
    pub fn decide(&self, ip: IpAddr, interface: &str) -> Result<(), Refusal> {
        if !self.pools.iter().any(|r| r.contains(ip)) {
            return Err(Refusal::NotInPool);
        }
        let Some(entry) = self.ips.get(&ip) else {
            return Err(Refusal::NotOurs);
        };
        match &entry.answer {
            IpAnswer::NotAdvertised => Err(Refusal::NotAdvertised),
            IpAnswer::Elsewhere { owner } => Err(Refusal::NotElected {
                owner: owner.clone(),
            }),
            IpAnswer::Owned(interfaces) if interfaces.contains(interface) => Ok(()),
            IpAnswer::Owned(_) => Err(Refusal::InterfaceNotSelected),
        }
    }

    pub fn entry(&self, ip: IpAddr) -> Option<&IpEntry> {
        self.ips.get(&ip)
    }

    /// Every address this node owns, in order.
    pub fn owned(&self) -> impl Iterator<Item = Owned<'_>> {
        self.ips
            .iter()
            .filter_map(|(ip, entry)| match &entry.answer {
                IpAnswer::Owned(interfaces) => Some(Owned {
                    ip: *ip,
                    interfaces,
                    services: &entry.services,
                }),
                _ => None,
            })
    }

    /// Whether this node owns `ip` on `interface`.
    pub fn owns_on(&self, ip: IpAddr, interface: &str) -> bool {
        self.decide(ip, interface).is_ok()
    }
}

/// What changed between two tables, for this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnershipChanges {
    /// Addresses this node now owns and did not (or now owns on other interfaces): announce
    /// them gratuitously.
    pub gained: Vec<IpAddr>,
    /// Addresses it no longer owns.
    pub lost: Vec<IpAddr>,
    /// Services whose owned address is new to them: their announcing-node annotation is due.
    pub services: Vec<(ServiceKey, IpAddr)>,
}

impl OwnershipChanges {
    pub fn is_empty(&self) -> bool {
        self.gained.is_empty() && self.lost.is_empty() && self.services.is_empty()
    }
}

/// The difference from `old` to `new`.
pub fn diff_ownership(old: &Answers, new: &Answers) -> OwnershipChanges {
    let mut changes = OwnershipChanges::default();
    let before: BTreeMap<IpAddr, Owned<'_>> = old.owned().map(|o| (o.ip, o)).collect();
    let after: BTreeMap<IpAddr, Owned<'_>> = new.owned().map(|o| (o.ip, o)).collect();
    for (ip, owned) in &after {
        let previous = before.get(ip);
        if previous.is_none_or(|p| p.interfaces != owned.interfaces) {
            changes.gained.push(*ip);
        }
        for service in owned.services {
            if previous.is_none_or(|p| !p.services.contains(service)) {
                changes.services.push((service.clone(), *ip));
            }
        }
    }
    changes.lost = before
        .keys()
        .filter(|ip| !after.contains_key(ip))
        .copied()
        .collect();
    changes
}
