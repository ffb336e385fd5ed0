//! `ControllerOptions` (what the flags say, already typed) -> `ControllerConfig` (checked once,
//! then trusted). The binary parses each flag with the functions here.

use std::time::Duration;

use berth_api::names::{class, lease};
use berth_core::PortRange;
use ipnet::IpNet;

use crate::Error;

/// Leader election settings (client-go's names and meaning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// This replica's identity in `holderIdentity`.
    pub identity: String,
    /// How long a holder's claim lasts after its last renewal; standbys wait this long.
    pub lease_duration: Duration,
    /// A leader that cannot renew for this long stops leading (before the lease expires).
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// Defaults as in kube-controller-manager: 15 s, 10 s, 2 s.
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            name: lease::CONTROLLER.to_string(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The durations must nest: retry < renew deadline < lease duration, so a leader gives
    /// up before anyone else may take over. [`ControllerOptions::validate`] checks this once;
    /// the elector trusts what it is given.
    pub fn validate(&self) -> Result<(), Error> {
        if self.lease_duration.as_secs() < 1 {
            return Err(Error::InvalidConfig(
                "--lease-duration must be at least 1s".into(),
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(Error::InvalidConfig(
                "--renew-deadline must be shorter than --lease-duration".into(),
            ));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(Error::InvalidConfig(
                "--retry-period must be positive and shorter than --renew-deadline".into(),
            ));
        }
        if self.name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return Err(Error::InvalidConfig(
                "lease name, namespace and identity must not be empty".into(),
            ));
        }
        Ok(())
    }
}

/// Everything the allocation and load-balancer controllers need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// One CIDR, or two of different families; the first is the default family.
    pub service_cidrs: Vec<IpNet>,
    pub node_port_range: PortRange,
    /// The class served for LoadBalancer Services without `loadBalancerClass`.
    pub default_class: Option<&'static str>,
    /// `None` runs without leader election (one replica).
    pub lease: Option<LeaseConfig>,
    /// Seed of the random ClusterIP and NodePort picks.
    pub seed: u64,
    /// Writes to the API server in flight at once.
    pub max_in_flight: usize,
    /// Reporting instance on Events.
    pub instance: String,
    /// `Some`: also maintain Endpoints and EndpointSlices (`--endpoints on`).
    pub endpoints: Option<crate::endpoints::EndpointsConfig>,
    /// How long a Service keeps a LoadBalancer address that left every IPPool before it is
    /// decided again (`--pool-gone-grace`); `None` (the default, MetalLB's behaviour) keeps it
    /// until the Service changes.
    pub pool_gone_grace: Option<Duration>,
    /// How often every Service that lacks an address it should have is decided again.
    pub resync_period: Duration,
    /// `--reserved-addresses`: never assigned from any IPPool, beside the Nodes' addresses,
    /// their pod CIDRs and the service CIDRs (the LAN's gateway, DNS servers, a pod CIDR).
    pub reserved_addresses: Vec<berth_core::AddressRange>,
    /// What the agents allow a Service (`--external-ip-cidrs`, `--max-service-*`, the agents'
    /// values): the controller reports what they leave out.
    pub service_policy: berth_api::ServicePolicy,
}

impl ControllerConfig {
    pub fn new(service_cidrs: Vec<IpNet>) -> Self {
        Self {
            service_cidrs,
            node_port_range: PortRange::DEFAULT,
            default_class: Some(class::L2),
            lease: None,
            seed: 0,
            max_in_flight: 64,
            instance: "berth-controller".to_string(),
            endpoints: None,
            pool_gone_grace: None,
            resync_period: Duration::from_secs(300),
            reserved_addresses: Vec::new(),
            service_policy: berth_api::ServicePolicy::default(),
        }
    }
}

/// The controller's settings as the flags give them, each already parsed into its type;
/// [`ControllerOptions::validate`] checks how they fit together.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// As [`parse_service_cidrs`] returns them.
    pub service_cidrs: Vec<IpNet>,
    pub node_port_range: PortRange,
    /// As [`parse_default_class`] returns it.
    pub default_class: Option<&'static str>,
    /// Maintain Endpoints and EndpointSlices.
    pub endpoints: bool,
    pub max_endpoints_per_slice: usize,
    /// Services whose Endpoints are synced at the same time.
    pub concurrent_endpoint_syncs: usize,
    /// `false` runs without a Lease (one replica).
    pub leader_election: bool,
    pub lease_name: String,
    pub lease_namespace: String,
    /// This replica's identity in the Lease and on Events.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// As [`parse_grace`] returns it.
    pub pool_gone_grace: Option<Duration>,
    /// As [`parse_reserved_addresses`] returns them.
    pub reserved_addresses: Vec<berth_core::AddressRange>,
    /// The agents' `--external-ip-cidrs` and `--max-service-*`.
    pub service_policy: berth_api::ServicePolicy,
}

impl ControllerOptions {
    pub fn validate(self) -> Result<ControllerConfig, Error> {
        let ControllerOptions {
            service_cidrs,
            node_port_range,
            default_class,
            endpoints,
            max_endpoints_per_slice,
            concurrent_endpoint_syncs,
            leader_election,
            lease_name,
            lease_namespace,
            identity,
            lease_duration,
            renew_deadline,
            retry_period,
            pool_gone_grace,
            reserved_addresses,
            service_policy,
        } = self;
        let endpoints = if endpoints {
            let slices = berth_endpoints::SliceConfig::new(max_endpoints_per_slice)
                .map_err(|e| Error::InvalidConfig(format!("--max-endpoints-per-slice: {e}")))?;
            if concurrent_endpoint_syncs == 0 {
                return Err(Error::InvalidConfig(
                    "--concurrent-endpoint-syncs must be at least 1".into(),
                ));
            }
            Some(crate::endpoints::EndpointsConfig {
                slices,
                workers: concurrent_endpoint_syncs,
                ..Default::default()
            })
        } else {
            None
        };
        let lease = if leader_election {
            let lease = LeaseConfig {
                name: lease_name,
                namespace: lease_namespace,
                identity: identity.clone(),
                lease_duration,
                renew_deadline,
                retry_period,
            };
            lease.validate()?;
            Some(lease)
        } else {
            None
        };
        Ok(ControllerConfig {
            node_port_range,
            default_class,
            lease,
            instance: identity,
            endpoints,
            pool_gone_grace,
            reserved_addresses,
            service_policy,
            ..ControllerConfig::new(service_cidrs)
        })
    }
}

/// Parses `--pool-gone-grace`: `never` (keep until the Service changes) or a duration such
/// as `0s` or `10m`, read by `parse_duration` (the binary's duration flags' reader).
pub fn parse_grace(
    text: &str,
    parse_duration: impl Fn(&str) -> Result<Duration, String>,
) -> Result<Option<Duration>, Error> {
    match text.trim() {
        "never" => Ok(None),
        other => parse_duration(other).map(Some).map_err(|e| {
            Error::InvalidConfig(format!("--pool-gone-grace {text:?}: {e} (or `never`)"))
        }),
    }
}

/// Parses `--reserved-addresses`: comma-separated addresses, CIDRs and `a-b` ranges (as
/// IPPools write them; a bare address is one address), empty for none.
pub fn parse_reserved_addresses(text: &str) -> Result<Vec<berth_core::AddressRange>, Error> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.parse::<std::net::IpAddr>() {
            Ok(ip) => berth_core::AddressRange::new(ip, ip)
                .ok_or_else(|| Error::InvalidConfig(format!("--reserved-addresses {s:?}"))),
            Err(_) => berth_core::parse_address(s)
                .map_err(|e| Error::InvalidConfig(format!("--reserved-addresses: {e}"))),
        })
        .collect()
}

/// Parses `--service-cidr`: one CIDR or two comma-separated ones of different families.
pub fn parse_service_cidrs(text: &str) -> Result<Vec<IpNet>, Error> {
    let cidrs = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| Error::InvalidConfig(format!("--service-cidr {s:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if matches!(a, IpNet::V4(_)) != matches!(b, IpNet::V4(_)) => Ok(cidrs),
        _ => Err(Error::InvalidConfig(format!(
            "--service-cidr {text:?}: expected one CIDR, or two of different IP families"
        ))),
    }
}

/// Parses `--node-port-range`: `first-last`.
pub fn parse_node_port_range(text: &str) -> Result<PortRange, Error> {
    text.parse()
        .map_err(|e| Error::InvalidConfig(format!("--node-port-range: {e}")))
}

/// Parses `--default-class`: `l2`, `aws-nlb` (or their full class names) or `none`.
pub fn parse_default_class(text: &str) -> Result<Option<&'static str>, Error> {
    match text.trim() {
        "none" | "" => Ok(None),
        "l2" | class::L2 => Ok(Some(class::L2)),
        "aws-nlb" | class::AWS_NLB => Ok(Some(class::AWS_NLB)),
        other => Err(Error::InvalidConfig(format!(
            "--default-class {other:?}: expected l2, aws-nlb or none"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_cidrs() {
        assert_eq!(parse_service_cidrs("10.96.0.0/16").unwrap().len(), 1);
        assert_eq!(
            parse_service_cidrs("10.96.0.0/16, fd00::/108")
                .unwrap()
                .len(),
            2
        );
        assert!(parse_service_cidrs("10.96.0.0/16,10.97.0.0/16").is_err());
        assert!(parse_service_cidrs("bogus").is_err());
        assert!(parse_service_cidrs("").is_err());
    }

    #[test]
    fn default_classes() {
        assert_eq!(parse_default_class("l2").unwrap(), Some(class::L2));
        assert_eq!(
            parse_default_class("berth.dev/aws-nlb").unwrap(),
            Some(class::AWS_NLB)
        );
        assert_eq!(parse_default_class("none").unwrap(), None);
        assert!(parse_default_class("metallb").is_err());
    }

    #[test]
    fn reserved_addresses() {
        let got = parse_reserved_addresses(" 198.18.0.1, 10.244.0.0/16,fd00::1-fd00::9 ,").unwrap();
        let shown: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["198.18.0.1/32", "10.244.0.0/16", "fd00::1-fd00::9"]);
        assert!(parse_reserved_addresses("").unwrap().is_empty());
        let e = parse_reserved_addresses("198.18.0.1/24")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--reserved-addresses") && e.contains("198.18.0.0/24"),
            "{e}"
        );
        assert!(parse_reserved_addresses("gateway").is_err());
    }

    #[test]
    fn pool_gone_grace() {
        let secs = |t: &str| -> Result<Duration, String> {
            t.strip_suffix('s')
                .and_then(|n| n.parse().ok())
                .map(Duration::from_secs)
                .ok_or_else(|| format!("bad duration {t:?}"))
        };
        assert_eq!(parse_grace("never", secs).unwrap(), None);
        assert_eq!(parse_grace("0s", secs).unwrap(), Some(Duration::ZERO));
        assert_eq!(
            parse_grace("90s", secs).unwrap(),
            Some(Duration::from_secs(90))
        );
        let e = parse_grace("soon", secs).unwrap_err().to_string();
        assert!(
            e.contains("--pool-gone-grace") && e.contains("never"),
            "{e}"
        );
    }

    #[test]
    fn lease_durations_must_nest() {
        let mut c = LeaseConfig::new("kube-system", "me");
        assert!(c.validate().is_ok());
        c.renew_deadline = c.lease_duration;
        assert!(c.validate().is_err());
        let mut c = LeaseConfig::new("kube-system", "me");
        c.retry_period = c.renew_deadline;
        assert!(c.validate().is_err());
    }
}
