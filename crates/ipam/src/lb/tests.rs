//! The allocator against its reference model: every operation, on random histories, gives
//! the same result (addresses or error text), the same holders, counts and orphans.

use std::net::IpAddr;

use proptest::prelude::*;

use super::reference::Reference;
use super::*;
use berth_core::{IpFamily, Labels, Protocol, TrafficPolicy};

fn candidate_ips() -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = (250..=255)
        .map(|n| format!("198.18.0.{n}").parse().unwrap())
        .collect();
    v.extend((0..=6).map(|n| format!("198.18.1.{n}").parse::<IpAddr>().unwrap()));
    v.extend((0..=5).map(|n| format!("fd00:18::{n}").parse::<IpAddr>().unwrap()));
    v.push("10.0.0.1".parse().unwrap());
    v
}

fn view() -> impl Strategy<Value = ServiceView> {
    let ips = candidate_ips();
    (
        proptest::option::of(prop_oneof![Just("k".to_string()), Just("j".to_string())]),
        proptest::collection::vec((any::<bool>(), 80u16..83), 0..3),
        any::<bool>(),
        0u8..2,
        prop_oneof![
            Just(vec![IpFamily::V4]),
            Just(vec![IpFamily::V6]),
            Just(vec![IpFamily::V4, IpFamily::V6]),
            Just(vec![IpFamily::V6, IpFamily::V4]),
            Just(vec![]),
        ],
        proptest::collection::vec(proptest::sample::select(ips), 0..3),
        proptest::option::of(prop_oneof![
            Just("low".to_string()),
            Just("high".to_string()),
            Just("manual".to_string()),
            Just("gone".to_string())
        ]),
        prop_oneof![Just("default"), Just("team-a")],
        any::<bool>(),
    )
        .prop_map(
            |(sharing_key, ports, local, app, families, requested_ips, pool, ns, public)| {
                ServiceView {
                    namespace: ns.into(),
                    labels: if public {
                        [("expose".to_string(), "public".to_string())].into()
                    } else {
                        Labels::new()
                    },
                    sharing_key,
                    // Some Services of team-a accept any namespace: sharing across namespaces
                    // is exercised, and refused when only one side consents.
                    sharing_namespaces: if public && ns == "team-a" {
                        vec!["*".to_string()]
                    } else {
                        Vec::new()
                    },
                    ports: ports
                        .into_iter()
                        .map(|(udp, p)| {
                            LbPort::new(if udp { Protocol::Udp } else { Protocol::Tcp }, p)
                        })
                        .collect(),
                    external_traffic_policy: if local {
                        TrafficPolicy::Local
                    } else {
                        TrafficPolicy::Cluster
                    },
                    selector: [("app".to_string(), app.to_string())].into(),
                    requested_ips,
                    requested_pool: pool,
                    families,
                    ..Default::default()
                }
            },
        )
}

fn pools(variant: u8) -> Vec<PoolSpec> {
    let mut low = PoolSpec::new("low", &["198.18.0.250-198.18.1.2", "fd00:18::/126"]);
    low.avoid_buggy_ips = variant & 1 != 0;
    low.priority = Some(1);
    let mut out = vec![low];
    if variant & 2 != 0 {
        let mut high = PoolSpec::new("high", &["198.18.1.0-198.18.1.5"]);
        high.avoid_buggy_ips = true;
        high.service_selectors = vec![berth_core::LabelSelector::from_labels([(
            "expose", "public",
        )])];
        out.push(high);
    }
    if variant & 4 != 0 {
        let mut manual = PoolSpec::new("manual", &["198.18.1.4-198.18.1.6", "fd00:18::4/127"]);
        manual.auto_assign = false;
        manual.namespaces = vec!["team-a".into()];
        out.push(manual);
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    Assign(u8, ServiceView),
    Adopt(u8, ServiceView, Vec<IpAddr>),
    Release(u8),
    ReleaseOne(u8, IpAddr),
    Pools(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let ips = candidate_ips();
    prop_oneof![
        5 => (0u8..6, view()).prop_map(|(o, v)| Op::Assign(o, v)),
        2 => (0u8..6, view(), proptest::sample::subsequence(ips, 0..3)).prop_map(|(o, v, ips)| Op::Adopt(o, v, ips)),
        2 => (0u8..6).prop_map(Op::Release),
        2 => (0u8..6, proptest::sample::select(candidate_ips())).prop_map(|(o, ip)| Op::ReleaseOne(o, ip)),
        1 => (0u8..8).prop_map(Op::Pools),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]
    #[test]
    fn agrees_with_the_reference_model(first in 0u8..8, ops in proptest::collection::vec(op(), 1..80)) {
        let mut a: LbIpAllocator<String> = LbIpAllocator::new();
        let mut r: Reference<String> = Reference::new();
        let name = |o: u8| format!("ns/svc-{o}");
        let err = |e: Error| e.to_string();
        prop_assert_eq!(a.set_pools(pools(first)).map_err(err), r.set_pools(pools(first)).map_err(err));
        for op in ops {
            match op {
                Op::Assign(o, v) => prop_assert_eq!(
                    a.assign(&name(o), &v).map_err(err),
                    r.assign(&name(o), &v).map_err(err)
                ),
                Op::Adopt(o, v, ips) => prop_assert_eq!(
                    a.adopt(&name(o), &v, &ips).map_err(err),
                    r.adopt(&name(o), &v, &ips).map_err(err)
                ),
                Op::Release(o) => prop_assert_eq!(a.release_owner(&name(o)), r.release_owner(&name(o))),
                Op::ReleaseOne(o, ip) => prop_assert_eq!(a.release(&name(o), ip), r.release(&name(o), ip)),
                Op::Pools(variant) => prop_assert_eq!(
                    a.set_pools(pools(variant)).map_err(err),
                    r.set_pools(pools(variant)).map_err(err)
                ),
            }
            for o in 0u8..6 {
                prop_assert_eq!(a.ips_of(&name(o)), r.ips_of(&name(o)));
            }
            for ip in candidate_ips() {
                prop_assert_eq!(a.holders_of(ip), r.holders_of(ip), "holders of {}", ip);
                prop_assert_eq!(a.pool_of(ip), r.pool_of(ip));
            }
            for p in ["low", "high", "manual"] {
                prop_assert_eq!(a.pool_status(p), r.pool_status(p), "status of {}", p);
            }
            prop_assert_eq!(a.pool_names(), r.pool_names());
            prop_assert_eq!(a.overlapping_pools(), r.overlapping_pools());
            for f in [IpFamily::V4, IpFamily::V6] {
                prop_assert_eq!(a.used(f), r.used(f));
            }
        }
    }
}

#[test]
fn a_kept_address_outside_every_pool_is_held_counted_once_a_pool_has_it_and_checked_without_change()
{
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let v4 = ServiceView {
        namespace: "default".into(),
        ..ServiceView::default()
    };
    let mut a: LbIpAllocator<u8> = LbIpAllocator::new();
    a.set_pools(vec![PoolSpec::new("p", &["198.18.0.10-198.18.0.11"])])
        .unwrap();
    // Adoption refuses an address in no pool; keeping takes it.
    assert!(matches!(
        a.adopt(&1, &v4, &[ip("198.18.0.20")]),
        Err(Error::NotAllowedByConfig { .. })
    ));
    a.keep(&1, &v4, &[ip("198.18.0.20")]).unwrap();
    assert_eq!(a.ips_of(&1), [ip("198.18.0.20")]);
    // Nobody else is given it, and another claim of it is refused.
    assert!(a.keep(&2, &v4, &[ip("198.18.0.20")]).is_err());
    // A check is what assign would give, and changes nothing.
    assert_eq!(a.check(&1, &v4).unwrap(), [ip("198.18.0.10")]);
    assert_eq!(a.ips_of(&1), [ip("198.18.0.20")]);
    assert_eq!(a.pool_status("p").unwrap().assigned_ipv4, 0);
    // A pool that has it counts it, and the Service keeps it.
    a.set_pools(vec![PoolSpec::new("p", &["198.18.0.10-198.18.0.20"])])
        .unwrap();
    assert_eq!(a.pool_status("p").unwrap().assigned_ipv4, 1);
    assert_eq!(a.check(&1, &v4).unwrap(), [ip("198.18.0.20")]);
    assert_eq!(a.assign(&2, &v4).unwrap(), [ip("198.18.0.10")]);
}
