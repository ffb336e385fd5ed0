//! The Service CIDRs the ClusterIP allocator serves, read from the cluster's ServiceCIDR
//! objects (`networking.k8s.io/v1`) as an API server's allocator reads them: every object's
//! CIDRs, in name order; an object is ready unless it is being deleted or its `Ready`
//! condition says otherwise (no condition counts as ready, as upstream assumes for clusters
//! whose controller manager does not write it). A range that is not ready hands out no new
//! address but keeps the ones Services hold. `--service-cidr` holds where the kind is not
//! served, and while no object names a CIDR (an API server creates the default object from
//! its own flags, so a cluster with none is one whose API server did not). Pure.

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;

use berth_ipam::ServiceRange;

/// Whether an object hands out new addresses.
fn is_ready(object: &ServiceCIDR) -> bool {
    if object.metadata.deletion_timestamp.is_some() {
        return false;
    }
    object
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True")
}

/// An object's CIDRs; an entry that is not a CIDR is left out (the API server validates them).
fn cidrs_of(object: &ServiceCIDR) -> impl Iterator<Item = IpNet> + '_ {
    object
        .spec
        .iter()
        .flat_map(|s| s.cidrs.iter().flatten())
        .filter_map(|text| text.parse::<IpNet>().ok())
        .map(|net| net.trunc())
}

/// The ranges to serve: the objects' (in the order given: name order), else `flags`.
pub(crate) fn service_ranges<'a>(
    objects: impl IntoIterator<Item = &'a ServiceCIDR>,
    flags: &[IpNet],
) -> Vec<ServiceRange> {
    let mut out: Vec<ServiceRange> = Vec::new();
    for object in objects {
        let ready = is_ready(object);
        for cidr in cidrs_of(object) {
            match out.iter_mut().find(|r| r.cidr == cidr) {
                Some(seen) => seen.ready |= ready,
                None => out.push(ServiceRange { cidr, ready }),
            }
        }
    }
    if out.is_empty() {
        out = flags
            .iter()
            .map(|cidr| ServiceRange {
                cidr: cidr.trunc(),
                ready: true,
            })
            .collect();
    }
    out
}

/// Every Service CIDR the cluster has or had a say in: `flags` and every object's, being
/// deleted or not. No IPPool may contain them.
pub(crate) fn all_service_cidrs<'a>(
    objects: impl IntoIterator<Item = &'a ServiceCIDR>,
    flags: &[IpNet],
) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = flags.iter().map(IpNet::trunc).collect();
    for object in objects {
        for cidr in cidrs_of(object) {
            if !out.contains(&cidr) {
                out.push(cidr);
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::{ServiceCIDRSpec, ServiceCIDRStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;

    fn mk(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        ServiceCIDR {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
            status: None,
        }
    }

    fn with_ready(mut o: ServiceCIDR, status: &str) -> ServiceCIDR {
        o.status = Some(ServiceCIDRStatus {
            conditions: Some(vec![Condition {
                type_: "Ready".into(),
                status: status.into(),
                reason: "Test".into(),
                message: String::new(),
                last_transition_time: Time(jiff_epoch()),
                observed_generation: None,
            }]),
        });
        o
    }

    fn jiff_epoch() -> Timestamp {
        Timestamp::UNIX_EPOCH
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn r(cidr: &str, ready: bool) -> ServiceRange {
        ServiceRange {
            cidr: net(cidr),
            ready,
        }
    }

    #[test]
    fn ranges_from_objects_else_the_flags() {
        let flags = [net("10.96.0.0/16")];
        let none: Vec<ServiceCIDR> = Vec::new();
        // Flag only (the kind not served, or no object): as before.
        assert_eq!(service_ranges(&none, &flags), vec![r("10.96.0.0/16", true)]);
        let empty = mk("empty", &[]);
        assert_eq!(
            service_ranges([&empty], &flags),
            vec![r("10.96.0.0/16", true)]
        );

        let default = mk("kubernetes", &["10.96.0.0/16", "fd00:10:96::/112"]);
        let extra = mk("extra", &["10.97.0.1/24", "not-a-cidr"]);
        let mut deleting = mk("old", &["10.98.0.0/24"]);
        deleting.metadata.deletion_timestamp = Some(Time(jiff_epoch()));
        let not_ready = with_ready(mk("pending", &["10.99.0.0/24"]), "False");
        let ready = with_ready(mk("ready", &["10.100.0.0/24"]), "True");
        // The same CIDR in a deleting and a ready object: ready.
        let twin = mk("twin", &["10.98.0.0/24"]);
        assert_eq!(
            service_ranges([&extra, &default, &deleting, &not_ready, &ready], &flags),
            vec![
                r("10.97.0.0/24", true),
                r("10.96.0.0/16", true),
                r("fd00:10:96::/112", true),
                r("10.98.0.0/24", false),
                r("10.99.0.0/24", false),
                r("10.100.0.0/24", true),
            ]
        );
        assert_eq!(
            service_ranges([&deleting, &twin], &flags),
            vec![r("10.98.0.0/24", true)]
        );
        assert_eq!(
            all_service_cidrs([&extra, &default, &deleting], &flags),
            vec![
                net("10.96.0.0/16"),
                net("10.97.0.0/24"),
                net("fd00:10:96::/112"),
                net("10.98.0.0/24"),
            ]
        );
    }
}
