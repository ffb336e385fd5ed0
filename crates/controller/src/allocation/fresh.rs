//! What one decision newly gave a Service: values it did not hold before the decision and
//! that the Service, as read, does not name, so that only the decision's writes would name
//! them. When the API server refuses such a write with 409, nothing of it was written and no
//! object names those values: they are released. Kept, they would stand against what the
//! Service names by then — typically values a killed leader's write set after this decision
//! was made from the older version — and the next decision would refuse them ("a cluster IP
//! may not change once set") or replace them (a LoadBalancer address).

use std::net::IpAddr;

use berth_ipam::ServiceKey;

use crate::allocation::facts::ServiceFacts;
use crate::allocation::plan::{Allocators, SpecFill};
use crate::allocation::write::Write;

/// What a Service holds in the allocators.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    pub cluster_ips: Vec<IpAddr>,
    /// Node ports and the healthCheckNodePort.
    pub node_ports: Vec<u16>,
    pub lb_ips: Vec<IpAddr>,
}

impl Holding {
    pub fn of(alloc: &Allocators, owner: &ServiceKey) -> Self {
        Self {
            cluster_ips: alloc.cluster.ips_of(owner),
            node_ports: alloc.ports.ports_of(owner),
            lb_ips: alloc.lb.ips_of(owner),
        }
    }

    /// Whether `owner` no longer holds some of these values.
    pub fn any_released(&self, alloc: &Allocators, owner: &ServiceKey) -> bool {
        self.cluster_ips
            .iter()
            .any(|ip| alloc.cluster.owner_of(*ip) != Some(owner))
            || self
                .node_ports
                .iter()
                .any(|p| alloc.ports.owner_of(*p) != Some(owner))
            || (!self.lb_ips.is_empty() && alloc.lb.ips_of(owner) != self.lb_ips)
    }
}

/// Values a decision newly gave a Service, by the write that would name them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fresh {
    /// Named by the spec write.
    pub cluster_ips: Vec<IpAddr>,
    /// Node ports and the healthCheckNodePort, named by the spec write.
    pub node_ports: Vec<u16>,
    /// Named by the status write.
    pub lb_ips: Vec<IpAddr>,
}

impl Fresh {
    pub fn is_empty(&self) -> bool {
        self.cluster_ips.is_empty() && self.node_ports.is_empty() && self.lb_ips.is_empty()
    }

    /// The values `f` does not name: of what a refused write would have named, those the
    /// Service, read again, does not name either.
    pub fn unnamed_by(&self, f: &ServiceFacts) -> Self {
        let ports = named_node_ports(f);
        Self {
            cluster_ips: self
                .cluster_ips
                .iter()
                .copied()
                .filter(|ip| {
                    !f.cluster_ips.cluster_ips.contains(ip) && !f.stale_cluster_ips.contains(ip)
                })
                .collect(),
            node_ports: self
                .node_ports
                .iter()
                .copied()
                .filter(|p| !ports.contains(p))
                .collect(),
            lb_ips: self
                .lb_ips
                .iter()
                .copied()
                .filter(|ip| !f.ingress_ips.contains(ip))
                .collect(),
        }
    }

    /// Adds the values of `other` that `self` lacks.
    pub fn merge(&mut self, other: Self) {
        fn add<T: PartialEq>(to: &mut Vec<T>, from: Vec<T>) {
            for x in from {
                if !to.contains(&x) {
                    to.push(x);
                }
            }
        }
        add(&mut self.cluster_ips, other.cluster_ips);
        add(&mut self.node_ports, other.node_ports);
        add(&mut self.lb_ips, other.lb_ips);
    }

    /// The values of `self` that are not in `other`.
    pub fn without(&self, other: &Self) -> Self {
        Self {
            cluster_ips: minus(&self.cluster_ips, &other.cluster_ips),
            node_ports: minus(&self.node_ports, &other.node_ports),
            lb_ips: minus(&self.lb_ips, &other.lb_ips),
        }
    }

    /// What stays unwritten when `rejected` is refused: the status write is sent only after
    /// the spec write has landed, so a refused spec write leaves both unwritten, and a
    /// refused status write only the status.
    pub fn unwritten(self, rejected: Write) -> Self {
        match rejected {
            Write::Spec => self,
            Write::Status => Self {
                lb_ips: self.lb_ips,
                ..Self::default()
            },
        }
    }
}

/// The values of `fill` (the spec write) and `ingress` (the status write, `None` when it
/// does not change the ingress) that the Service `f` does not name and that it did not hold
/// `before` the decision. A value held before stays out: an earlier write naming it may have
/// landed (a timeout says nothing), and a 409 may be that write's own doing.
pub fn compute_fresh(
    before: &Holding,
    f: &ServiceFacts,
    fill: &SpecFill,
    ingress: Option<&[IpAddr]>,
) -> Fresh {
    let named_ports = named_node_ports(f);
    let mut node_ports: Vec<u16> = fill
        .node_ports
        .iter()
        .flatten()
        .chain(&fill.health_check_node_port)
        .copied()
        .filter(|p| !before.node_ports.contains(p) && !named_ports.contains(p))
        .collect();
    // Entries for one Service port (TCP and UDP on 53) share a node port.
    node_ports.sort_unstable();
    node_ports.dedup();
    Fresh {
        cluster_ips: fill
            .cluster_ips
            .iter()
            .flatten()
            .copied()
            .filter(|ip| {
                !before.cluster_ips.contains(ip) && !f.cluster_ips.cluster_ips.contains(ip)
            })
            .collect(),
        node_ports,
        lb_ips: ingress
            .into_iter()
            .flatten()
            .copied()
            .filter(|ip| !before.lb_ips.contains(ip) && !f.ingress_ips.contains(ip))
            .collect(),
    }
}

/// Node ports and the healthCheckNodePort `f` names, those its type no longer uses included.
fn named_node_ports(f: &ServiceFacts) -> Vec<u16> {
    f.node_ports
        .ports
        .iter()
        .filter_map(|p| p.node_port)
        .chain(f.node_ports.health_check.flatten())
        .chain(f.stale_node_ports.all())
        .collect()
}

fn minus<T: PartialEq + Copy>(a: &[T], b: &[T]) -> Vec<T> {
    a.iter().copied().filter(|x| !b.contains(x)).collect()
}

/// Frees the values of `fresh` that `owner` still holds; true when any was.
pub fn release_fresh(alloc: &mut Allocators, owner: &ServiceKey, fresh: &Fresh) -> bool {
    let mut freed = false;
    for ip in &fresh.cluster_ips {
        if alloc.cluster.owner_of(*ip) == Some(owner) {
            freed |= alloc.cluster.release(*ip);
        }
    }
    for port in &fresh.node_ports {
        if alloc.ports.owner_of(*port) == Some(owner) {
            freed |= alloc.ports.release(*port);
        }
    }
    for ip in &fresh.lb_ips {
        freed |= alloc.lb.release(owner, *ip);
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::facts::read_service;
    use crate::allocation::plan::plan_service;
    use berth_api::names::class;
    use berth_core::{Labels, PortRange};
    use berth_ipam::PoolSpec;
    use k8s_openapi::api::core::v1::Service;
    use serde_json::{json, Value};

    fn mk_facts(v: Value) -> ServiceFacts {
        let mut v = v;
        v["metadata"]["namespace"] = json!("ns");
        let svc: Service = serde_json::from_value(v).unwrap();
        read_service(&svc, Some(class::L2))
    }

    fn mk_alloc() -> Allocators {
        let mut a =
            Allocators::new(&["10.96.0.0/16".parse().unwrap()], PortRange::DEFAULT, 7).unwrap();
        a.lb.set_pools(vec![PoolSpec::new("p", &["198.18.0.10-198.18.0.11"])])
            .unwrap();
        a
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Decides `f` and returns what the decision newly gave it.
    fn decide(a: &mut Allocators, f: &ServiceFacts) -> Fresh {
        let before = Holding::of(a, &f.key);
        let out = plan_service(a, f, &Labels::new());
        compute_fresh(&before, f, &out.fill, out.ingress.as_deref())
    }

    fn local_lb() -> Value {
        json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "ports": [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}})
    }

    #[test]
    fn a_first_decision_gives_everything_fresh_and_a_refused_spec_write_frees_it_all() {
        let mut a = mk_alloc();
        let f = mk_facts(local_lb());
        let fresh = decide(&mut a, &f);
        let held = Holding::of(&a, &f.key);
        assert_eq!(fresh.cluster_ips, held.cluster_ips);
        // Two entries, one Service port: one node port, plus the health check port.
        assert_eq!(fresh.node_ports, held.node_ports);
        assert_eq!(fresh.node_ports.len(), 2);
        assert_eq!(fresh.lb_ips, [ip("198.18.0.10")]);

        assert!(release_fresh(
            &mut a,
            &f.key,
            &fresh.clone().unwritten(Write::Spec)
        ));
        assert_eq!(Holding::of(&a, &f.key), Holding::default());
        assert!(!release_fresh(&mut a, &f.key, &fresh), "idempotent");

        // What the Service names now (a killed leader's write) is adopted, not refused.
        let mut landed = local_lb();
        landed["spec"]["clusterIP"] = json!("10.96.0.77");
        landed["spec"]["ports"][0]["nodePort"] = json!(30555);
        landed["spec"]["ports"][1]["nodePort"] = json!(30555);
        landed["spec"]["healthCheckNodePort"] = json!(30556);
        let f = mk_facts(landed);
        let out = plan_service(&mut a, &f, &Labels::new());
        assert_eq!(out.result, Some(Ok(())));
        let held = Holding::of(&a, &f.key);
        assert_eq!(held.cluster_ips, [ip("10.96.0.77")]);
        assert_eq!(held.node_ports, [30555, 30556]);
    }

    #[test]
    fn a_refused_status_write_frees_only_the_new_address() {
        let mut a = mk_alloc();
        let f = mk_facts(local_lb());
        let fresh = decide(&mut a, &f).unwritten(Write::Status);
        assert!(fresh.cluster_ips.is_empty() && fresh.node_ports.is_empty());
        assert!(release_fresh(&mut a, &f.key, &fresh));
        let held = Holding::of(&a, &f.key);
        assert!(held.lb_ips.is_empty());
        assert_eq!((held.cluster_ips.len(), held.node_ports.len()), (1, 2));
    }

    #[test]
    fn values_held_before_or_named_by_the_service_are_never_fresh() {
        let mut a = mk_alloc();
        let f = mk_facts(local_lb());
        decide(&mut a, &f);
        let held = Holding::of(&a, &f.key);
        // The same version decided again (a retry after a timeout): everything was held,
        // and stays so.
        assert_eq!(decide(&mut a, &f), Fresh::default());
        assert_eq!(Holding::of(&a, &f.key), held);

        // A Service read with its values set, first seen now: nothing is fresh, though the
        // decision is the first to hold them.
        let mut set = local_lb();
        set["metadata"]["name"] = json!("t");
        set["spec"]["clusterIPs"] = json!(["10.96.0.5"]);
        set["spec"]["ports"][0]["nodePort"] = json!(30100);
        set["spec"]["healthCheckNodePort"] = json!(30101);
        set["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.11"}]}});
        let t = mk_facts(set);
        assert_eq!(decide(&mut a, &t), Fresh::default());
        assert_eq!(Holding::of(&a, &t.key).lb_ips, [ip("198.18.0.11")]);
    }

    #[test]
    fn a_decision_that_lets_values_go_is_seen() {
        let mut a = mk_alloc();
        let f = mk_facts(local_lb());
        decide(&mut a, &f);
        let before = Holding::of(&a, &f.key);
        assert!(!before.any_released(&a, &f.key));
        // Local LoadBalancer -> ClusterIP: the address goes at once.
        let mut changed = local_lb();
        changed["spec"] = json!({"type": "ClusterIP", "ports": [{"port": 53}],
            "clusterIP": before.cluster_ips[0].to_string()});
        plan_service(&mut a, &mk_facts(changed), &Labels::new());
        assert!(before.any_released(&a, &f.key));
    }

    #[test]
    fn what_the_service_names_when_read_again_is_not_let_go() {
        let mut a = mk_alloc();
        let f = mk_facts(local_lb());
        let fresh = decide(&mut a, &f);
        // Read again with nothing set: all of it is unnamed.
        assert_eq!(fresh.unnamed_by(&f), fresh);
        // Read again after another writer set the same address and one of the node ports.
        let mut landed = local_lb();
        landed["spec"]["ports"][0]["nodePort"] = json!(fresh.node_ports[0]);
        landed["spec"]["ports"][1]["nodePort"] = json!(fresh.node_ports[0]);
        landed["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.10"}]}});
        let unnamed = fresh.unnamed_by(&mk_facts(landed));
        assert_eq!(unnamed.cluster_ips, fresh.cluster_ips);
        assert_eq!(unnamed.node_ports, fresh.node_ports[1..]);
        assert!(unnamed.lb_ips.is_empty());
        assert_eq!(
            fresh.without(&unnamed),
            Fresh {
                node_ports: vec![fresh.node_ports[0]],
                lb_ips: vec![ip("198.18.0.10")],
                ..Fresh::default()
            }
        );
    }

    #[test]
    fn only_the_owner_loses_a_value() {
        let mut a = mk_alloc();
        let f = mk_facts(local_lb());
        let fresh = decide(&mut a, &f);
        a.release_all(&f.key);
        // Given to another Service meanwhile: not this Service's to free.
        let mut other = local_lb();
        other["metadata"]["name"] = json!("u");
        other["spec"]["clusterIP"] = json!(fresh.cluster_ips[0].to_string());
        let u = mk_facts(other);
        plan_service(&mut a, &u, &Labels::new());
        let before = Holding::of(&a, &u.key);
        assert!(!release_fresh(&mut a, &f.key, &fresh));
        assert_eq!(Holding::of(&a, &u.key), before);
    }
}
