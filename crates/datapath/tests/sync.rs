//! The Syncer against the in-memory iptables: full and partial syncs, failures, canary, stale chains.
#![allow(clippy::unwrap_used)]

mod common;

use berth_datapath::backend::SyncKind;
use berth_datapath::fake::MemoryIptables;
use berth_datapath::iptables::Syncer;
use berth_datapath::*;
use common::*;

fn mk_many(n: usize) -> NodeView {
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

fn full_state(rs: &Ruleset) -> Ruleset {
    let mut syncer = Syncer::new(MemoryIptables::default());
    syncer.sync(rs).unwrap();
    syncer.iptables().berth_ruleset()
}

#[test]
fn first_sync_is_full_and_installs_the_plan() {
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Tree));
    let mut syncer = Syncer::new(MemoryIptables::default());
    let report = syncer.sync(&rs).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(syncer.iptables().berth_ruleset(), rs);
    let again = syncer.sync(&rs).unwrap();
    assert_eq!(
        (again.kind, again.payload_bytes, again.rewritten_chains),
        (SyncKind::Partial, 0, 0)
    );
    // Re-ensuring jumps never duplicates them.
    syncer.force_full_sync();
    syncer.sync(&rs).unwrap();
    assert_eq!(syncer.iptables().berth_ruleset(), rs);
}

#[test]
fn endpoint_change_rewrites_only_that_service() {
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let mut view = mk_many(200);
        let options = mk_options(dispatch);
        let mut syncer = Syncer::new(MemoryIptables::default());
        syncer.sync(&plan(&view, &options)).unwrap();
        view.services[7].endpoints.make_mut()[0].ip = ip("10.244.3.9");
        let rs = plan(&view, &options);
        let report = syncer.sync(&rs).unwrap();
        assert_eq!(report.kind, SyncKind::Partial);
        // The Service's SVC chain and its new SEP chain; the old SEP chain is deleted.
        assert_eq!(
            (report.rewritten_chains, report.deleted_chains),
            (2, 1),
            "{dispatch:?}"
        );
        let payload = syncer.iptables().restores.last().unwrap().clone();
        assert!(!payload.contains(":BERTH-SERVICES"), "{dispatch:?}");
        assert_eq!(syncer.iptables().berth_ruleset(), rs);
        assert_eq!(syncer.iptables().berth_ruleset(), full_state(&rs));
    }
}

#[test]
fn new_service_rewrites_one_leaf_in_tree_mode_but_the_entry_chain_in_linear_mode() {
    for (dispatch, entry_rewritten) in [(Dispatch::Linear, true), (Dispatch::Tree, false)] {
        let mut view = mk_many(300);
        let options = mk_options(dispatch);
        let mut syncer = Syncer::new(MemoryIptables::default());
        syncer.sync(&plan(&view, &options)).unwrap();
        let mut extra = mk_svc(
            "svc-extra",
            "10.96.0.251",
            80,
            vec![mk_ep("10.244.1.9", 8080, "node-a")],
        );
        extra.node_port = Some(30300);
        view.services.push(extra);
        let rs = plan(&view, &options);
        let report = syncer.sync(&rs).unwrap();
        // SVC, SEP and EXT chains, plus the dispatch chains on the new Service's paths.
        assert!(
            report.rewritten_chains <= 3 + 2 * 2,
            "{dispatch:?} {report:?}"
        );
        let payload = syncer.iptables().restores.last().unwrap().clone();
        assert_eq!(
            payload.contains(":BERTH-SERVICES "),
            entry_rewritten,
            "{dispatch:?}"
        );
        assert_eq!(
            payload.contains(":BERTH-NODEPORTS "),
            entry_rewritten,
            "{dispatch:?}"
        );
        assert_eq!(syncer.iptables().berth_ruleset(), full_state(&rs));
    }
}

#[test]
fn failure_forces_a_full_sync() {
    let mut view = mk_fixed_view();
    let options = mk_options(Dispatch::Tree);
    let mut syncer = Syncer::new(MemoryIptables::default());
    syncer.sync(&plan(&view, &options)).unwrap();
    view.services[0].endpoints.edit(Vec::pop);
    let rs = plan(&view, &options);
    syncer.iptables_mut().fail_next_restore = true;
    assert!(syncer.sync(&rs).is_err());
    let report = syncer.sync(&rs).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(syncer.iptables().berth_ruleset(), rs);
}

#[test]
fn a_rejected_partial_payload_is_recovered_by_the_next_full_sync() {
    let mut view = mk_fixed_view();
    let options = mk_options(Dispatch::Linear);
    let mut syncer = Syncer::new(MemoryIptables::default());
    let rs = plan(&view, &options);
    syncer.sync(&rs).unwrap();
    // Someone deletes one of berth's chains behind its back (but not the canary): the SEP chain of
    // an endpoint that the next partial sync still jumps to.
    let victim = rs
        .table(Table::Nat)
        .unwrap()
        .chains
        .iter()
        .find(|(_, rules)| {
            rules
                .iter()
                .any(|r| r.target == Some(Target::Dnat("10.244.1.5:8080".parse().unwrap())))
        })
        .map(|(chain, _)| chain.clone())
        .unwrap();
    let nat = syncer.iptables_mut().tables.get_mut(&Table::Nat).unwrap();
    nat.remove(&victim);
    for rules in nat.values_mut() {
        rules.retain(|r| r.jump_target() != Some(&victim));
    }
    view.services[3].endpoints.edit(Vec::pop);
    let rs = plan(&view, &options);
    assert!(
        syncer.sync(&rs).is_err(),
        "the partial payload jumps to the deleted chain"
    );
    let report = syncer.sync(&rs).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert!(syncer.iptables().berth_ruleset() == rs);
}

#[test]
fn missing_canary_forces_a_full_sync() {
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Tree));
    let mut syncer = Syncer::new(MemoryIptables::default());
    syncer.sync(&rs).unwrap();
    syncer.iptables_mut().flush_everything();
    let report = syncer.sync(&rs).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(syncer.iptables().berth_ruleset(), rs);
}

#[test]
fn stale_chains_are_removed_and_foreign_chains_kept() {
    let mut memory = MemoryIptables::default();
    memory
        .restore_text("*nat\n:BERTH-SVC-OLDOLDOLDOLDOLDO - [0:0]\n:KUBE-SVC-XYZ - [0:0]\n-A KUBE-SVC-XYZ -j RETURN\nCOMMIT\n")
        .unwrap();
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Tree));
    let mut syncer = Syncer::new(memory);
    let report = syncer.sync(&rs).unwrap();
    assert_eq!(report.deleted_chains, 1);
    let nat = &syncer.iptables().tables[&Table::Nat];
    assert!(!nat.contains_key(&ChainName::new("BERTH-SVC-OLDOLDOLDOLDOLDO")));
    assert_eq!(nat[&ChainName::new("KUBE-SVC-XYZ")].len(), 1);
    // A Service going away removes its chains in the next partial sync.
    let mut view = mk_fixed_view();
    view.services.remove(0);
    let rs = plan(&view, &mk_options(Dispatch::Tree));
    let report = syncer.sync(&rs).unwrap();
    assert_eq!((report.kind, report.deleted_chains), (SyncKind::Partial, 3));
    assert_eq!(syncer.iptables().berth_ruleset(), rs);
}

#[test]
fn payloads_never_touch_foreign_chains() {
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Tree));
    let mut syncer = Syncer::new(MemoryIptables::default());
    syncer.sync(&rs).unwrap();
    for payload in &syncer.iptables().restores {
        for line in payload.lines() {
            if let Some(rest) = line
                .strip_prefix(':')
                .or_else(|| line.strip_prefix("-A "))
                .or_else(|| line.strip_prefix("-X "))
            {
                assert!(rest.starts_with("BERTH-"), "{line}");
            }
        }
    }
}

#[test]
fn linear_dispatch_rewrites_the_entry_chains_on_every_partial_sync_as_kube_proxy_does() {
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let mut view = mk_many(50);
        let options = mk_options(dispatch);
        let mut planner = Planner::new(options.clone());
        let mut syncer = Syncer::new(MemoryIptables::default())
            .rewriting_every_sync(rewritten_every_sync(dispatch));
        planner.update(&view);
        let changes = planner.take_changes();
        assert_eq!(changes, Changes::All);
        let report = syncer.sync_changes(planner.ruleset(), &changes).unwrap();
        assert_eq!(report.kind, SyncKind::Full);

        view.services[7].endpoints.make_mut()[0].ip = ip("10.244.3.9");
        planner.update(&view);
        let changes = planner.take_changes();
        let report = syncer.sync_changes(planner.ruleset(), &changes).unwrap();
        assert_eq!(report.kind, SyncKind::Partial);
        let payload = syncer.iptables().restores.last().unwrap().clone();
        let linear = dispatch == Dispatch::Linear;
        for chain in [
            ":BERTH-SERVICES ",
            ":BERTH-NODEPORTS ",
            ":BERTH-EXTERNAL-SERVICES ",
        ] {
            assert_eq!(payload.contains(chain), linear, "{dispatch:?} {chain}");
        }
        // SVC, new SEP, old SEP deleted: the same in both layouts.
        assert_eq!(report.deleted_chains, 1, "{dispatch:?}");
        assert_eq!(
            report.rewritten_chains,
            2 + if linear { 9 } else { 0 },
            "{dispatch:?}"
        );
        assert_eq!(syncer.iptables().berth_ruleset(), plan(&view, &options));

        // Nothing changed: tree dispatch sends nothing, linear still refills its entry chains.
        planner.update(&view);
        let changes = planner.take_changes();
        let report = syncer.sync_changes(planner.ruleset(), &changes).unwrap();
        assert_eq!(report.payload_bytes == 0, !linear, "{dispatch:?}");
    }
}

#[test]
fn planner_follows_node_changes_and_ports_sharing_a_name() {
    let mut view = mk_fixed_view();
    // Two ports with the same name and protocol are planned together, as `plan` does.
    let mut twin = view.services[0].clone();
    twin.cluster_ips = vec![ip("10.96.0.99")];
    view.services.push(twin);
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        let options = mk_options(dispatch);
        let mut planner = Planner::new(options.clone());
        planner.update(&view);
        assert_eq!(planner.ruleset(), &plan(&view, &options), "{dispatch:?}");
        planner.take_changes();

        let mut moved = view.clone();
        moved.node.addresses = vec![ip("198.18.0.13")];
        planner.update(&moved);
        assert_eq!(planner.ruleset(), &plan(&moved, &options), "{dispatch:?}");
        assert_eq!(planner.take_changes(), Changes::All, "{dispatch:?}");

        moved.services.pop();
        planner.update_changed(&moved, &|name| *name == view.services[0].name);
        assert_eq!(planner.ruleset(), &plan(&moved, &options), "{dispatch:?}");
    }
}

#[test]
fn removing_berth_leaves_only_foreign_rules() {
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Tree));
    let mut ipt = MemoryIptables::default();
    ipt.restore_text(
        "*nat\n:KEEP-NAT - [0:0]\n-A KEEP-NAT -s 10.244.9.9/32 -j RETURN\n-A PREROUTING -j KEEP-NAT\nCOMMIT\n",
    )
    .unwrap();
    let foreign = ipt.tables.clone();
    let mut syncer = Syncer::new(ipt);
    syncer.sync(&rs).unwrap();
    assert_ne!(syncer.iptables().tables, foreign);
    let changed = iptables::remove_berth_rules(syncer.iptables_mut()).unwrap();
    assert_eq!(changed, 2, "filter and nat");
    assert_eq!(syncer.iptables().tables, foreign);
    // Nothing left to remove: no payload at all.
    assert_eq!(
        iptables::remove_berth_rules(syncer.iptables_mut()).unwrap(),
        0
    );
}

#[test]
fn a_full_restore_can_start_each_table_with_a_listing() {
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Tree));
    let selection = ChainSelection::all();
    let mut text = Vec::new();
    Payload::write_to(
        &Rendered::new(&rs, &selection).listing_first(true),
        &mut text,
    )
    .unwrap();
    let text = String::from_utf8(text).unwrap();
    assert_eq!(text.matches("-S\n").count(), 2, "{text}");
    assert!(text.starts_with("*filter\n-S\n:BERTH-"), "{text}");
    assert!(text.contains("*nat\n-S\n:BERTH-"), "{text}");
    let plain = render(&rs, &selection);
    assert_eq!(text.replace("-S\n", ""), plain);
}
