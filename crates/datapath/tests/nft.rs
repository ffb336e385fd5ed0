//! The nftables backend against the in-memory nftables: the golden transaction, full and partial
//! syncs, element-level map updates, affinity sets, failures and a deleted table, and traced outcomes
//! equal to the plan's. `UPDATE_GOLDEN=1` rewrites the golden file.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::IpAddr;

use berth_core::IpFamily;
use berth_datapath::backend::SyncKind;
use berth_datapath::fake::MemoryNft;
use berth_datapath::nft::{remove_table, Nft, NftSyncer};
use berth_datapath::nft::{Command, Element, NftChain, NftRule};
use berth_datapath::*;
use common::*;

fn syncer() -> NftSyncer<MemoryNft> {
    NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4)
}

fn linear() -> PlanOptions {
    mk_options(Dispatch::Linear)
}

fn many(n: usize) -> NodeView {
    let services = (0..n)
        .map(|i| {
            let mut svc = mk_svc(
                &format!("svc-{i}"),
                &format!("10.96.{}.{}", i / 250, i % 250 + 1),
                80,
                vec![mk_ep(&format!("10.244.2.{}", i % 250 + 1), 8080, "node-b")],
            );
            svc.node_port = Some(30000 + i as u16);
            svc
        })
        .collect();
    NodeView {
        node: mk_node(),
        services,
    }
}

/// Syncs the chains the planner reports changed since the last step.
fn step(
    s: &mut NftSyncer<MemoryNft>,
    planner: &mut Planner,
) -> berth_datapath::backend::SyncReport {
    let changes = planner.take_changes();
    s.sync_changes(planner.ruleset(), &changes).unwrap()
}

/// The lines of a transaction that name the `cluster-ips` set.
fn cluster_ip_lines(tx: &str) -> Vec<&str> {
    tx.lines().filter(|l| l.contains("cluster-ips")).collect()
}

fn last_tx(syncer: &NftSyncer<MemoryNft>) -> String {
    syncer
        .nft()
        .transactions
        .last()
        .cloned()
        .unwrap_or_default()
}

/// What a fresh full sync of `rs` leaves.
fn fresh(rs: &Ruleset) -> MemoryNft {
    let mut s = syncer();
    s.sync(rs).unwrap();
    s.nft().clone()
}

#[test]
fn golden_full_transaction_of_the_fixed_set() {
    let rs = plan(&mk_fixed_view(), &linear());
    let mut s = syncer();
    s.sync(&rs).unwrap();
    let text = last_tx(&s);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/fixed_nft.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, expected);
    // Only berth's table is ever named, and no Service gets an anonymous set.
    for line in text.lines() {
        assert!(line.contains(" ip berth"), "{line}");
        assert!(!line.contains("vmap {"), "anonymous verdict map: {line}");
    }
}

/// Every packet the fixed set can receive has the same outcomes in the plan and in the table.
#[test]
fn the_table_traces_like_the_plan() {
    let view = mk_fixed_view();
    let rs = plan(&view, &linear());
    let table = nft_traceable(&rs, IpFamily::V4);
    let packets = fixed_view_packets(&view);
    assert!(packets.len() > 50);
    for p in &packets {
        assert_eq!(
            outcomes(&rs, &env(), p),
            outcomes(&table, &env(), p),
            "{p:?}"
        );
    }
}

#[test]
fn first_sync_is_full_and_an_unchanged_plan_sends_nothing() {
    let rs = plan(&many(20), &linear());
    let mut s = syncer();
    let report = s.sync_changes(&rs, &Changes::All).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert!(report.payload_bytes > 0);
    let table = s.nft().table.clone().unwrap();
    assert_eq!(table.services.len(), 20);
    assert_eq!(table.node_ports.len(), 20);
    let again = s
        .sync_changes(&rs, &Changes::Chains(Default::default()))
        .unwrap();
    assert_eq!(
        (again.kind, again.payload_bytes, again.rewritten_chains),
        (SyncKind::Partial, 0, 0)
    );
    assert_eq!(s.nft().applied, 1);
}

#[test]
fn endpoint_change_rewrites_only_that_service_and_no_map() {
    let mut view = many(50);
    let mut planner = Planner::new(linear());
    planner.update(&view);
    let mut s = syncer();
    step(&mut s, &mut planner);
    view.services[7].endpoints.make_mut()[0].ip = ip("10.244.3.9");
    planner.update(&view);
    let report = step(&mut s, &mut planner);
    assert_eq!(report.kind, SyncKind::Partial);
    // Only the SVC chain: the endpoint is folded into its rules, and the hairpin pair moves.
    assert_eq!((report.rewritten_chains, report.deleted_chains), (1, 0));
    let tx = last_tx(&s);
    assert!(!tx.contains("element ip berth service-ips"), "{tx}");
    assert!(!tx.contains("BERTH-SERVICES"), "{tx}");
    assert!(!tx.contains("BERTH-SEP-"), "{tx}");
    assert!(
        tx.contains("delete element ip berth hairpin { 10.244.2.8 . 10.244.2.8 }"),
        "{tx}"
    );
    assert!(
        tx.contains("add element ip berth hairpin { 10.244.3.9 . 10.244.3.9 }"),
        "{tx}"
    );
    assert_eq!(s.nft().table, fresh(planner.ruleset()).table);
}

#[test]
fn services_come_and_go_as_map_elements() {
    let mut view = many(30);
    let mut planner = Planner::new(linear());
    planner.update(&view);
    let mut s = syncer();
    step(&mut s, &mut planner);
    let removed = view.services.remove(3);
    planner.update(&view);
    step(&mut s, &mut planner);
    let tx = last_tx(&s);
    let deletes: Vec<&str> = tx
        .lines()
        .filter(|l| l.starts_with("delete element ip berth service-ips"))
        .collect();
    assert_eq!(deletes.len(), 1, "{tx}");
    assert!(deletes[0].contains(&removed.cluster_ips[0].to_string()));
    assert!(
        tx.contains("delete element ip berth node-ports { tcp . 30003 }"),
        "{tx}"
    );
    assert!(tx.contains("delete chain ip berth nat-BERTH-SVC-"), "{tx}");
    // The BERTH-SERVICES chain itself is not rewritten: only its elements change.
    assert!(
        !tx.contains("flush chain ip berth nat-BERTH-SERVICES"),
        "{tx}"
    );
    assert_eq!(s.nft().table, fresh(planner.ruleset()).table);

    view.services.push(removed);
    planner.update(&view);
    step(&mut s, &mut planner);
    let tx = last_tx(&s);
    assert_eq!(
        tx.lines()
            .filter(|l| l.starts_with("add element ip berth service-ips"))
            .count(),
        1,
        "{tx}"
    );
    assert_eq!(s.nft().table, fresh(planner.ruleset()).table);
}

#[test]
fn a_failed_transaction_changes_nothing_and_forces_a_full_sync() {
    let mut view = many(10);
    let rs = plan(&view, &linear());
    let mut s = syncer();
    s.sync(&rs).unwrap();
    let before = s.nft().table.clone();
    view.services[2].endpoints.make_mut()[0].ip = ip("10.244.3.3");
    let rs2 = plan(&view, &linear());
    s.nft_mut().fail_next = true;
    assert!(s
        .sync_changes(&rs2, &Changes::Chains(all_chains(&rs2)))
        .is_err());
    assert_eq!(s.nft().table, before);
    let report = s
        .sync_changes(&rs2, &Changes::Chains(Default::default()))
        .unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(s.nft().table, fresh(&rs2).table);
}

fn all_chains(rs: &Ruleset) -> std::collections::BTreeSet<(Table, ChainName)> {
    rs.tables
        .iter()
        .flat_map(|(t, rules)| rules.chains.keys().map(move |c| (*t, c.clone())))
        .collect()
}

#[test]
fn a_deleted_table_fails_the_next_partial_sync_and_the_one_after_restores_everything() {
    let mut view = many(10);
    let rs = plan(&view, &linear());
    let mut s = syncer();
    s.sync(&rs).unwrap();
    s.nft_mut().flush_ruleset();
    view.services[1].endpoints.make_mut()[0].ip = ip("10.244.3.1");
    let rs2 = plan(&view, &linear());
    let err = s
        .sync_changes(&rs2, &Changes::Chains(all_chains(&rs2)))
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let report = s
        .sync_changes(&rs2, &Changes::Chains(Default::default()))
        .unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(s.nft().table, fresh(&rs2).table);
}

#[test]
fn the_fake_refuses_what_the_kernel_refuses() {
    let mut nft = MemoryNft::new(IpFamily::V4);
    let chain = NftChain::new(Table::Nat, &ChainName::new("BERTH-A"));
    let missing = ChainName::new("BERTH-MISSING");
    let mut tx = berth_datapath::nft::Transaction::new(IpFamily::V4);
    tx.push(Command::AddChain(chain.clone(), None));
    assert!(nft.apply(&tx).is_err(), "no table");
    let mut tx = berth_datapath::nft::Transaction::new(IpFamily::V4);
    tx.push(Command::AddTable(0));
    tx.push(Command::AddMaps(0));
    tx.push(Command::AddChain(chain.clone(), None));
    nft.apply(&tx).unwrap();
    let bad = [
        Command::AddRule(
            chain.clone(),
            berth_datapath::nft::NftRule::Rule(Rule::jump(vec![], &missing)),
        ),
        Command::AddElement(Element::Service(
            (ip("10.96.0.1"), berth_core::Protocol::Tcp, 80),
            NftChain::new(Table::Nat, &missing),
        )),
        Command::DeleteElement(Element::NodePort(
            (berth_core::Protocol::Tcp, 30000),
            NftChain::new(Table::Nat, &missing),
        )),
        Command::DeleteChain(NftChain::new(Table::Nat, &missing)),
    ];
    for command in bad {
        let before = nft.clone();
        let mut tx = berth_datapath::nft::Transaction::new(IpFamily::V4);
        tx.push(Command::AddChain(
            NftChain::new(Table::Nat, &ChainName::new("BERTH-B")),
            None,
        ));
        tx.push(command.clone());
        assert!(nft.apply(&tx).is_err(), "{command:?}");
        assert_eq!(nft.table, before.table, "{command:?} left a partial change");
    }
    // A chain a map element jumps to cannot be deleted.
    let mut tx = berth_datapath::nft::Transaction::new(IpFamily::V4);
    tx.push(Command::AddElement(Element::Service(
        (ip("10.96.0.1"), berth_core::Protocol::Tcp, 80),
        chain.clone(),
    )));
    nft.apply(&tx).unwrap();
    let mut tx = berth_datapath::nft::Transaction::new(IpFamily::V4);
    tx.push(Command::DeleteChain(chain));
    assert!(nft.apply(&tx).is_err());
    nft.apply(&remove_table(IpFamily::V4)).unwrap();
    assert_eq!(nft.table, None);
    // Removing an absent table is no error.
    nft.apply(&remove_table(IpFamily::V4)).unwrap();
}

#[test]
fn affinity_sets_follow_the_service_timeout() {
    let mut view = many(3);
    view.services[1].session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 600,
    };
    let mut planner = Planner::new(linear());
    planner.update(&view);
    let mut s = syncer();
    step(&mut s, &mut planner);
    let table = s.nft().table.clone().unwrap();
    assert_eq!(table.affinity.values().copied().collect::<Vec<_>>(), [600]);
    let tx = last_tx(&s);
    assert!(tx.contains("flags dynamic,timeout ; timeout 600s"), "{tx}");
    assert!(tx.contains("update @BERTH-SEP-"), "{tx}");

    view.services[1].session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 60,
    };
    planner.update(&view);
    step(&mut s, &mut planner);
    assert_eq!(s.nft().table, fresh(planner.ruleset()).table);

    view.services[1].session_affinity = SessionAffinity::None;
    planner.update(&view);
    step(&mut s, &mut planner);
    assert!(s.nft().table.as_ref().unwrap().affinity.is_empty());
    assert_eq!(s.nft().table, fresh(planner.ruleset()).table);
}

#[test]
fn ipv6_programs_the_ip6_table() {
    let mut view = many(2);
    for svc in &mut view.services {
        svc.cluster_ips = vec![ip("fd00:96::10")];
        svc.node_port = None;
        for ep in svc.endpoints.make_mut() {
            ep.ip = ip("fd00:244:2::5");
        }
    }
    view.services.truncate(1);
    let mut options = linear();
    options.family = IpFamily::V6;
    options.cluster_cidr = Some("fd00:244::/48".parse().unwrap());
    let rs = plan(&view, &options);
    let mut s = NftSyncer::new(MemoryNft::new(IpFamily::V6), IpFamily::V6);
    s.sync(&rs).unwrap();
    let tx = last_tx(&s);
    assert!(tx.contains("add table ip6 berth"), "{tx}");
    assert!(tx.contains("dnat to [fd00:244:2::5]:8080"), "{tx}");
    assert!(
        tx.contains("ip6 daddr . meta l4proto . th dport vmap @service-ips"),
        "{tx}"
    );
    assert!(
        tx.contains("fd00:96::10 . tcp . 80 : jump nat-BERTH-SVC-"),
        "{tx}"
    );
}

/// With the cluster's Service CIDRs the ClusterIPs' REJECTs are elements of `cluster-ips` behind
/// one reject rule: a Service removed or added is one element deleted or added, the chain is not
/// written again, whether the planner tells the changed entries or the Syncer diffs the chain.
#[test]
fn cluster_ips_come_and_go_as_set_elements() {
    let options = PlanOptions {
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
        ..linear()
    };
    let cluster_ips = NftChain::new(Table::Filter, &ChainName::new("BERTH-CLUSTER-IPS"));
    for told in [true, false] {
        let mut view = many(30);
        let mut planner = Planner::new(options.clone());
        planner.update(&view);
        let mut s = syncer();
        step(&mut s, &mut planner);
        let table = s.nft().table.clone().unwrap();
        let rules = &table.chains[&cluster_ips];
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(rules[0], NftRule::ClusterIpSet);
        assert_eq!(table.cluster_ips.len(), 30);
        let sync = |s: &mut NftSyncer<MemoryNft>, planner: &mut Planner| {
            if told {
                step(s, planner);
            } else {
                planner.take_changes();
                s.sync(planner.ruleset()).unwrap();
            }
        };
        // One update and sync: the transaction changes exactly `ip`'s element, and the table is
        // what a full sync writes.
        let change = |s: &mut NftSyncer<MemoryNft>,
                      planner: &mut Planner,
                      view: &NodeView,
                      verb: &str,
                      ip: IpAddr| {
            planner.update(view);
            sync(s, planner);
            let tx = last_tx(s);
            assert_eq!(
                cluster_ip_lines(&tx),
                [format!("{verb} element ip berth cluster-ips {{ {ip} }}")],
                "{tx}"
            );
            assert_eq!(s.nft().table, fresh(planner.ruleset()).table);
            tx
        };
        let removed = view.services.remove(3);
        let tx = change(
            &mut s,
            &mut planner,
            &view,
            "delete",
            removed.cluster_ips[0],
        );
        assert!(!tx.contains("filter-BERTH-CLUSTER-IPS"), "{tx}");

        view.services.push(removed.clone());
        change(&mut s, &mut planner, &view, "add", removed.cluster_ips[0]);

        // Without Service CIDRs any more: the chain and its elements go.
        let mut planner = Planner::new(linear());
        planner.update(&view);
        s.sync(planner.ruleset()).unwrap();
        let table = s.nft().table.clone().unwrap();
        assert!(!table.chains.contains_key(&cluster_ips));
        assert!(table.cluster_ips.is_empty());
        assert_eq!(s.nft().table, fresh(planner.ruleset()).table);
    }
}
