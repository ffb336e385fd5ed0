//! `MembershipOptions` (what the flags say) -> `MembershipConfig` (checked once, then trusted).

use std::net::{IpAddr, SocketAddr};
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use berth_core::{dns1123_label_problem, dns1123_subdomain_problem};

use crate::frame::{Key, MAX_DATAGRAM, MAX_OVERHEAD};
use crate::Error;

/// The UDP port agents talk SWIM on by default: next to memberlist's 7946 (MetalLB), so both
/// can run on one node.
pub const DEFAULT_PORT: u16 = 7947;

/// The membership settings as given; [`MembershipOptions::validate`] turns them into a
/// [`MembershipConfig`].
#[derive(Debug, Clone)]
pub struct MembershipOptions {
    /// Name of the Node this agent runs on.
    pub node_name: String,
    /// `false`: liveness from the Leases alone (no UDP socket, no key).
    pub enabled: bool,
    /// Namespace of the agents' Leases.
    pub lease_namespace: String,
    /// How long a Lease stays fresh without renewal; renewed every third of it.
    pub lease_duration: Duration,
    /// Where the SWIM socket binds; port 0 picks a free one (it is advertised on the Lease).
    pub bind: SocketAddr,
    /// The address peers reach this agent on; when unset, the Node's first InternalIP of the
    /// bind address's family.
    pub advertise_address: Option<IpAddr>,
    /// The shared HMAC-SHA256 key (the file's bytes, read by the caller). Required when enabled.
    /// Every datagram is sealed with it.
    pub key: Option<Vec<u8>>,
    /// A second key whose datagrams are accepted too (never used to seal), so that a key can
    /// be rotated without splitting the cluster: see `docs/architecture.md`.
    pub previous_key: Option<Vec<u8>>,
    /// Where `key` and `previous_key` were read from: read again every 10 s, so a rotated
    /// Secret takes effect without a restart (see `docs/l2.md`).
    pub key_file: Option<std::path::PathBuf>,
    pub previous_key_file: Option<std::path::PathBuf>,
    /// How often a random peer is probed.
    pub probe_period: Duration,
    /// How long a probe waits for a direct answer before asking others to probe indirectly.
    pub probe_timeout: Duration,
    /// How long a suspected peer has to refute before it is declared down.
    pub suspicion_timeout: Duration,
    /// How long a node that regains liveness (start, rejoin, end of isolation) waits before it
    /// counts itself live, so the node handing over stops answering first.
    pub takeover_hold: Duration,
    /// How far a message's timestamp may be from the receiver's clock.
    pub clock_window: Duration,
    /// How often every agent sends each peer a heartbeat.
    pub heartbeat_interval: Duration,
    /// How long this node answers without hearing a majority of its peers.
    pub withdraw_after: Duration,
    /// How long a peer stays live without being heard (then its addresses move). At least
    /// `withdraw_after` plus two heartbeat intervals, so a node cut off withdraws first.
    pub failure_timeout: Duration,
}

impl Default for MembershipOptions {
    fn default() -> Self {
        MembershipOptions {
            node_name: String::new(),
            enabled: true,
            lease_namespace: "kube-system".into(),
            lease_duration: Duration::from_secs(10),
            bind: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
            advertise_address: None,
            key: None,
            previous_key: None,
            key_file: None,
            previous_key_file: None,
            probe_period: Duration::from_millis(200),
            probe_timeout: Duration::from_millis(80),
            suspicion_timeout: Duration::from_millis(400),
            takeover_hold: Duration::from_millis(300),
            clock_window: Duration::from_secs(5),
            heartbeat_interval: Duration::from_millis(40),
            withdraw_after: Duration::from_millis(130),
            failure_timeout: Duration::from_millis(250),
        }
    }
}

/// Validated membership settings.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    options: MembershipOptions,
    key: Option<Key>,
    previous_key: Option<Key>,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

impl MembershipOptions {
    /// Options for Lease-only liveness (membership off).
    pub fn lease_only(node_name: impl Into<String>, lease_namespace: impl Into<String>) -> Self {
        MembershipOptions {
            node_name: node_name.into(),
            lease_namespace: lease_namespace.into(),
            enabled: false,
            ..MembershipOptions::default()
        }
    }

    pub fn validate(mut self) -> Result<MembershipConfig, Error> {
        if dns1123_subdomain_problem(&self.node_name).is_some() {
            return Err(invalid(
                "node name",
                format!("{:?} is not a valid Node name", self.node_name),
            ));
        }
        if dns1123_label_problem(&self.lease_namespace).is_some() {
            return Err(invalid(
                "lease namespace",
                format!("{:?} is not a valid namespace", self.lease_namespace),
            ));
        }
        // Lease durations are whole seconds on the object.
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration.subsec_nanos() != 0 {
            return Err(invalid(
                "lease duration",
                format!(
                    "{:?} must be a whole number of seconds, at least 1s",
                    self.lease_duration
                ),
            ));
        }
        if self.lease_duration > Duration::from_secs(i32::MAX as u64) {
            return Err(invalid("lease duration", "too long"));
        }
        let key = if self.enabled {
            if self.probe_period.is_zero() {
                return Err(invalid("probe period", "must be greater than zero"));
            }
            if self.probe_timeout.is_zero() || self.probe_timeout >= self.probe_period {
                return Err(invalid(
                    "probe timeout",
                    format!(
                        "{:?} must be greater than zero and shorter than the probe period {:?}",
                        self.probe_timeout, self.probe_period
                    ),
                ));
            }
            if self.suspicion_timeout.is_zero() {
                return Err(invalid("suspicion timeout", "must be greater than zero"));
            }
            if self.heartbeat_interval < Duration::from_millis(5) {
                return Err(invalid("heartbeat interval", "must be at least 5ms"));
            }
            if self.withdraw_after <= self.heartbeat_interval {
                return Err(invalid(
                    "withdraw after",
                    format!(
                        "{:?} must be longer than the heartbeat interval {:?}",
                        self.withdraw_after, self.heartbeat_interval
                    ),
                ));
            }
            let timing = crate::live::Timing {
                heartbeat: self.heartbeat_interval,
                withdraw: self.withdraw_after,
                failure: self.failure_timeout,
            };
            if !timing.is_safe() {
                return Err(invalid(
                    "failure timeout",
                    format!(
                        "{:?} must be at least the withdrawal time {:?} plus two heartbeat intervals ({:?}): a node cut off must stop answering before its peers take over",
                        self.failure_timeout,
                        self.withdraw_after,
                        self.withdraw_after + self.heartbeat_interval * 2
                    ),
                ));
            }
            if self.clock_window < Duration::from_millis(100) {
                return Err(invalid("clock window", "must be at least 100ms"));
            }
            if self.node_name.len() > u8::MAX as usize {
                return Err(invalid("node name", "longer than 255 bytes"));
            }
            let bytes = self
                .key
                .take()
                .ok_or_else(|| invalid("membership key", "required when membership is on"))?;
            Some(Key::new(&bytes).map_err(|reason| invalid("membership key", reason))?)
        } else {
            self.key = None;
            None
        };
        let previous_key = match self.previous_key.take() {
            Some(bytes) if key.is_some() => Some(
                Key::new(&bytes).map_err(|reason| invalid("previous membership key", reason))?,
            ),
            _ => None,
        };
        Ok(MembershipConfig {
            options: self,
            key,
            previous_key,
        })
    }
}

impl MembershipConfig {
    pub fn node_name(&self) -> &str {
        &self.options.node_name
    }

    pub fn enabled(&self) -> bool {
        self.options.enabled
    }

    pub fn lease_namespace(&self) -> &str {
        &self.options.lease_namespace
    }

    pub fn lease_duration(&self) -> Duration {
        self.options.lease_duration
    }

    /// How often the agent renews its Lease: a third of its duration, so two renewals may
    /// fail before peers see it expire.
    pub fn lease_renew_interval(&self) -> Duration {
        self.options.lease_duration / 3
    }

    pub fn bind(&self) -> SocketAddr {
        self.options.bind
    }

    pub fn advertise_address(&self) -> Option<IpAddr> {
        self.options.advertise_address
    }

    pub(crate) fn key(&self) -> Option<&Key> {
        self.key.as_ref()
    }

    pub(crate) fn previous_key(&self) -> Option<&Key> {
        self.previous_key.as_ref()
    }

    pub fn probe_period(&self) -> Duration {
        self.options.probe_period
    }

    pub fn probe_timeout(&self) -> Duration {
        self.options.probe_timeout
    }

    pub fn suspicion_timeout(&self) -> Duration {
        self.options.suspicion_timeout
    }

    pub fn takeover_hold(&self) -> Duration {
        self.options.takeover_hold
    }

    pub fn clock_window(&self) -> Duration {
        self.options.clock_window
    }

    /// The key files to read again while running, when given.
    pub fn key_files(&self) -> Option<(&std::path::Path, Option<&std::path::Path>)> {
        let key = self.options.key_file.as_deref()?;
        Some((key, self.options.previous_key_file.as_deref()))
    }

    /// The heartbeat's three times.
    pub fn timing(&self) -> crate::live::Timing {
        crate::live::Timing {
            heartbeat: self.options.heartbeat_interval,
            withdraw: self.options.withdraw_after,
            failure: self.options.failure_timeout,
        }
    }

    /// The slowest crash detection SWIM allows with these timings for a cluster where every
    /// live peer probes the dead one at least every `peers` probe periods: wait for a probe,
    /// the probe period itself, then the suspicion timeout.
    pub fn worst_case_detection(&self, peers: u32) -> Duration {
        self.options.probe_period * peers.max(1)
            + self.options.probe_period
            + self.options.suspicion_timeout
    }

    /// foca's settings for these timings.
    pub(crate) fn foca_config(&self) -> foca::Config {
        let mut config = foca::Config::new_lan(NonZeroU32::MIN.saturating_add(15));
        config.probe_period = self.options.probe_period;
        config.probe_rtt = self.options.probe_timeout;
        config.suspect_to_down_after = self.options.suspicion_timeout;
        // Never forget a node declared down: a forgotten one would look "unknown" again,
        // and unknown peers fall back to their Lease (see `live`).
        config.remove_down_after = None;
        // The room the HMAC frame leaves in one Ethernet-sized datagram.
        config.max_packet_size =
            NonZeroUsize::new(MAX_DATAGRAM - MAX_OVERHEAD).unwrap_or(NonZeroUsize::MIN);
        config.notify_down_members = true;
        // Down peers are asked to rejoin about once a second, so a healed partition heals
        // the membership quickly.
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: Duration::from_secs(1),
            num_members: NonZeroUsize::MIN.saturating_add(2),
        });
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: self.options.probe_period,
            num_members: NonZeroUsize::MIN.saturating_add(2),
        });
        config
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn mk_options() -> MembershipOptions {
        MembershipOptions {
            node_name: "node-1".into(),
            key: Some(b"0123456789abcdef0123456789abcdef".to_vec()),
            ..MembershipOptions::default()
        }
    }

    #[test]
    fn defaults_validate_with_a_key() {
        let config = mk_options().validate().unwrap();
        assert!(config.enabled());
        assert!(config.key().is_some());
        assert_eq!(config.lease_renew_interval(), Duration::from_secs(10) / 3);
        let foca = config.foca_config();
        assert_eq!(foca.probe_period, Duration::from_millis(200));
        assert_eq!(foca.probe_rtt, Duration::from_millis(80));
        assert_eq!(foca.suspect_to_down_after, Duration::from_millis(400));
        assert_eq!(foca.remove_down_after, None);
        assert!(foca.max_packet_size.get() + MAX_OVERHEAD <= MAX_DATAGRAM);
        // Two peers probing a dead third: detected within a second.
        assert!(config.worst_case_detection(2) <= Duration::from_secs(1));
    }

    #[test]
    fn a_previous_key_is_checked_and_dropped_without_membership() {
        let with_previous = MembershipOptions {
            previous_key: Some(b"0123456789abcdef-previous".to_vec()),
            ..mk_options()
        };
        assert!(with_previous.validate().unwrap().previous_key().is_some());
        let short = MembershipOptions {
            previous_key: Some(b"short".to_vec()),
            ..mk_options()
        };
        let err = short.validate().unwrap_err().to_string();
        assert!(err.contains("previous membership key"), "{err}");
        let lease_only = MembershipOptions {
            previous_key: Some(b"short".to_vec()),
            ..MembershipOptions::lease_only("n", "ns")
        };
        assert!(lease_only.validate().unwrap().previous_key().is_none());
    }

    #[test]
    fn lease_only_needs_no_key() {
        let config = MembershipOptions::lease_only("node-1", "berth-system")
            .validate()
            .unwrap();
        assert!(!config.enabled());
        assert!(config.key().is_none());
    }

    #[test]
    fn each_bad_setting_names_its_field() {
        let cases: Vec<(&str, MembershipOptions)> = vec![
            (
                "node name",
                MembershipOptions {
                    node_name: "Node_1".into(),
                    ..mk_options()
                },
            ),
            (
                "lease namespace",
                MembershipOptions {
                    lease_namespace: "a.b".into(),
                    ..mk_options()
                },
            ),
            (
                "lease duration",
                MembershipOptions {
                    lease_duration: Duration::from_millis(500),
                    ..mk_options()
                },
            ),
            (
                "lease duration",
                MembershipOptions {
                    lease_duration: Duration::from_millis(1500),
                    ..mk_options()
                },
            ),
            (
                "probe period",
                MembershipOptions {
                    probe_period: Duration::ZERO,
                    ..mk_options()
                },
            ),
            (
                "probe timeout",
                MembershipOptions {
                    probe_timeout: Duration::ZERO,
                    ..mk_options()
                },
            ),
            (
                "probe timeout",
                MembershipOptions {
                    probe_timeout: Duration::from_millis(200),
                    ..mk_options()
                },
            ),
            (
                "suspicion timeout",
                MembershipOptions {
                    suspicion_timeout: Duration::ZERO,
                    ..mk_options()
                },
            ),
            (
                "clock window",
                MembershipOptions {
                    clock_window: Duration::from_millis(10),
                    ..mk_options()
                },
            ),
            (
                "membership key",
                MembershipOptions {
                    key: None,
                    ..mk_options()
                },
            ),
            (
                "membership key",
                MembershipOptions {
                    key: Some(b"short".to_vec()),
                    ..mk_options()
                },
            ),
        ];
        for (field, options) in cases {
            match options.clone().validate() {
                Err(Error::InvalidConfig { field: got, .. }) => {
                    assert_eq!(got, field, "{options:?}")
                }
                other => panic!("{options:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn timings_do_not_matter_when_membership_is_off() {
        let options = MembershipOptions {
            probe_timeout: Duration::ZERO,
            key: None,
            ..MembershipOptions::lease_only("node-1", "berth-system")
        };
        assert!(options.validate().is_ok());
    }
}
