//! Who may hold the same LoadBalancer IP: Services with the same sharing key whose ports
//! do not overlap per protocol, and that either both use `externalTrafficPolicy: Cluster`
//! or both select the same pods (the same selector in the same namespace). A sharing key is
//! a namespace's own: Services of two namespaces share only when each one names the other's
//! namespace (or `*`) in `berth.dev/sharing-cross-namespace`, as Cilium's
//! `sharing-cross-namespace`, so a tenant cannot join another's address by guessing its key.

use std::fmt::Display;
use std::net::IpAddr;

use berth_core::{Labels, Protocol, TrafficPolicy};

use crate::error::Error;

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
    pub(crate) namespace: String,
    /// Other namespaces whose Services may share with this one (`*`: any).
    pub(crate) shares_with: Vec<String>,
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
) -> Result<(), Error> {
    if others.is_empty() {
        return Ok(());
    }
    let cannot = |reason: String| Error::CannotShare {
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
        if other.namespace != new.namespace
            && !(admits(new, &other.namespace) && admits(other, &new.namespace))
        {
            return Err(cannot(format!(
                "sharing across namespaces needs the {CROSS} annotation on both Services, naming \
                 the other's namespace ({:?} and {:?})",
                new.namespace, other.namespace
            )));
        }
        let both_cluster =
            other.policy == TrafficPolicy::Cluster && new.policy == TrafficPolicy::Cluster;
        if !both_cluster && (other.selector != new.selector || other.namespace != new.namespace) {
            return Err(cannot(
                "Services sharing an address must all use externalTrafficPolicy Cluster or select the same pods"
                    .into(),
            ));
        }
    }
    for port in &new.ports {
        if others.iter().any(|(_, o)| o.ports.contains(port)) {
            return Err(Error::PortInUse {
                port: port.to_string(),
                ip,
            });
        }
    }
    Ok(())
}

/// berth-api's `annotation::SHARING_CROSS_NAMESPACE` (this crate knows no Kubernetes names).
const CROSS: &str = "berth.dev/sharing-cross-namespace";

/// Whether `holder` lets a Service of `namespace` share its address.
fn admits(holder: &Holder, namespace: &str) -> bool {
    holder
        .shares_with
        .iter()
        .any(|n| n == "*" || n == namespace)
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
            namespace: "ns".into(),
            shares_with: Vec::new(),
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
    fn a_sharing_key_crosses_namespaces_only_with_both_sides_consent() {
        use Protocol::Tcp;
        use TrafficPolicy::{Cluster, Local};
        let web = [("app", "web")];
        let in_ns = |ns: &str, policy, shares: &[&str], port| Holder {
            namespace: ns.into(),
            shares_with: shares.iter().map(|s| s.to_string()).collect(),
            ..mk_holder(Some("k"), policy, &web, &[(Tcp, port)])
        };
        let refused = "can't share 198.18.0.200 with ns/old: sharing across namespaces needs the \
                       berth.dev/sharing-cross-namespace annotation on both Services, naming the \
                       other's namespace (\"tenant-b\" and \"tenant-a\")";
        let same_pods = "can't share 198.18.0.200 with ns/old: Services sharing an address must \
                         all use externalTrafficPolicy Cluster or select the same pods";
        // (what, new, existing, verdict)
        let rows: Vec<(&str, Holder, Holder, Result<(), &str>)> = vec![
            (
                "no opt-in",
                in_ns("tenant-b", Cluster, &[], 443),
                in_ns("tenant-a", Cluster, &[], 80),
                Err(refused),
            ),
            (
                "only the joiner opts in",
                in_ns("tenant-b", Cluster, &["tenant-a"], 443),
                in_ns("tenant-a", Cluster, &[], 80),
                Err(refused),
            ),
            (
                "only the holder opts in",
                in_ns("tenant-b", Cluster, &[], 443),
                in_ns("tenant-a", Cluster, &["tenant-b"], 80),
                Err(refused),
            ),
            (
                "each names a third namespace",
                in_ns("tenant-b", Cluster, &["tenant-c"], 443),
                in_ns("tenant-a", Cluster, &["tenant-c"], 80),
                Err(refused),
            ),
            (
                "both name each other",
                in_ns("tenant-b", Cluster, &["tenant-a"], 443),
                in_ns("tenant-a", Cluster, &["tenant-b"], 80),
                Ok(()),
            ),
            (
                "both allow any",
                in_ns("tenant-b", Cluster, &["*"], 443),
                in_ns("tenant-a", Cluster, &["*"], 80),
                Ok(()),
            ),
            (
                // Equal selectors in two namespaces select different pods.
                "Local, consented, same selector in another namespace",
                in_ns("tenant-b", Local, &["tenant-a"], 443),
                in_ns("tenant-a", Local, &["tenant-b"], 80),
                Err(same_pods),
            ),
            (
                "Local, same namespace, same selector",
                in_ns("tenant-a", Local, &[], 443),
                in_ns("tenant-a", Local, &[], 80),
                Ok(()),
            ),
            (
                "the same namespace needs no opt-in",
                in_ns("tenant-a", Cluster, &[], 443),
                in_ns("tenant-a", Cluster, &[], 80),
                Ok(()),
            ),
        ];
        for (what, new, other, want) in rows {
            assert_eq!(check(&new, &other), want.map_err(String::from), "{what}");
        }
    }

    #[test]
    fn nobody_else_means_no_conflict() {
        let ip: IpAddr = "198.18.0.200".parse().unwrap();
        let h = mk_holder(None, TrafficPolicy::Local, &[], &[]);
        assert!(check_sharing::<String>(ip, &h, &[]).is_ok());
    }
}
