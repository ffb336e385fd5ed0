//! The cluster's Service CIDRs as the datapath reads them: the `ServiceCIDR` objects
//! (`networking.k8s.io/v1`, GA in Kubernetes 1.33) once they have been listed, the agent's
//! `--service-cidr` before that and on a cluster that does not serve the kind. kube-proxy's
//! nftables mode takes every object's CIDRs alike, those being deleted included (their
//! ClusterIPs are still in use until the finalizer goes), and so does berth.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;

/// A synchronous index of ServiceCIDRs, fed like the agent's other indexes (`apply`, `delete`,
/// `begin`/`finish` around a list); every change reports whether [`ServiceCidrs::current`] moved.
#[derive(Debug, Clone, Default)]
pub struct ServiceCidrs {
    fallback: Vec<IpNet>,
    /// Each object's readable CIDRs, by name.
    objects: BTreeMap<String, Vec<IpNet>>,
    /// Whether a list of the kind completed: from then on the objects hold, not the fallback.
    listed: bool,
    relist: Option<BTreeSet<String>>,
    current: Vec<IpNet>,
}

/// An object's CIDRs; entries that are not a CIDR are logged and left out.
pub fn build_cidrs(object: &ServiceCIDR) -> Vec<IpNet> {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for text in object.spec.iter().flat_map(|s| s.cidrs.iter().flatten()) {
        match text.parse::<IpNet>() {
            Ok(net) => out.push(net.trunc()),
            Err(_) => {
                tracing::warn!(%name, cidr = %text, "ServiceCIDR entry is not a CIDR; ignored")
            }
        }
    }
    out
}

impl ServiceCidrs {
    /// `fallback` holds until a list of ServiceCIDRs completes (for good when the kind is not
    /// watched).
    pub fn new(fallback: Vec<IpNet>) -> Self {
        ServiceCidrs {
            current: fallback.clone(),
            fallback,
            ..ServiceCidrs::default()
        }
    }

    /// The Service CIDRs now: every listed object's, in name order without repeats, or the
    /// fallback.
    pub fn current(&self) -> &[IpNet] {
        &self.current
    }

    fn recompute(&mut self) -> bool {
        let next = if self.listed {
            let mut out: Vec<IpNet> = Vec::new();
            for net in self.objects.values().flatten() {
                if !out.contains(net) {
                    out.push(*net);
                }
            }
            out
        } else {
            self.fallback.clone()
        };
        let changed = next != self.current;
        if changed {
            tracing::info!(cidrs = ?next, "Service CIDRs changed");
            self.current = next;
        }
        changed
    }

    pub fn apply(&mut self, object: &ServiceCIDR) -> bool {
        let Some(name) = object.metadata.name.clone() else {
            return false;
        };
        if let Some(seen) = &mut self.relist {
            seen.insert(name.clone());
        }
        self.objects.insert(name, build_cidrs(object));
        self.recompute()
    }

    pub fn delete(&mut self, object: &ServiceCIDR) -> bool {
        if let Some(name) = &object.metadata.name {
            self.objects.remove(name);
        }
        self.recompute()
    }

    pub fn begin(&mut self) {
        self.relist = Some(BTreeSet::new());
    }

    /// The list is complete: objects it did not name are gone, and the objects hold from now on.
    pub fn finish(&mut self) -> bool {
        if let Some(seen) = self.relist.take() {
            self.objects.retain(|name, _| seen.contains(name));
        }
        self.listed = true;
        self.recompute()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::ServiceCIDRSpec;
    use kube::api::ObjectMeta;

    fn mk_service_cidr(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        ServiceCIDR {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|c| (*c).to_owned()).collect()),
            }),
            status: None,
        }
    }

    fn nets(cidrs: &[&str]) -> Vec<IpNet> {
        cidrs.iter().map(|c| c.parse().unwrap()).collect()
    }

    /// One history per row: each step and what the datapath reads after it.
    #[test]
    fn objects_replace_the_flag_once_listed() {
        enum Step<'a> {
            Begin,
            Apply(&'a str, &'a [&'a str]),
            Delete(&'a str),
            Finish,
        }
        use Step::*;
        type Row<'a> = (&'a str, Vec<(Step<'a>, bool, &'a [&'a str])>);
        let flag = ["10.96.0.0/16"];
        let rows: Vec<Row> = vec![
            (
                "an object seen before the list completes waits for it",
                vec![
                    (Begin, false, &flag),
                    (
                        Apply("kubernetes", &["10.96.0.0/16", "fd00:96::/112"]),
                        false,
                        &flag,
                    ),
                    (Finish, true, &["10.96.0.0/16", "fd00:96::/112"]),
                ],
            ),
            (
                "an empty list means no Service CIDR at all",
                vec![(Begin, false, &flag), (Finish, true, &[])],
            ),
            (
                "a second object adds its ranges; deleting it takes them away",
                vec![
                    (Begin, false, &flag),
                    (Apply("kubernetes", &["10.96.0.0/16"]), false, &flag),
                    (Finish, false, &["10.96.0.0/16"]),
                    (
                        Apply("extra", &["10.97.0.0/24", "10.96.0.0/16"]),
                        true,
                        &["10.97.0.0/24", "10.96.0.0/16"],
                    ),
                    (Delete("extra"), true, &["10.96.0.0/16"]),
                ],
            ),
            (
                "a relist forgets what it did not name",
                vec![
                    (Begin, false, &flag),
                    (Apply("old", &["10.98.0.0/24"]), false, &flag),
                    (Finish, true, &["10.98.0.0/24"]),
                    (Begin, false, &["10.98.0.0/24"]),
                    (
                        Apply("kubernetes", &["10.96.0.0/16"]),
                        true,
                        &["10.96.0.0/16", "10.98.0.0/24"],
                    ),
                    (Finish, true, &["10.96.0.0/16"]),
                ],
            ),
            (
                "entries that are not CIDRs are left out, host bits cleared",
                vec![
                    (Begin, false, &flag),
                    (
                        Apply("kubernetes", &["10.96.0.1/16", "nonsense"]),
                        false,
                        &flag,
                    ),
                    (Finish, false, &["10.96.0.0/16"]),
                ],
            ),
        ];
        for (what, steps) in rows {
            let mut cidrs = ServiceCidrs::new(nets(&flag));
            for (i, (step, changed, want)) in steps.into_iter().enumerate() {
                let got = match step {
                    Begin => {
                        cidrs.begin();
                        false
                    }
                    Apply(name, c) => cidrs.apply(&mk_service_cidr(name, c)),
                    Delete(name) => cidrs.delete(&mk_service_cidr(name, &[])),
                    Finish => cidrs.finish(),
                };
                assert_eq!(got, changed, "{what}: step {i} changed");
                assert_eq!(cidrs.current(), nets(want), "{what}: step {i}");
            }
        }
    }
}
