//! Hostile Services and IPPools through the pure reconcile planning: never a panic, always a
//! decision (allocated, or a failure with a bounded reason), and never two owners.

#![allow(clippy::unwrap_used)]

use berth_api::names::{class, condition::reason};
use berth_controller::allocation::facts::read_service;
use berth_controller::allocation::plan::{plan_service, Allocators};
use berth_controller::allocation::pools::build_pool_specs;
use berth_core::{Labels, PortRange};
use k8s_openapi::api::core::v1::Service;
use proptest::prelude::*;
use serde_json::{json, Value};

const REASONS: [&str; 10] = [
    reason::IP_ALREADY_ALLOCATED,
    reason::PORT_ALREADY_ALLOCATED,
    reason::NOT_IN_ANY_POOL,
    reason::POOL_NOT_FOUND,
    reason::POOL_NOT_ADMITTING,
    reason::NO_AVAILABLE_POOL,
    reason::RANGE_FULL,
    reason::INVALID_REQUEST,
    reason::SHARING_CONFLICT,
    reason::ALLOCATED,
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-zA-Z0-9:./,-]{0,24}",
        Just("None".to_string()),
        Just("10.96.0.5".to_string()),
        Just("fd00:96::5".to_string()),
        Just("198.18.0.201".to_string()),
        Just("::ffff:10.0.0.1".to_string()),
        Just("198.18.0.201,198.18.0.202".to_string()),
        any::<String>(),
    ]
}

fn port_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (any::<i32>()).prop_map(|p| json!(p)),
        (30000..32800i32).prop_map(|p| json!(p)),
        (1..100i32).prop_map(|p| json!(p)),
    ]
}

fn service() -> impl Strategy<Value = Value> {
    let ty = prop_oneof![
        Just("ClusterIP"),
        Just("NodePort"),
        Just("LoadBalancer"),
        Just("ExternalName"),
        Just("Bogus"),
        Just("")
    ];
    let proto = prop_oneof![Just("TCP"), Just("UDP"), Just("SCTP"), Just("ICMP")];
    let port = (port_value(), proto, proptest::option::of(port_value()))
        .prop_map(|(p, proto, np)| json!({"port": p, "protocol": proto, "nodePort": np}));
    (
        "[a-c]",
        ty,
        proptest::collection::vec(text(), 0..3),
        proptest::collection::vec(prop_oneof![Just("IPv4".to_string()), Just("IPv6".to_string()), text()], 0..3),
        proptest::option::of(prop_oneof![Just("SingleStack"), Just("PreferDualStack"), Just("RequireDualStack"), Just("Half")]),
        proptest::collection::vec(port, 0..4),
        (proptest::option::of(text()), proptest::option::of(text()), proptest::option::of(text())),
        (proptest::option::of(any::<i32>()), proptest::option::of(prop_oneof![Just("Local"), Just("Cluster"), Just("x")])),
        proptest::option::of(prop_oneof![Just(class::L2.to_string()), Just(class::AWS_NLB.to_string()), text()]),
    )
        .prop_map(|(name, ty, ips, fams, policy, ports, (lbips, pool, share), (hc, etp), lbclass)| {
            json!({
                "metadata": {"namespace": "default", "name": name, "uid": name,
                    "annotations": {
                        "berth.dev/load-balancer-ips": lbips, "berth.dev/ip-pool": pool,
                        "berth.dev/sharing-key": share}},
                "spec": {"type": ty, "clusterIPs": ips, "ipFamilies": fams, "ipFamilyPolicy": policy,
                    "ports": ports, "healthCheckNodePort": hc, "externalTrafficPolicy": etp,
                    "loadBalancerClass": lbclass},
                "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.203"}]}}
            })
        })
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn hostile_services_get_a_decision_never_a_panic(raw in proptest::collection::vec(service(), 1..6)) {
        let mut alloc = Allocators::new(
            &["10.96.0.0/28".parse().unwrap(), "fd00:96::/124".parse().unwrap()],
            PortRange { first: 30000, last: 30015 },
            1,
        ).unwrap();
        let (specs, _) = build_pool_specs(&[serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"},
            "spec": {"addresses": ["198.18.0.200-198.18.0.203"]}})).unwrap()], &[]);
        alloc.lb.set_pools(specs).unwrap();
        for mut v in raw {
            strip_nulls(&mut v);
            let Ok(svc) = serde_json::from_value::<Service>(v) else { continue };
            let facts = read_service(&svc, Some(class::L2));
            let out = plan_service(&mut alloc, &facts, &Labels::new());
            if let Some(Err(f)) = &out.result {
                prop_assert!(REASONS.contains(&f.reason), "{}", f.reason);
                prop_assert!(!f.message.is_empty());
            }
        }
        // Never two owners of one address.
        for ip in (1..15u8).map(|i| std::net::IpAddr::from([10, 96, 0, i])) {
            let owner = alloc.cluster.owner_of(ip).cloned();
            if let Some(o) = owner {
                prop_assert!(alloc.cluster.ips_of(&o).contains(&ip));
            }
        }
    }

    #[test]
    fn hostile_pools_are_refused_or_installed(addresses in proptest::collection::vec(text(), 0..4),
                                               priority in proptest::option::of(any::<i32>()),
                                               op in "[A-Za-z]{0,8}") {
        let pool = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"},
            "spec": {"addresses": addresses, "serviceAllocation": {"priority": priority,
                "serviceSelector": {"matchExpressions": [{"key": "k", "operator": op}]}}}});
        let mut pool = pool;
        strip_nulls(&mut pool);
        let Ok(pool) = serde_json::from_value(pool) else { return Ok(()) };
        let (specs, problems) = build_pool_specs(&[pool], &[]);
        prop_assert_eq!(specs.len() + problems.len(), 1);
        let mut alloc = Allocators::new(&["10.96.0.0/16".parse().unwrap()], PortRange::DEFAULT, 1).unwrap();
        prop_assert!(alloc.lb.set_pools(specs).is_ok());
    }
}
