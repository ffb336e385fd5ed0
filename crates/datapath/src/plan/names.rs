//! Chain names: fixed top-level chains and hashed per-Service / per-endpoint chains.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::plan::input::{Endpoint, ServicePortName};
use crate::plan::model::ChainName;
use berth_core::Protocol;

pub const SERVICES: &str = "BERTH-SERVICES";
pub const EXTERNAL_SERVICES: &str = "BERTH-EXTERNAL-SERVICES";
pub const NODEPORTS: &str = "BERTH-NODEPORTS";
pub const POSTROUTING: &str = "BERTH-POSTROUTING";
pub const MARK_MASQ: &str = "BERTH-MARK-MASQ";
pub const FORWARD: &str = "BERTH-FORWARD";
/// Drops load-balancer traffic that `BERTH-FW-*` did not accept (nat cannot drop).
pub const PROXY_FIREWALL: &str = "BERTH-PROXY-FIREWALL";
/// Filter: new connections to a Service CIDR that were not translated (kube-proxy's
/// `cluster-ips-check`): REJECT for a ClusterIP (a port its Service does not have), else DROP.
pub const CLUSTER_IPS: &str = "BERTH-CLUSTER-IPS";
/// An empty chain nobody else creates: if it is gone, someone flushed iptables and berth resyncs fully.
pub const CANARY: &str = "BERTH-CANARY";
/// The prefix of an endpoint chain's name; a 16-character hash follows ([`endpoint_chain`]).
pub const ENDPOINT_CHAIN_PREFIX: &str = "BERTH-SEP-";

pub fn fixed(name: &'static str) -> ChainName {
    ChainName::new(name)
}

/// First 16 characters of base32(sha256(input)), as kube-proxy names its chains.
pub fn hash16(input: &str) -> String {
    let mut hash = String::with_capacity(16);
    push_hash16(&mut hash, format_args!("{input}"));
    hash
}

/// Appends [`hash16`] of the formatted `input` to `out`, without building the input as a string
/// first: names are made for every endpoint of every Service (100,000 at a cold plan).
fn push_hash16(out: &mut String, input: fmt::Arguments<'_>) {
    struct Hashing(Sha256);
    impl fmt::Write for Hashing {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0.update(s.as_bytes());
            Ok(())
        }
    }
    let mut hashing = Hashing(Sha256::new());
    // Writing into a hash cannot fail; a Display that fails would only change the name.
    let _ = fmt::write(&mut hashing, input);
    let digest = hashing.0.finalize();
    // Base32 turns each 5 bytes into 8 characters: the first 10 bytes are the first 16.
    data_encoding::BASE32.encode_append(&digest[..10], out);
}

/// `prefix` followed by the hash of `input`.
fn hashed_name(prefix: &str, input: fmt::Arguments<'_>) -> ChainName {
    let mut name = String::with_capacity(prefix.len() + 16);
    name.push_str(prefix);
    push_hash16(&mut name, input);
    ChainName::new(name)
}

/// The hash shared by a Service port's SVC/SVL/EXT/FW chains: port name plus protocol.
pub fn service_port_hash(name: &ServicePortName, protocol: Protocol) -> String {
    let mut hash = String::with_capacity(16);
    push_hash16(&mut hash, format_args!("{name}{}", protocol.as_str()));
    hash
}

/// Per-Service-port chains, one variant per role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceChain {
    /// Cluster policy: every usable endpoint.
    Cluster,
    /// Local policy: this node's endpoints.
    Local,
    /// External destinations (node ports, external IPs, LB IPs).
    External,
    /// `loadBalancerSourceRanges`.
    Firewall,
}

impl ServiceChain {
    fn prefix(self) -> &'static str {
        match self {
            ServiceChain::Cluster => "BERTH-SVC-",
            ServiceChain::Local => "BERTH-SVL-",
            ServiceChain::External => "BERTH-EXT-",
            ServiceChain::Firewall => "BERTH-FW-",
        }
    }
}

pub fn service_chain(kind: ServiceChain, name: &ServicePortName, protocol: Protocol) -> ChainName {
    hashed_name(kind.prefix(), format_args!("{name}{}", protocol.as_str()))
}

pub fn endpoint_chain(
    name: &ServicePortName,
    protocol: Protocol,
    endpoint: &Endpoint,
) -> ChainName {
    hashed_name(
        ENDPOINT_CHAIN_PREFIX,
        format_args!("{name}{}{}", protocol.as_str(), endpoint.address()),
    )
}

/// Kinds of dispatch-tree chains: by destination address, and by node port.
pub const DISPATCH_DST: &str = "DST";
pub const DISPATCH_NODE_PORT: &str = "NP";
/// The filter tree of ClusterIPs below [`CLUSTER_IPS`].
pub const DISPATCH_CLUSTER_IP: &str = "CIP";

/// Whether the chain is an inner node or leaf of a dispatch tree.
pub fn is_dispatch_chain(chain: &ChainName) -> bool {
    [DISPATCH_DST, DISPATCH_NODE_PORT, DISPATCH_CLUSTER_IP]
        .iter()
        .any(|kind| {
            chain
                .as_str()
                .strip_prefix("BERTH-")
                .and_then(|rest| rest.strip_prefix(kind))
                .is_some_and(|rest| rest.starts_with('-'))
        })
}

/// A dispatch-tree chain, named after the key range it covers (`kind` separates the trees).
pub fn dispatch_chain(kind: &str, range: &str) -> ChainName {
    ChainName::new(format!("BERTH-{kind}-{}", hash16(range)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::MAX_CHAIN_NAME;

    /// A ready endpoint on no node: names depend only on its address.
    fn mk_ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            hints: None,
        }
    }

    fn name() -> ServicePortName {
        ServicePortName {
            namespace: "ns1".into(),
            name: "svc1".into(),
            port: "p80".into(),
        }
    }

    #[test]
    fn hash_is_kube_proxy_shaped() {
        let hash = service_port_hash(&name(), Protocol::Tcp);
        assert_eq!(hash.len(), 16);
        assert!(hash
            .chars()
            .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c)));
        // Same input as kube-proxy's servicePortChainName("ns1/svc1:p80", "tcp") upper-cased protocol.
        assert_eq!(hash, hash16("ns1/svc1:p80TCP"));
        assert_ne!(hash, service_port_hash(&name(), Protocol::Udp));
    }

    #[test]
    fn hash16_is_the_head_of_the_whole_digest_in_base32() {
        // kube-proxy's definition, kept literally: encode the whole digest, keep 16 characters.
        let reference = |input: &str| {
            let mut encoded = data_encoding::BASE32.encode(&Sha256::digest(input.as_bytes()));
            encoded.truncate(16);
            encoded
        };
        for input in [
            "",
            "ns1/svc1:p80TCP",
            "ns1/svc1:p80tcp10.244.1.5:8080",
            "é/ü:ß",
        ] {
            assert_eq!(hash16(input), reference(input), "{input:?}");
        }
        let endpoint = mk_ep("fd00:10:244::5", 8080);
        assert_eq!(
            endpoint_chain(&name(), Protocol::Udp, &endpoint).as_str(),
            format!(
                "BERTH-SEP-{}",
                reference(&format!("ns1/svc1:p80UDP{}", endpoint.address()))
            )
        );
        assert_eq!(
            service_chain(ServiceChain::External, &name(), Protocol::Sctp).as_str(),
            format!("BERTH-EXT-{}", reference("ns1/svc1:p80SCTP"))
        );
    }

    #[test]
    fn chain_names_fit_iptables_limit() {
        let endpoint = mk_ep("fd00::1234:5678:9abc", 65535);
        for chain in [
            service_chain(ServiceChain::Cluster, &name(), Protocol::Sctp),
            service_chain(ServiceChain::Firewall, &name(), Protocol::Sctp),
            endpoint_chain(&name(), Protocol::Sctp, &endpoint),
            dispatch_chain("DST", "fd00::/7"),
            dispatch_chain("NP", "tcp 30000-32767"),
            dispatch_chain(DISPATCH_CLUSTER_IP, "fd00:96::/112"),
            fixed(CLUSTER_IPS),
            fixed(EXTERNAL_SERVICES),
            fixed(PROXY_FIREWALL),
        ] {
            assert!(chain.as_str().len() <= MAX_CHAIN_NAME, "{chain}");
            assert!(chain.is_berth());
        }
    }

    #[test]
    fn endpoint_chain_depends_on_endpoint() {
        let mut endpoint = mk_ep("10.244.1.5", 8080);
        let first = endpoint_chain(&name(), Protocol::Tcp, &endpoint);
        endpoint.port = 8081;
        assert_ne!(first, endpoint_chain(&name(), Protocol::Tcp, &endpoint));
    }
}
