//! Port ranges such as `--service-node-port-range`, printed and parsed as `30000-32767`.

use std::fmt;
use std::str::FromStr;

/// An inclusive port range with `first <= last` and no port 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

/// Why a port range did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid node port range {range:?}: {reason}")]
pub struct PortRangeError {
    pub range: String,
    pub reason: String,
}

impl PortRange {
    /// Kubernetes' default `--service-node-port-range`.
    pub const DEFAULT: PortRange = PortRange {
        first: 30000,
        last: 32767,
    };

    /// Number of ports in the range.
    pub fn size(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for PortRange {
    type Err = PortRangeError;

    /// Accepts `first-last`, `first+count` (the API server's other form) and a single port.
    fn from_str(s: &str) -> Result<Self, PortRangeError> {
        let invalid = |reason: &str| PortRangeError {
            range: s.to_string(),
            reason: reason.to_string(),
        };
        let num = |t: &str| {
            t.trim()
                .parse::<u16>()
                .map_err(|_| invalid("not a port number"))
        };
        let (first, last) = if let Some((a, b)) = s.split_once('-') {
            (num(a)?, num(b)?)
        } else if let Some((a, n)) = s.split_once('+') {
            let first = num(a)?;
            let last = first
                .checked_add(num(n)?)
                .ok_or_else(|| invalid("range ends beyond port 65535"))?;
            (first, last)
        } else {
            let p = num(s)?;
            (p, p)
        };
        if first == 0 {
            return Err(invalid("port 0 cannot be a node port"));
        }
        if first > last {
            return Err(invalid("the first port is after the last"));
        }
        Ok(Self { first, last })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges() {
        assert_eq!(
            "30000-32767".parse::<PortRange>().unwrap(),
            PortRange::DEFAULT
        );
        assert_eq!(
            "30000+2767".parse::<PortRange>().unwrap(),
            PortRange::DEFAULT
        );
        assert_eq!("30000".parse::<PortRange>().unwrap().size(), 1);
        for bad in ["0-10", "20-10", "a-b", "65535+1", ""] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad}");
        }
        assert_eq!(PortRange::DEFAULT.to_string(), "30000-32767");
        assert_eq!(PortRange::DEFAULT.size(), 2768);
        assert!(PortRange::DEFAULT.contains(30000) && PortRange::DEFAULT.contains(32767));
        assert!(!PortRange::DEFAULT.contains(32768));
    }

    #[test]
    fn errors_say_what_and_why() {
        assert_eq!(
            "20-10".parse::<PortRange>().unwrap_err().to_string(),
            "invalid node port range \"20-10\": the first port is after the last"
        );
        assert_eq!(
            "65535+1".parse::<PortRange>().unwrap_err().reason,
            "range ends beyond port 65535"
        );
    }
}
