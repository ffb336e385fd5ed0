//! `spec.externalTrafficPolicy` and `spec.internalTrafficPolicy`.

/// Where traffic may go: any ready endpoint (`Cluster`) or only those on the receiving node
/// (`Local`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

impl TrafficPolicy {
    /// The policy a spec field asks for. `Local` is the only value that changes anything; the
    /// apiserver defaults the field to `Cluster`.
    pub fn from_spec(value: Option<&str>) -> Self {
        if value == Some("Local") {
            Self::Local
        } else {
            Self::Cluster
        }
    }

    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cluster => "Cluster",
            Self::Local => "Local",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_is_local() {
        assert_eq!(
            TrafficPolicy::from_spec(Some("Local")),
            TrafficPolicy::Local
        );
        assert_eq!(
            TrafficPolicy::from_spec(Some("Cluster")),
            TrafficPolicy::Cluster
        );
        assert_eq!(TrafficPolicy::from_spec(None), TrafficPolicy::Cluster);
        assert_eq!(
            TrafficPolicy::from_spec(Some("local")),
            TrafficPolicy::Cluster
        );
        assert_eq!(TrafficPolicy::default(), TrafficPolicy::Cluster);
        assert_eq!(TrafficPolicy::Local.as_str(), "Local");
    }
}
