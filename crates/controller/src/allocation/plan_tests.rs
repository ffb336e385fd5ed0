//! Address plan: service CIDR 10.96.0.0/16 (+ fd00:96::/112 when dual), node ports
//! 30000-32767, pool "default" 198.18.0.200-198.18.0.250.

use super::*;
use crate::allocation::facts::read_service;
use berth_api::names::class;
use berth_ipam::{PoolSpec, ServicePortSpec};
use k8s_openapi::api::core::v1::Service;
use serde_json::{json, Value};

fn mk_alloc(dual: bool) -> Allocators {
    let mut cidrs: Vec<IpNet> = vec!["10.96.0.0/16".parse().unwrap()];
    if dual {
        cidrs.push("fd00:96::/112".parse().unwrap());
    }
    let mut a = Allocators::new(&cidrs, PortRange::DEFAULT, 7).unwrap();
    a.lb.set_pools(vec![PoolSpec::new(
        "default",
        &["198.18.0.200-198.18.0.250"],
    )])
    .unwrap();
    a
}

fn mk_facts(name: &str, spec: Value) -> ServiceFacts {
    mk_facts_full(json!({"metadata": {"namespace": "default", "name": name}, "spec": spec}))
}

fn mk_facts_full(v: Value) -> ServiceFacts {
    let svc: Service = serde_json::from_value(v).unwrap();
    read_service(&svc, Some(class::L2))
}

fn plan(a: &mut Allocators, f: &ServiceFacts) -> Allocation {
    plan_service(a, f, &Labels::new())
}

#[test]
fn cluster_ip_is_filled_with_families_and_policy() {
    let mut a = mk_alloc(false);
    let out = plan(&mut a, &mk_facts("a", json!({"ports": [{"port": 80}]})));
    assert_eq!(out.result, Some(Ok(())));
    let ips = out.fill.cluster_ips.unwrap();
    assert_eq!(ips.len(), 1);
    assert_ne!(ips[0], "10.96.0.0".parse::<IpAddr>().unwrap());
    assert_eq!(out.fill.ip_families, Some(vec![IpFamily::V4]));
    assert_eq!(out.fill.ip_family_policy, Some(IpFamilyPolicy::SingleStack));
    assert!(out.fill.node_ports.is_empty());
    assert_eq!(out.ingress, None);
}

#[test]
fn a_second_plan_is_a_no_op_once_written() {
    let mut a = mk_alloc(false);
    let first = plan(&mut a, &mk_facts("a", json!({})));
    let ip = first.fill.cluster_ips.unwrap()[0].to_string();
    let written = mk_facts(
        "a",
        json!({"clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}),
    );
    let again = plan(&mut a, &written);
    assert!(again.fill.is_empty(), "{:?}", again.fill);
    assert_eq!(again.result, Some(Ok(())));
}

#[test]
fn duplicate_requested_cluster_ip_fails_with_apiserver_words() {
    let mut a = mk_alloc(false);
    let one = plan(&mut a, &mk_facts("a", json!({"clusterIP": "10.96.0.5"})));
    assert_eq!(one.result, Some(Ok(())));
    let two = plan(&mut a, &mk_facts("b", json!({"clusterIP": "10.96.0.5"})));
    let err = two.result.unwrap().unwrap_err();
    assert_eq!(err.reason, reason::IP_ALREADY_ALLOCATED);
    assert_eq!(
        err.message,
        "failed to allocate IP 10.96.0.5: provided IP is already allocated"
    );
    assert!(two.fill.is_empty());
}

#[test]
fn node_ports_fill_only_empty_entries_and_share_tcp_udp() {
    let mut a = mk_alloc(false);
    let out = plan(
        &mut a,
        &mk_facts(
            "dns",
            json!({"type": "NodePort", "ports": [
                {"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"},
                {"port": 80, "nodePort": 30080}]}),
        ),
    );
    assert_eq!(out.result, Some(Ok(())));
    let np = out.fill.node_ports;
    assert_eq!(np.len(), 3);
    assert!(np[0].is_some());
    assert_eq!(np[0], np[1]);
    assert_eq!(np[2], None, "a set nodePort is never rewritten");
    assert_eq!(a.ports.owner_of(30080).unwrap().name, "dns");
}

#[test]
fn node_port_out_of_range_and_colliding() {
    let mut a = mk_alloc(false);
    let out = plan(
        &mut a,
        &mk_facts(
            "a",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 40000}]}),
        ),
    );
    assert_eq!(
        out.result.unwrap().unwrap_err().message,
        "spec.ports[0].nodePort: Invalid value: 40000: provided port is not in the valid range. The range of valid ports is 30000-32767"
    );
    plan(
        &mut a,
        &mk_facts(
            "b",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30500}]}),
        ),
    );
    let out = plan(
        &mut a,
        &mk_facts(
            "c",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30500}]}),
        ),
    );
    let err = out.result.unwrap().unwrap_err();
    assert_eq!(err.reason, reason::PORT_ALREADY_ALLOCATED);
    assert_eq!(
        err.message,
        "spec.ports[0].nodePort: Invalid value: 30500: provided port is already allocated"
    );
}

#[test]
fn health_check_node_port_only_for_load_balancer_local() {
    let mut a = mk_alloc(false);
    let local = plan(
        &mut a,
        &mk_facts(
            "lb",
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
        ),
    );
    assert!(local.fill.health_check_node_port.is_some());
    let np = plan(
        &mut a,
        &mk_facts(
            "np",
            json!({"type": "NodePort", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
        ),
    );
    assert_eq!(np.fill.health_check_node_port, None);
    let cluster = plan(
        &mut a,
        &mk_facts(
            "lbc",
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        ),
    );
    assert_eq!(cluster.fill.health_check_node_port, None);
}

#[test]
fn load_balancer_gets_lowest_pool_address_and_new_ip_is_reported() {
    let mut a = mk_alloc(false);
    let out = plan(
        &mut a,
        &mk_facts(
            "lb",
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        ),
    );
    let want: IpAddr = "198.18.0.200".parse().unwrap();
    assert_eq!(out.ingress, Some(vec![want]));
    assert_eq!(out.new_lb_ips, vec![want]);
}

#[test]
fn foreign_class_gets_node_ports_but_no_address_nor_status() {
    let mut a = mk_alloc(false);
    let out = plan(
        &mut a,
        &mk_facts(
            "lb",
            json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/x", "ports": [{"port": 80}]}),
        ),
    );
    assert_eq!(out.ingress, None);
    assert!(out.fill.node_ports[0].is_some());
    assert!(a.lb.ips_of(&ServiceKey::new("default", "lb")).is_empty());
}

#[test]
fn type_changes_release_exactly_what_they_should() {
    let mut a = mk_alloc(false);
    let key = ServiceKey::new("default", "s");
    let lb = plan(
        &mut a,
        &mk_facts(
            "s",
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        ),
    );
    let ip = lb.fill.cluster_ips.unwrap()[0].to_string();
    let port = lb.fill.node_ports[0].unwrap();
    let lb_ip = lb.ingress.unwrap()[0].to_string();
    let status = json!({"loadBalancer": {"ingress": [{"ip": lb_ip, "ipMode": "VIP"}]}});
    let as_type = |t: &str| {
        mk_facts_full(json!({"metadata": {"namespace": "default", "name": "s"},
            "spec": {"type": t, "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack", "ports": [{"port": 80, "nodePort": port}]},
            "status": status}))
    };
    // LoadBalancer -> NodePort: keeps the node port, drops the external address.
    let out = plan(&mut a, &as_type("NodePort"));
    assert_eq!(out.ingress, Some(vec![]));
    assert!(a.lb.ips_of(&key).is_empty());
    assert_eq!(a.ports.ports_of(&key), vec![port]);
    // NodePort -> ClusterIP: drops the node port too (held until the spec stops naming
    // it), keeps the ClusterIP.
    let out = plan(&mut a, &as_type("ClusterIP"));
    assert!(out.fill.drop_node_ports);
    assert_eq!(a.ports.ports_of(&key), vec![port]);
    let mut dropped = as_type("ClusterIP");
    dropped.stale_node_ports.ports.clear();
    assert!(!plan(&mut a, &dropped).fill.drop_node_ports);
    assert!(a.ports.ports_of(&key).is_empty());
    assert_eq!(a.cluster.ips_of(&key).len(), 1);
    // ClusterIP -> LoadBalancer: everything again.
    let out = plan(&mut a, &as_type("LoadBalancer"));
    assert_eq!(out.ingress.unwrap().len(), 1);
    assert_eq!(a.ports.ports_of(&key), vec![port]);
    // -> ExternalName: the ClusterIP and node port are dropped from the spec, and held
    // until then; then nothing is held.
    let out = plan(&mut a, &as_type("ExternalName"));
    assert_eq!(out.result, None);
    assert_eq!(out.ingress, Some(vec![]));
    assert!(out.fill.drop_node_ports && out.fill.drop_cluster_ips);
    assert_eq!(a.cluster.ips_of(&key), vec![ip.parse::<IpAddr>().unwrap()]);
    let mut dropped = as_type("ExternalName");
    dropped.stale_node_ports.ports.clear();
    dropped.stale_cluster_ips.clear();
    let out = plan(&mut a, &dropped);
    assert!(!out.fill.drop_cluster_ips);
    assert!(a.ports.ports_of(&key).is_empty());
    assert!(a.cluster.ips_of(&key).is_empty());
}

#[test]
fn dual_stack_policies() {
    let mut a = mk_alloc(true);
    let out = plan(
        &mut a,
        &mk_facts("d", json!({"ipFamilyPolicy": "RequireDualStack"})),
    );
    assert_eq!(out.fill.cluster_ips.unwrap().len(), 2);
    assert_eq!(out.fill.ip_families, Some(vec![IpFamily::V4, IpFamily::V6]));
    let out = plan(
        &mut a,
        &mk_facts(
            "p",
            json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"]}),
        ),
    );
    let ips = out.fill.cluster_ips.unwrap();
    assert!(ips[0].is_ipv6() && ips[1].is_ipv4());
    let mut single = mk_alloc(false);
    let out = plan(
        &mut single,
        &mk_facts("r", json!({"ipFamilyPolicy": "RequireDualStack"})),
    );
    assert_eq!(
        out.result.unwrap().unwrap_err().message,
        "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services"
    );
}

#[test]
fn adoption_keeps_the_older_claim() {
    let mut a = mk_alloc(false);
    let older = mk_facts_full(json!({"metadata": {"namespace": "default", "name": "old",
        "creationTimestamp": "2024-01-01T00:00:00Z"}, "spec": {"clusterIP": "10.96.1.1"}}));
    let younger = mk_facts_full(
        json!({"metadata": {"namespace": "default", "name": "a-young",
        "creationTimestamp": "2025-01-01T00:00:00Z"}, "spec": {"clusterIP": "10.96.1.1"}}),
    );
    let labels = Labels::new();
    let refused = adopt_all(&mut a, [(&younger, &labels), (&older, &labels)]);
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].0.name, "a-young");
    assert_eq!(
        a.cluster
            .owner_of("10.96.1.1".parse().unwrap())
            .unwrap()
            .name,
        "old"
    );
    let out = plan(&mut a, &younger);
    assert_eq!(
        out.result.unwrap().unwrap_err().reason,
        reason::IP_ALREADY_ALLOCATED
    );
}

#[test]
fn stale_ingress_of_a_former_load_balancer_is_held_until_cleared_after_live_claims() {
    let mut a = mk_alloc(false);
    // Older, no longer a LoadBalancer, status not yet cleared: 198.18.0.200 and .201.
    let stale = |name: &str, ip: &str| {
        mk_facts_full(json!({"metadata": {"namespace": "default", "name": name,
            "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.1.1", "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}))
    };
    let old = stale("old", "198.18.0.200");
    let mut other = stale("other", "198.18.0.201");
    other.cluster_ips = mk_facts("x", json!({"clusterIP": "10.96.1.2"})).cluster_ips;
    other.node_ports = mk_facts(
        "x",
        json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30081}]}),
    )
    .node_ports;
    // Younger, a LoadBalancer that holds .201 in its status: the live claim wins.
    let live = mk_facts_full(json!({"metadata": {"namespace": "default", "name": "live",
        "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.1.3", "ports": [{"port": 80, "nodePort": 30082}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.201"}]}}}));
    let labels = Labels::new();
    let refused = adopt_all(
        &mut a,
        [(&old, &labels), (&other, &labels), (&live, &labels)],
    );
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(
        a.lb.ips_of(&live.key),
        ["198.18.0.201".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        a.lb.ips_of(&old.key),
        ["198.18.0.200".parse::<IpAddr>().unwrap()]
    );
    assert!(a.lb.ips_of(&other.key).is_empty());
    // A new LoadBalancer cannot get .200 while "old" still names it.
    let new = mk_facts(
        "new",
        json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
    );
    assert_eq!(
        plan(&mut a, &new).ingress,
        Some(vec!["198.18.0.202".parse().unwrap()])
    );
    // Deciding "old" clears its status; the release waits for that write (the worker's job).
    let out = plan(&mut a, &old);
    assert_eq!(out.ingress, Some(vec![]));
}

#[test]
fn invalid_services_keep_what_they_hold() {
    let mut a = mk_alloc(false);
    plan(&mut a, &mk_facts("a", json!({"clusterIP": "10.96.0.7"})));
    let out = plan(
        &mut a,
        &mk_facts("a", json!({"clusterIP": "10.96.0.7", "type": "Bogus"})),
    );
    assert_eq!(
        out.result.unwrap().unwrap_err().reason,
        reason::INVALID_REQUEST
    );
    assert_eq!(a.cluster.ips_of(&ServiceKey::new("default", "a")).len(), 1);
}

#[test]
fn an_address_left_outside_every_pool_is_given_up() {
    let mut a = mk_alloc(false);
    let svc = mk_facts(
        "lb",
        json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
    );
    assert_eq!(plan(&mut a, &svc).ingress.unwrap().len(), 1);
    // The pool moves: a new address from the pools as they are now.
    a.lb.set_pools(vec![PoolSpec::new("moved", &["198.18.0.10-198.18.0.10"])])
        .unwrap();
    let out = plan(&mut a, &svc);
    assert_eq!(out.ingress, Some(vec!["198.18.0.10".parse().unwrap()]));
    // No pool left: the address is released, not kept.
    a.lb.set_pools(vec![]).unwrap();
    let out = plan(&mut a, &svc);
    assert_eq!(out.ingress, Some(vec![]));
    assert_eq!(
        out.result.unwrap().unwrap_err().reason,
        reason::NO_AVAILABLE_POOL
    );
    assert_eq!(a.lb.used(IpFamily::V4), 0);
}

#[test]
fn dual_stack_load_balancer_gets_both_addresses_in_one_pass() {
    let mut a = mk_alloc(true);
    a.lb.set_pools(vec![PoolSpec::new(
        "dual",
        &["198.18.0.200-198.18.0.210", "fd00:18::/120"],
    )])
    .unwrap();
    let out = plan(
        &mut a,
        &mk_facts(
            "lb",
            json!({"type": "LoadBalancer", "ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}),
        ),
    );
    let ingress = out.ingress.unwrap();
    assert_eq!(ingress.len(), 2);
    assert!(ingress[0].is_ipv4() && ingress[1].is_ipv6());
}

#[test]
fn headless_services_get_families_but_no_address() {
    let mut a = mk_alloc(false);
    let out = plan(
        &mut a,
        &mk_facts("h", json!({"clusterIP": "None", "selector": {"app": "x"}})),
    );
    assert_eq!(out.result, Some(Ok(())));
    assert_eq!(out.fill.cluster_ips, None);
    assert_eq!(out.fill.ip_families, Some(vec![IpFamily::V4]));
    assert!(a
        .cluster
        .ips_of(&ServiceKey::new("default", "h"))
        .is_empty());
}

fn failure_of(out: &Allocation) -> &Failure {
    match &out.result {
        Some(Err(f)) => f,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn a_health_check_port_left_named_by_a_type_change_stays_held_until_dropped() {
    let mut a = mk_alloc(false);
    let lb = mk_facts(
        "a",
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
    );
    let hc = plan(&mut a, &lb).fill.health_check_node_port.unwrap();
    // Changed to NodePort by a merge patch that replaced the ports: the spec still names
    // the health-check port, as nothing dropped it yet.
    let changed = mk_facts(
        "a",
        json!({"type": "NodePort", "externalTrafficPolicy": "Local", "healthCheckNodePort": hc,
               "ports": [{"port": 80}, {"port": 81}]}),
    );
    assert_eq!(changed.stale_node_ports.health_check, Some(hc));
    let out = plan(&mut a, &changed);
    assert_eq!(out.result, Some(Ok(())));
    assert!(out.fill.drop_health_check_node_port);
    assert!(!out.fill.drop_node_ports);
    assert_eq!(a.ports.owner_of(hc), Some(&changed.key));
    let given: Vec<u16> = out.fill.node_ports.iter().flatten().copied().collect();
    assert_eq!(given.len(), 2);
    assert!(!given.contains(&hc));

    // Nobody else gets it meanwhile.
    let other = mk_facts(
        "b",
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": hc,
               "ports": [{"port": 80}]}),
    );
    assert_eq!(
        failure_of(&plan(&mut a, &other)).reason,
        reason::PORT_ALREADY_ALLOCATED
    );

    // The drop landed: the port is free, the node ports stay.
    let dropped = mk_facts(
        "a",
        json!({"type": "NodePort", "externalTrafficPolicy": "Local",
               "ports": [{"port": 80, "nodePort": given[0]}, {"port": 81, "nodePort": given[1]}]}),
    );
    let out = plan(&mut a, &dropped);
    assert!(!out.fill.drop_health_check_node_port, "{:?}", out.fill);
    assert!(out.fill.node_ports.iter().all(Option::is_none));
    assert_eq!(a.ports.owner_of(hc), None);
    assert_eq!(a.ports.ports_of(&dropped.key).len(), 2);
    assert_eq!(plan(&mut a, &other).result, Some(Ok(())));
}

#[test]
fn node_ports_left_named_by_a_change_to_cluster_ip_stay_held_until_dropped() {
    let mut a = mk_alloc(false);
    let changed = mk_facts(
        "a",
        json!({"type": "ClusterIP", "ports": [{"port": 80, "nodePort": 30080}, {"port": 53, "protocol": "UDP", "nodePort": 30053}]}),
    );
    assert_eq!(changed.stale_node_ports.ports, vec![30080, 30053]);
    let out = plan(&mut a, &changed);
    assert!(out.fill.drop_node_ports);
    assert!(!out.fill.drop_health_check_node_port);
    assert_eq!(a.ports.ports_of(&changed.key), vec![30053, 30080]);
    let other = mk_facts(
        "b",
        json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}),
    );
    assert_eq!(
        failure_of(&plan(&mut a, &other)).reason,
        reason::PORT_ALREADY_ALLOCATED
    );
    let dropped = mk_facts(
        "a",
        json!({"type": "ClusterIP", "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}),
    );
    assert!(!plan(&mut a, &dropped).fill.drop_node_ports);
    assert!(a.ports.ports_of(&dropped.key).is_empty());
    assert_eq!(plan(&mut a, &other).result, Some(Ok(())));
}

#[test]
fn an_external_name_service_holds_the_node_ports_it_names_until_dropped() {
    let mut a = mk_alloc(false);
    let changed = mk_facts(
        "a",
        json!({"type": "ExternalName", "externalName": "example.invalid",
               "ports": [{"port": 80, "nodePort": 30080}], "healthCheckNodePort": 30081}),
    );
    let out = plan(&mut a, &changed);
    assert!(out.fill.drop_node_ports && out.fill.drop_health_check_node_port);
    assert_eq!(a.ports.ports_of(&changed.key), vec![30080, 30081]);
}

#[test]
fn stale_node_ports_are_adopted_after_every_live_claim() {
    let mut a = mk_alloc(false);
    let labels = Labels::new();
    // The older Service was changed to ClusterIP, its node port given to the younger one
    // (by a leader that freed it too early); the live claim wins, the stale one is dropped.
    let older = mk_facts_full(json!({"metadata": {"namespace": "default", "name": "old",
        "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.1.1", "ports": [{"port": 80, "nodePort": 30080}],
                 "healthCheckNodePort": 30090}}));
    let younger = mk_facts_full(json!({"metadata": {"namespace": "default", "name": "young",
        "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"type": "NodePort", "clusterIP": "10.96.1.2", "ports": [{"port": 80, "nodePort": 30080}]}}));
    let refused = adopt_all(&mut a, [(&older, &labels), (&younger, &labels)]);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(a.ports.owner_of(30080), Some(&younger.key));
    // Unclaimed by anyone live: held until the drop lands.
    assert_eq!(a.ports.owner_of(30090), Some(&older.key));
    let out = plan(&mut a, &older);
    assert!(out.fill.drop_node_ports && out.fill.drop_health_check_node_port);
    assert_eq!(a.ports.owner_of(30080), Some(&younger.key));
}

#[test]
fn stale_cluster_ips_of_external_name_services_are_adopted_after_every_live_claim() {
    let mut a = mk_alloc(false);
    let labels = Labels::new();
    // The older Service became ExternalName and its address went to the younger one (by a
    // leader that freed it before the spec stopped naming it): the live claim wins.
    let older = mk_facts_full(json!({"metadata": {"namespace": "default", "name": "old",
        "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {"type": "ExternalName", "externalName": "example.invalid", "clusterIP": "10.96.1.1"}}));
    let younger = mk_facts_full(json!({"metadata": {"namespace": "default", "name": "young",
        "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"clusterIP": "10.96.1.1"}}));
    let unclaimed = mk_facts_full(json!({"metadata": {"namespace": "default", "name": "gone",
        "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {"type": "ExternalName", "externalName": "example.invalid", "clusterIPs": ["10.96.1.3"]}}));
    let refused = adopt_all(
        &mut a,
        [
            (&older, &labels),
            (&younger, &labels),
            (&unclaimed, &labels),
        ],
    );
    assert!(refused.is_empty(), "{refused:?}");
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(a.cluster.owner_of(ip("10.96.1.1")), Some(&younger.key));
    // Unclaimed by anyone live: held until the drop lands.
    assert_eq!(a.cluster.owner_of(ip("10.96.1.3")), Some(&unclaimed.key));
    for f in [&older, &unclaimed] {
        assert!(plan(&mut a, f).fill.drop_cluster_ips);
    }
    assert_eq!(a.cluster.owner_of(ip("10.96.1.1")), Some(&younger.key));
}

#[test]
fn a_decision_made_again_asks_for_the_node_ports_it_gave_before() {
    let mut a = mk_alloc(false);
    let f = mk_facts(
        "s",
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [
            {"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}, {"port": 80}]}),
    );
    let first = plan(&mut a, &f).fill;
    let held = a.ports.ports_of(&f.key);
    assert_eq!(held.len(), 3);
    // From the same version again (its write failed, perhaps after landing): the same ports,
    // the TCP and UDP entries still sharing one.
    let again = plan(&mut a, &f).fill;
    assert_eq!(a.ports.ports_of(&f.key), held);
    assert_eq!(again.node_ports[0], again.node_ports[1]);
    let given = |fill: &SpecFill| {
        let mut v: Vec<u16> = fill
            .node_ports
            .iter()
            .flatten()
            .chain(&fill.health_check_node_port)
            .copied()
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    assert_eq!(given(&again), given(&first));
}

#[test]
fn held_node_ports_go_to_unnamed_entries_only_when_the_spec_may_get_them() {
    let spec = |port: u16, node_port: Option<u16>| ServicePortSpec {
        port,
        protocol: berth_core::Protocol::Tcp,
        node_port,
    };
    let req = NodePortRequest {
        ports: vec![
            spec(80, Some(30080)),
            spec(81, None),
            spec(81, None),
            spec(82, None),
        ],
        allocate_node_ports: true,
        health_check: Some(None),
    };
    let stale = crate::allocation::facts::StaleNodePorts::default();
    // 30080 is named; 30001 and 30002 are spare; nothing is left for the health check.
    let out = with_held_node_ports(&req, &[30001, 30002, 30080], &stale);
    let got: Vec<Option<u16>> = out.ports.iter().map(|p| p.node_port).collect();
    assert_eq!(got, [Some(30080), Some(30001), None, Some(30002)]);
    assert_eq!(out.health_check, Some(None));
    // A stale port (being dropped) is not reused; the health check gets the spare one.
    let stale = crate::allocation::facts::StaleNodePorts {
        health_check: None,
        ports: vec![30002],
    };
    let one = NodePortRequest {
        ports: vec![spec(80, Some(30080))],
        ..req.clone()
    };
    let out = with_held_node_ports(&one, &[30001, 30002, 30080], &stale);
    assert_eq!(out.health_check, Some(Some(30001)));
    // allocateLoadBalancerNodePorts: false assigns none, so none is reused either.
    let off = NodePortRequest {
        allocate_node_ports: false,
        health_check: None,
        ..req
    };
    let out = with_held_node_ports(&off, &[30001], &Default::default());
    assert!(out.ports[1..].iter().all(|p| p.node_port.is_none()));
}
