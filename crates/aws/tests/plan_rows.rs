//! The AWS diff (`plan_stack`) as history rows, the way the allocation state machine is tested:
//! each row starts from what a Service has in AWS, changes the Service or what exists (by hand,
//! by a crash), and names the calls the diff must make, in order. Every row then applies those
//! steps to a small model of AWS ([`apply`]) and plans again: one pass must converge (the second
//! plan is empty, so a steady state makes no call), and what remains must hold together (one
//! load balancer, every listener forwarding to a target group that exists).
//!
//! The Service: `web/front`, TCP 80 -> node port 30080 and TCP 443 -> 30443, three nodes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use berth_api::names::{annotation as ann, aws_tag};
use berth_aws::model::{HcProtocol, ListenerSpec, Scheme, Target, TgProtocol};
use berth_aws::observed::{
    Listener, LoadBalancer, Observed, ObservedLoadBalancer, ObservedTargetGroup, TargetGroup,
};
use berth_aws::plan::{LbRef, TgRef, TARGETS_PER_CALL};
use berth_aws::{
    build_stack, plan_stack, IpTargets, NodeFacts, PortFacts, ProviderConfig, ServiceFacts, Stack,
    Step,
};
use berth_core::{Protocol, TrafficPolicy};

fn port(port: u16, protocol: Protocol, node_port: u16) -> PortFacts {
    PortFacts {
        name: None,
        port,
        protocol,
        node_port: Some(node_port),
    }
}

fn node(i: usize) -> NodeFacts {
    NodeFacts {
        name: format!("node-{i}"),
        provider_id: Some(format!("aws:///us-east-1a/i-{i:017x}")),
        labels: BTreeMap::new(),
    }
}

/// The Service as it starts, and the nodes it is served on.
fn base() -> (ServiceFacts, Vec<NodeFacts>) {
    let svc = ServiceFacts {
        namespace: "web".into(),
        name: "front".into(),
        uid: "6a1c0b8e-0000-4000-8000-000000000001".into(),
        ports: vec![
            port(80, Protocol::Tcp, 30080),
            port(443, Protocol::Tcp, 30443),
        ],
        annotations: BTreeMap::new(),
        external_traffic_policy: TrafficPolicy::Cluster,
        health_check_node_port: None,
    };
    (svc, (0..3).map(node).collect())
}

fn stack(svc: &ServiceFacts, nodes: &[NodeFacts]) -> Stack {
    let config = ProviderConfig {
        cluster_name: "lab".into(),
        default_subnets: vec!["subnet-a".into(), "subnet-b".into()],
        quotas: Default::default(),
    };
    build_stack(svc, nodes, &IpTargets::new(), &config).expect("the Service models")
}

/// A small AWS: ARNs are handed out in order, a created resource is as its spec says.
#[derive(Default)]
struct Aws {
    have: Observed,
    next_arn: usize,
}

impl Aws {
    fn arn(&mut self, kind: &str) -> String {
        self.next_arn += 1;
        format!("arn:{kind}:{:04}", self.next_arn)
    }

    fn tg(&mut self, arn: &str) -> &mut ObservedTargetGroup {
        self.have
            .target_groups
            .iter_mut()
            .find(|t| t.tg.arn == arn)
            .unwrap_or_else(|| panic!("no target group {arn}"))
    }

    fn lb(&mut self, arn: &str) -> &mut ObservedLoadBalancer {
        self.have
            .load_balancers
            .iter_mut()
            .find(|l| l.lb.arn == arn)
            .unwrap_or_else(|| panic!("no load balancer {arn}"))
    }

    fn listener(&mut self, arn: &str) -> &mut Listener {
        self.have
            .load_balancers
            .iter_mut()
            .flat_map(|l| l.listeners.iter_mut())
            .find(|l| l.arn == arn)
            .unwrap_or_else(|| panic!("no listener {arn}"))
    }

    fn tags(&mut self, arn: &str) -> &mut BTreeMap<String, String> {
        if self.have.load_balancers.iter().any(|l| l.lb.arn == arn) {
            &mut self.lb(arn).tags
        } else {
            &mut self.tg(arn).tags
        }
    }
}

/// Applies a plan's steps in order, as the provider does; planned references resolve to what
/// the same plan created.
fn apply(aws: &mut Aws, steps: &[Step]) {
    let mut planned_lb: Option<String> = None;
    let mut planned_tgs: BTreeMap<String, String> = BTreeMap::new();
    let lb_arn = |lb: &LbRef, planned: &Option<String>| match lb {
        LbRef::Arn(arn) => arn.clone(),
        LbRef::Planned => planned.clone().expect("the load balancer is created first"),
    };
    let tg_arn = |tg: &TgRef, planned: &BTreeMap<String, String>| match tg {
        TgRef::Arn(arn) => arn.clone(),
        TgRef::Planned(resource) => planned
            .get(resource)
            .cloned()
            .unwrap_or_else(|| panic!("target group {resource} is created before it is used")),
    };
    for step in steps {
        match step {
            Step::DeleteLoadBalancer { arn, .. } => {
                let before = aws.have.load_balancers.len();
                aws.have.load_balancers.retain(|l| l.lb.arn != *arn);
                assert_eq!(before, aws.have.load_balancers.len() + 1, "deleting {arn}");
                for tg in &mut aws.have.target_groups {
                    tg.tg.load_balancer_arns.retain(|a| a != arn);
                }
            }
            Step::CreateLoadBalancer(spec) => {
                let arn = aws.arn("lb");
                aws.have.load_balancers.push(ObservedLoadBalancer {
                    lb: LoadBalancer {
                        arn: arn.clone(),
                        name: spec.name.clone(),
                        dns_name: format!("{}.elb.amazonaws.com", spec.name),
                        scheme: spec.scheme,
                        subnets: spec.subnets.clone(),
                        vpc_id: Some("vpc-1".into()),
                    },
                    tags: spec.tags.clone(),
                    attributes: None,
                    listeners: Vec::new(),
                });
                planned_lb = Some(arn);
            }
            Step::CreateTargetGroup(spec) => {
                let arn = aws.arn("tg");
                aws.have.target_groups.push(ObservedTargetGroup {
                    tg: TargetGroup {
                        arn: arn.clone(),
                        name: spec.name.clone(),
                        protocol: spec.protocol,
                        port: spec.port,
                        target_type: spec.target_type,
                        health_check: spec.health_check.clone(),
                        load_balancer_arns: Vec::new(),
                    },
                    tags: spec.tags.clone(),
                    attributes: None,
                    targets: BTreeSet::new(),
                });
                planned_tgs.insert(spec.resource.clone(), arn);
            }
            Step::SetSubnets { arn, subnets } => aws.lb(arn).lb.subnets = subnets.clone(),
            Step::ModifyLoadBalancerAttributes { lb, attributes } => {
                let arn = lb_arn(lb, &planned_lb);
                aws.lb(&arn)
                    .attributes
                    .get_or_insert_with(BTreeMap::new)
                    .extend(attributes.clone());
            }
            Step::ModifyTargetGroup { arn, health_check } => {
                aws.tg(arn).tg.health_check = health_check.clone();
            }
            Step::ModifyTargetGroupAttributes { tg, attributes } => {
                let arn = tg_arn(tg, &planned_tgs);
                aws.tg(&arn)
                    .attributes
                    .get_or_insert_with(BTreeMap::new)
                    .extend(attributes.clone());
            }
            Step::RegisterTargets { tg, targets } => {
                assert!(
                    targets.len() <= TARGETS_PER_CALL,
                    "one call registers at most 100"
                );
                let arn = tg_arn(tg, &planned_tgs);
                aws.tg(&arn).targets.extend(targets.iter().cloned());
            }
            Step::DeregisterTargets { arn, targets } => {
                assert!(targets.len() <= TARGETS_PER_CALL);
                let tg = aws.tg(arn);
                for t in targets {
                    assert!(
                        tg.targets.remove(t),
                        "deregistering {t:?}, which is not registered"
                    );
                }
            }
            Step::CreateListener {
                lb,
                spec,
                target_group,
            } => {
                let lb = lb_arn(lb, &planned_lb);
                let tg = tg_arn(target_group, &planned_tgs);
                let arn = aws.arn("listener");
                let ListenerSpec {
                    port,
                    protocol,
                    tls,
                    ..
                } = spec.clone();
                aws.tg(&tg).tg.load_balancer_arns.push(lb.clone());
                aws.lb(&lb).listeners.push(Listener {
                    arn,
                    load_balancer_arn: lb.clone(),
                    port,
                    protocol: Some(protocol),
                    target_group_arn: Some(tg),
                    tls,
                });
            }
            Step::ModifyListener {
                arn,
                protocol,
                tls,
                target_group,
            } => {
                let tg = tg_arn(target_group, &planned_tgs);
                let listener = aws.listener(arn);
                if let Some(protocol) = protocol {
                    listener.protocol = Some(*protocol);
                }
                listener.tls = tls.clone();
                listener.target_group_arn = Some(tg);
            }
            Step::DeleteListener { arn } => {
                for lb in &mut aws.have.load_balancers {
                    lb.listeners.retain(|l| l.arn != *arn);
                }
            }
            Step::DeleteTargetGroup { arn } => {
                let in_use = aws
                    .have
                    .load_balancers
                    .iter()
                    .flat_map(|l| &l.listeners)
                    .any(|l| l.target_group_arn.as_deref() == Some(arn));
                assert!(
                    !in_use,
                    "AWS refuses to delete target group {arn}: a listener uses it"
                );
                aws.have.target_groups.retain(|t| t.tg.arn != *arn);
            }
            Step::AddTags { arn, tags } => aws.tags(arn).extend(tags.clone()),
            Step::RemoveTags { arn, keys } => {
                let tags = aws.tags(arn);
                for k in keys {
                    tags.remove(k);
                }
            }
        }
    }
}

/// What one Service's resources must look like after a plan has been applied.
fn check_whole(want: &Stack, have: &Observed, what: &str) {
    assert_eq!(
        have.load_balancers.len(),
        1,
        "{what}: exactly one load balancer"
    );
    let lb = &have.load_balancers[0];
    assert_eq!(lb.lb.name, want.load_balancer.name, "{what}");
    let ports: BTreeSet<u16> = lb.listeners.iter().map(|l| l.port).collect();
    assert_eq!(
        ports,
        want.listeners.keys().copied().collect(),
        "{what}: listener ports"
    );
    assert_eq!(
        lb.listeners.len(),
        want.listeners.len(),
        "{what}: one listener per port"
    );
    for l in &lb.listeners {
        let tg = have
            .target_groups
            .iter()
            .find(|t| Some(&t.tg.arn) == l.target_group_arn.as_ref())
            .unwrap_or_else(|| {
                panic!(
                    "{what}: listener {} forwards to a missing target group",
                    l.port
                )
            });
        let spec = &want.target_groups[&want.listeners[&l.port].target_group];
        assert_eq!(
            tg.tg.name, spec.name,
            "{what}: listener {} forwards to its own target group",
            l.port
        );
        assert_eq!(
            tg.targets, spec.targets,
            "{what}: targets of {}",
            spec.resource
        );
    }
    assert_eq!(
        have.target_groups.len(),
        want.target_groups.len(),
        "{what}: no target group left over"
    );
}

/// The Service's resources as the provider makes them from nothing.
fn made(svc: &ServiceFacts, nodes: &[NodeFacts]) -> Aws {
    let mut aws = Aws::default();
    let want = stack(svc, nodes);
    let steps = plan_stack(&want, &aws.have);
    apply(&mut aws, &steps);
    aws
}

type Change = fn(&mut ServiceFacts, &mut Vec<NodeFacts>);
type Drift = fn(&mut Aws);

struct Row {
    what: &'static str,
    /// What the Service (or its nodes) becomes.
    change: Change,
    /// What happened in AWS behind berth's back, after the Service's resources were made.
    drift: Drift,
    /// The operations of the plan, in order.
    calls: &'static [&'static str],
}

fn same(_: &mut ServiceFacts, _: &mut Vec<NodeFacts>) {}
fn untouched(_: &mut Aws) {}

fn first_tg(aws: &mut Aws) -> &mut ObservedTargetGroup {
    aws.have
        .target_groups
        .iter_mut()
        .find(|t| t.tags.get(aws_tag::RESOURCE).map(String::as_str) == Some("80/TCP"))
        .expect("the target group of port 80")
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "as made: no call at all",
            change: same,
            drift: untouched,
            calls: &[],
        },
        Row {
            what: "from nothing: the load balancer, then its target groups with their targets, then the listeners",
            change: same,
            drift: |aws| aws.have = Observed::default(),
            calls: &[
                "CreateLoadBalancer",
                "CreateTargetGroup",
                "CreateTargetGroup",
                "RegisterTargets",
                "RegisterTargets",
                "CreateListener",
                "CreateListener",
            ],
        },
        Row {
            what: "a node joins: one registration per target group",
            change: |_, nodes| nodes.push(node(3)),
            drift: untouched,
            calls: &["RegisterTargets", "RegisterTargets"],
        },
        Row {
            what: "a node leaves: one deregistration per target group",
            change: |_, nodes| {
                nodes.pop();
            },
            drift: untouched,
            calls: &["DeregisterTargets", "DeregisterTargets"],
        },
        Row {
            what: "247 nodes join: registrations in calls of at most 100",
            change: |_, nodes| nodes.extend((3..250).map(node)),
            drift: untouched,
            calls: &[
                "RegisterTargets",
                "RegisterTargets",
                "RegisterTargets",
                "RegisterTargets",
                "RegisterTargets",
                "RegisterTargets",
            ],
        },
        Row {
            what: "port 80's node port changes: a new target group, the listener moved to it, the old one deleted last",
            change: |svc, _| svc.ports[0].node_port = Some(30081),
            drift: untouched,
            calls: &["CreateTargetGroup", "RegisterTargets", "ModifyListener", "DeleteTargetGroup"],
        },
        Row {
            what: "port 443 removed: its listener goes before its target group",
            change: |svc, _| {
                svc.ports.pop();
            },
            drift: untouched,
            calls: &["DeleteListener", "DeleteTargetGroup"],
        },
        Row {
            what: "a port added: its target group, targets and listener; nothing else",
            change: |svc, _| svc.ports.push(port(8080, Protocol::Tcp, 30808)),
            drift: untouched,
            calls: &["CreateTargetGroup", "RegisterTargets", "CreateListener"],
        },
        Row {
            what: "internet-facing instead of internal: the old NLB is deleted first (its listeners with it), a new one made",
            change: |svc, _| {
                svc.annotations
                    .insert(ann::AWS_LOAD_BALANCER_SCHEME.into(), "internet-facing".into());
            },
            drift: untouched,
            calls: &["DeleteLoadBalancer", "CreateLoadBalancer", "CreateListener", "CreateListener"],
        },
        Row {
            what: "a duplicate NLB of the same name (a crash before the first was seen): the later ARN goes",
            change: same,
            drift: |aws| {
                let mut dup = aws.have.load_balancers[0].clone();
                dup.lb.arn = "arn:lb:9999".into();
                dup.listeners.clear();
                aws.have.load_balancers.push(dup);
            },
            calls: &["DeleteLoadBalancer"],
        },
        Row {
            what: "subnets changed by the annotation: set in place",
            change: |svc, _| {
                svc.annotations
                    .insert(ann::AWS_LOAD_BALANCER_SUBNETS.into(), "subnet-c,subnet-d".into());
            },
            drift: untouched,
            calls: &["SetSubnets"],
        },
        Row {
            what: "a health check changed by hand: set back",
            change: same,
            drift: |aws| first_tg(aws).tg.health_check.interval_seconds = 30,
            calls: &["ModifyTargetGroup"],
        },
        Row {
            what: "externalTrafficPolicy Local: both health checks become HTTP on the health-check node port",
            change: |svc, _| {
                svc.external_traffic_policy = TrafficPolicy::Local;
                svc.health_check_node_port = Some(32000);
            },
            drift: untouched,
            calls: &["ModifyTargetGroup", "ModifyTargetGroup"],
        },
        Row {
            what: "a target deregistered by hand: registered again, alone",
            change: same,
            drift: |aws| {
                let tg = first_tg(aws);
                let t = tg.targets.iter().next().cloned().unwrap();
                tg.targets.remove(&t);
            },
            calls: &["RegisterTargets"],
        },
        Row {
            what: "a stranger's instance registered by hand: deregistered",
            change: same,
            drift: |aws| {
                first_tg(aws).targets.insert(Target {
                    id: "i-0ffffffffffffffff".into(),
                    port: 30080,
                });
            },
            calls: &["DeregisterTargets"],
        },
        Row {
            what: "a listener pointed at the other target group by hand: pointed back",
            change: same,
            drift: |aws| {
                let arns: Vec<String> = aws.have.target_groups.iter().map(|t| t.tg.arn.clone()).collect();
                let l = &mut aws.have.load_balancers[0].listeners[0];
                let other = arns.iter().find(|a| l.target_group_arn.as_ref() != Some(a)).cloned();
                l.target_group_arn = other;
            },
            calls: &["ModifyListener"],
        },
        Row {
            what: "berth's ownership tag removed by hand from the NLB: added back",
            change: same,
            drift: |aws| {
                aws.have.load_balancers[0].tags.remove(aws_tag::SERVICE);
            },
            calls: &["AddTags"],
        },
        Row {
            what: "extra tags from the annotation: added to the NLB and to both target groups",
            change: |svc, _| {
                svc.annotations
                    .insert(ann::AWS_ADDITIONAL_RESOURCE_TAGS.into(), "team=edge".into());
            },
            drift: untouched,
            calls: &["AddTags", "AddTags", "AddTags"],
        },
        Row {
            what: "a load-balancer attribute asked for: set on the NLB only",
            change: |svc, _| {
                svc.annotations.insert(
                    ann::AWS_LOAD_BALANCER_ATTRIBUTES.into(),
                    "load_balancing.cross_zone.enabled=true".into(),
                );
            },
            drift: untouched,
            calls: &["ModifyLoadBalancerAttributes"],
        },
        Row {
            what: "a target-group attribute asked for: set on each target group",
            change: |svc, _| {
                svc.annotations.insert(
                    ann::AWS_TARGET_GROUP_ATTRIBUTES.into(),
                    "deregistration_delay.timeout_seconds=120".into(),
                );
            },
            drift: untouched,
            calls: &["ModifyTargetGroupAttributes", "ModifyTargetGroupAttributes"],
        },
        Row {
            what: "TCP and UDP on port 80 (one node port): the TCP target group is replaced by a TCP_UDP one",
            change: |svc, _| svc.ports.push(port(80, Protocol::Udp, 30080)),
            drift: untouched,
            calls: &["CreateTargetGroup", "RegisterTargets", "ModifyListener", "DeleteTargetGroup"],
        },
        Row {
            what: "the NLB deleted by hand: made again, the target groups kept and re-attached",
            change: same,
            drift: |aws| {
                aws.have.load_balancers.clear();
                for tg in &mut aws.have.target_groups {
                    tg.tg.load_balancer_arns.clear();
                }
            },
            calls: &["CreateLoadBalancer", "CreateListener", "CreateListener"],
        },
    ]
}

#[test]
fn plan_rows_call_what_they_name_and_converge_in_one_pass() {
    for row in rows() {
        let (mut svc, mut nodes) = base();
        let mut aws = made(&svc, &nodes);
        check_whole(&stack(&svc, &nodes), &aws.have, "as made");
        (row.drift)(&mut aws);
        (row.change)(&mut svc, &mut nodes);
        let want = stack(&svc, &nodes);

        let steps = plan_stack(&want, &aws.have);
        let calls: Vec<&str> = steps.iter().map(Step::operation).collect();
        assert_eq!(calls, row.calls, "{}: {steps:#?}", row.what);

        apply(&mut aws, &steps);
        let again = plan_stack(&want, &aws.have);
        assert!(
            again.is_empty(),
            "{}: a second pass still plans {again:#?}",
            row.what
        );
        check_whole(&want, &aws.have, row.what);
    }
}

#[test]
fn a_scheme_change_keeps_names_apart() {
    // The replaced NLB and its successor may not share a name: AWS refuses a second load
    // balancer of one name, and the look-up before create would adopt the old one.
    let (mut svc, nodes) = base();
    let internal = stack(&svc, &nodes);
    svc.annotations.insert(
        ann::AWS_LOAD_BALANCER_SCHEME.into(),
        "internet-facing".into(),
    );
    let public = stack(&svc, &nodes);
    assert_eq!(internal.load_balancer.scheme, Scheme::Internal);
    assert_eq!(public.load_balancer.scheme, Scheme::InternetFacing);
    assert_ne!(internal.load_balancer.name, public.load_balancer.name);
}

#[test]
fn local_policy_health_checks_are_http_on_the_health_check_node_port() {
    let (mut svc, nodes) = base();
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    for tg in stack(&svc, &nodes).target_groups.values() {
        assert_eq!(
            tg.health_check.protocol,
            HcProtocol::Http,
            "{}",
            tg.resource
        );
        assert_eq!(tg.health_check.port.to_string(), "32000", "{}", tg.resource);
        assert_eq!(
            tg.health_check.path.as_deref(),
            Some("/healthz"),
            "{}",
            tg.resource
        );
        assert_eq!(tg.protocol, TgProtocol::Tcp);
    }
}
