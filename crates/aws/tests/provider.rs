//! The provider against the in-memory ELBv2, which enforces what AWS enforces: create,
//! update, replace, delete, drift, leaks, foreign resources, and a crash at every call.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use berth_api::names::{annotation as ann, aws_tag};
use berth_aws::elbv2::Elbv2;
use berth_aws::memory::{is_mutating, Snapshot};
use berth_aws::metrics::{SWEPT_LOAD_BALANCER, SWEPT_TARGET_GROUP};
use berth_aws::model::{HcProtocol, Scheme};
use berth_aws::{Error, IpTargets, MemoryElbv2, NlbProvider, ServiceFacts};
use berth_core::{Protocol, TrafficPolicy};
use common::*;

fn provider(fake: MemoryElbv2) -> NlbProvider<MemoryElbv2> {
    // Every ensure reads AWS: these tests are about what is there, not about the cache.
    NlbProvider::new(fake, mk_config(), Duration::ZERO)
}

fn mutating_calls(fake: &MemoryElbv2) -> u64 {
    fake.calls()
        .iter()
        .filter(|(op, _)| is_mutating(op))
        .map(|(_, n)| n)
        .sum()
}

/// The invariant every test ends on: the fake holds exactly one NLB for the Service, one
/// target group per listener, nothing else of berth's.
fn assert_exactly(snap: &Snapshot, svc: &ServiceFacts, listeners: &[u16], targets_per_tg: usize) {
    let key = svc.key();
    let ours = |arn: &str| snap.tags.get(arn).and_then(|t| t.get(aws_tag::SERVICE)) == Some(&key);
    let lbs: Vec<_> = snap
        .load_balancers
        .iter()
        .filter(|l| ours(&l.arn))
        .collect();
    assert_eq!(lbs.len(), 1, "{snap:#?}");
    let tgs: Vec<_> = snap.target_groups.iter().filter(|t| ours(&t.arn)).collect();
    assert_eq!(tgs.len(), listeners.len(), "{snap:#?}");
    let mut ports: Vec<u16> = snap
        .listeners
        .iter()
        .filter(|l| l.load_balancer_arn == lbs[0].arn)
        .map(|l| l.port)
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, listeners);
    for tg in tgs {
        assert_eq!(
            snap.targets.get(&tg.arn).map_or(0, BTreeSet::len),
            targets_per_tg,
            "{}",
            tg.name
        );
    }
}

#[tokio::test]
async fn create_makes_the_model_and_a_steady_state_calls_nothing_that_changes() {
    let p = provider(mk_fake(3));
    let svc = mk_service(
        "web",
        "front",
        vec![
            mk_port(80, Protocol::Tcp, 30080),
            mk_port(443, Protocol::Tcp, 30443),
        ],
    );
    let first = p
        .ensure(&svc, &mk_nodes(3), &IpTargets::new(), None)
        .await
        .unwrap();
    assert!(
        first.hostname.ends_with(".elb.us-east-1.amazonaws.com"),
        "{}",
        first.hostname
    );
    assert_exactly(&p.client().snapshot(), &svc, &[80, 443], 3);
    // Creating: one load balancer, two target groups, two listeners, one register per group.
    assert_eq!(mutating_calls(p.client()), 7, "{:?}", p.client().calls());

    p.client().reset_calls();
    let again = p
        .ensure(
            &svc,
            &mk_nodes(3),
            &IpTargets::new(),
            Some(&first.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_eq!(again.changes, 0);
    assert_eq!(again.hostname, first.hostname);
    assert_eq!(mutating_calls(p.client()), 0, "{:?}", p.client().calls());
}

#[tokio::test]
async fn a_converged_service_is_answered_from_memory_until_it_changes() {
    let p = NlbProvider::new(mk_fake(3), mk_config(), Duration::from_secs(3600));
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let first = p
        .ensure(&svc, &mk_nodes(3), &IpTargets::new(), None)
        .await
        .unwrap();
    p.client().reset_calls();
    p.ensure(
        &svc,
        &mk_nodes(3),
        &IpTargets::new(),
        Some(&first.load_balancer_arn),
    )
    .await
    .unwrap();
    assert!(p.client().calls().is_empty(), "{:?}", p.client().calls());
    // A node leaving changes the model: AWS is read and the target deregistered.
    p.ensure(
        &svc,
        &mk_nodes(2),
        &IpTargets::new(),
        Some(&first.load_balancer_arn),
    )
    .await
    .unwrap();
    assert_eq!(p.client().calls().get("DeregisterTargets"), Some(&1));
    assert_exactly(&p.client().snapshot(), &svc, &[80], 2);
}

#[tokio::test]
async fn ports_nodes_policy_and_annotations_change_only_what_differs() {
    let p = provider(mk_fake(5));
    let mut svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let arn = p
        .ensure(&svc, &mk_nodes(3), &IpTargets::new(), None)
        .await
        .unwrap()
        .load_balancer_arn;

    svc.ports.push(mk_port(8443, Protocol::Tcp, 30443));
    p.ensure(&svc, &mk_nodes(3), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    assert_exactly(&p.client().snapshot(), &svc, &[80, 8443], 3);

    svc.ports.remove(0);
    p.ensure(&svc, &mk_nodes(3), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    assert_exactly(&p.client().snapshot(), &svc, &[8443], 3);

    p.client().reset_calls();
    p.ensure(&svc, &mk_nodes(5), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    assert_eq!(p.client().calls().get("RegisterTargets"), Some(&1));
    assert_exactly(&p.client().snapshot(), &svc, &[8443], 5);

    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32100);
    p.client().reset_calls();
    p.ensure(&svc, &mk_nodes(5), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    assert_eq!(mutating_calls(p.client()), 1, "{:?}", p.client().calls());
    let tg = &p.client().snapshot().target_groups[0];
    assert_eq!(tg.health_check.protocol, HcProtocol::Http);

    svc.annotations.insert(
        ann::AWS_LOAD_BALANCER_SUBNETS.into(),
        "subnet-0000000a,subnet-0000000c".into(),
    );
    svc.annotations
        .insert(ann::AWS_ADDITIONAL_RESOURCE_TAGS.into(), "team=web".into());
    svc.annotations.insert(
        ann::AWS_LOAD_BALANCER_ATTRIBUTES.into(),
        "load_balancing.cross_zone.enabled=true".into(),
    );
    p.ensure(&svc, &mk_nodes(5), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    let snap = p.client().snapshot();
    assert!(snap.load_balancers[0].subnets.contains("subnet-0000000c"));
    assert!(
        snap.tags
            .values()
            .filter(|t| t.get("team").map(String::as_str) == Some("web"))
            .count()
            >= 2
    );
    // Then nothing more to do.
    p.client().reset_calls();
    assert_eq!(
        p.ensure(&svc, &mk_nodes(5), &IpTargets::new(), Some(&arn))
            .await
            .unwrap()
            .changes,
        0
    );
}

#[tokio::test]
async fn a_scheme_change_replaces_the_load_balancer() {
    let p = provider(mk_fake(2));
    let mut svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let old = p
        .ensure(&svc, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap();
    svc.annotations.insert(
        ann::AWS_LOAD_BALANCER_SCHEME.into(),
        "internet-facing".into(),
    );
    let new = p
        .ensure(
            &svc,
            &mk_nodes(2),
            &IpTargets::new(),
            Some(&old.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_ne!(old.load_balancer_arn, new.load_balancer_arn);
    let snap = p.client().snapshot();
    assert_eq!(snap.load_balancers.len(), 1);
    assert_eq!(snap.load_balancers[0].scheme, Scheme::InternetFacing);
    assert_exactly(&snap, &svc, &[80], 2);
}

#[tokio::test]
async fn delete_leaves_nothing_and_is_idempotent() {
    let p = provider(mk_fake(2));
    let svc = mk_service(
        "web",
        "front",
        vec![
            mk_port(80, Protocol::Tcp, 30080),
            mk_port(53, Protocol::Udp, 30053),
        ],
    );
    let arn = p
        .ensure(&svc, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap()
        .load_balancer_arn;
    assert_eq!(p.delete(&svc, Some(&arn)).await.unwrap(), 3);
    let snap = p.client().snapshot();
    assert!(
        snap.load_balancers.is_empty()
            && snap.target_groups.is_empty()
            && snap.listeners.is_empty(),
        "{snap:#?}"
    );
    assert_eq!(p.delete(&svc, Some(&arn)).await.unwrap(), 0);
}

#[tokio::test]
async fn what_is_deleted_behind_berths_back_is_recreated() {
    let p = NlbProvider::new(mk_fake(2), mk_config(), Duration::from_secs(3600));
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let first = p
        .ensure(&svc, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap();
    // Someone deletes the load balancer and its target group in the console.
    p.client()
        .delete_load_balancer(first.load_balancer_arn.clone())
        .await
        .unwrap();
    let tg = p.client().snapshot().target_groups[0].arn.clone();
    p.client().delete_target_group(tg).await.unwrap();
    let swept = p.sweep(&BTreeSet::from([svc.key()])).await.unwrap();
    assert_eq!(swept.drifted, vec![svc.key()]);
    let again = p
        .ensure(
            &svc,
            &mk_nodes(2),
            &IpTargets::new(),
            Some(&first.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_ne!(again.load_balancer_arn, first.load_balancer_arn);
    assert_exactly(&p.client().snapshot(), &svc, &[80], 2);
}

#[tokio::test]
async fn resources_without_berths_tags_are_never_touched() {
    let fake = mk_fake(2);
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    // Someone else's load balancer with the very name berth derives for this Service, and one
    // of another cluster's.
    let stack = berth_aws::build_stack(&svc, &[], &IpTargets::new(), &mk_config()).unwrap();
    let mut squatter = stack.load_balancer.clone();
    squatter.tags = [("owner".to_string(), "someone".to_string())].into();
    fake.create_load_balancer(squatter).await.unwrap();
    let mut other = stack.load_balancer.clone();
    other.name = "other-cluster".into();
    other.tags.insert(aws_tag::CLUSTER.into(), "other".into());
    fake.create_load_balancer(other).await.unwrap();
    let before = fake.snapshot();
    let p = provider(fake);
    let err = p
        .ensure(&svc, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NameTaken { .. }), "{err}");
    assert!(!err.is_retryable());
    p.delete(&svc, None).await.unwrap();
    p.sweep(&BTreeSet::new()).await.unwrap();
    assert_eq!(p.client().snapshot(), before);
}

#[tokio::test]
async fn the_sweep_removes_what_belongs_to_services_that_are_gone() {
    let p = provider(mk_fake(2));
    let live = mk_service("web", "live", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let gone = mk_service("web", "gone", vec![mk_port(80, Protocol::Tcp, 30081)]);
    p.ensure(&live, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap();
    p.ensure(&gone, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap();
    p.client().set_page_size(1);
    let swept = p.sweep(&BTreeSet::from([live.key()])).await.unwrap();
    assert_eq!(
        (swept.load_balancers.len(), swept.target_groups.len()),
        (1, 1)
    );
    assert_exactly(&p.client().snapshot(), &live, &[80], 2);
    assert_eq!(p.client().snapshot().load_balancers.len(), 1);
    // The counter says what was removed, by kind; a sweep that finds nothing adds nothing.
    p.sweep(&BTreeSet::from([live.key()])).await.unwrap();
    assert_eq!(
        (
            p.metrics().swept_count(SWEPT_LOAD_BALANCER),
            p.metrics().swept_count(SWEPT_TARGET_GROUP)
        ),
        (1, 1)
    );
}

/// A Service deleted (by its finalizer) while the sweep runs: its resources were in the
/// listing but are gone, and are not counted as leaks.
#[tokio::test]
async fn the_sweep_does_not_count_what_a_delete_removed_meanwhile() {
    let p = provider(mk_fake(2));
    let old = mk_service("web", "old", vec![mk_port(80, Protocol::Tcp, 30080)]);
    p.ensure(&old, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap();
    let listing = p.list_for_sweep().await.unwrap();
    p.delete(&old, None).await.unwrap();
    // The Services as read after the delete: `old` is gone.
    let swept = p.sweep_listed(listing, &BTreeSet::new()).await.unwrap();
    assert_eq!(swept, berth_aws::Swept::default());
    assert_eq!(
        (
            p.metrics().swept_count(SWEPT_LOAD_BALANCER),
            p.metrics().swept_count(SWEPT_TARGET_GROUP)
        ),
        (0, 0)
    );
    // A later listing of a real leak is still swept.
    p.ensure(&old, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap();
    let swept = p.sweep(&BTreeSet::new()).await.unwrap();
    assert_eq!(
        (swept.load_balancers.len(), swept.target_groups.len()),
        (1, 1)
    );
}

/// A Service created while the sweep runs: AWS is listed before the Services are read, so
/// its new load balancer is not taken for a leak.
#[tokio::test]
async fn the_sweep_never_takes_a_service_created_meanwhile_for_a_leak() {
    let p = provider(mk_fake(2));
    let listing = p.list_for_sweep().await.unwrap();
    let new = mk_service("web", "new", vec![mk_port(80, Protocol::Tcp, 30080)]);
    p.ensure(&new, &mk_nodes(2), &IpTargets::new(), None)
        .await
        .unwrap();
    // The Services as read after the listing: `new` is there (or would not have its NLB).
    let swept = p
        .sweep_listed(listing, &BTreeSet::from([new.key()]))
        .await
        .unwrap();
    assert_eq!(swept, berth_aws::Swept::default());
    assert_exactly(&p.client().snapshot(), &new, &[80], 2);
    assert_eq!(p.metrics().swept_count(SWEPT_LOAD_BALANCER), 0);
}

/// A crash after every possible number of mutating calls, then a restarted provider with no
/// memory and no remembered ARN: it must converge to exactly one of everything.
#[tokio::test]
async fn a_crash_between_any_two_calls_never_leaves_a_duplicate() {
    let svc = mk_service(
        "web",
        "front",
        vec![
            mk_port(80, Protocol::Tcp, 30080),
            mk_port(53, Protocol::Udp, 30053),
        ],
    );
    for crash_after in 0..7u64 {
        let fake = mk_fake(3);
        fake.fail_after_mutations(Some(crash_after));
        let p = provider(fake);
        assert!(p
            .ensure(&svc, &mk_nodes(3), &IpTargets::new(), None)
            .await
            .is_err());
        let fake = p.into_client();
        fake.fail_after_mutations(None);
        let restarted = NlbProvider::new(fake, mk_config(), Duration::ZERO);
        restarted
            .ensure(&svc, &mk_nodes(3), &IpTargets::new(), None)
            .await
            .unwrap();
        assert_exactly(&restarted.client().snapshot(), &svc, &[53, 80], 3);
        // And a delete that crashes part-way is finished by the next one.
        restarted
            .client()
            .fail_after_mutations(Some(crash_after.min(2)));
        let _ = restarted.delete(&svc, None).await;
        restarted.client().fail_after_mutations(None);
        restarted.delete(&svc, None).await.unwrap();
        assert!(restarted.client().snapshot().load_balancers.is_empty());
        assert!(restarted.client().snapshot().target_groups.is_empty());
    }
}

/// An endpoint whose every page names the same next marker: the listing ends with an error
/// after the second time, instead of looping and growing for ever.
#[tokio::test]
async fn a_marker_that_comes_back_ends_the_listing() {
    let p = provider(mk_fake(1));
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    p.ensure(&svc, &mk_nodes(1), &IpTargets::new(), None)
        .await
        .unwrap();
    p.client().repeat_markers(true);
    p.client().reset_calls();
    let err = p.list_for_sweep().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Paging {
                operation: "DescribeLoadBalancers",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_retryable());
    // The first page, then the repeat: two calls, not an endless loop.
    assert_eq!(p.client().calls().get("DescribeLoadBalancers"), Some(&2));
    let err = p.sweep(&BTreeSet::new()).await.unwrap_err();
    assert!(matches!(err, Error::Paging { .. }), "{err}");
    // Nothing was swept on a listing that never finished.
    p.client().repeat_markers(false);
    assert_exactly(&p.client().snapshot(), &svc, &[80], 1);
}

/// The regional quota counts every owner's target groups as last listed, plus what berth
/// made since: a Service whose new target groups would not fit is refused before any call
/// that changes something, and one that fits still converges.
#[tokio::test]
async fn the_regional_target_group_quota_refuses_before_creating() {
    let mut config = mk_config();
    config.quotas.target_groups_per_region = 3;
    let p = NlbProvider::new(mk_fake(1), config, Duration::ZERO);
    let one = mk_service("web", "one", vec![mk_port(80, Protocol::Tcp, 30080)]);
    p.ensure(&one, &mk_nodes(1), &IpTargets::new(), None)
        .await
        .unwrap();
    p.list_for_sweep().await.unwrap();
    assert_eq!(p.metrics().region_target_groups(), 1);
    let two = mk_service(
        "web",
        "two",
        vec![
            mk_port(80, Protocol::Tcp, 30081),
            mk_port(443, Protocol::Tcp, 30444),
        ],
    );
    // 1 + 2 = 3: fits.
    p.ensure(&two, &mk_nodes(1), &IpTargets::new(), None)
        .await
        .unwrap();
    let three = mk_service("web", "three", vec![mk_port(80, Protocol::Tcp, 30082)]);
    let before = mutating_calls(p.client());
    let err = p
        .ensure(&three, &mk_nodes(1), &IpTargets::new(), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Model(berth_aws::ModelError::Quota {
                quota: "Target groups per Region",
                limit: 3,
                needed: 4,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(mutating_calls(p.client()), before);
    // A deletion frees room.
    p.delete(&one, None).await.unwrap();
    p.ensure(&three, &mk_nodes(1), &IpTargets::new(), None)
        .await
        .unwrap();
}

/// A listener switches between TCP and TLS in place (ModifyListener with the new protocol,
/// which moto refuses for TLS) as the certificate and ports come and go.
#[tokio::test]
async fn listeners_switch_between_tcp_and_tls_in_place() {
    let p = provider(mk_fake(1));
    let cert = "arn:aws:acm:us-east-1:000000000000:certificate/front";
    let mut svc = mk_service(
        "web",
        "front",
        vec![
            mk_port(80, Protocol::Tcp, 30080),
            mk_port(443, Protocol::Tcp, 30443),
        ],
    );
    let tls_ports = |p: &NlbProvider<MemoryElbv2>| -> Vec<(u16, Option<String>)> {
        let mut l: Vec<_> = p
            .client()
            .snapshot()
            .listeners
            .iter()
            .map(|l| (l.port, l.tls.as_ref().map(|t| t.policy.clone())))
            .collect();
        l.sort();
        l
    };
    let first = p
        .ensure(&svc, &mk_nodes(1), &IpTargets::new(), None)
        .await
        .unwrap();
    svc.annotations
        .insert(ann::AWS_SSL_CERT.into(), cert.into());
    svc.annotations
        .insert(ann::AWS_SSL_PORTS.into(), "443".into());
    let tls = p
        .ensure(
            &svc,
            &mk_nodes(1),
            &IpTargets::new(),
            Some(&first.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_eq!(tls.changes, 1, "one ModifyListener");
    assert_eq!(
        tls_ports(&p),
        [(80, None), (443, Some("ELBSecurityPolicy-2016-08".into()))]
    );
    // Every port, by leaving -ssl-ports out.
    svc.annotations.remove(ann::AWS_SSL_PORTS);
    p.ensure(
        &svc,
        &mk_nodes(1),
        &IpTargets::new(),
        Some(&first.load_balancer_arn),
    )
    .await
    .unwrap();
    assert!(tls_ports(&p).iter().all(|(_, t)| t.is_some()));
    // Without the certificate: plain TCP again, the same load balancer and target groups.
    svc.annotations.remove(ann::AWS_SSL_CERT);
    let plain = p
        .ensure(
            &svc,
            &mk_nodes(1),
            &IpTargets::new(),
            Some(&first.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_eq!(
        (plain.changes, plain.load_balancer_arn),
        (2, first.load_balancer_arn)
    );
    assert_eq!(tls_ports(&p), [(80, None), (443, None)]);
    assert_exactly(&p.client().snapshot(), &svc, &[80, 443], 1);
}
