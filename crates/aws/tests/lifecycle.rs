//! Property: whatever a Service goes through (ports, nodes, policy and scheme changes),
//! whatever is deleted behind berth's back, and wherever the controller crashes and restarts
//! without memory, the next successful ensure leaves exactly the model in AWS, and the one
//! after it changes nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use berth_api::names::{annotation as ann, aws_tag};
use berth_aws::elbv2::Elbv2;
use berth_aws::memory::MemoryElbv2;
use berth_aws::{build_stack, IpTargets, NlbProvider, ServiceFacts};
use berth_core::{Protocol, TrafficPolicy};
use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Ports(u8),
    Nodes(usize),
    Local(bool),
    InternetFacing(bool),
    /// The controller dies after this many mutating calls of the next ensure, and restarts
    /// with no memory and no remembered ARN.
    CrashAfter(u64),
    DeleteBehindBack(u8),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u8..16).prop_map(Op::Ports),
        (0usize..5).prop_map(Op::Nodes),
        any::<bool>().prop_map(Op::Local),
        any::<bool>().prop_map(Op::InternetFacing),
        (0u64..6).prop_map(Op::CrashAfter),
        any::<u8>().prop_map(Op::DeleteBehindBack),
        Just(Op::Sweep),
    ]
}

/// Ports from a bit set: 80/TCP, 443/TCP, 53/UDP, 9000/TCP+UDP.
fn ports(bits: u8) -> Vec<berth_aws::PortFacts> {
    let mut out = Vec::new();
    if bits & 1 != 0 {
        out.push(mk_port(80, Protocol::Tcp, 30080));
    }
    if bits & 2 != 0 {
        out.push(mk_port(443, Protocol::Tcp, 30443));
    }
    if bits & 4 != 0 {
        out.push(mk_port(53, Protocol::Udp, 30053));
    }
    if bits & 8 != 0 {
        out.push(mk_port(9000, Protocol::Tcp, 30900));
        out.push(mk_port(9000, Protocol::Udp, 30900));
    }
    out
}

async fn check_exactly_the_model(p: &NlbProvider<MemoryElbv2>, svc: &ServiceFacts, nodes: usize) {
    let stack = build_stack(svc, &mk_nodes(nodes), &IpTargets::new(), &mk_config()).unwrap();
    let snap = p.client().snapshot();
    let ours = |arn: &str| {
        snap.tags
            .get(arn)
            .and_then(|t| t.get(aws_tag::SERVICE))
            .is_some()
    };
    let lbs: Vec<_> = snap
        .load_balancers
        .iter()
        .filter(|l| ours(&l.arn))
        .collect();
    assert_eq!(lbs.len(), 1, "{snap:#?}");
    assert_eq!(lbs[0].name, stack.load_balancer.name);
    let tg_names: BTreeSet<&str> = snap
        .target_groups
        .iter()
        .filter(|t| ours(&t.arn))
        .map(|t| t.name.as_str())
        .collect();
    let want: BTreeSet<&str> = stack
        .target_groups
        .values()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(tg_names, want);
    let ports: BTreeSet<u16> = snap
        .listeners
        .iter()
        .filter(|l| l.load_balancer_arn == lbs[0].arn)
        .map(|l| l.port)
        .collect();
    assert_eq!(ports, stack.listeners.keys().copied().collect());
    assert_eq!(
        snap.listeners
            .iter()
            .filter(|l| l.load_balancer_arn == lbs[0].arn)
            .count(),
        ports.len()
    );
    for tg in snap.target_groups.iter().filter(|t| ours(&t.arn)) {
        assert_eq!(
            snap.targets.get(&tg.arn).map_or(0, BTreeSet::len),
            stack
                .target_groups
                .values()
                .find(|w| w.name == tg.name)
                .map_or(0, |w| w.targets.len())
        );
    }
}

async fn run(ops: Vec<Op>) {
    let mut p = NlbProvider::new(mk_fake(5), mk_config(), Duration::from_secs(3600));
    let mut svc = mk_service("web", "front", ports(1));
    svc.health_check_node_port = Some(32000);
    let mut nodes = 3;
    let mut arn: Option<String> = None;
    for op in ops {
        match op {
            Op::Ports(bits) => svc.ports = ports(bits),
            Op::Nodes(n) => nodes = n,
            Op::Local(local) => {
                svc.external_traffic_policy = if local {
                    TrafficPolicy::Local
                } else {
                    TrafficPolicy::Cluster
                }
            }
            Op::InternetFacing(yes) => {
                if yes {
                    svc.annotations.insert(
                        ann::AWS_LOAD_BALANCER_SCHEME.into(),
                        "internet-facing".into(),
                    );
                } else {
                    svc.annotations.remove(ann::AWS_LOAD_BALANCER_SCHEME);
                }
            }
            Op::CrashAfter(n) => {
                p.client().fail_after_mutations(Some(n));
                let _ = p
                    .ensure(&svc, &mk_nodes(nodes), &IpTargets::new(), arn.as_deref())
                    .await;
                let fake = p.into_client();
                fake.fail_after_mutations(None);
                p = NlbProvider::new(fake, mk_config(), Duration::from_secs(3600));
                arn = None;
                continue;
            }
            Op::DeleteBehindBack(which) => {
                let snap = p.client().snapshot();
                match which % 3 {
                    0 => {
                        if let Some(l) = snap.listeners.first() {
                            p.client().delete_listener(l.arn.clone()).await.unwrap();
                        }
                    }
                    1 => {
                        if let Some(lb) = snap.load_balancers.first() {
                            p.client()
                                .delete_load_balancer(lb.arn.clone())
                                .await
                                .unwrap();
                        }
                    }
                    _ => {
                        if let Some(t) = snap.targets.iter().find(|(_, t)| !t.is_empty()) {
                            let one = t.1.iter().next().cloned().into_iter().collect();
                            p.client()
                                .deregister_targets(t.0.clone(), one)
                                .await
                                .unwrap();
                        }
                    }
                }
                // Drift is found by the sweep (load balancers and target groups) or when the
                // cache expires: forget, as an expired cache would.
                p.forget(&svc.key());
                continue;
            }
            Op::Sweep => {
                p.sweep(&BTreeSet::from([svc.key()])).await.unwrap();
                continue;
            }
        }
        let ensured = p
            .ensure(&svc, &mk_nodes(nodes), &IpTargets::new(), arn.as_deref())
            .await
            .unwrap();
        arn = Some(ensured.load_balancer_arn);
    }
    // Orphans (a target group whose port went away while its load balancer was gone) are the
    // sweep's to remove.
    p.forget(&svc.key());
    p.sweep(&BTreeSet::from([svc.key()])).await.unwrap();
    let last = p
        .ensure(&svc, &mk_nodes(nodes), &IpTargets::new(), arn.as_deref())
        .await
        .unwrap();
    check_exactly_the_model(&p, &svc, nodes).await;
    p.forget(&svc.key());
    let steady = p
        .ensure(
            &svc,
            &mk_nodes(nodes),
            &IpTargets::new(),
            Some(&last.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_eq!(steady.changes, 0);
    p.delete(&svc, Some(&last.load_balancer_arn)).await.unwrap();
    let snap = p.client().snapshot();
    assert!(
        snap.load_balancers.is_empty() && snap.target_groups.is_empty(),
        "{snap:#?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_history_converges_to_exactly_the_model(ops in proptest::collection::vec(op(), 1..14)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(run(ops));
    }
}
