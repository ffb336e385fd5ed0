//! nat sharding against the in-memory nftables: the golden transaction of the fixed set in four
//! shards, traced outcomes equal to the plan's, a change to one Service written into its shard
//! alone, partial syncs that leave what a fresh full sync leaves, an endpoint chain that stays a
//! chain in its Service's shard, a packet followed across the shards as `berth explain` shows it,
//! and a restart with another shard count that removes the stale shards. `UPDATE_GOLDEN=1`
//! rewrites the golden file.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use berth_core::IpFamily;
use berth_datapath::backend::SyncKind;
use berth_datapath::fake::MemoryNft;
use berth_datapath::nft::render::NftRuleset;
use berth_datapath::nft::shard::{parse_table_name, Shard, MAIN};
use berth_datapath::nft::{NftSyncer, Shards};
use berth_datapath::plan::names;
use berth_datapath::trace::Origin;
use berth_datapath::*;
use common::*;

fn shards(k: u16) -> Shards {
    Shards::new(k).unwrap()
}

fn syncer(k: u16) -> NftSyncer<MemoryNft> {
    NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4).with_shards(shards(k))
}

fn linear() -> PlanOptions {
    mk_options(Dispatch::Linear)
}

/// `n` Services with one endpoint and a node port each, every third with ClientIP affinity.
fn many(n: usize) -> NodeView {
    let services = (0..n)
        .map(|i| {
            let mut svc = mk_svc(
                &format!("svc-{i}"),
                &format!("10.96.{}.{}", i / 250, i % 250 + 1),
                80,
                vec![
                    mk_ep(&format!("10.244.2.{}", i % 250 + 1), 8080, "node-b"),
                    mk_ep(&format!("10.244.3.{}", i % 250 + 1), 8080, "node-b"),
                ],
            );
            svc.node_port = Some(30000 + i as u16);
            if i % 3 == 0 {
                svc.session_affinity = SessionAffinity::ClientIp {
                    timeout_seconds: 600,
                };
            }
            svc
        })
        .collect();
    NodeView {
        node: mk_node(),
        services,
    }
}

fn step(s: &mut NftSyncer<MemoryNft>, planner: &mut Planner) -> backend::SyncReport {
    let changes = planner.take_changes();
    s.sync_changes(planner.ruleset(), &changes).unwrap()
}

fn last_tx(s: &NftSyncer<MemoryNft>) -> String {
    s.nft().transactions.last().cloned().unwrap_or_default()
}

fn fresh(rs: &Ruleset, k: u16) -> MemoryNft {
    let mut s = syncer(k);
    s.sync(rs).unwrap();
    s.nft().clone()
}

/// The tables a transaction's lines name (`ip berth` is 0, `ip berth-<n>` n).
fn tables_named(tx: &str) -> BTreeSet<Shard> {
    tx.lines()
        .map(|line| {
            let table = line
                .split_whitespace()
                .find(|w| w.starts_with("berth"))
                .unwrap();
            parse_table_name("berth", table).unwrap()
        })
        .collect()
}

/// The shard tables (not the main one) a transaction names.
fn shard_tables(tx: &str) -> Vec<Shard> {
    tables_named(tx)
        .into_iter()
        .filter(|t| *t != MAIN)
        .collect()
}

#[test]
fn golden_full_transaction_of_the_fixed_set_in_four_shards() {
    let rs = plan(&mk_fixed_view(), &linear());
    let mut s = syncer(4);
    s.sync(&rs).unwrap();
    let text = last_tx(&s);
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/fixed_nft_shards.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert_eq!(text, std::fs::read_to_string(&path).unwrap());
    // berth's tables only; no Service chain in the main table, no filter chain in a shard.
    for line in text.lines() {
        assert!(line.contains(" ip berth"), "{line}");
        let main = line.contains(" ip berth ");
        assert!(!(main && line.contains("nat-BERTH-SVC-")), "{line}");
        assert!(main || !line.contains(" filter-"), "{line}");
    }
    assert_eq!(tables_named(&text), (0..=4).collect());
}

/// Every packet the fixed set can receive has the same outcomes in the plan and in the shards,
/// whatever their count.
#[test]
fn the_sharded_tables_trace_like_the_plan() {
    let view = mk_fixed_view();
    let rs = plan(&view, &linear());
    let packets = fixed_view_packets(&view);
    for k in [2, 4, 16] {
        let table = fresh(&rs, k).traceable();
        for p in &packets {
            assert_eq!(
                outcomes(&rs, &env(), p),
                outcomes(&table, &env(), p),
                "{k} shards: {p:?}"
            );
        }
    }
}

#[test]
fn a_change_to_one_service_writes_only_its_shard() {
    let mut view = many(60);
    let mut planner = Planner::new(linear());
    planner.update(&view);
    let mut s = syncer(8);
    assert_eq!(step(&mut s, &mut planner).kind, SyncKind::Full);
    for i in [7, 9, 30] {
        // One endpoint replaced: the Service's chain in its shard, the hairpin pair in main
        // (a plain set: no validation).
        view.services[i].endpoints.make_mut()[0].ip = ip(&format!("10.244.4.{i}"));
        planner.update(&view);
        let report = step(&mut s, &mut planner);
        assert_eq!(report.kind, SyncKind::Partial);
        let tx = last_tx(&s);
        assert_eq!(shard_tables(&tx).len(), 1, "{tx}");
        for line in tx.lines().filter(|l| l.contains(" ip berth ")) {
            assert!(line.contains(" hairpin "), "{line}");
        }
        assert_eq!(s.nft().table, fresh(planner.ruleset(), 8).table);
    }
    // A new Service: its chain and its map elements in its shard alone.
    view.services.push({
        let mut svc = mk_svc(
            "svc-new",
            "10.96.9.1",
            80,
            vec![mk_ep("10.244.5.1", 8080, "node-b")],
        );
        svc.node_port = Some(31000);
        svc
    });
    planner.update(&view);
    step(&mut s, &mut planner);
    let tx = last_tx(&s);
    assert_eq!(shard_tables(&tx).len(), 1, "{tx}");
    assert!(tx.contains("add element ip berth-"), "{tx}");
    assert_eq!(s.nft().table, fresh(planner.ruleset(), 8).table);
    // And gone again, affinity sets with it.
    view.services.truncate(30);
    planner.update(&view);
    step(&mut s, &mut planner);
    assert_eq!(s.nft().table, fresh(planner.ruleset(), 8).table);
}

/// With linear dispatch the planner hands the Syncer the changed dispatch entries, and a
/// partial sync writes them as map elements without touching the dispatch chains: a new
/// Service, an address another Service takes over (the first entry of a key wins), and both
/// gone again.
#[test]
fn dispatch_entries_become_map_elements_without_the_dispatch_chains() {
    let mut view = many(60);
    let mut planner = Planner::new(linear());
    planner.update(&view);
    let mut s = syncer(8);
    assert_eq!(step(&mut s, &mut planner).kind, SyncKind::Full);
    let dispatch_chains = |tx: &str| {
        tx.lines()
            .filter(|l| l.contains("BERTH-SERVICES") || l.contains("BERTH-NODEPORTS"))
            .count()
    };
    let new_ip = ip("10.96.9.1");
    let mut svc = mk_svc(
        "svc-new",
        "10.96.9.1",
        80,
        vec![mk_ep("10.244.5.1", 8080, "node-b")],
    );
    svc.node_port = Some(31000);
    view.services.push(svc);
    planner.update(&view);
    let changes = planner.take_changes();
    let Changes::Dispatch(_, dispatch) = &changes else {
        panic!("no dispatch entries: {changes:?}");
    };
    assert_eq!(dispatch.services.keys().collect::<Vec<_>>(), [&new_ip]);
    assert_eq!(dispatch.services[&new_ip].len(), 1);
    assert_eq!(
        dispatch.node_ports.keys().collect::<Vec<_>>(),
        [&(berth_core::Protocol::Tcp, 31000)]
    );
    s.sync_changes(planner.ruleset(), &changes).unwrap();
    let tx = last_tx(&s);
    assert_eq!(dispatch_chains(&tx), 0, "{tx}");
    for map in ["service-ips", "node-ports"] {
        let adds = tx
            .lines()
            .filter(|l| l.starts_with("add element") && l.contains(map));
        assert_eq!(adds.count(), 1, "{tx}");
    }
    assert_eq!(s.nft().table, fresh(planner.ruleset(), 8).table);

    // svc-5 takes the same address and port: its entry comes first, the element is retargeted.
    view.services[5].cluster_ips = vec![new_ip];
    planner.update(&view);
    step(&mut s, &mut planner);
    let tx = last_tx(&s);
    assert_eq!(dispatch_chains(&tx), 0, "{tx}");
    assert!(
        tx.contains("delete element") && tx.contains("10.96.9.1"),
        "{tx}"
    );
    assert_eq!(s.nft().table, fresh(planner.ruleset(), 8).table);

    // Both gone: the elements with them.
    view.services.retain(|svc| svc.cluster_ips != [new_ip]);
    planner.update(&view);
    step(&mut s, &mut planner);
    assert_eq!(dispatch_chains(&last_tx(&s)), 0);
    assert_eq!(s.nft().table, fresh(planner.ruleset(), 8).table);
    assert_eq!(s.nft().table, fresh(&plan(&view, &linear()), 8).table);
}

/// The partial sync takes the map elements from the planner's entries, not from the dispatch
/// chain: entries that say an address has none left delete its element though no chain is named
/// (which shows the path is taken), and entries that are not all map elements fall back to the
/// whole chain.
#[test]
fn the_partial_sync_writes_the_entries_it_is_given() {
    let view = many(20);
    let rs = plan(&view, &linear());
    let addr = ip("10.96.0.5");
    for k in [1, 8] {
        let mut s = syncer(k);
        s.sync(&rs).unwrap();
        assert!(s
            .nft()
            .table
            .as_ref()
            .unwrap()
            .services
            .keys()
            .any(|key| key.0 == addr));
        let emptied = DispatchChanges {
            services: [(addr, Vec::new())].into(),
            ..Default::default()
        };
        s.sync_changes(&rs, &Changes::Dispatch(Default::default(), emptied))
            .unwrap();
        let table = s.nft().table.clone().unwrap();
        assert!(!table.services.keys().any(|key| key.0 == addr), "{k}");
        assert_eq!(table.services.len(), 19, "{k}");

        // A range is no map element: the chain it names is diffed whole, which restores the
        // element the plan holds.
        let services = (Table::Nat, ChainName::new("BERTH-SERVICES"));
        let range = Rule::jump(
            vec![Match::dst_net("10.96.0.0/24".parse().unwrap())],
            &ChainName::new("BERTH-SVC-X"),
        );
        let odd = DispatchChanges {
            services: [(addr, vec![range])].into(),
            ..Default::default()
        };
        s.sync_changes(&rs, &Changes::Dispatch([services].into(), odd))
            .unwrap();
        assert_eq!(s.nft().table, fresh(&rs, k).table, "{k}");
    }
}

#[test]
fn another_shard_count_after_a_restart_converges() {
    let rs = plan(&many(40), &linear());
    for (before, after) in [(8, 2), (2, 8), (8, 1), (1, 4)] {
        let mut s = syncer(before);
        s.sync(&rs).unwrap();
        // A restart: a new syncer on the same tables.
        let mut restarted =
            NftSyncer::new(s.nft().clone(), IpFamily::V4).with_shards(shards(after));
        assert_eq!(restarted.sync(&rs).unwrap().kind, SyncKind::Full);
        let table = restarted.nft().table.clone().unwrap();
        assert_eq!(
            table.tables,
            (0..=after).filter(|t| *t == 0 || after > 1).collect(),
            "{before} -> {after}"
        );
        assert_eq!(
            restarted.nft().table,
            fresh(&rs, after).table,
            "{before} -> {after}"
        );
    }
}

#[test]
fn a_plan_whose_jumps_would_cross_tables_is_refused() {
    // Tree dispatch jumps from the main table's dispatch chains into the Services' chains.
    let rs = plan(&many(40), &mk_options(Dispatch::Tree));
    let err = NftRuleset::from_ruleset_in(&rs, shards(4)).unwrap_err();
    assert!(err.to_string().contains("not in the same table"), "{err}");
    let mut s = syncer(4);
    assert!(s.sync(&rs).is_err());
    assert_eq!(s.nft().table, None);
}

/// What `berth explain` shows: a node-port packet traced through every shard's address lookup
/// (each a miss), then the node-port lookups, into its Service's shard, each hop in the words of
/// the table that holds it.
#[test]
fn a_packet_is_followed_across_the_shards() {
    let rs = plan(&mk_fixed_view(), &linear());
    let table = fresh(&rs, 4).table.unwrap();
    let p = packet(CLIENT_IP, NODE_IP, 30040, Origin::Network);
    let paths = trace::trace_paths(&table.traceable(), &env(), &p).unwrap();
    assert_eq!(paths.len(), 3, "three endpoints");
    for path in &paths {
        assert!(
            matches!(path.outcome.verdict, trace::Verdict::Dnat(_)),
            "{path:?}"
        );
        assert!(path.outcome.masqueraded, "{path:?}");
        let hops: Vec<String> = path
            .hits
            .iter()
            .map(|hit| table.hop_text(IpFamily::V4, hit))
            .collect();
        // The address lookups of the four shards, in table order, then the node-port lookup
        // of the first shard and on to the Service's shard (berth-2 in the golden file).
        for shard in 1..=4 {
            let lookup = format!("berth-{shard} nat-PREROUTING: jump nat-BERTH-SERVICES");
            assert!(hops[shard - 1].starts_with(&lookup), "{hops:#?}");
        }
        let element = "berth-2 nat-BERTH-NODEPORTS: meta l4proto . th dport vmap @node-ports \
                       (element tcp . 30040 : jump nat-BERTH-EXT-BBOKZYRKT4CZJZWS)";
        assert!(hops.iter().any(|h| h == element), "{hops:#?}");
        assert!(
            hops.iter().any(|h| h
                .starts_with("berth-2 nat-BERTH-EXT-BBOKZYRKT4CZJZWS: jump nat-BERTH-MARK-MASQ")),
            "{hops:#?}"
        );
        assert!(
            hops.iter()
                .any(|h| h.starts_with("berth-2 nat-BERTH-MARK-MASQ: meta mark set")),
            "{hops:#?}"
        );
        assert!(
            hops.iter()
                .any(|h| h.starts_with("nat-POSTROUTING: jump nat-BERTH-POSTROUTING")),
            "{hops:#?}"
        );
    }
}

/// An endpoint chain that cannot be folded stays a chain, in the shard of the Service chains
/// that jump to it: partially, as a fresh full sync has it, and folded away again after.
#[test]
fn an_endpoint_chain_that_stays_a_chain_lives_with_its_service() {
    let rs = plan(&many(12), &linear());
    let nat = &rs.tables[&Table::Nat];
    let (svc, sep) = nat
        .chains
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("BERTH-SVC-"))
        .find_map(|(name, rules)| {
            let sep = rules
                .iter()
                .filter_map(Rule::jump_target)
                .find(|t| t.as_str().starts_with("BERTH-SEP-"))?;
            Some((name.clone(), sep.clone()))
        })
        .unwrap();
    let mut rs2 = rs.clone();
    rs2.table_mut(Table::Nat)
        .chains
        .get_mut(&sep)
        .unwrap()
        .insert(0, Rule::counting(vec![]));
    let mut s = syncer(4);
    s.sync(&rs).unwrap();
    s.sync_changes(&rs2, &Changes::Chains([(Table::Nat, sep.clone())].into()))
        .unwrap();
    let table = s.nft().table.clone().unwrap();
    let home = table
        .chains
        .keys()
        .find(|c| c.name == svc)
        .map(|c| c.shard)
        .unwrap();
    assert_ne!(home, MAIN);
    let kept = table.chains.keys().find(|c| c.name == sep).unwrap();
    assert_eq!(
        kept.shard, home,
        "the endpoint chain is in its Service's shard"
    );
    assert_eq!(s.nft().table, fresh(&rs2, 4).table);
    let p = packet(CLIENT_IP, "10.96.0.1", 80, Origin::Network);
    assert_eq!(
        outcomes(&rs2, &env(), &p),
        outcomes(&s.nft().traceable(), &env(), &p)
    );
    s.sync_changes(&rs, &Changes::Chains([(Table::Nat, sep.clone())].into()))
        .unwrap();
    assert!(s
        .nft()
        .table
        .as_ref()
        .unwrap()
        .chains
        .keys()
        .all(|c| c.name != sep));
    assert_eq!(s.nft().table, fresh(&rs, 4).table);
}

/// The in-memory nftables, refusing its `fail_at`-th transaction (0: the first).
struct FailingAt {
    nft: MemoryNft,
    fail_at: usize,
    seen: usize,
}

impl nft::Nft for FailingAt {
    fn apply(&mut self, tx: &nft::Transaction) -> Result<(), Error> {
        self.nft.fail_next = self.seen == self.fail_at;
        self.seen += 1;
        self.nft.apply(tx)
    }

    fn tables(
        &mut self,
        family: IpFamily,
    ) -> Result<Option<BTreeSet<Shard>>, berth_datapath::Error> {
        self.nft.tables(family)
    }
}

/// A cold load in stages: one transaction per table naming that table alone and no hook, then
/// one adding the base chains; it leaves exactly what the one-transaction load leaves, and a
/// later full sync (berth's tables exist now) is one transaction again.
#[test]
fn a_cold_load_in_stages_leaves_what_one_transaction_leaves() {
    let rs = plan(&many(40), &linear());
    for k in [1, 4] {
        let mut s = syncer(k).with_staged_cold_load(true);
        let report = s.sync(&rs).unwrap();
        assert_eq!(report.kind, SyncKind::Full);
        assert_eq!(s.nft().table, fresh(&rs, k).table, "k={k}");
        let txs = s.nft().transactions.clone();
        let tables: Vec<Shard> = std::iter::once(MAIN).chain(shards(k).shards()).collect();
        // The tables, the hairpin pairs (fewer than one stage holds), the base chains.
        assert_eq!(txs.len(), tables.len() + 2, "k={k}");
        let (last, stages) = txs.split_last().unwrap();
        let (hairpin, stages) = stages.split_last().unwrap();
        for (stage, table) in stages.iter().zip(&tables) {
            assert_eq!(tables_named(stage), BTreeSet::from([*table]), "k={k}");
            assert!(
                !stage.contains("hook"),
                "k={k}: a hook before the last stage:\n{stage}"
            );
            assert!(
                !stage.contains("add element ip berth hairpin"),
                "k={k}: {stage}"
            );
        }
        assert!(
            hairpin
                .lines()
                .all(|line| line.starts_with("add element ip berth hairpin")),
            "k={k}: {hairpin}"
        );
        assert!(
            last.lines()
                .all(|line| line.contains("hook") || line.starts_with("add rule")),
            "k={k}: the last stage adds base chains and their rules only:\n{last}"
        );
        assert_eq!(
            tables_named(last),
            tables.iter().copied().collect(),
            "k={k}"
        );
        // The hourly full sync over existing tables: one transaction.
        s.force_full_sync();
        s.sync(&rs).unwrap();
        assert_eq!(s.nft().transactions.len(), txs.len() + 1, "k={k}");
        assert_eq!(s.nft().table, fresh(&rs, k).table, "k={k}");
    }
}

/// A staged load cut short at any stage leaves no base chain (nothing a packet meets), and the
/// next full sync, over the tables left behind, ends where a cold load does.
#[test]
fn a_staged_load_cut_short_hooks_nothing_and_the_next_sync_completes_it() {
    let rs = plan(&many(40), &linear());
    let k = 4;
    for fail_at in 0..=usize::from(k) + 2 {
        let mut nft = MemoryNft::new(IpFamily::V4);
        nft.record = true;
        let writer = FailingAt {
            nft,
            fail_at,
            seen: 0,
        };
        let mut s = NftSyncer::new(writer, IpFamily::V4)
            .with_shards(shards(k))
            .with_staged_cold_load(true);
        assert!(s.sync(&rs).is_err(), "fail_at={fail_at}");
        let left = s.nft().nft.table.clone();
        let hooks = left.as_ref().map_or(0, |t| t.hooks.len());
        assert_eq!(
            hooks, 0,
            "fail_at={fail_at}: a base chain after a cut-short load"
        );
        assert_eq!(
            left.as_ref().map_or(0, |t| t.tables.len()),
            fail_at.min(usize::from(k) + 1),
            "fail_at={fail_at}: the stages before the refused one stay"
        );
        s.sync(&rs).unwrap();
        assert_eq!(s.nft().nft.table, fresh(&rs, k).table, "fail_at={fail_at}");
    }
}

/// The pieces' union, and the order of their tables.
fn union_of(
    pieces: impl Iterator<Item = Result<berth_datapath::nft::stage::Piece, Error>>,
) -> (NftRuleset, Vec<String>) {
    use berth_datapath::nft::stage::Piece;
    let mut union = NftRuleset::default();
    let mut order = Vec::new();
    for piece in pieces {
        let (kind, piece) = match piece.unwrap() {
            Piece::Table(shard, piece) => (format!("{shard}"), piece),
            Piece::Rest(piece) => ("rest".to_string(), piece),
            Piece::Hooks(piece) => ("hooks".to_string(), piece),
        };
        order.push(kind);
        let NftRuleset {
            chains,
            hooks,
            services,
            node_ports,
            cluster_ips,
            affinity,
            hairpin,
            endpoint_users,
            planned,
            ..
        } = piece;
        union.chains.extend(chains);
        union.hooks.extend(hooks);
        union.services.extend(services);
        union.node_ports.extend(node_ports);
        union.cluster_ips.extend(cluster_ips);
        union.affinity.extend(affinity);
        union.hairpin.extend(hairpin);
        union.endpoint_users.extend(endpoint_users);
        union.planned.extend(planned);
    }
    (union, order)
}

/// A plan converted table by table (a staged cold load's pieces) is, piece by piece, the plan
/// converted whole: the main table first, the shards in order, the base chains last. So are
/// the pieces of a streamed load, whose Service chains a lean planner plans for each shard's
/// piece from a ruleset without them.
#[test]
fn a_plan_converted_table_by_table_is_the_plan_converted_whole() {
    use berth_datapath::nft::stage::TablePieces;
    for (name, view) in [
        ("many", many(40)),
        ("fixed", mk_fixed_view()),
        ("kube-proxy", kube_proxy::kube_proxy_overall_view()),
    ] {
        // With the cluster's Service CIDRs too (the ClusterIPs then fill `cluster-ips`).
        let with_cidrs = PlanOptions {
            service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
            ..linear()
        };
        for (options, k) in [1, 4, 32]
            .into_iter()
            .flat_map(|k| [(linear(), k), (with_cidrs.clone(), k)])
        {
            let rs = plan(&view, &options);
            let whole = NftRuleset::from_ruleset_in(&rs, shards(k)).unwrap();
            let (union, order) = union_of(TablePieces::new(&rs, shards(k)).unwrap());
            assert!(union == whole, "{name}, {k} shards: the pieces differ");
            let tables: Vec<String> = (0..k).map(|s| s.to_string()).collect();
            assert_eq!(order[..tables.len()], tables[..], "{name}, {k} shards");
            assert_eq!(order.last().map(String::as_str), Some("hooks"), "{name}");
            if k == 1 {
                assert!(
                    TablePieces::streamed(&rs, shards(k), &mut |_| Ruleset::default()).is_err()
                );
                continue;
            }
            let mut lean = Planner::new(options.clone()).lean();
            lean.update_without_service_chains(&view);
            assert!(!lean.is_complete(), "{name}");
            let mut ports = PortGroups::new(&view, |port, protocol| {
                shards(k).of_service_port(&names::service_port_hash(port, protocol))
            });
            let mut asked = Vec::new();
            let mut service_chains = |shard: Shard| {
                asked.push(shard);
                ports.take_service_chains(&lean, shard)
            };
            let streamed = TablePieces::streamed(lean.ruleset(), shards(k), &mut service_chains);
            let (union, streamed_order) = union_of(streamed.unwrap());
            assert!(
                union == whole,
                "{name}, {k} shards: the streamed pieces differ"
            );
            assert_eq!(streamed_order, order, "{name}, {k} shards");
            assert_eq!(asked, shards(k).shards().collect::<Vec<_>>(), "{name}");
        }
    }
}

/// A streamed cold load (a lean planner's ruleset without Service chains, those planned as
/// each shard's stage is built) leaves what a cold load of the whole plan leaves; over berth's
/// tables it declines (an adoption compares the whole plan), and the lean planner filled then
/// syncs in full to the same tables.
#[test]
fn a_streamed_cold_load_leaves_what_a_whole_one_leaves() {
    let view = many(60);
    let rs = plan(&view, &linear());
    let k = 4;
    let mut lean = Planner::new(linear()).lean();
    lean.update_without_service_chains(&view);
    let changes = lean.take_changes();
    assert_eq!(changes, Changes::All);
    let ports = PortGroups::new(&view, |port, protocol| {
        shards(k).of_service_port(&names::service_port_hash(port, protocol))
    });
    let mut s = syncer(k).with_staged_cold_load(true);
    let mut taken = ports.clone();
    let report = s
        .sync_streamed(lean.ruleset(), &mut |shard| {
            taken.take_service_chains(&lean, shard)
        })
        .unwrap()
        .expect("a cold load");
    assert_eq!(report.kind, SyncKind::Full);
    let whole = syncer(k).with_staged_cold_load(true).sync(&rs).unwrap();
    assert_eq!(report.rule_count, whole.rule_count);
    assert_eq!(s.nft().table, fresh(&rs, k).table);
    // Not staged, or not sharded: declined before anything is written.
    let mut one = syncer(1).with_staged_cold_load(true);
    let mut taken = ports.clone();
    assert!(one
        .sync_streamed(lean.ruleset(), &mut |shard| {
            taken.take_service_chains(&lean, shard)
        })
        .unwrap()
        .is_none());
    assert!(one.nft().transactions.is_empty());
    // berth's tables exist now: declined, and nothing written.
    let written = s.nft().transactions.len();
    s.force_full_sync();
    let mut taken = ports.clone();
    assert!(s
        .sync_streamed(lean.ruleset(), &mut |shard| {
            taken.take_service_chains(&lean, shard)
        })
        .unwrap()
        .is_none());
    assert_eq!(s.nft().transactions.len(), written);
    lean.fill(&view);
    assert_eq!(lean.ruleset(), &rs);
    s.sync_changes(lean.ruleset(), &Changes::All).unwrap();
    assert_eq!(s.nft().table, fresh(&rs, k).table);
}
