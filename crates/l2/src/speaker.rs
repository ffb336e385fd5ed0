//! One task per interface: answers requests from the current [`Answers`], keeps the
//! solicited-node groups of the IPv6 addresses it owns joined, and sends the gratuitous rounds
//! after each takeover.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

use crate::answers::{Answers, IpAnswer};
use crate::frame::client::read_answer;
use crate::frame::{build_gratuitous, solicited_node, Mac};
use crate::responder::{respond, Ignored};
use crate::schedule::GratuitousSchedule;
use crate::transport::Link;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AddressLabels {
    pub address: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

/// The states of [`L2Metrics::addresses`], one per [`IpAnswer`] (and `Elsewhere` split by
/// whether anyone was elected).
const ADDRESS_STATES: [&str; 4] = ["owned", "elsewhere", "unowned", "not_advertised"];

/// The announcer's counters and gauges; clones share their values.
#[derive(Debug, Clone, Default)]
pub struct L2Metrics {
    pub requests_received: Counter,
    pub replies_sent: Counter,
    pub gratuitous_sent: Counter,
    pub ownership_changes: Counter,
    pub ignored: Family<ReasonLabels, Counter>,
    /// One series per address this node answers for, so the agents' series together show an
    /// address answered by two nodes (the series of a given-up address goes away).
    pub announced: Family<AddressLabels, Gauge>,
    /// Addresses of this node's view by election outcome; `unowned` has no candidate node.
    pub addresses: Family<StateLabels, Gauge>,
    /// Gratuitous announcements by another host of an address this node answers for.
    pub conflicts: Family<AddressLabels, Counter>,
}

impl L2Metrics {
    /// Registers the counters in `registry` (the agent's `berth_l2_` sub-registry).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = L2Metrics::default();
        registry.register(
            "requests_received",
            "ARP requests and Neighbor Solicitations received",
            metrics.requests_received.clone(),
        );
        registry.register(
            "replies_sent",
            "ARP replies and Neighbor Advertisements sent in answer",
            metrics.replies_sent.clone(),
        );
        registry.register(
            "gratuitous_sent",
            "Gratuitous ARP and unsolicited Neighbor Advertisement frames sent",
            metrics.gratuitous_sent.clone(),
        );
        registry.register(
            "ownership_changes",
            "Addresses this node took over or gave up",
            metrics.ownership_changes.clone(),
        );
        registry.register(
            "requests_ignored",
            "Requests left unanswered, by reason",
            metrics.ignored.clone(),
        );
        registry.register(
            "announced",
            "1 for each LoadBalancer address this node answers for",
            metrics.announced.clone(),
        );
        registry.register(
            "addresses",
            "LoadBalancer addresses in this node's view, by election outcome (owned here, elsewhere, unowned: no candidate node, not_advertised)",
            metrics.addresses.clone(),
        );
        registry.register(
            "conflicts",
            "Gratuitous announcements by another host of an address this node answers for",
            metrics.conflicts.clone(),
        );
        for state in ADDRESS_STATES {
            metrics
                .addresses
                .get_or_create(&StateLabels { state })
                .set(0);
        }
        metrics
    }

    /// Sets the gauges from the table the responders now read.
    pub fn observe_answers(&self, answers: &Answers) {
        let mut counts = [0i64; ADDRESS_STATES.len()];
        self.announced.clear();
        for (ip, entry) in &answers.ips {
            let state = match &entry.answer {
                IpAnswer::Owned(_) => {
                    self.announced
                        .get_or_create(&AddressLabels {
                            address: ip.to_string(),
                        })
                        .set(1);
                    0
                }
                IpAnswer::Elsewhere { owner: Some(_) } => 1,
                IpAnswer::Elsewhere { owner: None } => 2,
                IpAnswer::NotAdvertised => 3,
            };
            counts[state] += 1;
        }
        for (state, count) in ADDRESS_STATES.into_iter().zip(counts) {
            self.addresses
                .get_or_create(&StateLabels { state })
                .set(count);
        }
    }

    fn observe_ignored(&self, ignored: &Ignored) {
        self.ignored
            .get_or_create(&ReasonLabels {
                reason: ignored.label(),
            })
            .inc();
    }
}

/// The addresses `answers` has this interface answer for.
fn owned_here(answers: &Answers, interface: &str) -> BTreeSet<IpAddr> {
    answers
        .owned()
        .filter(|o| o.interfaces.contains(interface))
        .map(|o| o.ip)
        .collect()
}

fn groups_of(owned: &BTreeSet<IpAddr>) -> BTreeSet<Ipv6Addr> {
    owned
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(ip) => Some(solicited_node(*ip)),
            IpAddr::V4(_) => None,
        })
        .collect()
}

/// Serves `link` until `stop` resolves or the answers' sender is dropped; gratuitous rounds
/// after takeovers only.
pub async fn run_link<L: Link>(
    link: L,
    answers: watch::Receiver<Arc<Answers>>,
    metrics: L2Metrics,
    stop: impl std::future::Future<Output = ()>,
) {
    run_link_refreshing(link, answers, metrics, None, stop).await;
}

/// [`run_link`], and every owned address announced again every `refresh` after its takeover
/// rounds.
pub async fn run_link_refreshing<L: Link>(
    link: L,
    answers: watch::Receiver<Arc<Answers>>,
    metrics: L2Metrics,
    refresh: Option<std::time::Duration>,
    stop: impl std::future::Future<Output = ()>,
) {
    let options = LinkOptions {
        refresh,
        ..LinkOptions::default()
    };
    run_link_with(link, answers, metrics, options, stop).await;
}

/// What a speaker does besides answering from the table.
#[derive(Debug, Default, Clone)]
pub struct LinkOptions {
    /// Owned addresses are announced again this often after their takeover rounds.
    pub refresh: Option<std::time::Duration>,
    /// Until when this node may answer at all (berth-membership's verdict): checked on every
    /// request and every gratuitous round, so a node cut off from its peers, or stopped and
    /// continued, is silent on time even before its table is recomputed. `None`: always.
    pub until: Option<watch::Receiver<Option<std::time::Instant>>>,
    /// Where to report another host's gratuitous announcement of an address this interface
    /// answers for.
    pub conflicts: Option<mpsc::UnboundedSender<Conflict>>,
}

/// Another host announced an address this node answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub ip: IpAddr,
    pub mac: Mac,
    pub interface: String,
}

/// Whether `until` lets this node answer at `now`.
pub fn may_answer(until: Option<std::time::Instant>, now: std::time::Instant) -> bool {
    until.is_none_or(|until| now < until)
}

/// A gratuitous announcement in `frame`, by another MAC than `ours`, of an address in `owned`.
pub fn find_conflict(frame: &[u8], ours: Mac, owned: &BTreeSet<IpAddr>) -> Option<(IpAddr, Mac)> {
    let answer = read_answer(frame)?;
    (answer.gratuitous && answer.mac != ours && owned.contains(&answer.ip))
        .then_some((answer.ip, answer.mac))
}

/// [`run_link`] with [`LinkOptions`].
pub async fn run_link_with<L: Link>(
    mut link: L,
    mut answers: watch::Receiver<Arc<Answers>>,
    metrics: L2Metrics,
    options: LinkOptions,
    stop: impl std::future::Future<Output = ()>,
) {
    let LinkOptions {
        refresh,
        until,
        conflicts,
    } = options;
    let allowed = || {
        let now = tokio::time::Instant::now().into_std();
        may_answer(until.as_ref().and_then(|u| *u.borrow()), now)
    };
    let name = link.interface().name.clone();
    let mut owned: BTreeSet<IpAddr> = BTreeSet::new();
    let mut groups: BTreeSet<Ipv6Addr> = BTreeSet::new();
    let mut schedule = GratuitousSchedule::with_refresh(refresh);
    let mut current = answers.borrow_and_update().clone();
    let mut refresh = true;
    tokio::pin!(stop);
    loop {
        if refresh {
            refresh = false;
            let now_owned = owned_here(&current, &name);
            // tokio's clock, so tests can run it paused.
            let now = tokio::time::Instant::now().into_std();
            for ip in now_owned.difference(&owned) {
                tracing::info!(interface = %name, %ip, "announcing");
                schedule.start(*ip, now);
            }
            for ip in owned.difference(&now_owned) {
                tracing::info!(interface = %name, %ip, "no longer announcing");
                schedule.stop(*ip);
            }
            let wanted = groups_of(&now_owned);
            for group in wanted.difference(&groups) {
                if let Err(err) = link.join(*group) {
                    tracing::warn!(interface = %name, %group, error = %err, "joining a solicited-node group failed");
                }
            }
            for group in groups.difference(&wanted) {
                if let Err(err) = link.leave(*group) {
                    tracing::debug!(interface = %name, %group, error = %err, "leaving a solicited-node group failed");
                }
            }
            groups = wanted;
            owned = now_owned;
        }
        let due = schedule.take_due(tokio::time::Instant::now().into_std());
        for ip in due.into_iter().filter(|_| allowed()) {
            for frame in build_gratuitous(link.interface().mac, ip) {
                match link.send(&frame) {
                    Ok(()) => {
                        metrics.gratuitous_sent.inc();
                    }
                    Err(err) => {
                        tracing::debug!(interface = %name, %ip, error = %err, "gratuitous send failed");
                    }
                }
            }
        }
        let next = schedule.next_due();
        let frame = tokio::select! {
            () = &mut stop => return,
            changed = answers.changed() => {
                if changed.is_err() {
                    return;
                }
                current = answers.borrow_and_update().clone();
                refresh = true;
                continue;
            }
            () = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => continue,
            frame = link.recv() => frame,
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(err) => {
                tracing::warn!(interface = %name, error = %err, "receiving failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let interface = link.interface().clone();
        // A withdrawn node (stopped and continued, cut off) answers for nothing: the peers that
        // took its addresses over announce them rightly, whatever its stale table says.
        let conflict = find_conflict(&frame, interface.mac, &owned).filter(|_| allowed());
        if let Some((ip, mac)) = conflict {
            tracing::warn!(interface = %name, %ip, mac = ?mac, "another host announces an address this node answers for");
            metrics
                .conflicts
                .get_or_create(&AddressLabels {
                    address: ip.to_string(),
                })
                .inc();
            if let Some(tx) = &conflicts {
                let _ = tx.send(Conflict {
                    ip,
                    mac,
                    interface: name.clone(),
                });
            }
        }
        match respond(&frame, &interface, |ip, iface| current.decide(ip, iface)) {
            Ok(_) if !allowed() => {
                metrics.requests_received.inc();
                metrics
                    .ignored
                    .get_or_create(&ReasonLabels {
                        reason: "withdrawn",
                    })
                    .inc();
            }
            Ok(reply) => {
                metrics.requests_received.inc();
                match link.send(&reply) {
                    Ok(()) => {
                        metrics.replies_sent.inc();
                    }
                    Err(err) => {
                        tracing::debug!(interface = %name, error = %err, "reply send failed");
                    }
                }
            }
            Err(ignored) => {
                if !matches!(ignored, Ignored::NotARequest | Ignored::FromSelf) {
                    metrics.requests_received.inc();
                }
                tracing::trace!(interface = %name, reason = ?ignored, "ignored");
                metrics.observe_ignored(&ignored);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const OURS: Mac = [2, 0, 0, 0, 0, 1];
    const THEIRS: Mac = [2, 0, 0, 0, 0, 9];

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn another_hosts_gratuitous_announcement_of_an_owned_address_is_a_conflict() {
        let owned: BTreeSet<IpAddr> = [ip("198.18.0.200"), ip("fd00::200")].into();
        for frame in build_gratuitous(THEIRS, ip("198.18.0.200")) {
            assert_eq!(
                find_conflict(&frame, OURS, &owned),
                Some((ip("198.18.0.200"), THEIRS))
            );
        }
        for frame in build_gratuitous(THEIRS, ip("fd00::200")) {
            assert_eq!(
                find_conflict(&frame, OURS, &owned),
                Some((ip("fd00::200"), THEIRS))
            );
        }
        // Our own announcements, another address, and a request are no conflict.
        for frame in build_gratuitous(OURS, ip("198.18.0.200")) {
            assert_eq!(find_conflict(&frame, OURS, &owned), None);
        }
        for frame in build_gratuitous(THEIRS, ip("198.18.0.201")) {
            assert_eq!(find_conflict(&frame, OURS, &owned), None);
        }
        let request = crate::frame::client::build_arp_request(
            THEIRS,
            std::net::Ipv4Addr::new(198, 18, 0, 100),
            std::net::Ipv4Addr::new(198, 18, 0, 200),
        );
        assert_eq!(find_conflict(&request, OURS, &owned), None);
    }

    #[test]
    fn answers_stop_at_the_deadline() {
        let now = Instant::now();
        assert!(may_answer(None, now));
        assert!(may_answer(Some(now + Duration::from_millis(1)), now));
        assert!(!may_answer(Some(now), now));
        assert!(!may_answer(Some(now - Duration::from_millis(1)), now));
    }
}
