//! Plain types shared by the allocators: owner keys and protocols.

use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::family::IpFamily;

/// What an allocator needs from an owner key: cheap equality, hashing and a total order
/// (for reproducible reports), and a Display for error messages.
pub trait OwnerKey: Clone + Eq + Hash + Ord + fmt::Display {}

impl<T: Clone + Eq + Hash + Ord + fmt::Display> OwnerKey for T {}

/// The usual owner: a Service by namespace and name. Displays as `namespace/name`.
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

/// Written out so `clone_from` reuses the target's string buffers: the allocators keep
/// freed owner slots and refill them this way, without allocating.
impl Clone for ServiceKey {
    fn clone(&self) -> Self {
        Self {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.namespace.clone_from(&source.namespace);
        self.name.clone_from(&source.name);
    }
}

impl ServiceKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Service port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "TCP" => Ok(Self::Tcp),
            "UDP" => Ok(Self::Udp),
            "SCTP" => Ok(Self::Sctp),
            other => Err(format!("unsupported protocol {other:?}")),
        }
    }
}

/// An address as a number within its family (IPv4 in the low 32 bits).
pub(crate) fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inverse of [`ip_to_u128`]; IPv4 values above 32 bits wrap, which callers never pass.
pub(crate) fn u128_to_ip(family: IpFamily, value: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_numbers_round_trip() {
        for s in [
            "0.0.0.0",
            "10.96.0.1",
            "255.255.255.255",
            "::",
            "fd00::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            let ip: IpAddr = s.parse().unwrap();
            assert_eq!(u128_to_ip(IpFamily::of(ip), ip_to_u128(ip)), ip);
        }
    }

    #[test]
    fn protocol_and_key_spellings() {
        for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(p.as_str().parse::<Protocol>().unwrap(), p);
        }
        assert!("ICMP".parse::<Protocol>().is_err());
        assert_eq!(ServiceKey::new("default", "web").to_string(), "default/web");
    }
}
