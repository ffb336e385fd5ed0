//! What this node answers for, computed from the index: the table the responders read, and the
//! difference between two tables (what the announcer must start or stop announcing).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

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
    /// Entries are shared between successive tables: the index re-elects only what changed.
    pub(crate) ips: BTreeMap<IpAddr, Arc<IpEntry>>,
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
        self.ips.get(&ip).map(Arc::as_ref)
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
}

/// What changed between two tables, for this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnershipChanges {
    /// Addresses this node now owns and did not (or now owns on other interfaces): announce
    /// them gratuitously.
    pub gained: Vec<IpAddr>,
    /// Addresses it no longer owns.
    pub lost: Vec<IpAddr>,
    /// Services whose owned address is new to them: their "announcing from node X" Event is due.
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

/// Break before make: an address this node takes from an owner that is still live (the move
/// comes from a change both see — endpoints, labels, advertisements — not from a death) is
/// answered only after a delay, so the old owner, reacting to the same change, stops first.
/// Addresses taken from a dead owner, or from nobody, are answered at once. Pure: the caller
/// passes the time.
///
/// A planned handover: when this node (re)gains liveness, every address it gains waits the
/// (shorter) handover delay from that moment, whoever answered it before. Its peers count it
/// live when its first heartbeat saying so arrives, and stop answering what it takes at once;
/// the handover delay covers that heartbeat's way. Agents that become live together wait too,
/// so they hear of each other before answering.
#[derive(Debug, Clone)]
pub struct TakeoverDelay {
    delay: std::time::Duration,
    handover: std::time::Duration,
    returned: Option<std::time::Instant>,
    waiting: BTreeMap<IpAddr, std::time::Instant>,
}

impl TakeoverDelay {
    pub fn new(delay: std::time::Duration) -> Self {
        TakeoverDelay {
            delay,
            handover: delay,
            returned: None,
            waiting: BTreeMap::new(),
        }
    }

    /// The delay of a planned handover (see the type).
    pub fn with_handover(mut self, handover: std::time::Duration) -> Self {
        self.handover = handover;
        self
    }

    /// This node just became live.
    pub fn returned(&mut self, now: std::time::Instant) {
        self.returned = Some(now);
    }

    /// `next`, with the takeovers from live owners still waiting shown as the old owner's.
    /// `published` is the table answered from until now; `live` the live nodes.
    pub fn apply(
        &mut self,
        published: &Answers,
        mut next: Answers,
        live: &BTreeSet<String>,
        now: std::time::Instant,
    ) -> Answers {
        let owned_now: BTreeSet<IpAddr> = next.owned().map(|o| o.ip).collect();
        self.waiting.retain(|ip, _| owned_now.contains(ip));
        let handover_end = self
            .returned
            .map(|at| at + self.handover)
            .filter(|end| now < *end);
        if handover_end.is_none() {
            self.returned = None;
        }
        for ip in owned_now {
            let before = published.ips.get(&ip).map(|e| &e.answer);
            if let Some(end) = handover_end {
                if !matches!(before, Some(IpAnswer::Owned(_))) {
                    let due = *self.waiting.entry(ip).or_insert(end);
                    if now < due {
                        if let Some(entry) = next.ips.get_mut(&ip) {
                            Arc::make_mut(entry).answer = match before {
                                Some(answer) => answer.clone(),
                                None => IpAnswer::Elsewhere { owner: None },
                            };
                        }
                        continue;
                    }
                    self.waiting.remove(&ip);
                    continue;
                }
            }
            let previous_owner = match before {
                Some(IpAnswer::Elsewhere { owner: Some(owner) }) => owner.clone(),
                _ => {
                    self.waiting.remove(&ip);
                    continue;
                }
            };
            if !live.contains(&previous_owner) {
                self.waiting.remove(&ip);
                continue;
            }
            let due = *self.waiting.entry(ip).or_insert(now + self.delay);
            if now >= due {
                self.waiting.remove(&ip);
                continue;
            }
            if let Some(entry) = next.ips.get_mut(&ip) {
                Arc::make_mut(entry).answer = IpAnswer::Elsewhere {
                    owner: Some(previous_owner),
                };
            }
        }
        next
    }

    /// When the next waiting takeover is due.
    pub fn next_due(&self) -> Option<std::time::Instant> {
        self.waiting.values().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn table(entries: &[(&str, IpAnswer)]) -> Answers {
        Answers {
            pools: vec![berth_core::parse_address("198.18.0.200-198.18.0.250").expect("range")],
            ips: entries
                .iter()
                .map(|(ip, answer)| {
                    (
                        ip.parse().expect("ip"),
                        Arc::new(IpEntry {
                            answer: answer.clone(),
                            services: BTreeSet::new(),
                        }),
                    )
                })
                .collect(),
        }
    }

    fn elsewhere(owner: &str) -> IpAnswer {
        IpAnswer::Elsewhere {
            owner: Some(owner.into()),
        }
    }

    fn owned() -> IpAnswer {
        IpAnswer::Owned(crate::election::Interfaces::Any)
    }

    #[test]
    fn a_live_owner_stops_first_a_dead_one_is_replaced_at_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let live: BTreeSet<String> = ["n1", "n2"].iter().map(|s| s.to_string()).collect();
        let mut delay = TakeoverDelay::new(ms(300));
        let before = table(&[
            ("198.18.0.200", elsewhere("n2")),
            ("198.18.0.201", elsewhere("n3")),
        ]);
        let after = table(&[("198.18.0.200", owned()), ("198.18.0.201", owned())]);
        // n2 is live: .200 waits; n3 is dead: .201 is taken at once.
        let published = delay.apply(&before, after.clone(), &live, t0);
        assert!(published
            .decide("198.18.0.201".parse().expect("ip"), "eth0")
            .is_ok());
        assert_eq!(
            published.decide("198.18.0.200".parse().expect("ip"), "eth0"),
            Err(Refusal::NotElected {
                owner: Some("n2".into())
            })
        );
        assert_eq!(delay.next_due(), Some(t0 + ms(300)));
        let published = delay.apply(&published, after.clone(), &live, t0 + ms(299));
        assert!(published
            .decide("198.18.0.200".parse().expect("ip"), "eth0")
            .is_err());
        let published = delay.apply(&published, after.clone(), &live, t0 + ms(300));
        assert!(published
            .decide("198.18.0.200".parse().expect("ip"), "eth0")
            .is_ok());
        assert_eq!(delay.next_due(), None);
        // Losing is never delayed.
        let lost = delay.apply(&published, before.clone(), &live, t0 + ms(301));
        assert_eq!(lost, before);
    }

    #[test]
    fn a_returning_node_takes_everything_after_the_handover_delay_only() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let live: BTreeSet<String> = ["n1", "n2"].iter().map(|s| s.to_string()).collect();
        let mut delay = TakeoverDelay::new(ms(300)).with_handover(ms(60));
        let before = table(&[
            ("198.18.0.200", elsewhere("n2")),
            ("198.18.0.201", IpAnswer::Elsewhere { owner: None }),
        ]);
        let after = table(&[("198.18.0.200", owned()), ("198.18.0.201", owned())]);
        delay.returned(t0);
        // From a live owner and from nobody alike: wait for the handover, not 300 ms.
        let published = delay.apply(&before, after.clone(), &live, t0 + ms(10));
        assert_eq!(published, before);
        assert_eq!(delay.next_due(), Some(t0 + ms(60)));
        let published = delay.apply(&published, after.clone(), &live, t0 + ms(60));
        assert_eq!(published, after);
        assert_eq!(delay.next_due(), None);
        // Later moves from a live owner wait the full delay again.
        let moved = table(&[("198.18.0.200", elsewhere("n2")), ("198.18.0.201", owned())]);
        let published = delay.apply(&published, moved.clone(), &live, t0 + ms(500));
        assert_eq!(published, moved);
        let published = delay.apply(&published, after.clone(), &live, t0 + ms(600));
        assert!(published
            .decide("198.18.0.200".parse().expect("ip"), "eth0")
            .is_err());
        assert_eq!(delay.next_due(), Some(t0 + ms(900)));
    }

    #[test]
    fn a_takeover_abandoned_while_waiting_is_forgotten() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let live: BTreeSet<String> = ["n1", "n2"].iter().map(|s| s.to_string()).collect();
        let mut delay = TakeoverDelay::new(ms(300));
        let before = table(&[("198.18.0.200", elsewhere("n2"))]);
        let after = table(&[("198.18.0.200", owned())]);
        let published = delay.apply(&before, after.clone(), &live, t0);
        let back = delay.apply(&published, before.clone(), &live, t0 + ms(100));
        assert_eq!(back, before);
        assert_eq!(delay.next_due(), None);
        // The owner dies while we wait: taken at once.
        let published = delay.apply(&back, after.clone(), &live, t0 + ms(200));
        assert!(published
            .decide("198.18.0.200".parse().expect("ip"), "eth0")
            .is_err());
        let only_n1: BTreeSet<String> = ["n1".to_string()].into();
        let published = delay.apply(&published, after, &only_n1, t0 + ms(250));
        assert!(published
            .decide("198.18.0.200".parse().expect("ip"), "eth0")
            .is_ok());
    }
}
