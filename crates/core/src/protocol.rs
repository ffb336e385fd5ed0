//! A Service port's protocol.

use std::fmt;
use std::str::FromStr;

use crate::UnknownValue;

/// `TCP`, `UDP` or `SCTP`. Ordered TCP, UDP, SCTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The API spelling (`TCP`), which is also what kube-proxy's chain-name hashes are built from.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }

    /// The protocol of a port spec: unset is TCP, as the apiserver defaults it; an unknown
    /// spelling is `None`.
    pub fn from_spec(value: Option<&str>) -> Option<Self> {
        value.unwrap_or("TCP").parse().ok()
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "TCP" => Ok(Self::Tcp),
            "UDP" => Ok(Self::Udp),
            "SCTP" => Ok(Self::Sctp),
            other => Err(UnknownValue {
                what: "protocol",
                value: other.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings() {
        for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(p.as_str().parse::<Protocol>().unwrap(), p);
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(
            "ICMP".parse::<Protocol>().unwrap_err().to_string(),
            "unsupported protocol \"ICMP\""
        );
        assert!("tcp".parse::<Protocol>().is_err());
    }

    #[test]
    fn unset_is_tcp() {
        assert_eq!(Protocol::from_spec(None), Some(Protocol::Tcp));
        assert_eq!(Protocol::from_spec(Some("UDP")), Some(Protocol::Udp));
        assert_eq!(Protocol::from_spec(Some("ICMP")), None);
        assert!(Protocol::Tcp < Protocol::Udp && Protocol::Udp < Protocol::Sctp);
    }
}
