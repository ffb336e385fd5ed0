//! Plain types shared by the allocators: owner keys, and addresses as numbers.

use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};

use berth_core::{from_u128, IpFamily};

use crate::error::Error;

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

/// The inverse of [`berth_core::to_u128`]. IPv4 values above 32 bits wrap, which callers never pass; the
/// allocators keep values inside their family, so this needs no `Option`.
pub(crate) fn u128_to_ip(family: IpFamily, value: u128) -> IpAddr {
    let value = match family {
        IpFamily::V4 => value & u128::from(u32::MAX),
        IpFamily::V6 => value,
    };
    from_u128(family, value).unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED))
}

/// Adopts `(owner, value)` pairs one by one in the order given (oldest Service first, so the
/// first claimant wins) and returns the refused ones with the reason, for Warning Events.
pub(crate) fn adopt_in_order<K, V: Copy>(
    existing: impl IntoIterator<Item = (K, V)>,
    mut adopt: impl FnMut(&K, V) -> Result<(), Error>,
) -> Vec<(K, V, Error)> {
    existing
        .into_iter()
        .filter_map(|(owner, value)| adopt(&owner, value).err().map(|e| (owner, value, e)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::to_u128;

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
            assert_eq!(u128_to_ip(IpFamily::of(ip), to_u128(ip)), ip);
        }
    }

    #[test]
    fn key_spelling() {
        assert_eq!(ServiceKey::new("default", "web").to_string(), "default/web");
    }
}
