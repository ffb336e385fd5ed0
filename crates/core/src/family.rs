//! IP families and `spec.ipFamilyPolicy`, spelled as Kubernetes spells them.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::UnknownValue;

/// `IPv4` or `IPv6`, as in `spec.ipFamilies`; also the family of one iptables instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// Both families, IPv4 first.
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// The family of an address. An IPv4-mapped IPv6 address counts as IPv6, as in Go.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// Whether `ip` is of this family.
    pub fn contains(self, ip: IpAddr) -> bool {
        Self::of(ip) == self
    }

    /// The other family.
    pub fn other(self) -> Self {
        match self {
            Self::V4 => Self::V6,
            Self::V6 => Self::V4,
        }
    }

    /// Position in per-family arrays: 0 for IPv4, 1 for IPv6.
    pub fn index(self) -> usize {
        match self {
            Self::V4 => 0,
            Self::V6 => 1,
        }
    }

    /// Address width in bits.
    pub fn bits(self) -> u32 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }

    /// The API spelling, `IPv4` or `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IpFamily {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "IPv4" => Ok(Self::V4),
            "IPv6" => Ok(Self::V6),
            other => Err(UnknownValue {
                what: "IP family",
                value: other.to_string(),
            }),
        }
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamilyPolicy {
    SingleStack,
    PreferDualStack,
    RequireDualStack,
}

impl IpFamilyPolicy {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SingleStack => "SingleStack",
            Self::PreferDualStack => "PreferDualStack",
            Self::RequireDualStack => "RequireDualStack",
        }
    }
}

impl fmt::Display for IpFamilyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IpFamilyPolicy {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "SingleStack" => Ok(Self::SingleStack),
            "PreferDualStack" => Ok(Self::PreferDualStack),
            "RequireDualStack" => Ok(Self::RequireDualStack),
            other => Err(UnknownValue {
                what: "IP family policy",
                value: other.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use IpFamily::{V4, V6};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn families_of_addresses() {
        assert_eq!(IpFamily::of(ip("10.0.0.1")), V4);
        assert_eq!(IpFamily::of(ip("::1")), V6);
        assert_eq!(IpFamily::of(ip("::ffff:10.0.0.1")), V6);
        assert!(V4.contains(ip("10.0.0.1")));
        assert!(!V4.contains(ip("fd00::1")));
        assert_eq!((V4.other(), V6.other()), (V6, V4));
        assert_eq!((V4.index(), V6.index()), (0, 1));
        assert_eq!((V4.bits(), V6.bits()), (32, 128));
        assert_eq!(IpFamily::ALL, [V4, V6]);
    }

    #[test]
    fn parses_and_prints_api_spellings() {
        for f in IpFamily::ALL {
            assert_eq!(f.as_str().parse::<IpFamily>().unwrap(), f);
        }
        assert_eq!(V4.to_string(), "IPv4");
        assert_eq!(V6.to_string(), "IPv6");
        for p in [
            IpFamilyPolicy::SingleStack,
            IpFamilyPolicy::PreferDualStack,
            IpFamilyPolicy::RequireDualStack,
        ] {
            assert_eq!(p.to_string().parse::<IpFamilyPolicy>().unwrap(), p);
        }
        assert_eq!(
            "IPv5".parse::<IpFamily>().unwrap_err().to_string(),
            "unsupported IP family \"IPv5\""
        );
        assert_eq!(
            "Dual".parse::<IpFamilyPolicy>().unwrap_err().to_string(),
            "unsupported IP family policy \"Dual\""
        );
    }
}
