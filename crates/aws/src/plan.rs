//! desired [`Stack`] x [`Observed`] -> the ordered changes that make AWS match, and nothing
//! else: a stack that matches plans no step, so a steady state makes no mutating call.
//!
//! Order: old or duplicate load balancers go first (their listeners go with them, freeing
//! the target groups), then the load balancer and, in its VPC, the target groups are created,
//! modified and given their targets, then listeners point at them, and only then are listeners and target
//! groups that nothing wants removed.

use std::collections::{BTreeMap, BTreeSet};

use berth_api::names::aws_tag;

use crate::model::{
    HealthCheck, ListenerSpec, ListenerTls, LoadBalancerSpec, Stack, Target, TargetGroupSpec,
    TgProtocol,
};
use crate::observed::{Observed, ObservedLoadBalancer, ObservedTargetGroup, Tags};

/// At most this many targets per RegisterTargets / DeregisterTargets call.
pub const TARGETS_PER_CALL: usize = 100;

/// A load balancer that exists, or the one this plan creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbRef {
    Arn(String),
    Planned,
}

/// A target group that exists, or one this plan creates (by resource).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TgRef {
    Arn(String),
    Planned(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    DeleteLoadBalancer {
        arn: String,
        why: &'static str,
    },
    CreateTargetGroup(TargetGroupSpec),
    CreateLoadBalancer(LoadBalancerSpec),
    SetSubnets {
        arn: String,
        subnets: BTreeSet<String>,
    },
    ModifyLoadBalancerAttributes {
        lb: LbRef,
        attributes: BTreeMap<String, String>,
    },
    ModifyTargetGroup {
        arn: String,
        health_check: HealthCheck,
    },
    ModifyTargetGroupAttributes {
        tg: TgRef,
        attributes: BTreeMap<String, String>,
    },
    RegisterTargets {
        tg: TgRef,
        targets: Vec<Target>,
    },
    DeregisterTargets {
        arn: String,
        targets: Vec<Target>,
    },
    CreateListener {
        lb: LbRef,
        spec: ListenerSpec,
        target_group: TgRef,
    },
    ModifyListener {
        arn: String,
        /// `None`: the listener keeps its protocol (only its certificate, policy or target
        /// group change).
        protocol: Option<TgProtocol>,
        tls: Option<ListenerTls>,
        target_group: TgRef,
    },
    DeleteListener {
        arn: String,
    },
    DeleteTargetGroup {
        arn: String,
    },
    AddTags {
        arn: String,
        tags: Tags,
    },
    RemoveTags {
        arn: String,
        keys: Vec<String>,
    },
}

impl Step {
    /// The ELBv2 operation the step calls.
    pub fn operation(&self) -> &'static str {
        match self {
            Step::DeleteLoadBalancer { .. } => "DeleteLoadBalancer",
            Step::CreateTargetGroup(_) => "CreateTargetGroup",
            Step::CreateLoadBalancer(_) => "CreateLoadBalancer",
            Step::SetSubnets { .. } => "SetSubnets",
            Step::ModifyLoadBalancerAttributes { .. } => "ModifyLoadBalancerAttributes",
            Step::ModifyTargetGroup { .. } => "ModifyTargetGroup",
            Step::ModifyTargetGroupAttributes { .. } => "ModifyTargetGroupAttributes",
            Step::RegisterTargets { .. } => "RegisterTargets",
            Step::DeregisterTargets { .. } => "DeregisterTargets",
            Step::CreateListener { .. } => "CreateListener",
            Step::ModifyListener { .. } => "ModifyListener",
            Step::DeleteListener { .. } => "DeleteListener",
            Step::DeleteTargetGroup { .. } => "DeleteTargetGroup",
            Step::AddTags { .. } => "AddTags",
            Step::RemoveTags { .. } => "RemoveTags",
        }
    }
}

fn chunks(targets: impl IntoIterator<Item = Target>) -> Vec<Vec<Target>> {
    let all: Vec<Target> = targets.into_iter().collect();
    all.chunks(TARGETS_PER_CALL)
        .map(<[Target]>::to_vec)
        .collect()
}

/// Tag changes that make `have` equal `want`.
fn plan_tags(arn: &str, want: &Tags, have: &Tags, out: &mut Vec<Step>) {
    let add: Tags = want
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let remove: Vec<String> = have
        .keys()
        .filter(|k| !want.contains_key(*k))
        .cloned()
        .collect();
    if !add.is_empty() {
        out.push(Step::AddTags {
            arn: arn.to_string(),
            tags: add,
        });
    }
    if !remove.is_empty() {
        out.push(Step::RemoveTags {
            arn: arn.to_string(),
            keys: remove,
        });
    }
}

/// Only the keys the Service names are managed; an unknown current value counts as different.
fn changed_attributes(
    want: &BTreeMap<String, String>,
    have: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    want.iter()
        .filter(|(k, v)| have.and_then(|h| h.get(*k)) != Some(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn tag<'a>(tags: &'a Tags, key: &str) -> Option<&'a str> {
    tags.get(key).map(String::as_str)
}

fn keeps_load_balancer(want: &LoadBalancerSpec, have: &ObservedLoadBalancer) -> bool {
    have.lb.name == want.name && have.lb.scheme == want.scheme
}

fn keeps_target_group(want: &TargetGroupSpec, have: &ObservedTargetGroup) -> bool {
    tag(&have.tags, aws_tag::RESOURCE) == Some(want.resource.as_str())
        && have.tg.name == want.name
        && have.tg.protocol == want.protocol
        && have.tg.port == want.port
        && have.tg.target_type == want.target_type
}

/// The changes that make `observed` (the Service's resources, found by its tags) match `desired`.
pub fn plan_stack(desired: &Stack, observed: &Observed) -> Vec<Step> {
    let mut steps = Vec::new();
    let want_lb = &desired.load_balancer;

    let keeper = plan_load_balancer_keeper(want_lb, &observed.load_balancers, &mut steps);
    let tgs = sorted_target_groups(observed);
    let (kept, create_tgs) = choose_target_groups(desired, &tgs);
    let lb_ref = plan_load_balancer(want_lb, keeper, &mut steps);

    // A target group is made in the load balancer's VPC, so after the load balancer.
    steps.extend(create_tgs);
    for want in desired.target_groups.values() {
        match kept.get(want.resource.as_str()) {
            Some(o) => plan_kept_target_group(want, o, &mut steps),
            None => plan_new_target_group(want, &mut steps),
        }
    }

    plan_listeners(desired, keeper, &kept, &lb_ref, &mut steps);

    // Target groups nothing wants any more.
    for o in &tgs {
        if !kept.values().any(|k| k.tg.arn == o.tg.arn) {
            steps.push(Step::DeleteTargetGroup {
                arn: o.tg.arn.clone(),
            });
        }
    }

    if let Some(k) = keeper {
        plan_tags(&k.lb.arn, &want_lb.tags, &k.tags, &mut steps);
    }
    for want in desired.target_groups.values() {
        if let Some(o) = kept.get(want.resource.as_str()) {
            plan_tags(&o.tg.arn, &want.tags, &o.tags, &mut steps);
        }
    }
    steps
}

/// The load balancer to keep: the first that matches (lowest ARN, so the choice is stable);
/// the rest are deleted: replaced by a scheme or name change, or duplicates.
fn plan_load_balancer_keeper<'a>(
    want_lb: &LoadBalancerSpec,
    observed: &'a [ObservedLoadBalancer],
    steps: &mut Vec<Step>,
) -> Option<&'a ObservedLoadBalancer> {
    let mut lbs: Vec<&ObservedLoadBalancer> = observed.iter().collect();
    lbs.sort_by(|a, b| a.lb.arn.cmp(&b.lb.arn));
    let keeper = lbs
        .iter()
        .copied()
        .find(|o| keeps_load_balancer(want_lb, o));
    for o in &lbs {
        if keeper.is_some_and(|k| k.lb.arn == o.lb.arn) {
            continue;
        }
        let why = if keeps_load_balancer(want_lb, o) {
            "duplicate"
        } else {
            "replaced"
        };
        steps.push(Step::DeleteLoadBalancer {
            arn: o.lb.arn.clone(),
            why,
        });
    }
    keeper
}

fn sorted_target_groups(observed: &Observed) -> Vec<&ObservedTargetGroup> {
    let mut tgs: Vec<&ObservedTargetGroup> = observed.target_groups.iter().collect();
    tgs.sort_by(|a, b| a.tg.arn.cmp(&b.tg.arn));
    tgs
}

/// Target groups: keep one per resource whose immutable fields match; create the others.
fn choose_target_groups<'a, 'd>(
    desired: &'d Stack,
    tgs: &[&'a ObservedTargetGroup],
) -> (BTreeMap<&'d str, &'a ObservedTargetGroup>, Vec<Step>) {
    let mut kept = BTreeMap::new();
    let mut create_tgs = Vec::new();
    for want in desired.target_groups.values() {
        if let Some(o) = tgs.iter().copied().find(|o| keeps_target_group(want, o)) {
            kept.insert(want.resource.as_str(), o);
        } else {
            create_tgs.push(Step::CreateTargetGroup(want.clone()));
        }
    }
    (kept, create_tgs)
}

/// The kept load balancer brought to the wanted subnets and attributes, or a new one.
fn plan_load_balancer(
    want_lb: &LoadBalancerSpec,
    keeper: Option<&ObservedLoadBalancer>,
    steps: &mut Vec<Step>,
) -> LbRef {
    match keeper {
        Some(k) => {
            if k.lb.subnets != want_lb.subnets {
                steps.push(Step::SetSubnets {
                    arn: k.lb.arn.clone(),
                    subnets: want_lb.subnets.clone(),
                });
            }
            let attributes = changed_attributes(&want_lb.attributes, k.attributes.as_ref());
            if !attributes.is_empty() {
                steps.push(Step::ModifyLoadBalancerAttributes {
                    lb: LbRef::Arn(k.lb.arn.clone()),
                    attributes,
                });
            }
            LbRef::Arn(k.lb.arn.clone())
        }
        None => {
            steps.push(Step::CreateLoadBalancer(want_lb.clone()));
            if !want_lb.attributes.is_empty() {
                steps.push(Step::ModifyLoadBalancerAttributes {
                    lb: LbRef::Planned,
                    attributes: want_lb.attributes.clone(),
                });
            }
            LbRef::Planned
        }
    }
}

/// A kept target group: its health check, attributes and targets brought to what is wanted.
fn plan_kept_target_group(want: &TargetGroupSpec, o: &ObservedTargetGroup, steps: &mut Vec<Step>) {
    if o.tg.health_check != want.health_check {
        steps.push(Step::ModifyTargetGroup {
            arn: o.tg.arn.clone(),
            health_check: want.health_check.clone(),
        });
    }
    let attributes = changed_attributes(&want.attributes, o.attributes.as_ref());
    if !attributes.is_empty() {
        steps.push(Step::ModifyTargetGroupAttributes {
            tg: TgRef::Arn(o.tg.arn.clone()),
            attributes,
        });
    }
    for batch in chunks(want.targets.difference(&o.targets).cloned()) {
        steps.push(Step::RegisterTargets {
            tg: TgRef::Arn(o.tg.arn.clone()),
            targets: batch,
        });
    }
    for batch in chunks(o.targets.difference(&want.targets).cloned()) {
        steps.push(Step::DeregisterTargets {
            arn: o.tg.arn.clone(),
            targets: batch,
        });
    }
}

/// A target group this plan creates: its attributes and all its targets.
fn plan_new_target_group(want: &TargetGroupSpec, steps: &mut Vec<Step>) {
    if !want.attributes.is_empty() {
        steps.push(Step::ModifyTargetGroupAttributes {
            tg: TgRef::Planned(want.resource.clone()),
            attributes: want.attributes.clone(),
        });
    }
    for batch in chunks(want.targets.iter().cloned()) {
        steps.push(Step::RegisterTargets {
            tg: TgRef::Planned(want.resource.clone()),
            targets: batch,
        });
    }
}

/// Listeners, on the kept load balancer (a new one has none yet): created, modified, and
/// those of unwanted or duplicate ports deleted last.
fn plan_listeners(
    desired: &Stack,
    keeper: Option<&ObservedLoadBalancer>,
    kept: &BTreeMap<&str, &ObservedTargetGroup>,
    lb_ref: &LbRef,
    steps: &mut Vec<Step>,
) {
    let tg_ref = |resource: &str| match kept.get(resource) {
        Some(o) => TgRef::Arn(o.tg.arn.clone()),
        None => TgRef::Planned(resource.to_string()),
    };
    let mut existing: Vec<_> = keeper.map(|k| k.listeners.clone()).unwrap_or_default();
    existing.sort_by(|a, b| a.arn.cmp(&b.arn));
    let mut seen_ports = BTreeSet::new();
    let mut delete_listeners = Vec::new();
    for l in &existing {
        if !desired.listeners.contains_key(&l.port) || !seen_ports.insert(l.port) {
            delete_listeners.push(l.arn.clone());
        }
    }
    for want in desired.listeners.values() {
        let target_group = tg_ref(&want.target_group);
        match existing
            .iter()
            .find(|l| l.port == want.port && !delete_listeners.contains(&l.arn))
        {
            Some(l) => {
                let same_tg = matches!(&target_group, TgRef::Arn(a) if l.target_group_arn.as_deref() == Some(a.as_str()));
                let protocol_changes =
                    l.protocol != Some(want.protocol) || l.tls.is_some() != want.tls.is_some();
                if protocol_changes || l.tls != want.tls || !same_tg {
                    steps.push(Step::ModifyListener {
                        arn: l.arn.clone(),
                        protocol: protocol_changes.then_some(want.protocol),
                        tls: want.tls.clone(),
                        target_group,
                    });
                }
            }
            None => steps.push(Step::CreateListener {
                lb: lb_ref.clone(),
                spec: want.clone(),
                target_group,
            }),
        }
    }
    steps.extend(
        delete_listeners
            .into_iter()
            .map(|arn| Step::DeleteListener { arn }),
    );
}

/// Removing everything the Service has: load balancers first (their listeners go with them),
/// then the target groups.
pub fn plan_delete(observed: &Observed) -> Vec<Step> {
    let lbs = observed
        .load_balancers
        .iter()
        .map(|o| Step::DeleteLoadBalancer {
            arn: o.lb.arn.clone(),
            why: "service deleted",
        });
    let tgs = observed
        .target_groups
        .iter()
        .map(|o| Step::DeleteTargetGroup {
            arn: o.tg.arn.clone(),
        });
    lbs.chain(tgs).collect()
}

#[cfg(test)]
mod tests {
    //! The listener rows of the diff: what exists on the Service's own NLB (made by berth,
    //! changed or added by hand) against one TCP port 80 and one port 443 that may be TLS.
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::model::{ListenerTls, ProviderConfig};
    use crate::observed::{Listener, LoadBalancer};
    use crate::{build_stack, IpTargets, NodeFacts, PortFacts, ServiceFacts};
    use berth_core::{Protocol, TrafficPolicy};

    const LB: &str = "arn:lb";
    const CERT: &str = "arn:aws:acm:us-east-1:0:certificate/a";

    fn tls(policy: &str) -> Option<ListenerTls> {
        Some(ListenerTls {
            certificate: CERT.into(),
            policy: policy.into(),
        })
    }

    /// The desired stack, with 443 as TLS under `policy` when given.
    fn desired(policy: Option<&str>) -> Stack {
        let port = |port, node_port| PortFacts {
            name: None,
            port,
            protocol: Protocol::Tcp,
            node_port: Some(node_port),
        };
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(policy) = policy {
            annotations.insert(
                berth_api::names::annotation::AWS_SSL_CERT.into(),
                CERT.into(),
            );
            annotations.insert(
                berth_api::names::annotation::AWS_SSL_PORTS.into(),
                "443".into(),
            );
            annotations.insert(
                berth_api::names::annotation::AWS_SSL_NEGOTIATION_POLICY.into(),
                policy.into(),
            );
        }
        let svc = ServiceFacts {
            namespace: "web".into(),
            name: "front".into(),
            uid: "uid".into(),
            ports: vec![port(80, 30080), port(443, 30443)],
            annotations,
            external_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
        };
        let nodes = [NodeFacts {
            name: "n".into(),
            provider_id: Some("aws:///us-east-1a/i-0000000000000000a".into()),
            labels: Default::default(),
        }];
        let config = ProviderConfig {
            cluster_name: "lab".into(),
            default_subnets: vec!["subnet-a".into()],
            quotas: Default::default(),
        };
        build_stack(&svc, &nodes, &IpTargets::new(), &config).unwrap()
    }

    /// What exists: the stack as made, with `listeners` (port, protocol, tls) on its NLB.
    fn observed(
        stack: &Stack,
        listeners: &[(u16, Option<TgProtocol>, Option<ListenerTls>)],
    ) -> Observed {
        let lb = &stack.load_balancer;
        let target_groups = stack
            .target_groups
            .values()
            .map(|t| ObservedTargetGroup {
                tg: crate::observed::TargetGroup {
                    arn: format!("arn:tg:{}", t.resource),
                    name: t.name.clone(),
                    protocol: t.protocol,
                    port: t.port,
                    target_type: t.target_type,
                    health_check: t.health_check.clone(),
                    load_balancer_arns: vec![LB.into()],
                },
                tags: t.tags.clone(),
                attributes: None,
                targets: t.targets.clone(),
            })
            .collect();
        Observed {
            load_balancers: vec![ObservedLoadBalancer {
                lb: LoadBalancer {
                    arn: LB.into(),
                    name: lb.name.clone(),
                    dns_name: "dns".into(),
                    scheme: lb.scheme,
                    subnets: lb.subnets.clone(),
                    vpc_id: None,
                },
                tags: lb.tags.clone(),
                attributes: None,
                listeners: listeners
                    .iter()
                    .map(|(port, protocol, tls)| Listener {
                        arn: format!("arn:listener:{port}"),
                        load_balancer_arn: LB.into(),
                        port: *port,
                        protocol: *protocol,
                        target_group_arn: Some(format!("arn:tg:{port}/TCP")),
                        tls: tls.clone(),
                    })
                    .collect(),
            }],
            target_groups,
        }
    }

    #[test]
    fn listener_rows() {
        let tcp = Some(TgProtocol::Tcp);
        let modify = |port: u16, protocol: Option<TgProtocol>, tls: Option<ListenerTls>| {
            Step::ModifyListener {
                arn: format!("arn:listener:{port}"),
                protocol,
                tls,
                target_group: TgRef::Arn(format!("arn:tg:{port}/TCP")),
            }
        };
        type Row = (
            &'static str,
            Option<&'static str>,
            Vec<(u16, Option<TgProtocol>, Option<ListenerTls>)>,
            Vec<Step>,
        );
        let rows: Vec<Row> = vec![
            (
                "as made: nothing to do",
                None,
                vec![(80, tcp, None), (443, tcp, None)],
                vec![],
            ),
            (
                "TLS as made: nothing to do",
                Some("P1"),
                vec![(80, tcp, None), (443, tcp, tls("P1"))],
                vec![],
            ),
            (
                "a certificate arrives: 443 becomes TLS, with its protocol",
                Some("P1"),
                vec![(80, tcp, None), (443, tcp, None)],
                vec![modify(443, tcp, tls("P1"))],
            ),
            (
                "another policy: changed in place, the protocol left out",
                Some("P2"),
                vec![(80, tcp, None), (443, tcp, tls("P1"))],
                vec![modify(443, None, tls("P2"))],
            ),
            (
                "the certificate goes: 443 is plain TCP again",
                None,
                vec![(80, tcp, None), (443, tcp, tls("P1"))],
                vec![modify(443, tcp, None)],
            ),
            (
                "a protocol berth never makes, on a port it serves: set back",
                None,
                vec![(80, None, None), (443, tcp, None)],
                vec![modify(80, tcp, None)],
            ),
            (
                "a listener added by hand on a port the Service does not declare: removed",
                None,
                vec![(80, tcp, None), (443, tcp, None), (8443, tcp, tls("P1"))],
                vec![Step::DeleteListener {
                    arn: "arn:listener:8443".into(),
                }],
            ),
        ];
        for (what, policy, have, want) in rows {
            let stack = desired(policy);
            let steps = plan_stack(&stack, &observed(&stack, &have));
            assert_eq!(steps, want, "{what}");
        }
    }
}
