//! The nftables table holds no chain per endpoint: endpoint chains are folded into the rules
//! that choose them, hairpin pairs live in one set kept by the diff, and the traced outcomes stay
//! those of the plan (address plan in `common`).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use berth_core::IpFamily;
use berth_datapath::fake::MemoryNft;
use berth_datapath::nft::{Command, Element, NftChain, NftRule, Transaction};
use berth_datapath::nft::{Nft, NftSyncer};
use berth_datapath::trace::Origin;
use berth_datapath::*;
use common::*;

fn syncer() -> NftSyncer<MemoryNft> {
    NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4)
}

fn linear() -> PlanOptions {
    mk_options(Dispatch::Linear)
}

fn fresh(rs: &Ruleset) -> MemoryNft {
    let mut s = syncer();
    s.sync(rs).unwrap();
    s.nft().clone()
}

fn step(s: &mut NftSyncer<MemoryNft>, planner: &mut Planner) {
    let changes = planner.take_changes();
    s.sync_changes(planner.ruleset(), &changes).unwrap();
}

fn hairpin(s: &NftSyncer<MemoryNft>) -> BTreeSet<String> {
    let table = s.nft().table.as_ref().unwrap();
    table.hairpin.iter().map(ToString::to_string).collect()
}

/// Two Services; `shared` is an endpoint of both, each has one of its own.
fn two_sharing(shared: &str) -> NodeView {
    NodeView {
        node: mk_node(),
        services: vec![
            mk_svc(
                "a",
                "10.96.0.10",
                80,
                vec![
                    mk_ep(shared, 8080, "node-a"),
                    mk_ep("10.244.2.2", 8080, "node-b"),
                ],
            ),
            mk_svc(
                "b",
                "10.96.0.20",
                80,
                vec![
                    mk_ep(shared, 8080, "node-a"),
                    mk_ep("10.244.2.3", 8080, "node-b"),
                ],
            ),
        ],
    }
}

#[test]
fn the_table_has_no_endpoint_chain_and_hairpin_is_masqueraded() {
    let view = two_sharing("10.244.1.2");
    let rs = plan(&view, &linear());
    let s = {
        let mut s = syncer();
        s.sync(&rs).unwrap();
        s
    };
    let chains = s.nft().chain_names();
    assert!(
        chains.iter().all(|c| !c.contains("BERTH-SEP-")),
        "{chains:?}"
    );
    assert_eq!(
        hairpin(&s),
        ["10.244.1.2", "10.244.2.2", "10.244.2.3"]
            .map(String::from)
            .into()
    );
    let table = s.nft().traceable();
    // The pod reaching itself through its Service is masqueraded, others are not.
    let to_a = packet("10.244.1.2", "10.96.0.10", 80, Origin::Network);
    assert_eq!(
        outcomes(&rs, &env(), &to_a),
        outcomes(&table, &env(), &to_a)
    );
    assert!(outcomes(&table, &env(), &to_a)
        .iter()
        .any(|(v, masq, _)| *v == dnat("10.244.1.2:8080") && *masq));
    let other = packet(LOCAL_POD, "10.96.0.10", 80, Origin::Network);
    assert_eq!(
        outcomes(&rs, &env(), &other),
        outcomes(&table, &env(), &other)
    );
    assert!(outcomes(&table, &env(), &other)
        .iter()
        .all(|(_, masq, _)| !masq));
}

#[test]
fn a_shared_hairpin_pair_stays_until_no_service_needs_it() {
    let mut view = two_sharing("10.244.1.2");
    let mut planner = Planner::new(linear());
    planner.update(&view);
    let mut s = syncer();
    step(&mut s, &mut planner);
    view.services[0].endpoints.edit(|eps| eps.remove(0));
    planner.update(&view);
    step(&mut s, &mut planner);
    let tx = s.nft().transactions.last().unwrap().clone();
    assert!(!tx.contains("element ip berth hairpin"), "{tx}");
    assert!(hairpin(&s).contains("10.244.1.2"));
    view.services[1].endpoints.edit(|eps| eps.remove(0));
    planner.update(&view);
    step(&mut s, &mut planner);
    let tx = s.nft().transactions.last().unwrap().clone();
    assert!(
        tx.contains("delete element ip berth hairpin { 10.244.1.2 . 10.244.1.2 }"),
        "{tx}"
    );
    assert_eq!(s.nft().table, fresh(planner.ruleset()).table);
}

/// The SVC chain of Service `a` and its first endpoint chain.
fn svc_and_sep(rs: &Ruleset) -> (ChainName, ChainName) {
    let nat = &rs.tables[&Table::Nat];
    let (svc, rules) = nat
        .chains
        .iter()
        .find(|(name, rules)| {
            name.as_str().starts_with("BERTH-SVC-")
                && rules.iter().any(|r| {
                    r.matches
                        .iter()
                        .any(|m| matches!(m, Match::Comment(c) if c.contains("ns1/a:p80 ->")))
                })
        })
        .unwrap();
    let sep = rules
        .iter()
        .filter_map(Rule::jump_target)
        .find(|t| t.as_str().starts_with("BERTH-SEP-"))
        .unwrap();
    (svc.clone(), sep.clone())
}

#[test]
fn a_changed_endpoint_chain_rewrites_the_chains_that_fold_it() {
    let rs = plan(&two_sharing("10.244.1.2"), &linear());
    let mut s = syncer();
    s.sync(&rs).unwrap();
    let (svc, sep) = svc_and_sep(&rs);
    // The endpoint chain alone changes (its DNAT port); only it is reported.
    let mut rs2 = rs.clone();
    let rules = rs2.table_mut(Table::Nat).chains.get_mut(&sep).unwrap();
    let moved: std::net::SocketAddr = "10.244.1.2:9090".parse().unwrap();
    rules[1] = Rule::new(rules[1].matches.to_vec(), Target::Dnat(moved));
    let changes = Changes::Chains([(Table::Nat, sep.clone())].into());
    let report = s.sync_changes(&rs2, &changes).unwrap();
    assert_eq!(report.rewritten_chains, 1);
    let tx = s.nft().transactions.last().unwrap().clone();
    assert!(
        tx.contains(&format!("flush chain ip berth nat-{svc}")),
        "{tx}"
    );
    assert!(tx.contains("dnat to 10.244.1.2:9090"), "{tx}");
    assert_eq!(s.nft().table, fresh(&rs2).table);
}

#[test]
fn a_chain_of_another_shape_stays_a_chain() {
    let rs = plan(&two_sharing("10.244.1.2"), &linear());
    let (svc, sep) = svc_and_sep(&rs);
    let mut rs2 = rs.clone();
    rs2.table_mut(Table::Nat)
        .chains
        .get_mut(&sep)
        .unwrap()
        .insert(0, Rule::counting(vec![]));
    let mut s = syncer();
    s.sync(&rs).unwrap();
    // Partially (the changed chain is reported), then against a fresh full sync.
    s.sync_changes(&rs2, &Changes::Chains([(Table::Nat, sep.clone())].into()))
        .unwrap();
    let table = s.nft().table.clone().unwrap();
    let kept = NftChain::new(Table::Nat, &sep);
    assert_eq!(table.chains[&kept].len(), 3);
    let jumps = table.chains[&NftChain::new(Table::Nat, &svc)]
        .iter()
        .filter(|rule| berth_datapath::nft::rule_jump(rule) == Some(&sep))
        .count();
    assert_eq!(jumps, 1);
    assert_eq!(s.nft().table, fresh(&rs2).table);
    // And back: the chain is folded again and deleted.
    s.sync_changes(&rs, &Changes::Chains([(Table::Nat, sep.clone())].into()))
        .unwrap();
    assert!(!s.nft().table.as_ref().unwrap().chains.contains_key(&kept));
    assert_eq!(s.nft().table, fresh(&rs).table);
}

#[test]
fn the_fake_refuses_bad_hairpin_commands() {
    let mut nft = MemoryNft::new(IpFamily::V4);
    let masq = ChainName::new("BERTH-MARK-MASQ");
    let post = NftChain::new(Table::Nat, &ChainName::new("BERTH-POSTROUTING"));
    let mut tx = Transaction::new(IpFamily::V4);
    tx.push(Command::AddTable(0));
    tx.push(Command::AddChain(NftChain::new(Table::Nat, &masq), None));
    tx.push(Command::AddChain(post.clone(), None));
    nft.apply(&tx).unwrap();
    let before = nft.clone();
    for bad in [
        // The set is declared with the maps.
        vec![Command::AddRule(
            post.clone(),
            NftRule::Hairpin(masq.clone()),
        )],
        vec![Command::AddElement(Element::Hairpin(ip("10.244.1.2")))],
        vec![
            Command::AddMaps(0),
            Command::DeleteElement(Element::Hairpin(ip("10.244.1.2"))),
        ],
        vec![
            Command::AddMaps(0),
            Command::AddElement(Element::Hairpin(ip("fd00::1"))),
        ],
        vec![
            Command::AddMaps(0),
            Command::AddRule(
                post.clone(),
                NftRule::Hairpin(ChainName::new("BERTH-MISSING")),
            ),
        ],
    ] {
        let mut tx = Transaction::new(IpFamily::V4);
        tx.commands = bad.clone();
        assert!(nft.apply(&tx).is_err(), "{bad:?}");
        assert_eq!(nft.table, before.table, "{bad:?}");
    }
    let mut tx = Transaction::new(IpFamily::V4);
    tx.push(Command::AddMaps(0));
    tx.push(Command::AddRule(post, NftRule::Hairpin(masq)));
    // Adding a pair twice is no error, as in the kernel.
    tx.push(Command::AddElement(Element::Hairpin(ip("10.244.1.2"))));
    tx.push(Command::AddElement(Element::Hairpin(ip("10.244.1.2"))));
    nft.apply(&tx).unwrap();
}

#[test]
fn ipv6_hairpin_pairs_are_ip6_pairs() {
    let view = NodeView {
        node: mk_node(),
        services: vec![mk_svc(
            "a",
            "fd00:96::10",
            80,
            vec![mk_ep("fd00:244:1::5", 8080, "node-a")],
        )],
    };
    let mut options = linear();
    options.family = IpFamily::V6;
    options.cluster_cidr = Some("fd00:244::/48".parse().unwrap());
    let rs = plan(&view, &options);
    let mut s = NftSyncer::new(MemoryNft::new(IpFamily::V6), IpFamily::V6);
    s.sync(&rs).unwrap();
    let tx = s.nft().transactions.last().unwrap().clone();
    assert!(
        tx.contains("add set ip6 berth hairpin { type ipv6_addr . ipv6_addr ; }"),
        "{tx}"
    );
    assert!(
        tx.contains("ct status dnat ip6 saddr . ip6 daddr @hairpin jump nat-BERTH-MARK-MASQ"),
        "{tx}"
    );
    assert!(
        tx.contains("add element ip6 berth hairpin { fd00:244:1::5 . fd00:244:1::5 }"),
        "{tx}"
    );
    let table = s.nft().traceable();
    let mut hairpin = packet("fd00:244:1::5", "fd00:96::10", 80, Origin::Network);
    hairpin.dst = ip("fd00:96::10");
    assert_eq!(
        outcomes(&rs, &env(), &hairpin),
        outcomes(&table, &env(), &hairpin)
    );
    assert!(outcomes(&table, &env(), &hairpin)
        .iter()
        .all(|(_, masq, _)| *masq));
}
