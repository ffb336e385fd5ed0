//! Properties over random Services: both dispatch modes give every packet the same outcomes, and
#![allow(clippy::unwrap_used)]
//! any sequence of partial syncs leaves exactly what a full sync of the last state would.

mod common;

use berth_core::IpFamily;
use berth_core::TrafficPolicy;
use berth_datapath::backend::SyncKind;
use berth_datapath::fake::MemoryIptables;
use berth_datapath::fake::MemoryNft;
use berth_datapath::iptables::Syncer;
use berth_datapath::nft::inline::is_endpoint_chain;
use berth_datapath::nft::NftSyncer;
use berth_datapath::trace::Origin;
use berth_datapath::*;
use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct SvcSpec {
    addr: u8,
    port: u16,
    node_port: Option<u16>,
    lb: Option<u8>,
    local: bool,
    internal_local: bool,
    endpoints: Vec<(u8, bool, bool)>,
    /// ClientIP affinity's timeout, when set.
    affinity: Option<u32>,
}

fn svc_spec() -> impl Strategy<Value = SvcSpec> {
    (
        any::<u8>(),
        prop_oneof![Just(80u16), Just(443u16), Just(53u16)],
        proptest::option::of(30000u16..30064),
        proptest::option::of(200u8..210),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec((1u8..40, any::<bool>(), any::<bool>()), 0..4),
        proptest::option::of(prop_oneof![Just(60u32), Just(10800u32)]),
    )
        .prop_map(
            |(addr, port, node_port, lb, local, internal_local, endpoints, affinity)| SvcSpec {
                addr,
                port,
                node_port,
                lb,
                local,
                internal_local,
                endpoints,
                affinity,
            },
        )
}

/// Service CIDRs of the plan: none, all of the views' ClusterIPs, or a part of them (and the
/// other family's, which an IPv4 plan ignores).
fn service_cidrs(choice: usize) -> Vec<ipnet::IpNet> {
    let cidrs: &[&str] = match choice {
        0 => &[],
        1 => &["10.96.0.0/16"],
        _ => &["10.96.0.0/23", "fd00:96::/112"],
    };
    cidrs.iter().map(|c| c.parse().unwrap()).collect()
}

fn mk_view(specs: &[SvcSpec]) -> NodeView {
    let mut seen_ports = std::collections::BTreeSet::new();
    let services = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let eps = s
                .endpoints
                .iter()
                .map(|(host, on_this_node, ready)| {
                    let node = if *on_this_node { "node-a" } else { "node-b" };
                    let mut ep = mk_ep(
                        &format!("10.244.{}.{host}", if *on_this_node { 1 } else { 2 }),
                        8080,
                        node,
                    );
                    if !ready {
                        ep = mk_terminating(ep);
                    }
                    ep
                })
                .collect();
            let mut svc = mk_svc(
                &format!("svc-{i}"),
                &format!("10.96.{}.{}", s.addr % 4, s.addr),
                s.port,
                eps,
            );
            // A node port belongs to one Service.
            svc.node_port = s.node_port.filter(|p| seen_ports.insert(*p));
            if let Some(lb) = s.lb {
                svc.load_balancer_ingress = vec![common::lb(&format!("198.18.0.{lb}"))];
            }
            if s.local {
                svc.external_traffic_policy = TrafficPolicy::Local;
            }
            if s.internal_local {
                svc.internal_traffic_policy = TrafficPolicy::Local;
            }
            if let Some(timeout_seconds) = s.affinity {
                svc.session_affinity = SessionAffinity::ClientIp { timeout_seconds };
            }
            svc
        })
        .collect();
    NodeView {
        node: mk_node(),
        services,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn tree_and_linear_agree(
        specs in proptest::collection::vec(svc_spec(), 1..30),
        leaf in 1usize..5,
        cidrs in 0usize..3,
    ) {
        let view = mk_view(&specs);
        let mut linear_options = mk_options(Dispatch::Linear);
        linear_options.service_cidrs = service_cidrs(cidrs);
        let linear = plan(&view, &linear_options);
        let mut tree_options = linear_options.clone();
        tree_options.dispatch = Dispatch::Tree;
        tree_options.leaf_size = leaf;
        let tree = plan(&view, &tree_options);
        check_consistency(&linear);
        check_consistency(&tree);
        let mut packets = Vec::new();
        for svc in &view.services {
            for src in [LOCAL_POD, CLIENT_IP] {
                packets.push(packet(src, &svc.cluster_ips[0].to_string(), svc.port, Origin::Network));
                for ingress in &svc.load_balancer_ingress {
                    packets.push(packet(src, &ingress.ip.to_string(), svc.port, Origin::Network));
                }
                if let Some(np) = svc.node_port {
                    packets.push(packet(src, NODE_IP, np, Origin::Network));
                }
            }
            packets.push(packet(NODE_IP, &svc.cluster_ips[0].to_string(), svc.port, Origin::LocalProcess));
            // A port the Service may not have.
            packets.push(packet(LOCAL_POD, &svc.cluster_ips[0].to_string(), 8443, Origin::Network));
        }
        packets.push(packet(LOCAL_POD, "10.96.3.250", 80, Origin::Network));
        packets.push(packet(CLIENT_IP, "10.96.9.9", 80, Origin::Network));
        for p in &packets {
            prop_assert_eq!(outcomes(&linear, &env(), p), outcomes(&tree, &env(), p), "{:?}", p);
        }
    }

    #[test]
    fn partial_syncs_converge_to_the_full_state(
        steps in proptest::collection::vec(proptest::collection::vec(svc_spec(), 0..12), 1..5),
        tree in any::<bool>(),
    ) {
        let mut options = mk_options(if tree { Dispatch::Tree } else { Dispatch::Linear });
        options.leaf_size = 2;
        let mut syncer = Syncer::new(MemoryIptables::default());
        for specs in &steps {
            let rs = plan(&mk_view(specs), &options);
            syncer.sync(&rs).unwrap();
            prop_assert_eq!(syncer.iptables().berth_ruleset(), rs.clone());
            let mut fresh = Syncer::new(MemoryIptables::default());
            fresh.sync(&rs).unwrap();
            prop_assert_eq!(&syncer.iptables().tables, &fresh.iptables().tables);
        }
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, SvcSpec),
    Add(SvcSpec),
    Remove(usize),
    /// Changes one endpoint's address, as a pod restart does.
    MoveEndpoint(usize, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), svc_spec()).prop_map(|(i, s)| Edit::Replace(i, s)),
        svc_spec().prop_map(Edit::Add),
        any::<usize>().prop_map(Edit::Remove),
        (any::<usize>(), 1u8..40).prop_map(|(i, host)| Edit::MoveEndpoint(i, host)),
    ]
}

fn apply_edit(specs: &mut Vec<SvcSpec>, edit: &Edit) {
    let len = specs.len();
    match edit.clone() {
        Edit::Add(spec) => specs.push(spec),
        Edit::Replace(i, spec) if len > 0 => specs[i % len] = spec,
        Edit::Remove(i) if len > 0 => {
            specs.remove(i % len);
        }
        Edit::MoveEndpoint(i, host) if len > 0 => {
            if let Some(ep) = specs[i % len].endpoints.first_mut() {
                ep.0 = host;
            }
        }
        _ => {}
    }
}

/// What berth's nftables Syncer relies on instead of a reverse index: every chain of `plan`
/// that jumps to an endpoint chain the changes name (and `plan` still holds) is named too.
fn assert_users_named(plan: &Ruleset, changes: &Changes) {
    let Some(changed) = changes.chains() else {
        return;
    };
    for (table, rules) in &plan.tables {
        for (chain, rules) in &rules.chains {
            for target in rules.iter().filter_map(Rule::jump_target) {
                let endpoint = (*table, target.clone());
                if is_endpoint_chain(target) && changed.contains(&endpoint) {
                    assert!(
                        changed.contains(&(*table, chain.clone())),
                        "{chain} uses the changed {target} but is not named"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// The incremental planner always holds exactly the ruleset `plan` gives from scratch, and
    /// syncing only the chains it reports leaves iptables, and berth's nftables table, exactly as
    /// a full sync would.
    #[test]
    fn incremental_planning_equals_a_full_plan(
        initial in proptest::collection::vec(svc_spec(), 0..16),
        batches in proptest::collection::vec(proptest::collection::vec(edit(), 1..4), 1..8),
        tree in any::<bool>(),
        leaf in 1usize..4,
        hinted in any::<bool>(),
        cidrs in 0usize..3,
    ) {
        let mut previous = NodeView::default();
        let mut options = mk_options(if tree { Dispatch::Tree } else { Dispatch::Linear });
        options.leaf_size = leaf;
        options.service_cidrs = service_cidrs(cidrs);
        let mut planner = Planner::new(options.clone());
        let mut syncer = Syncer::new(MemoryIptables::default())
            .rewriting_every_sync(rewritten_every_sync(options.dispatch));
        let mut nft = NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4);
        let mut specs = initial;
        for (step, batch) in std::iter::once(&Vec::new()).chain(&batches).enumerate() {
            for edit in batch {
                apply_edit(&mut specs, edit);
            }
            let view = mk_view(&specs);
            if hinted {
                // Every edit can rename later Services (names follow positions), so hint by
                // comparing with the previous view, as the agent's index would.
                let before: std::collections::BTreeMap<_, _> =
                    previous.services.iter().map(|s| (s.name.clone(), s.clone())).collect();
                let changed = |name: &ServicePortName| {
                    before.get(name) != view.services.iter().find(|s| &s.name == name)
                };
                planner.update_changed(&view, &changed);
            } else {
                planner.update(&view);
            }
            previous = view.clone();
            let expected = plan(&view, &options);
            prop_assert_eq!(planner.ruleset(), &expected, "step {}", step);
            let changes = planner.take_changes();
            prop_assert_eq!(step == 0, changes == Changes::All);
            assert_users_named(&expected, &changes);
            let report = syncer.sync_changes(planner.ruleset(), &changes).unwrap();
            prop_assert_eq!(report.rule_count, expected.rule_count());
            prop_assert_eq!(syncer.iptables().berth_ruleset(), expected.clone());
            let report = nft.sync_changes(planner.ruleset(), &changes).unwrap();
            prop_assert_eq!(report.kind == SyncKind::Full, step == 0);
            let mut fresh = NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4);
            fresh.sync(&expected).unwrap();
            prop_assert_eq!(&nft.nft().table, &fresh.nft().table, "step {}", step);
            check_consistency(planner.ruleset());
        }
        // Nothing changed: nothing to report, and the payload holds only what must be rewritten.
        planner.update(&mk_view(&specs));
        prop_assert_eq!(planner.take_changes(), Changes::Chains(Default::default()));
    }
}

/// Enough Service ports at once for the planner's bulk path (ports planned on several threads,
/// their chains merged into the ruleset at once): a cold plan, then as many ports again added
/// beside changed and removed ones. The planner holds what `plan` gives, and the chains it
/// reports bring berth's nftables table to what a full sync writes.
#[test]
fn planning_many_ports_at_once_equals_a_full_plan() {
    let spec = |i: usize, salt: usize| SvcSpec {
        addr: (i * 7 + salt) as u8,
        port: [80, 443, 53][i % 3],
        node_port: i.is_multiple_of(5).then(|| 30000 + (i % 64) as u16),
        lb: i.is_multiple_of(9).then(|| 200 + (i % 10) as u8),
        local: i.is_multiple_of(4),
        internal_local: i.is_multiple_of(11),
        endpoints: (0..(i + salt) % 4)
            .map(|e| (1 + ((i + e + salt) % 39) as u8, e % 2 == 0, e != 2))
            .collect(),
        // A timeout that changes with the salt: the endpoint chains' sets are updated.
        affinity: i.is_multiple_of(6).then_some(60 + salt as u32),
    };
    for (dispatch, cidrs) in [(Dispatch::Linear, 1), (Dispatch::Tree, 0)] {
        let mut options = mk_options(dispatch);
        options.service_cidrs = service_cidrs(cidrs);
        let mut planner = Planner::new(options.clone());
        let mut nft = NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4);
        let mut specs: Vec<SvcSpec> = (0..700).map(|i| spec(i, 0)).collect();
        for step in 0..3 {
            if step > 0 {
                // Change every third port, remove a few, add 600 new ones.
                for (i, s) in specs.iter_mut().enumerate().filter(|(i, _)| i % 3 == step) {
                    *s = spec(i, step);
                }
                specs.truncate(specs.len() - 40);
                let len = specs.len();
                specs.extend((len..len + 600).map(|i| spec(i, step)));
            }
            let view = mk_view(&specs);
            planner.update(&view);
            let expected = plan(&view, &options);
            assert_eq!(planner.ruleset(), &expected, "{dispatch:?} step {step}");
            let changes = planner.take_changes();
            assert_eq!(step == 0, changes == Changes::All);
            nft.sync_changes(planner.ruleset(), &changes).unwrap();
            let mut fresh = NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4);
            fresh.sync(&expected).unwrap();
            assert_eq!(
                &nft.nft().table,
                &fresh.nft().table,
                "{dispatch:?} step {step}"
            );
            check_consistency(planner.ruleset());
        }
    }
}

/// A Service for the dispatch-entry property: few addresses, ports and node ports, so that
/// addresses move between Services, are shared by two ports (or, invalidly, claimed twice),
/// node ports are reused, and targets change with the traffic policy or a rename.
#[derive(Debug, Clone)]
struct EntrySpec {
    /// Renames the Service (its chains get other names, so other shards).
    tag: u8,
    addr: u8,
    udp: bool,
    port: u16,
    /// A second port of the same Service on the same address.
    second_port: bool,
    node_port: Option<u16>,
    lb: Option<u8>,
    local: bool,
    endpoints: u8,
}

fn entry_spec() -> impl Strategy<Value = EntrySpec> {
    (
        (
            0u8..2,
            0u8..4,
            any::<bool>(),
            prop_oneof![Just(80u16), Just(443u16)],
        ),
        (
            any::<bool>(),
            proptest::option::of(30000u16..30004),
            proptest::option::of(200u8..203),
            any::<bool>(),
            0u8..3,
        ),
    )
        .prop_map(
            |((tag, addr, udp, port), (second_port, node_port, lb, local, endpoints))| EntrySpec {
                tag,
                addr,
                udp,
                port,
                second_port,
                node_port,
                lb,
                local,
                endpoints,
            },
        )
}

fn entry_view(specs: &[EntrySpec]) -> NodeView {
    let mut services = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let name = format!("svc-{i}-{}", s.tag);
        let eps: Vec<Endpoint> = (0..s.endpoints)
            .map(|e| {
                mk_ep(
                    &format!("10.244.2.{}", 10 * (i % 25) + usize::from(e) + 1),
                    8080,
                    "node-b",
                )
            })
            .collect();
        let cluster_ip = format!("10.96.0.{}", s.addr + 1);
        let mut ports = vec![mk_svc(&name, &cluster_ip, s.port, eps.clone())];
        if s.second_port {
            let mut second = mk_svc(&name, &cluster_ip, 8443, eps);
            second.name = berth_testing::port_name("ns1", &name, "p8443");
            ports.push(second);
        }
        for svc in &mut ports {
            if s.udp {
                svc.protocol = berth_core::Protocol::Udp;
            }
            if let Some(lb) = s.lb {
                svc.load_balancer_ingress = vec![common::lb(&format!("198.18.0.{lb}"))];
            }
            if s.local {
                svc.external_traffic_policy = TrafficPolicy::Local;
            }
        }
        // Node ports may be claimed twice: the first entry of a key is the map's.
        ports[0].node_port = s.node_port;
        services.extend(ports);
    }
    NodeView {
        node: mk_node(),
        services,
    }
}

#[derive(Debug, Clone)]
enum EntryEdit {
    Add(EntrySpec),
    Replace(usize, EntrySpec),
    Remove(usize),
    /// The Service takes another address (one another Service may hold).
    MoveAddress(usize, u8),
    /// The Service takes a node port (one another Service may have just given up).
    NodePort(usize, Option<u16>),
}

fn entry_edit() -> impl Strategy<Value = EntryEdit> {
    prop_oneof![
        entry_spec().prop_map(EntryEdit::Add),
        (any::<usize>(), entry_spec()).prop_map(|(i, s)| EntryEdit::Replace(i, s)),
        any::<usize>().prop_map(EntryEdit::Remove),
        (any::<usize>(), 0u8..4).prop_map(|(i, a)| EntryEdit::MoveAddress(i, a)),
        (any::<usize>(), proptest::option::of(30000u16..30004))
            .prop_map(|(i, p)| EntryEdit::NodePort(i, p)),
    ]
}

fn apply_entry_edit(specs: &mut Vec<EntrySpec>, edit: &EntryEdit) {
    let len = specs.len();
    match edit.clone() {
        EntryEdit::Add(spec) => specs.push(spec),
        EntryEdit::Replace(i, spec) if len > 0 => specs[i % len] = spec,
        EntryEdit::Remove(i) if len > 0 => {
            specs.remove(i % len);
        }
        EntryEdit::MoveAddress(i, addr) if len > 0 => specs[i % len].addr = addr,
        EntryEdit::NodePort(i, port) if len > 0 => specs[i % len].node_port = port,
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// With linear dispatch the planner reports the changed dispatch entries, and the nftables
    /// partial sync writes them as map elements without the whole chain: after any sequence of
    /// adds, removes, retargets, address moves and node-port reuses — one table or four shards,
    /// the changes of one plan or of several merged, as the agent merges them, with Service
    /// CIDRs (the ClusterIPs' `cluster-ips` elements) or without — berth's tables hold exactly
    /// what a full sync of the same ruleset leaves.
    #[test]
    fn partial_dispatch_entries_equal_a_full_sync(
        initial in proptest::collection::vec(entry_spec(), 0..24),
        batches in proptest::collection::vec(
            (proptest::collection::vec(entry_edit(), 1..4), any::<bool>()),
            1..10,
        ),
        sharded in any::<bool>(),
        service_cidrs in any::<bool>(),
    ) {
        let mut options = mk_options(Dispatch::Linear);
        if service_cidrs {
            options.service_cidrs = vec!["10.96.0.0/16".parse().unwrap()];
        }
        let shards = if sharded { nft::Shards::new(4).unwrap() } else { nft::Shards::default() };
        let mk_syncer = || {
            NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4).with_shards(shards)
        };
        let mut planner = Planner::new(options.clone());
        let mut nft = mk_syncer();
        let mut specs = initial;
        let mut pending = Changes::Chains(Default::default());
        for (step, (batch, sync_now)) in std::iter::once(&(Vec::new(), true))
            .chain(&batches)
            .enumerate()
        {
            for edit in batch {
                apply_entry_edit(&mut specs, edit);
            }
            let view = entry_view(&specs);
            planner.update(&view);
            let expected = plan(&view, &options);
            prop_assert_eq!(planner.ruleset(), &expected, "step {}", step);
            let changes = planner.take_changes();
            if let Changes::Dispatch(chains, dispatch) = &changes {
                prop_assert!(!dispatch.is_empty());
                // The chains of changed entries are reported too (iptables rewrites them).
                let services = (Table::Nat, ChainName::new("BERTH-SERVICES"));
                prop_assert!(dispatch.services.is_empty() || chains.contains(&services));
                let node_ports = (Table::Nat, ChainName::new("BERTH-NODEPORTS"));
                prop_assert!(dispatch.node_ports.is_empty() || chains.contains(&node_ports));
                let cluster_ips = (Table::Filter, ChainName::new("BERTH-CLUSTER-IPS"));
                prop_assert!(dispatch.cluster_ips.is_empty() || chains.contains(&cluster_ips));
                prop_assert!(service_cidrs || dispatch.cluster_ips.is_empty());
            }
            pending = if step == 0 { changes } else { pending.merge(changes) };
            if !sync_now && step + 1 < batches.len() + 1 {
                continue;
            }
            let report = nft.sync_changes(planner.ruleset(), &pending).unwrap();
            prop_assert_eq!(report.kind == SyncKind::Full, step == 0);
            pending = Changes::Chains(Default::default());
            let mut fresh = mk_syncer();
            fresh.sync(&expected).unwrap();
            prop_assert_eq!(&nft.nft().table, &fresh.nft().table, "step {}", step);
        }
    }
}

/// Drives a lean planner and a Syncer as the agent does ([`apply::plan_for_sync`], then
/// [`apply::apply_planned`]); `shards` when the Syncer takes a full sync's Service chains
/// shard by shard.
fn lean_step(
    planner: &mut Planner,
    syncer: &mut dyn SyncRuleset,
    pending: &mut Changes,
    view: &NodeView,
    full: bool,
    shards: Option<nft::Shards>,
) -> SyncReport {
    let full_sync = full || *pending == Changes::All;
    let ports = apply::plan_for_sync(planner, view, full_sync, shards, |planner| {
        planner.update(view)
    });
    let changes = planner.take_changes();
    if !full_sync {
        assert_users_named(&plan(view, planner.options()), &changes);
    }
    *pending = std::mem::replace(pending, Changes::All).merge(changes);
    if full {
        syncer.force_full_sync();
    }
    apply::apply_planned(syncer, planner, pending, ports, |planner| {
        planner.fill(view)
    })
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// A lean planner lets Service ports' own chains go once applied and plans them again for
    /// a change or a full sync: whatever the edits, and whether a full sync is asked for (`Full`)
    /// or found due by the Syncer alone (`Lost`: its state forgotten behind the planner's back),
    /// iptables and berth's nftables tables end exactly as a full sync of `plan(view)` leaves
    /// them, the rule counts are the full plan's, and a filled planner holds the full plan.
    #[test]
    fn a_lean_planner_applies_what_a_full_plan_does(
        initial in proptest::collection::vec(svc_spec(), 0..16),
        batches in proptest::collection::vec(
            (proptest::collection::vec(edit(), 1..4), 0u8..6),
            1..8,
        ),
        tree in any::<bool>(),
        leaf in 1usize..4,
        cidrs in 0usize..3,
    ) {
        let mut options = mk_options(if tree { Dispatch::Tree } else { Dispatch::Linear });
        options.leaf_size = leaf;
        options.service_cidrs = service_cidrs(cidrs);
        let mut ipt_planner = Planner::new(options.clone()).lean().keeping_endpoint_names();
        let mut nft_planner = Planner::new(options.clone()).lean();
        let mut ipt = Syncer::new(MemoryIptables::default())
            .rewriting_every_sync(rewritten_every_sync(options.dispatch));
        // Shards take linear dispatch (its chains become their maps), as the agent runs them.
        let shards = nft::Shards::new(if tree { 1 } else { 4 }).unwrap();
        let mut nft = NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4)
            .with_shards(shards)
            .with_staged_cold_load(true);
        let streams = shards.is_sharded().then_some(shards);
        let (mut ipt_pending, mut nft_pending) = (Changes::All, Changes::All);
        let mut specs = initial;
        for (step, (batch, how)) in std::iter::once(&(Vec::new(), 1)).chain(&batches).enumerate() {
            for edit in batch {
                apply_edit(&mut specs, edit);
            }
            let view = mk_view(&specs);
            let expected = plan(&view, &options);
            // 0: a full sync asked for; 1: the Syncers' state lost; otherwise a partial sync.
            let full = *how == 0;
            if *how == 1 {
                ipt.force_full_sync();
                nft.force_full_sync();
            }
            // iptables writes a full sync's Service chains as it plans them, four groups.
            let groups = Some(nft::Shards::new(4).unwrap());
            let report =
                lean_step(&mut ipt_planner, &mut ipt, &mut ipt_pending, &view, full, groups);
            prop_assert_eq!(report.rule_count, expected.rule_count(), "step {}", step);
            prop_assert_eq!(ipt.iptables().berth_ruleset(), expected.clone(), "step {}", step);
            let report =
                lean_step(&mut nft_planner, &mut nft, &mut nft_pending, &view, full, streams);
            prop_assert_eq!(report.kind == SyncKind::Full, full || *how == 1, "step {}", step);
            let mut fresh = NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4)
                .with_shards(shards);
            fresh.sync(&expected).unwrap();
            prop_assert_eq!(&nft.nft().table, &fresh.nft().table, "step {}", step);
            let counts: Vec<(Table, usize)> = expected
                .tables
                .iter()
                .map(|(table, rules)| (*table, rules.rule_count()))
                .collect();
            prop_assert_eq!(ipt_planner.rule_counts(), counts.clone(), "step {}", step);
            prop_assert_eq!(nft_planner.rule_counts(), counts, "step {}", step);
            // Released: the Service ports' own chains are gone until a fill.
            prop_assert!(ipt_planner.ruleset().rule_count() <= expected.rule_count());
            ipt_planner.fill(&view);
            prop_assert_eq!(ipt_planner.ruleset(), &expected, "step {}", step);
            prop_assert_eq!(ipt_planner.take_changes(), Changes::Chains(Default::default()));
            ipt_planner.release();
        }
    }
}
