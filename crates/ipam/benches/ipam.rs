//! Criterion benches for the allocators' hot paths, each at steady state (half full).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::IpAddr;

use berth_core::{
    IpFamily, IpFamilyPolicy, LabelSelector, LabelSelectorRequirement, PortRange, Protocol,
    SelectorOperator,
};
use berth_ipam::{
    plan_cluster_ips, ClusterIpAllocator, ClusterIpRequest, LbIpAllocator, LbPort,
    NodePortAllocator, PoolSpec, ServiceKey, ServiceView,
};
use criterion::{criterion_group, criterion_main, Criterion};
use ipnet::IpNet;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn keys(n: usize) -> Vec<ServiceKey> {
    (0..n)
        .map(|i| ServiceKey::new("default", format!("svc-{i}")))
        .collect()
}

fn cluster_ip(c: &mut Criterion) {
    let cidrs: Vec<IpNet> = vec![
        "10.96.0.0/16".parse().unwrap(),
        "fd00:96::/108".parse().unwrap(),
    ];
    let mut a = ClusterIpAllocator::new(&cidrs, SmallRng::seed_from_u64(1)).unwrap();
    let owners = keys(32767);
    let mut held: Vec<IpAddr> = owners
        .iter()
        .map(|k| a.allocate(k, IpFamily::V4).unwrap())
        .collect();
    let mut rng = SmallRng::seed_from_u64(2);
    c.bench_function("cluster_ip/allocate_release_/16_half_full", |b| {
        b.iter(|| {
            let i = rng.random_range(0..owners.len());
            a.release(held[i]);
            held[i] = a.allocate(&owners[i], IpFamily::V4).unwrap();
        })
    });
    let req = ClusterIpRequest {
        policy: Some(IpFamilyPolicy::PreferDualStack),
        has_selector: true,
        ..Default::default()
    };
    c.bench_function("cluster_ip/plan_prefer_dual_stack", |b| {
        b.iter(|| plan_cluster_ips(black_box(&req), &[IpFamily::V4, IpFamily::V6]).unwrap())
    });
}

fn node_port(c: &mut Criterion) {
    let mut a = NodePortAllocator::new(PortRange::DEFAULT, SmallRng::seed_from_u64(3));
    let owners = keys(1384);
    let mut held: Vec<u16> = owners.iter().map(|k| a.allocate(k).unwrap()).collect();
    let mut rng = SmallRng::seed_from_u64(4);
    c.bench_function("node_port/allocate_release_half_full", |b| {
        b.iter(|| {
            let i = rng.random_range(0..owners.len());
            a.release(held[i]);
            held[i] = a.allocate(&owners[i]).unwrap();
        })
    });
}

fn lb(c: &mut Criterion) {
    for (name, pool, family) in [
        (
            "lb/assign_release_v4_65536_half_full",
            "198.18.0.0/16",
            IpFamily::V4,
        ),
        ("lb/assign_release_v6_slash64", "fd00:18::/64", IpFamily::V6),
    ] {
        let mut a = LbIpAllocator::new();
        a.set_pools(vec![PoolSpec::new("bench", &[pool])]).unwrap();
        let view = ServiceView {
            namespace: "default".into(),
            ports: vec![LbPort::new(Protocol::Tcp, 80)],
            families: vec![family],
            ..Default::default()
        };
        let owners = keys(32768);
        for k in &owners {
            a.assign(k, &view).unwrap();
        }
        let mut rng = SmallRng::seed_from_u64(5);
        c.bench_function(name, |b| {
            b.iter(|| {
                let i = rng.random_range(0..owners.len());
                a.release_owner(&owners[i]);
                a.assign(&owners[i], &view).unwrap()
            })
        });
    }
    let sel = LabelSelector {
        match_labels: [("app".to_string(), "web".to_string())].into(),
        match_expressions: vec![LabelSelectorRequirement::new(
            "env",
            SelectorOperator::NotIn,
            &["dev", "test"],
        )],
    };
    let labels: BTreeMap<String, String> = [("app", "web"), ("env", "prod"), ("team", "a")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    c.bench_function("selector/matches", |b| {
        b.iter(|| black_box(&sel).matches(black_box(&labels)))
    });
}

criterion_group!(benches, cluster_ip, node_port, lb);
criterion_main!(benches);
