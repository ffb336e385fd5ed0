//! Packet-flow tests: outcomes of first packets through the planned rules, for both dispatch modes.
#![allow(clippy::unwrap_used)]

mod common;

use berth_core::{IpFamily, Protocol, TrafficPolicy};
use berth_datapath::trace::{trace, Origin, TraceEnv, Verdict};
use berth_datapath::*;
use common::*;

/// Traces the packet through the plan of `view` in both dispatch modes, and through the table the
/// nftables backend programs from the linear plan, and checks each against `expected` (verdict,
/// masqueraded, probability in thousandths).
fn assert_flow(
    view: &NodeView,
    env: &TraceEnv,
    p: &trace::Packet,
    expected: &[(Verdict, bool, u32)],
) {
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let mut options = mk_options(dispatch);
        options.leaf_size = 2;
        let rs = plan(view, &options);
        check_consistency(&rs);
        let mut expected = expected.to_vec();
        expected.sort();
        let mut got = outcomes(&rs, env, p);
        got.sort();
        assert_eq!(got, expected, "{dispatch:?} {p:?}");
        if dispatch == Dispatch::Linear {
            let mut got = outcomes(&nft_traceable(&rs, options.family), env, p);
            got.sort();
            assert_eq!(got, expected, "nftables {p:?}");
        }
    }
}

/// [`assert_flow`] with `cidrs` as the cluster's Service CIDRs.
fn assert_flow_in_cidrs(
    view: &NodeView,
    cidrs: &[&str],
    p: &trace::Packet,
    expected: &[(Verdict, bool, u32)],
) {
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let mut options = mk_options(dispatch);
        options.leaf_size = 2;
        options.service_cidrs = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        let rs = plan(view, &options);
        check_consistency(&rs);
        let mut got = outcomes(&rs, &env(), p);
        got.sort();
        assert_eq!(got, expected, "{dispatch:?} {cidrs:?} {p:?}");
        if dispatch == Dispatch::Linear {
            let mut got = outcomes(&nft_traceable(&rs, options.family), &env(), p);
            got.sort();
            assert_eq!(got, expected, "nftables {cidrs:?} {p:?}");
        }
    }
}

/// ServiceCIDRs, as kube-proxy's nftables mode reads them (`cluster-ips-check`): inside them a
/// new connection that no Service port translated is rejected when it goes to a ClusterIP (a
/// port the Service does not have) and dropped when no Service holds the address, from a pod,
/// the node itself and off the node alike. Services keep their own verdicts, and without
/// Service CIDRs (or outside them) such traffic passes untouched, as before.
#[test]
fn service_cidrs_reject_unknown_ports_and_drop_unallocated_addresses() {
    let view = mk_fixed_view();
    let (reject, drop, untouched) = (
        [(Verdict::Reject, false, 1000)],
        [(Verdict::Drop, false, 1000)],
        [(Verdict::Delivered, false, 1000)],
    );
    let both = |masq| {
        let mut out = vec![
            (dnat("10.244.1.2:8080"), masq, 500),
            (dnat("10.244.2.2:8080"), masq, 500),
        ];
        out.sort();
        out
    };
    let from_pod = |dst: &str, port| packet(LOCAL_POD, dst, port, Origin::Network);
    let from_node = |dst: &str, port| packet(NODE_IP, dst, port, Origin::LocalProcess);
    let all = ["10.96.0.0/16"];
    // (cidrs, packet, outcome)
    type Row<'a> = (&'a [&'a str], trace::Packet, Vec<(Verdict, bool, u32)>);
    let rows: Vec<Row> = vec![
        (&all, from_pod("10.96.0.10", 81), reject.to_vec()),
        (&all, from_node("10.96.0.10", 81), reject.to_vec()),
        (&all, from_client("10.96.0.10", 81), reject.to_vec()),
        (&all, from_pod("10.96.9.9", 80), drop.to_vec()),
        (&all, from_node("10.96.9.9", 80), drop.to_vec()),
        (&all, from_client("10.96.9.9", 80), drop.to_vec()),
        // What Services answer is unchanged.
        (&all, from_pod("10.96.0.10", 80), both(false)),
        (&all, from_node("10.96.0.10", 80), both(true)),
        (&all, from_pod("10.96.0.60", 80), reject.to_vec()),
        // Outside the CIDRs nothing changes.
        (&all, from_pod("10.97.0.10", 80), untouched.to_vec()),
        (
            &["10.96.0.0/24"],
            from_pod("10.96.9.9", 80),
            untouched.to_vec(),
        ),
        (&["10.96.0.0/24"], from_pod("10.96.0.99", 80), drop.to_vec()),
        // Without Service CIDRs, or with only the other family's: untouched.
        (&[], from_pod("10.96.0.10", 81), untouched.to_vec()),
        (&[], from_pod("10.96.9.9", 80), untouched.to_vec()),
        (
            &["fd00:96::/112"],
            from_pod("10.96.9.9", 80),
            untouched.to_vec(),
        ),
        (
            &["fd00:96::/112"],
            from_pod("10.96.0.10", 81),
            untouched.to_vec(),
        ),
    ];
    for (cidrs, p, expected) in rows {
        assert_flow_in_cidrs(&view, cidrs, &p, &expected);
    }
}

/// The incremental planner starts over when the Service CIDRs change, and then holds exactly
/// what a full plan with the new ones gives.
#[test]
fn a_change_of_service_cidrs_is_planned_as_in_full() {
    let view = mk_fixed_view();
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let mut options = mk_options(dispatch);
        options.leaf_size = 2;
        let mut planner = Planner::new(options.clone());
        for cidrs in [
            &[][..],
            &["10.96.0.0/16"],
            &["10.96.0.0/24", "fd00:96::/112"],
            &[],
        ] {
            let cidrs: Vec<ipnet::IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
            options.service_cidrs = cidrs.clone();
            planner.set_service_cidrs(&cidrs);
            planner.update(&view);
            assert_eq!(planner.ruleset(), &plan(&view, &options), "{cidrs:?}");
            assert_eq!(planner.take_changes(), Changes::All, "{cidrs:?}");
            planner.update(&view);
            assert_eq!(planner.take_changes(), Changes::Chains(Default::default()));
        }
    }
}

fn from_client(dst: &str, dport: u16) -> trace::Packet {
    packet(CLIENT_IP, dst, dport, Origin::Network)
}

#[test]
fn cluster_ip_from_pod_node_and_outside() {
    let view = mk_fixed_view();
    let both = |masq| {
        vec![
            (dnat("10.244.1.2:8080"), masq, 500),
            (dnat("10.244.2.2:8080"), masq, 500),
        ]
    };
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.10", 80, Origin::Network),
        &both(false),
    );
    // Off-cluster sources (the node itself included) are masqueraded so replies come back here.
    assert_flow(
        &view,
        &env(),
        &packet(NODE_IP, "10.96.0.10", 80, Origin::LocalProcess),
        &both(true),
    );
    assert_flow(&view, &env(), &from_client("10.96.0.10", 80), &both(true));
    // Wrong port: untouched.
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.10", 81, Origin::Network),
        &[(Verdict::Delivered, false, 1000)],
    );
}

#[test]
fn three_endpoints_get_equal_shares() {
    let view = mk_fixed_view();
    let expected = [
        (dnat("10.244.1.5:8080"), false, 333),
        (dnat("10.244.2.5:8080"), false, 333),
        (dnat("10.244.2.6:8080"), false, 333),
    ];
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.40", 80, Origin::Network),
        &expected,
    );
    let masq: Vec<_> = expected
        .iter()
        .map(|(v, _, p)| (v.clone(), true, *p))
        .collect();
    assert_flow(&view, &env(), &from_client("198.18.0.151", 80), &masq);
    assert_flow(&view, &env(), &from_client(NODE_IP, 30040), &masq);
}

#[test]
fn no_endpoints_rejects_everywhere() {
    let view = mk_fixed_view();
    let reject = [(Verdict::Reject, false, 1000)];
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.60", 80, Origin::Network),
        &reject,
    );
    assert_flow(
        &view,
        &env(),
        &packet(NODE_IP, "10.96.0.60", 80, Origin::LocalProcess),
        &reject,
    );
    assert_flow(&view, &env(), &from_client("198.18.0.152", 80), &reject);
    assert_flow(&view, &env(), &from_client(NODE_IP, 30060), &reject);
}

#[test]
fn local_external_policy_keeps_source_and_uses_local_endpoints() {
    let view = mk_fixed_view();
    let local = [(dnat("10.244.1.3:8080"), false, 1000)];
    assert_flow(&view, &env(), &from_client("198.18.0.200", 80), &local);
    assert_flow(&view, &env(), &from_client("198.18.0.150", 80), &local);
    assert_flow(&view, &env(), &from_client(NODE_IP, 30020), &local);
    // Pods and the node itself are short-circuited to all endpoints; only the node is masqueraded.
    let all = |masq| {
        vec![
            (dnat("10.244.1.3:8080"), masq, 500),
            (dnat("10.244.2.3:8080"), masq, 500),
        ]
    };
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "198.18.0.200", 80, Origin::Network),
        &all(false),
    );
    assert_flow(
        &view,
        &env(),
        &packet(NODE_IP, "198.18.0.200", 80, Origin::LocalProcess),
        &all(true),
    );
    // Internal traffic policy is still Cluster.
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.20", 80, Origin::Network),
        &all(false),
    );
}

#[test]
fn local_external_policy_without_local_endpoints_drops_external_traffic() {
    let mut view = mk_fixed_view();
    view.services[1]
        .endpoints
        .edit(|eps| eps.retain(|ep| ep.node_name.as_deref() != Some("node-a")));
    let drop = [(Verdict::Drop, false, 1000)];
    assert_flow(&view, &env(), &from_client("198.18.0.200", 80), &drop);
    assert_flow(&view, &env(), &from_client("198.18.0.150", 80), &drop);
    assert_flow(&view, &env(), &from_client(NODE_IP, 30020), &drop);
    let remote = |masq| vec![(dnat("10.244.2.3:8080"), masq, 1000)];
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "198.18.0.200", 80, Origin::Network),
        &remote(false),
    );
    assert_flow(
        &view,
        &env(),
        &packet(NODE_IP, "198.18.0.200", 80, Origin::LocalProcess),
        &remote(true),
    );
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.20", 80, Origin::Network),
        &remote(false),
    );
    // The health check port is open whether or not endpoints are local.
    assert_flow(
        &view,
        &env(),
        &from_client(NODE_IP, 30120),
        &[(Verdict::Delivered, false, 1000)],
    );
}

#[test]
fn cluster_external_policy_masquerades() {
    let view = mk_fixed_view();
    assert_flow(
        &view,
        &env(),
        &from_client(NODE_IP, 30030),
        &[(dnat("10.244.2.4:8080"), true, 1000)],
    );
}

#[test]
fn source_ranges_and_ip_mode() {
    let view = mk_fixed_view();
    let both = |masq| {
        vec![
            (dnat("10.244.1.6:8443"), masq, 500),
            (dnat("10.244.2.7:8443"), masq, 500),
        ]
    };
    assert_flow(
        &view,
        &env(),
        &packet("203.0.113.9", "198.18.0.201", 443, Origin::Network),
        &both(true),
    );
    assert_flow(
        &view,
        &env(),
        &packet("192.0.2.9", "198.18.0.201", 443, Origin::Network),
        &[(Verdict::Drop, false, 1000)],
    );
    // The node lies in an allowed range, and reaches its own VIP with the VIP as source.
    assert_flow(
        &view,
        &env(),
        &packet("198.18.0.201", "198.18.0.201", 443, Origin::Network),
        &both(true),
    );
    // Node ports are not subject to source ranges (as in kube-proxy).
    assert_flow(
        &view,
        &env(),
        &packet("192.0.2.9", NODE_IP, 30050, Origin::Network),
        &both(true),
    );
    // ipMode Proxy: the load balancer translates, the node must not capture the address.
    assert_flow(
        &view,
        &env(),
        &packet("203.0.113.9", "198.18.0.202", 443, Origin::Network),
        &[(Verdict::Delivered, false, 1000)],
    );
}

#[test]
fn client_ip_affinity_sticks() {
    let view = mk_fixed_view();
    let rs = plan(&view, &mk_options(Dispatch::Tree));
    let first = trace(
        &rs,
        &env(),
        &packet(LOCAL_POD, "10.96.0.50", 443, Origin::Network),
    )
    .unwrap();
    assert_eq!(first.len(), 2);
    // The first packet records its source in the chosen endpoint's list.
    let (outcome, _) = first
        .iter()
        .find(|(o, _)| o.verdict == dnat("10.244.2.7:8443"))
        .unwrap();
    let list = outcome.affinity_set.clone().unwrap();
    let mut env = env();
    env.recent.entry(list).or_default().insert(ip(LOCAL_POD));
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let rs = plan(&view, &mk_options(dispatch));
        let again = outcomes(
            &rs,
            &env,
            &packet(LOCAL_POD, "10.96.0.50", 443, Origin::Network),
        );
        assert_eq!(
            again,
            vec![(dnat("10.244.2.7:8443"), false, 1000)],
            "{dispatch:?}"
        );
        // Another client is balanced as usual.
        let other = outcomes(
            &rs,
            &env,
            &packet("10.244.1.78", "10.96.0.50", 443, Origin::Network),
        );
        assert_eq!(other.len(), 2);
    }
}

#[test]
fn hairpin_is_masqueraded() {
    let view = mk_fixed_view();
    assert_flow(
        &view,
        &env(),
        &packet("10.244.1.2", "10.96.0.10", 80, Origin::Network),
        &[
            (dnat("10.244.1.2:8080"), true, 500),
            (dnat("10.244.2.2:8080"), false, 500),
        ],
    );
}

#[test]
fn internal_traffic_policy_local() {
    let mut view = mk_fixed_view();
    view.services[0].internal_traffic_policy = TrafficPolicy::Local;
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.10", 80, Origin::Network),
        &[(dnat("10.244.1.2:8080"), false, 1000)],
    );
    view.services[0].endpoints.edit(|eps| eps.remove(0));
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.10", 80, Origin::Network),
        &[(Verdict::Drop, false, 1000)],
    );
}

#[test]
fn terminating_endpoints_are_a_fallback() {
    let mut view = mk_fixed_view();
    let eps = view.services[0].endpoints.make_mut();
    eps[0] = mk_terminating(eps[0].clone());
    // One endpoint still ready: the terminating one gets nothing.
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.10", 80, Origin::Network),
        &[(dnat("10.244.2.2:8080"), false, 1000)],
    );
    let eps = view.services[0].endpoints.make_mut();
    eps[1] = mk_terminating(eps[1].clone());
    let both = [
        (dnat("10.244.1.2:8080"), false, 500),
        (dnat("10.244.2.2:8080"), false, 500),
    ];
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.10", 80, Origin::Network),
        &both,
    );
    // Not serving any more: nothing left.
    for ep in view.services[0].endpoints.make_mut() {
        ep.serving = false;
    }
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.10", 80, Origin::Network),
        &[(Verdict::Reject, false, 1000)],
    );
}

#[test]
fn local_policy_terminating_fallback_is_separate() {
    let mut view = mk_fixed_view();
    let eps = view.services[1].endpoints.make_mut();
    // The local endpoint terminates while the remote one is ready.
    eps[0] = mk_terminating(eps[0].clone());
    assert_flow(
        &view,
        &env(),
        &from_client("198.18.0.200", 80),
        &[(dnat("10.244.1.3:8080"), false, 1000)],
    );
    assert_flow(
        &view,
        &env(),
        &packet(LOCAL_POD, "10.96.0.20", 80, Origin::Network),
        &[(dnat("10.244.2.3:8080"), false, 1000)],
    );
}

#[test]
fn masquerade_all_and_no_cluster_cidr() {
    let view = mk_fixed_view();
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let mut options = mk_options(dispatch);
        options.masquerade_all = true;
        let rs = plan(&view, &options);
        let got = outcomes(
            &rs,
            &env(),
            &packet(LOCAL_POD, "10.96.0.30", 80, Origin::Network),
        );
        assert_eq!(got, vec![(dnat("10.244.2.4:8080"), true, 1000)]);
        options.masquerade_all = false;
        options.cluster_cidr = None;
        let rs = plan(&view, &options);
        let got = outcomes(&rs, &env(), &from_client("10.96.0.30", 80));
        assert_eq!(got, vec![(dnat("10.244.2.4:8080"), false, 1000)]);
    }
}

#[test]
fn tree_dispatch_walks_logarithmically_many_rules() {
    let services: Vec<ServicePort> = (0..2000u32)
        .map(|i| {
            mk_svc(
                &format!("svc-{i}"),
                &format!("10.96.{}.{}", i / 200, i % 200 + 1),
                80,
                vec![mk_ep("10.244.2.9", 8080, "node-b")],
            )
        })
        .collect();
    let view = NodeView {
        node: mk_node(),
        services,
    };
    let walked = |dispatch, dst: &str| {
        let rs = plan(&view, &mk_options(dispatch));
        trace::dispatch_rules_walked(&rs, &env(), &packet(LOCAL_POD, dst, 80, Origin::Network))
            .unwrap()
            .unwrap()
    };
    assert_eq!(walked(Dispatch::Linear, "10.96.0.1"), 1);
    // Services are ordered by name, so `svc-999` (10.96.4.200) is the last linear rule.
    assert_eq!(walked(Dispatch::Linear, "10.96.4.200"), 2000);
    for dst in ["10.96.0.1", "10.96.9.200", "10.96.4.200", "10.96.4.77"] {
        let n = walked(Dispatch::Tree, dst);
        // About two rules per level of a binary tree over 2000 addresses, plus one leaf.
        assert!(n <= 2 * 11 + 16, "{dst}: {n}");
    }
    let rs = plan(&view, &mk_options(Dispatch::Tree));
    assert_eq!(
        trace::dispatch_rules_walked(
            &rs,
            &env(),
            &packet(LOCAL_POD, "10.97.0.1", 80, Origin::Network)
        )
        .unwrap(),
        None
    );
}

#[test]
fn ipv6_tree_dispatch_matches_linear() {
    let services: Vec<ServicePort> = (0..40u32)
        .map(|i| {
            let mut svc = mk_svc(
                &format!("svc-{i}"),
                &format!("fd00:96::{:x}", i * 977 + 1),
                80,
                vec![mk_ep(&format!("fd00:244:2::{:x}", i + 1), 8080, "node-b")],
            );
            svc.node_port = Some(30000 + (i as u16) * 37);
            svc
        })
        .collect();
    let view = NodeView {
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec![ip("fd00:18::11")],
            zone: None,
        },
        services,
    };
    let env = TraceEnv {
        local_addresses: vec![ip("fd00:18::11")],
        ..TraceEnv::default()
    };
    let plan_for = |dispatch| {
        let options = PlanOptions {
            family: IpFamily::V6,
            dispatch,
            cluster_cidr: Some("fd00:244::/48".parse().unwrap()),
            leaf_size: 1,
            ..PlanOptions::default()
        };
        plan(&view, &options)
    };
    let (linear, tree) = (plan_for(Dispatch::Linear), plan_for(Dispatch::Tree));
    check_consistency(&tree);
    for svc in &view.services {
        let p = trace::Packet {
            src: ip("fd00:18::100"),
            dst: svc.cluster_ips[0],
            protocol: Protocol::Tcp,
            dport: 80,
            origin: Origin::Network,
            bridged: false,
        };
        let expected = vec![(
            Verdict::Dnat(std::net::SocketAddr::new(svc.endpoints[0].ip, 8080)),
            true,
            1000,
        )];
        assert_eq!(outcomes(&linear, &env, &p), expected);
        assert_eq!(outcomes(&tree, &env, &p), expected);
        let np = trace::Packet {
            dst: ip("fd00:18::11"),
            dport: svc.node_port.unwrap(),
            ..p
        };
        assert_eq!(outcomes(&tree, &env, &np), expected);
    }
}

/// kube-proxy's rule for IPv6: node ports are never served on `::1` (a packet from `::1` cannot
/// leave the loopback device), while every other local address still takes them.
#[test]
fn ipv6_node_ports_leave_out_localhost() {
    let mut svc = mk_svc(
        "svc-v6",
        "fd00:96::a",
        80,
        vec![mk_ep("fd00:244:2::5", 8080, "node-b")],
    );
    svc.node_port = Some(30080);
    let view = NodeView {
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec![ip("fd00:198:18::b")],
            zone: None,
        },
        services: vec![svc],
    };
    let env = TraceEnv {
        local_addresses: vec![ip("fd00:198:18::b"), ip("::1")],
        ..TraceEnv::default()
    };
    let from_node = |dst: &str| trace::Packet {
        src: ip(dst),
        dst: ip(dst),
        protocol: Protocol::Tcp,
        dport: 30080,
        origin: Origin::LocalProcess,
        bridged: false,
    };
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let options = PlanOptions {
            family: IpFamily::V6,
            dispatch,
            cluster_cidr: Some("fd00:244::/32".parse().unwrap()),
            ..PlanOptions::default()
        };
        let rs = plan(&view, &options);
        let mut rulesets = vec![(format!("{dispatch:?}"), rs.clone())];
        if dispatch == Dispatch::Linear {
            rulesets.push(("nftables".into(), nft_traceable(&rs, IpFamily::V6)));
        }
        for (name, rs) in rulesets {
            assert_eq!(
                outcomes(&rs, &env, &from_node("::1")),
                vec![(Verdict::Delivered, false, 1000)],
                "{name}: [::1]:30080"
            );
            assert_eq!(
                outcomes(&rs, &env, &from_node("fd00:198:18::b")),
                vec![(Verdict::Dnat(ip_port("[fd00:244:2::5]:8080")), true, 1000)],
                "{name}: the node's own address"
            );
        }
    }
}

fn ip_port(s: &str) -> std::net::SocketAddr {
    s.parse().unwrap()
}

#[test]
fn each_path_names_every_rule_it_hit() {
    let view = mk_fixed_view();
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let rs = plan(&view, &mk_options(dispatch));
        let paths = trace::trace_paths(&rs, &env(), &from_client("10.96.0.10", 80)).unwrap();
        assert_eq!(paths.len(), 2, "{dispatch:?}: one path per endpoint");
        for path in &paths {
            let Verdict::Dnat(to) = path.outcome.verdict else {
                panic!("{dispatch:?}: {:?}", path.outcome)
            };
            let first = &path.hits[0];
            assert_eq!(
                (first.table, first.chain.as_str()),
                (Table::Nat, "PREROUTING")
            );
            assert!(
                path.hits
                    .iter()
                    .any(|h| h.chain.as_str().starts_with("BERTH-SEP-")
                        && h.rule.target == Some(Target::Dnat(to))),
                "{dispatch:?}: the DNAT to {to} is a hit"
            );
            assert!(
                path.hits
                    .iter()
                    .any(|h| matches!(h.rule.target, Some(Target::Masquerade { .. }))),
                "{dispatch:?}: an off-cluster client is masqueraded"
            );
            assert!((path.probability - 0.5).abs() < 1e-9);
        }
    }
}
