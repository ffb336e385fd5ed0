//! Property tests over random operation sequences: no address or port ever has two
//! owners, release is idempotent, adopting first means a later assignment never steals,
//! pools never hand out an address outside themselves or a skipped `.0`/`.255`, and the
//! counts always equal the truth.
//!
//! Address plan: ClusterIPs 10.96.0.0/28 + fd00:96::/124; node ports 30000-30019;
//! pools in 198.18.0.250-198.18.1.5 (crosses a /24) and fd00:18::/126.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use berth_core::{IpFamily, Protocol, TrafficPolicy};
use berth_ipam::{
    ClusterIpAllocator, LbIpAllocator, LbPort, NodePortAllocator, PoolSpec, ServiceView,
};
use ipnet::IpNet;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;

const OWNERS: u8 = 6;

fn fam(v6: bool) -> IpFamily {
    if v6 {
        IpFamily::V6
    } else {
        IpFamily::V4
    }
}

// ---------------------------------------------------------------- ClusterIP

#[derive(Debug, Clone)]
enum IpOp {
    Allocate(u8, bool),
    Specific(u8, bool, u8),
    Release(bool, u8),
    ReleaseOwner(u8),
}

fn ip_op() -> impl Strategy<Value = IpOp> {
    prop_oneof![
        (0..OWNERS, any::<bool>()).prop_map(|(o, v6)| IpOp::Allocate(o, v6)),
        (0..OWNERS, any::<bool>(), 0u8..16).prop_map(|(o, v6, n)| IpOp::Specific(o, v6, n)),
        (any::<bool>(), 0u8..16).prop_map(|(v6, n)| IpOp::Release(v6, n)),
        (0..OWNERS).prop_map(IpOp::ReleaseOwner),
    ]
}

fn nth_ip(v6: bool, n: u8) -> IpAddr {
    if v6 {
        format!("fd00:96::{n:x}").parse().unwrap()
    } else {
        format!("10.96.0.{n}").parse().unwrap()
    }
}

proptest! {
    #[test]
    fn cluster_ips_have_one_owner_and_true_counts(seed in any::<u64>(), ops in proptest::collection::vec(ip_op(), 1..120)) {
        let cidrs: Vec<IpNet> = vec!["10.96.0.0/28".parse().unwrap(), "fd00:96::/124".parse().unwrap()];
        let mut a: ClusterIpAllocator<u8> = ClusterIpAllocator::new(&cidrs, SmallRng::seed_from_u64(seed)).unwrap();
        // The model: ip -> owner.
        let mut model: BTreeMap<IpAddr, u8> = BTreeMap::new();
        for op in ops {
            match op {
                IpOp::Allocate(o, v6) => {
                    let held = model.iter().find(|(ip, owner)| **owner == o && ip.is_ipv6() == v6).map(|(ip, _)| *ip);
                    match a.allocate(&o, fam(v6)) {
                        Ok(ip) => {
                            if let Some(h) = held { prop_assert_eq!(ip, h); }
                            prop_assert!(model.get(&ip).is_none_or(|x| *x == o), "{ip} given to {o} while held by another");
                            model.insert(ip, o);
                        }
                        Err(e) => {
                            prop_assert!(held.is_none());
                            let size = if v6 { 15 } else { 14 };
                            prop_assert_eq!(model.keys().filter(|ip| ip.is_ipv6() == v6).count(), size, "{}", e);
                        }
                    }
                }
                IpOp::Specific(o, v6, n) => {
                    let ip = nth_ip(v6, n);
                    let reserved = n == 0 || (!v6 && n == 15);
                    let held = model.iter().find(|(i, owner)| **owner == o && i.is_ipv6() == v6).map(|(i, _)| *i);
                    let want_ok = !reserved && model.get(&ip).is_none_or(|x| *x == o) && held.is_none_or(|h| h == ip);
                    prop_assert_eq!(a.allocate_specific(&o, ip).is_ok(), want_ok, "{} for {}", ip, o);
                    if want_ok { model.insert(ip, o); }
                }
                IpOp::Release(v6, n) => {
                    let ip = nth_ip(v6, n);
                    let holder = a.owner_of(ip).copied();
                    prop_assert_eq!(holder, model.remove(&ip));
                    prop_assert_eq!(a.release(ip), holder.is_some());
                    prop_assert!(!a.release(ip), "release is idempotent");
                }
                IpOp::ReleaseOwner(o) => {
                    let want: Vec<IpAddr> = model.iter().filter(|(_, x)| **x == o).map(|(ip, _)| *ip).collect();
                    model.retain(|_, x| *x != o);
                    let mut got = a.release_owner(&o);
                    got.sort();
                    prop_assert_eq!(got, want);
                    prop_assert!(a.release_owner(&o).is_empty());
                }
            }
            for (ip, o) in &model {
                prop_assert_eq!(a.owner_of(*ip), Some(o));
                prop_assert!(a.cidr(IpFamily::of(*ip)).unwrap().contains(ip));
            }
            for v6 in [false, true] {
                let n = model.keys().filter(|ip| ip.is_ipv6() == v6).count() as u128;
                prop_assert_eq!(a.used(fam(v6)), n);
                prop_assert_eq!(a.free(fam(v6)), a.size(fam(v6)) - n);
            }
        }
    }
}

// ---------------------------------------------------------------- NodePort

#[derive(Debug, Clone)]
enum PortOp {
    Allocate(u8),
    Specific(u8, u16),
    Release(u16),
    ReleaseOwner(u8),
}

fn port_op() -> impl Strategy<Value = PortOp> {
    prop_oneof![
        (0..OWNERS).prop_map(PortOp::Allocate),
        (0..OWNERS, 29998u16..30022).prop_map(|(o, p)| PortOp::Specific(o, p)),
        (30000u16..30020).prop_map(PortOp::Release),
        (0..OWNERS).prop_map(PortOp::ReleaseOwner),
    ]
}

proptest! {
    #[test]
    fn node_ports_have_one_owner_and_true_counts(seed in any::<u64>(), ops in proptest::collection::vec(port_op(), 1..150)) {
        let mut a: NodePortAllocator<u8> = NodePortAllocator::new("30000-30019".parse().unwrap(), SmallRng::seed_from_u64(seed));
        let mut model: BTreeMap<u16, u8> = BTreeMap::new();
        for op in ops {
            match op {
                PortOp::Allocate(o) => match a.allocate(&o) {
                    Ok(p) => {
                        prop_assert!((30000..=30019).contains(&p));
                        prop_assert!(model.insert(p, o).is_none(), "{} handed out twice", p);
                    }
                    Err(_) => prop_assert_eq!(model.len(), 20),
                },
                PortOp::Specific(o, p) => {
                    let want_ok = (30000..=30019).contains(&p) && model.get(&p).is_none_or(|x| *x == o);
                    prop_assert_eq!(a.allocate_specific(&o, p).is_ok(), want_ok);
                    if want_ok { model.insert(p, o); }
                }
                PortOp::Release(p) => {
                    let holder = a.owner_of(p).copied();
                    prop_assert_eq!(holder, model.remove(&p));
                    prop_assert_eq!(a.release(p), holder.is_some());
                    prop_assert!(!a.release(p), "release is idempotent");
                }
                PortOp::ReleaseOwner(o) => {
                    let want: Vec<u16> = model.iter().filter(|(_, x)| **x == o).map(|(p, _)| *p).collect();
                    model.retain(|_, x| *x != o);
                    prop_assert_eq!(a.release_owner(&o), want);
                }
            }
            for (p, o) in &model {
                prop_assert_eq!(a.owner_of(*p), Some(o));
            }
            prop_assert_eq!(a.used() as usize, model.len());
            prop_assert_eq!(a.free() as usize, 20 - model.len());
        }
    }
}

// ---------------------------------------------------------------- LoadBalancer IPs

#[derive(Debug, Clone)]
enum LbOp {
    Assign(u8, ServiceView),
    Adopt(u8, ServiceView, Vec<IpAddr>),
    Release(u8),
    Pools(bool, bool),
}

fn candidate_ips() -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = (250..=255)
        .map(|n| format!("198.18.0.{n}").parse().unwrap())
        .collect();
    v.extend((0..=5).map(|n| format!("198.18.1.{n}").parse::<IpAddr>().unwrap()));
    v.extend((0..=4).map(|n| format!("fd00:18::{n}").parse::<IpAddr>().unwrap()));
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
            Just(vec![IpFamily::V4, IpFamily::V6])
        ],
        proptest::option::of(proptest::sample::select(ips)),
        proptest::option::of(prop_oneof![
            Just("low".to_string()),
            Just("high".to_string()),
            Just("gone".to_string())
        ]),
    )
        .prop_map(
            |(sharing_key, ports, local, app, families, req, pool)| ServiceView {
                namespace: "default".into(),
                sharing_key,
                ports: ports
                    .into_iter()
                    .map(|(udp, p)| LbPort::new(if udp { Protocol::Udp } else { Protocol::Tcp }, p))
                    .collect(),
                external_traffic_policy: if local {
                    TrafficPolicy::Local
                } else {
                    TrafficPolicy::Cluster
                },
                selector: [("app".to_string(), app.to_string())].into(),
                requested_ips: req
                    .into_iter()
                    .filter(|ip| families.contains(&IpFamily::of(*ip)))
                    .collect(),
                requested_pool: pool,
                families,
                ..Default::default()
            },
        )
}

fn lb_op() -> impl Strategy<Value = LbOp> {
    let ips = candidate_ips();
    prop_oneof![
        4 => (0..OWNERS, view()).prop_map(|(o, v)| LbOp::Assign(o, v)),
        2 => (0..OWNERS, view(), proptest::sample::subsequence(ips, 0..2)).prop_map(|(o, v, ips)| LbOp::Adopt(o, v, ips)),
        1 => (0..OWNERS).prop_map(LbOp::Release),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(a, b)| LbOp::Pools(a, b)),
    ]
}

fn pools(avoid_low: bool, with_high: bool) -> Vec<PoolSpec> {
    let mut low = PoolSpec::new("low", &["198.18.0.250-198.18.1.2", "fd00:18::/126"]);
    low.avoid_buggy_ips = avoid_low;
    low.priority = Some(1);
    let mut out = vec![low];
    if with_high {
        let mut high = PoolSpec::new("high", &["198.18.1.0-198.18.1.5"]);
        high.avoid_buggy_ips = true;
        out.push(high);
    }
    out
}

/// Every address a pool may hand out, by brute force.
fn pool_members(p: &PoolSpec) -> BTreeSet<IpAddr> {
    candidate_ips()
        .into_iter()
        .filter(|ip| {
            let in_ranges = p.addresses.iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (IpAddr, IpAddr) = (a.parse().unwrap(), b.parse().unwrap());
                    a.is_ipv6() == ip.is_ipv6() && a <= *ip && *ip <= b
                }
                None => r.parse::<IpNet>().unwrap().contains(ip),
            });
            let buggy = matches!(ip, IpAddr::V4(v4) if matches!(v4.octets()[3], 0 | 255));
            in_ranges && !(p.avoid_buggy_ips && buggy)
        })
        .collect()
}

fn ports_clash(a: &ServiceView, b: &ServiceView) -> bool {
    a.ports.iter().any(|p| b.ports.contains(p))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn lb_ips_follow_the_rules(ops in proptest::collection::vec(lb_op(), 1..60)) {
        let mut a: LbIpAllocator<u8> = LbIpAllocator::new();
        let mut specs = pools(false, true);
        a.set_pools(specs.clone()).unwrap();
        // Per owner: the view it was last granted with, and what it holds.
        let mut granted: BTreeMap<u8, (ServiceView, Vec<IpAddr>)> = BTreeMap::new();
        // Adopted (owner, ip) pairs that must survive until the owner is released/reassigned.
        let mut adopted: BTreeMap<u8, Vec<IpAddr>> = BTreeMap::new();
        for op in ops {
            match op {
                LbOp::Assign(o, v) => {
                    let before = a.ips_of(&o);
                    match a.assign(&o, &v) {
                        Ok(ips) => {
                            prop_assert_eq!(ips.len(), v.families.len().min(if v.requested_ips.is_empty() { 2 } else { v.requested_ips.len() }));
                            for ip in &ips {
                                // Nothing outside an admitting pool, nothing skipped.
                                prop_assert!(specs.iter().any(|p| pool_members(p).contains(ip)), "{} handed out", ip);
                                if v.requested_ips.is_empty() {
                                    if let Some(name) = &v.requested_pool {
                                        let p = specs.iter().find(|p| &p.name == name).unwrap();
                                        prop_assert!(pool_members(p).contains(ip));
                                    }
                                }
                            }
                            granted.insert(o, (v, ips));
                            adopted.remove(&o);
                        }
                        Err(_) => prop_assert_eq!(a.ips_of(&o), before, "failed assign changed state"),
                    }
                }
                LbOp::Adopt(o, v, ips) => {
                    let before = a.ips_of(&o);
                    if a.adopt(&o, &v, &ips).is_ok() {
                        granted.insert(o, (v, ips.clone()));
                        adopted.insert(o, ips);
                    } else {
                        prop_assert_eq!(a.ips_of(&o), before);
                    }
                }
                LbOp::Release(o) => {
                    let mut want = granted.remove(&o).map(|(_, ips)| ips).unwrap_or_default();
                    want.sort_by_key(|ip| ip.is_ipv6());
                    prop_assert_eq!(a.release_owner(&o), want);
                    prop_assert!(a.release_owner(&o).is_empty(), "release is idempotent");
                    adopted.remove(&o);
                }
                LbOp::Pools(avoid, high) => {
                    specs = pools(avoid, high);
                    let got = a.set_pools(specs.clone()).unwrap();
                    for x in &got {
                        prop_assert!(!specs.iter().any(|p| pool_members(p).contains(&x.ip)), "{} reported but still in a pool", x.ip);
                    }
                }
            }
            // Holders of every address are compatible pairwise and match what was granted.
            let mut by_ip: BTreeMap<IpAddr, Vec<u8>> = BTreeMap::new();
            for (o, (_, ips)) in &granted {
                prop_assert_eq!({ let mut s = ips.clone(); s.sort_by_key(|ip| ip.is_ipv6()); s }, a.ips_of(o));
                for ip in ips {
                    by_ip.entry(*ip).or_default().push(*o);
                }
            }
            for (ip, owners) in &by_ip {
                prop_assert_eq!(&a.holders_of(*ip), owners);
                for (i, x) in owners.iter().enumerate() {
                    for y in &owners[i + 1..] {
                        let (vx, vy) = (&granted[x].0, &granted[y].0);
                        prop_assert!(vx.sharing_key.is_some() && vx.sharing_key == vy.sharing_key, "{} shared without a common key", ip);
                        prop_assert!(!ports_clash(vx, vy), "{} shared with clashing ports", ip);
                        let both_cluster = vx.external_traffic_policy == TrafficPolicy::Cluster && vy.external_traffic_policy == TrafficPolicy::Cluster;
                        prop_assert!(both_cluster || vx.selector == vy.selector);
                    }
                }
            }
            // Adopted addresses are never taken away by someone else's assignment.
            for (o, ips) in &adopted {
                for ip in ips {
                    prop_assert!(a.holders_of(*ip).contains(o), "{} lost {}", o, ip);
                }
            }
            // Counts equal the truth.
            for p in &specs {
                let members = pool_members(p);
                let st = a.pool_status(&p.name).unwrap();
                let used4 = by_ip.keys().filter(|ip| ip.is_ipv4() && members.contains(ip)).count() as u128;
                let used6 = by_ip.keys().filter(|ip| ip.is_ipv6() && members.contains(ip)).count() as u128;
                let cap4 = members.iter().filter(|ip| ip.is_ipv4()).count() as u128;
                let cap6 = members.iter().filter(|ip| ip.is_ipv6()).count() as u128;
                prop_assert_eq!((st.assigned_ipv4, st.available_ipv4), (used4, cap4 - used4));
                prop_assert_eq!((st.assigned_ipv6, st.available_ipv6), (used6, cap6 - used6));
            }
            prop_assert_eq!(a.used(IpFamily::V4) + a.used(IpFamily::V6), by_ip.len() as u128);
        }
    }
}
