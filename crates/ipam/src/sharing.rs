//! Who may hold the same LoadBalancer IP: Services with the same sharing key whose ports
//! do not overlap per protocol, and that either both use `externalTrafficPolicy: Cluster`
//! or both select the same pods.

use std::net::IpAddr;
use std::sync::Arc;

use crate::error::IpamError;
use crate::selector::Labels;
use crate::types::{OwnerKey, Protocol};

/// `spec.externalTrafficPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// A port a Service exposes on its LoadBalancer IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LbPort {
    pub protocol: Protocol,
    pub port: u16,
}

impl LbPort {
    pub fn new(protocol: Protocol, port: u16) -> Self {
        Self { protocol, port }
    }
}

impl std::fmt::Display for LbPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.protocol, self.port)
    }
}

/// What the sharing rules need to know about one holder of an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) sharing_key: Option<String>,
    pub(crate) policy: TrafficPolicy,
    pub(crate) selector: Labels,
    pub(crate) ports: Vec<LbPort>,
}

/// One holder of an address: the owner and its sharing data, both shared (`Arc`) with
/// the allocator's other maps so recording a holder never deep-copies them.
pub(crate) type Holding<K> = (Arc<K>, Arc<Holder>);

/// The holders of one address, sorted by owner. Nearly always a single Service, kept
/// inline so the common case costs no extra allocation or pointer chase.
#[derive(Debug, Clone)]
pub(crate) enum Holdings<K> {
    One(Holding<K>),
    Many(Vec<Holding<K>>),
}

impl<K: Ord> Holdings<K> {
    pub(crate) fn as_slice(&self) -> &[Holding<K>] {
        match self {
            Self::One(h) => std::slice::from_ref(h),
            Self::Many(v) => v,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    pub(crate) fn insert(&mut self, h: Holding<K>) {
        let mut all = match std::mem::replace(self, Self::Many(Vec::new())) {
            Self::One(first) => vec![first],
            Self::Many(v) => v,
        };
        let pos = all.partition_point(|(k, _)| *k < h.0);
        all.insert(pos, h);
        *self = match all.len() {
            1 => Self::One(all.remove(0)),
            _ => Self::Many(all),
        };
    }

    /// Removes `owner` (found by pointer); returns its sharing data.
    pub(crate) fn remove(&mut self, owner: &Arc<K>) -> Option<Arc<Holder>> {
        match self {
            Self::One((k, _)) if Arc::ptr_eq(k, owner) => {
                match std::mem::replace(self, Self::Many(Vec::new())) {
                    Self::One((_, h)) => Some(h),
                    Self::Many(_) => None,
                }
            }
            Self::One(_) => None,
            Self::Many(v) => {
                let pos = v.iter().position(|(k, _)| Arc::ptr_eq(k, owner))?;
                Some(v.remove(pos).1)
            }
        }
    }
}

/// Checks that `new` may join `others` (every other holder of `ip`). Both `Local` Services
/// with equal selectors count as selecting the same pods, an empty selector included (as
/// MetalLB's backend key does); a `Cluster` and a `Local` Service with equal selectors do
/// too, since they reach the same pods.
pub(crate) fn check_sharing<K: OwnerKey>(
    ip: IpAddr,
    new: &Holder,
    others: &[(Arc<K>, Arc<Holder>)],
) -> Result<(), IpamError> {
    if others.is_empty() {
        return Ok(());
    }
    let cannot = |reason: String| IpamError::CannotShare {
        ip,
        holders: others
            .iter()
            .map(|(k, _)| k.to_string())
            .collect::<Vec<_>>()
            .join(","),
        reason,
    };
    for (_, other) in others {
        match (&other.sharing_key, &new.sharing_key) {
            (None, _) => return Err(cannot("existing service does not allow sharing".into())),
            (_, None) => return Err(cannot("new service does not allow sharing".into())),
            (Some(have), Some(want)) if have != want => {
                return Err(cannot(format!(
                    "sharing key {want:?} does not match existing sharing key {have:?}"
                )))
            }
            _ => {}
        }
        let both_cluster =
            other.policy == TrafficPolicy::Cluster && new.policy == TrafficPolicy::Cluster;
        if !both_cluster && other.selector != new.selector {
            return Err(cannot(
                "Services sharing an address must all use externalTrafficPolicy Cluster or select the same pods"
                    .into(),
            ));
        }
    }
    for port in &new.ports {
        if others.iter().any(|(_, o)| o.ports.contains(port)) {
            return Err(IpamError::PortInUse {
                port: port.to_string(),
                ip,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_holder(
        key: Option<&str>,
        policy: TrafficPolicy,
        selector: &[(&str, &str)],
        ports: &[(Protocol, u16)],
    ) -> Holder {
        Holder {
            sharing_key: key.map(String::from),
            policy,
            selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ports: ports.iter().map(|(p, n)| LbPort::new(*p, *n)).collect(),
        }
    }

    fn check(new: &Holder, other: &Holder) -> Result<(), String> {
        let ip: IpAddr = "198.18.0.200".parse().unwrap();
        check_sharing(
            ip,
            new,
            &[(Arc::new("ns/old".to_string()), Arc::new(other.clone()))],
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn sharing_table() {
        use Protocol::{Tcp, Udp};
        use TrafficPolicy::{Cluster, Local};
        let web = [("app", "web")];
        let db = [("app", "db")];
        let cases: Vec<(Holder, Holder, Result<(), &str>)> = vec![
            (mk_holder(Some("k"), Cluster, &web, &[(Tcp, 80)]), mk_holder(Some("k"), Cluster, &db, &[(Tcp, 443)]), Ok(())),
            (mk_holder(Some("k"), Cluster, &web, &[(Udp, 53)]), mk_holder(Some("k"), Cluster, &db, &[(Tcp, 53)]), Ok(())),
            (mk_holder(Some("k"), Local, &web, &[(Tcp, 80)]), mk_holder(Some("k"), Local, &web, &[(Tcp, 443)]), Ok(())),
            (mk_holder(Some("k"), Local, &web, &[(Tcp, 80)]), mk_holder(Some("k"), Cluster, &web, &[(Tcp, 443)]), Ok(())),
            (
                mk_holder(Some("k"), Cluster, &web, &[(Tcp, 80)]),
                mk_holder(Some("k"), Cluster, &db, &[(Tcp, 80)]),
                Err("port TCP/80 is already in use on \"198.18.0.200\""),
            ),
            (
                mk_holder(Some("k"), Local, &web, &[(Tcp, 80)]),
                mk_holder(Some("k"), Local, &db, &[(Tcp, 443)]),
                Err("can't share 198.18.0.200 with ns/old: Services sharing an address must all use externalTrafficPolicy Cluster or select the same pods"),
            ),
            (
                mk_holder(Some("a"), Cluster, &web, &[(Tcp, 80)]),
                mk_holder(Some("b"), Cluster, &web, &[(Tcp, 443)]),
                Err("can't share 198.18.0.200 with ns/old: sharing key \"a\" does not match existing sharing key \"b\""),
            ),
            (
                mk_holder(None, Cluster, &web, &[(Tcp, 80)]),
                mk_holder(Some("k"), Cluster, &web, &[(Tcp, 443)]),
                Err("can't share 198.18.0.200 with ns/old: new service does not allow sharing"),
            ),
            (
                mk_holder(Some("k"), Cluster, &web, &[(Tcp, 80)]),
                mk_holder(None, Cluster, &web, &[(Tcp, 443)]),
                Err("can't share 198.18.0.200 with ns/old: existing service does not allow sharing"),
            ),
        ];
        for (new, other, want) in cases {
            assert_eq!(
                check(&new, &other),
                want.map_err(String::from),
                "{new:?} joining {other:?}"
            );
        }
    }

    #[test]
    fn holdings_stay_sorted_and_find_owners_by_pointer() {
        let h = Arc::new(mk_holder(Some("k"), TrafficPolicy::Cluster, &[], &[]));
        let (a, b, c) = (Arc::new("a"), Arc::new("b"), Arc::new("c"));
        let mut hs = Holdings::One((b.clone(), h.clone()));
        hs.insert((c.clone(), h.clone()));
        hs.insert((a.clone(), h.clone()));
        let names: Vec<&str> = hs.as_slice().iter().map(|(k, _)| **k).collect();
        assert_eq!(names, vec!["a", "b", "c"]);
        assert!(
            hs.remove(&Arc::new("b")).is_none(),
            "an equal name is not the same owner"
        );
        assert!(hs.remove(&b).is_some());
        assert!(hs.remove(&a).is_some());
        assert!(hs.remove(&c).is_some());
        assert!(hs.is_empty());
        let mut one = Holdings::One((a.clone(), h));
        assert!(one.remove(&c).is_none());
        assert!(one.remove(&a).is_some());
        assert!(one.is_empty());
    }

    #[test]
    fn nobody_else_means_no_conflict() {
        let ip: IpAddr = "198.18.0.200".parse().unwrap();
        let h = mk_holder(None, TrafficPolicy::Local, &[], &[]);
        assert!(check_sharing::<String>(ip, &h, &[]).is_ok());
    }
}
