//! Where this node announces each Service, as the `ServiceL2Status` records its agent keeps:
//! pure, from the answers table to the records due and the writes that bring the written ones
//! there. The agent writes only these records (in its own namespace), never the Service.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use berth_api::names::label;
use berth_api::{ServiceL2Status, ServiceL2StatusSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::answers::{Answers, ServiceKey};
use crate::election::Interfaces;

/// What this node announces for one Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announced {
    pub addresses: BTreeSet<IpAddr>,
    /// Empty: every interface the agent answers on.
    pub interfaces: BTreeSet<String>,
}

/// Every Service this node announces, with its owned addresses and the union of their
/// interfaces.
pub fn build_announced(answers: &Answers) -> BTreeMap<ServiceKey, Announced> {
    let mut out: BTreeMap<ServiceKey, Announced> = BTreeMap::new();
    // Whether some address of the Service is answered on every interface.
    let mut any: BTreeSet<ServiceKey> = BTreeSet::new();
    for owned in answers.owned() {
        for service in owned.services {
            let entry = out.entry(service.clone()).or_default();
            entry.addresses.insert(owned.ip);
            match owned.interfaces {
                Interfaces::Any => {
                    any.insert(service.clone());
                }
                Interfaces::Named(names) => entry.interfaces.extend(names.iter().cloned()),
            }
        }
    }
    for service in any {
        if let Some(entry) = out.get_mut(&service) {
            entry.interfaces.clear();
        }
    }
    out
}

/// The record's name: `l2-` and 24 hex digits of sha256(node "/" namespace "/" name), so one
/// node's record of one Service always has the same name, whatever the lengths of the names.
pub fn status_name(node: &str, service: &ServiceKey) -> String {
    let digest = Sha256::digest(format!("{node}/{}/{}", service.0, service.1));
    let mut name = String::from("l2-");
    for byte in &digest[..12] {
        let _ = write!(name, "{byte:02x}");
    }
    name
}

/// The record of `node` announcing `service`, in `namespace` (the agent's own).
pub fn build_status(
    node: &str,
    namespace: &str,
    service: &ServiceKey,
    announced: &Announced,
) -> ServiceL2Status {
    let mut labels = BTreeMap::new();
    labels.insert(label::SERVICE_NAMESPACE.to_string(), service.0.clone());
    labels.insert(label::SERVICE_NAME.to_string(), service.1.clone());
    ServiceL2Status {
        metadata: ObjectMeta {
            name: Some(status_name(node, service)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: ServiceL2StatusSpec {
            node: node.to_string(),
            service_namespace: service.0.clone(),
            service_name: service.1.clone(),
            addresses: announced.addresses.iter().map(IpAddr::to_string).collect(),
            interfaces: announced.interfaces.iter().cloned().collect(),
        },
    }
}

/// A written record read back: the Service it describes and what it says, when it is `node`'s.
/// Another node's record, or one whose addresses do not parse, is `None` (a record that does
/// not parse is still `node`'s to replace: see [`is_own_record`]).
pub fn parse_status(node: &str, status: &ServiceL2Status) -> Option<(ServiceKey, Announced)> {
    if !is_own_record(node, status) {
        return None;
    }
    let spec = &status.spec;
    let addresses = spec
        .addresses
        .iter()
        .map(|a| a.parse::<IpAddr>().ok())
        .collect::<Option<BTreeSet<IpAddr>>>()?;
    Some((
        (spec.service_namespace.clone(), spec.service_name.clone()),
        Announced {
            addresses,
            interfaces: spec.interfaces.iter().cloned().collect(),
        },
    ))
}

/// Whether `status` is `node`'s record under the name it would give it.
pub fn is_own_record(node: &str, status: &ServiceL2Status) -> bool {
    let spec = &status.spec;
    spec.node == node
        && status.metadata.name.as_deref()
            == Some(&*status_name(
                node,
                &(spec.service_namespace.clone(), spec.service_name.clone()),
            ))
}

/// Records of other nodes that a new announcer of `service` replaces: those that claim only
/// addresses this node now announces for it. They are left by an agent that crashed (a stopping
/// agent deletes its own); a peer announcing another address of the same Service (the other
/// family, elected separately) keeps its record. Returns their names.
pub fn superseded_records(
    node: &str,
    service: &ServiceKey,
    announced: &Announced,
    records: &[ServiceL2Status],
) -> Vec<String> {
    records
        .iter()
        .filter(|r| {
            let spec = &r.spec;
            spec.node != node
                && spec.service_namespace == service.0
                && spec.service_name == service.1
                && spec.addresses.iter().all(|a| {
                    a.parse::<IpAddr>()
                        .is_ok_and(|ip| announced.addresses.contains(&ip))
                })
        })
        .filter_map(|r| r.metadata.name.clone())
        .collect()
}

/// The writes that turn `written` into `desired`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusPlan {
    /// Records to create or replace.
    pub apply: Vec<ServiceKey>,
    /// Records to delete.
    pub delete: Vec<ServiceKey>,
}

impl StatusPlan {
    pub fn is_empty(&self) -> bool {
        self.apply.is_empty() && self.delete.is_empty()
    }
}

/// What must be written so that the records say `desired`, given what they say now.
pub fn plan_status(
    desired: &BTreeMap<ServiceKey, Announced>,
    written: &BTreeMap<ServiceKey, Announced>,
) -> StatusPlan {
    StatusPlan {
        apply: desired
            .iter()
            .filter(|(key, announced)| written.get(*key) != Some(*announced))
            .map(|(key, _)| key.clone())
            .collect(),
        delete: written
            .keys()
            .filter(|key| !desired.contains_key(*key))
            .cloned()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::answers::{IpAnswer, IpEntry};
    use berth_core::parse_address;

    fn key(ns: &str, name: &str) -> ServiceKey {
        (ns.to_string(), name.to_string())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn answers(entries: &[(&str, IpAnswer, Vec<ServiceKey>)]) -> Answers {
        Answers {
            pools: vec![parse_address("198.18.0.200-198.18.0.250").unwrap()],
            ips: entries
                .iter()
                .map(|(a, answer, services)| {
                    (
                        ip(a),
                        std::sync::Arc::new(IpEntry {
                            answer: answer.clone(),
                            services: services.iter().cloned().collect(),
                        }),
                    )
                })
                .collect(),
        }
    }

    fn named(names: &[&str]) -> IpAnswer {
        IpAnswer::Owned(Interfaces::Named(
            names.iter().map(|n| n.to_string()).collect(),
        ))
    }

    fn announced(addresses: &[&str], interfaces: &[&str]) -> Announced {
        Announced {
            addresses: addresses.iter().map(|a| ip(a)).collect(),
            interfaces: interfaces.iter().map(|i| i.to_string()).collect(),
        }
    }

    #[test]
    fn only_owned_addresses_are_announced_and_grouped_by_service() {
        let web = key("web", "lb");
        let dns = key("dns", "udp");
        let other = key("other", "lb");
        let table = answers(&[
            (
                "198.18.0.200",
                named(&["eth0"]),
                vec![web.clone(), dns.clone()],
            ),
            ("198.18.0.201", named(&["eth1"]), vec![web.clone()]),
            (
                "198.18.0.202",
                IpAnswer::Elsewhere {
                    owner: Some("node-2".into()),
                },
                vec![other.clone()],
            ),
            ("198.18.0.203", IpAnswer::NotAdvertised, vec![other.clone()]),
        ]);
        let got = build_announced(&table);
        assert_eq!(
            got,
            BTreeMap::from([
                (dns, announced(&["198.18.0.200"], &["eth0"])),
                (
                    web,
                    announced(&["198.18.0.200", "198.18.0.201"], &["eth0", "eth1"])
                ),
            ])
        );
    }

    #[test]
    fn an_address_answered_everywhere_makes_the_interfaces_all() {
        let web = key("web", "lb");
        let table = answers(&[
            ("198.18.0.200", named(&["eth0"]), vec![web.clone()]),
            (
                "198.18.0.201",
                IpAnswer::Owned(Interfaces::Any),
                vec![web.clone()],
            ),
        ]);
        assert_eq!(
            build_announced(&table)[&web],
            announced(&["198.18.0.200", "198.18.0.201"], &[])
        );
    }

    #[test]
    fn names_are_stable_short_and_differ_per_node_and_service() {
        let long = "n".repeat(253);
        let a = status_name("node-1", &key("web", "lb"));
        assert_eq!(a, status_name("node-1", &key("web", "lb")));
        assert_eq!(a.len(), 27);
        assert!(a.starts_with("l2-"));
        assert_ne!(a, status_name("node-2", &key("web", "lb")));
        assert_ne!(a, status_name("node-1", &key("web", "lb2")));
        // The separator keeps ("a/b", "c") and ("a", "b/c") apart: names cannot hold "/".
        assert_eq!(status_name(&long, &key(&long, &long)).len(), 27);
    }

    #[test]
    fn a_record_round_trips_and_other_nodes_records_are_not_ours() {
        let web = key("web", "lb");
        let what = announced(&["198.18.0.200", "fd00::c8"], &["eth0"]);
        let status = build_status("node-1", "berth-system", &web, &what);
        assert_eq!(status.metadata.namespace.as_deref(), Some("berth-system"));
        assert_eq!(
            status.metadata.labels.as_ref().unwrap()[label::SERVICE_NAME],
            "lb"
        );
        assert_eq!(status.spec.addresses, ["198.18.0.200", "fd00::c8"]);
        assert_eq!(parse_status("node-1", &status), Some((web.clone(), what)));
        assert_eq!(parse_status("node-2", &status), None);
        let mut renamed = status.clone();
        renamed.metadata.name = Some("l2-other".into());
        assert!(!is_own_record("node-1", &renamed));
        let mut garbled = status;
        garbled.spec.addresses = vec!["not-an-ip".into()];
        assert!(is_own_record("node-1", &garbled));
        assert_eq!(parse_status("node-1", &garbled), None);
    }

    #[test]
    fn a_new_announcer_replaces_records_that_claim_only_its_addresses() {
        let web = key("web", "lb");
        let mine = announced(&["198.18.0.200"], &[]);
        let crashed = build_status("node-2", "ns", &web, &mine);
        let other_family = build_status("node-3", "ns", &web, &announced(&["fd00::c8"], &[]));
        let both = build_status(
            "node-4",
            "ns",
            &web,
            &announced(&["198.18.0.200", "fd00::c8"], &[]),
        );
        let other_service = build_status("node-5", "ns", &key("web", "db"), &mine);
        let own = build_status("node-1", "ns", &web, &mine);
        let records = [crashed.clone(), other_family, both, other_service, own];
        assert_eq!(
            superseded_records("node-1", &web, &mine, &records),
            [crashed.metadata.name.unwrap()]
        );
    }

    #[test]
    fn the_plan_writes_only_differences() {
        let web = key("web", "lb");
        let dns = key("dns", "udp");
        let gone = key("old", "lb");
        let desired = BTreeMap::from([
            (web.clone(), announced(&["198.18.0.200"], &[])),
            (dns.clone(), announced(&["198.18.0.201"], &["eth0"])),
        ]);
        let written = BTreeMap::from([
            (web.clone(), announced(&["198.18.0.200"], &[])),
            (dns.clone(), announced(&["198.18.0.201"], &[])),
            (gone.clone(), announced(&["198.18.0.202"], &[])),
        ]);
        assert_eq!(
            plan_status(&desired, &written),
            StatusPlan {
                apply: vec![dns],
                delete: vec![gone],
            }
        );
        assert!(plan_status(&desired, &desired).is_empty());
        assert_eq!(
            plan_status(&BTreeMap::new(), &desired).delete.len(),
            2,
            "a stopping agent deletes every record"
        );
    }
}
