//! Who may hold the same LoadBalancer IP: Services with the same sharing key whose ports
//! do not overlap per protocol, and that either both use `externalTrafficPolicy: Cluster`
//! or both select the same pods.

use std::fmt::Display;
use std::net::IpAddr;

use berth_core::{Labels, Protocol, TrafficPolicy};

use crate::error::IpamError;

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) sharing_key: Option<String>,
    pub(crate) policy: TrafficPolicy,
    pub(crate) selector: Labels,
    pub(crate) ports: Vec<LbPort>,
}

/// Checks that `new` may join `others` (every other holder of `ip`). Both `Local` Services
/// with equal selectors count as selecting the same pods, an empty selector included (as
/// MetalLB's backend key does); a `Cluster` and a `Local` Service with equal selectors do
/// too, since they reach the same pods.
pub(crate) fn check_sharing<K: Display>(
    ip: IpAddr,
    new: &Holder,
    others: &[(&K, &Holder)],
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
        check_sharing(ip, new, &[(&"ns/old", other)]).map_err(|e| e.to_string())
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
    fn nobody_else_means_no_conflict() {
        let ip: IpAddr = "198.18.0.200".parse().unwrap();
        let h = mk_holder(None, TrafficPolicy::Local, &[], &[]);
        assert!(check_sharing::<String>(ip, &h, &[]).is_ok());
    }
}
