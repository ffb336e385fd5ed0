//! Adoption on the real kernel: a Syncer that starts over (an agent restart, or the periodic full
//! reconciliation) reads berth's table back through netlink, compares it with the plan and
//! writes only the difference. A table that matches is not touched at all — same rule handles,
//! the ClientIP affinity entries of the dynamic sets still there — and a table someone changed
//! is repaired to exactly what a fresh write of the plan holds, affinity entries kept.
//!
//! Root, iproute2 and nft (skips with a message elsewhere, fails under `CI=true`).
//! Address plan: the datapath tests' own (tests/common); the client whose affinity entry is kept
//! is 198.18.0.100. The namespaces `berth-na<pid>-{a,fresh}` have no interfaces, only tables.

#![allow(clippy::unwrap_used)]

mod common;

use berth_core::IpFamily;
use berth_datapath::nft::shard::Shard;
use berth_datapath::nft::{adopt, NetlinkNft, Nft, NftSyncer, Shards, Transaction};
use berth_datapath::*;
use berth_testing::{require, Requirement};
use common::netns::Netns;
use common::*;
use serde_json::Value;

fn netns(tag: &str) -> Netns {
    Netns::new("na", tag)
}

/// `nft -j list table ip berth` (see [`common::netns::normalise`]).
fn table(ns: &Netns, handles: bool) -> Value {
    ns.table(IpFamily::V4, handles).expect("the table exists")
}

fn syncer(ns: &Netns) -> NftSyncer<NetlinkNft> {
    NftSyncer::new(NetlinkNft::in_netns(&ns.0), IpFamily::V4)
}

/// The affinity set of the fixed set's ClientIP Service and its name.
fn affinity_set(ns: &Netns) -> String {
    let listing = ns.nft(&["list", "table", "ip", "berth"]);
    listing
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("set BERTH-SEP-")
                .map(|rest| format!("BERTH-SEP-{}", rest.trim_end_matches(" {")))
        })
        .expect("an affinity set")
}

const CLIENT: &str = "198.18.0.100";

#[test]
fn a_restarted_syncer_adopts_a_matching_table_and_repairs_a_changed_one() {
    require!(Requirement::Netns, Requirement::Nft);
    let ns = netns("a");
    let fresh = netns("fresh");
    // With the cluster's Service CIDRs: the ClusterIPs' set and its reject rule are adopted too.
    let options = PlanOptions {
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
        ..mk_options(Dispatch::Linear)
    };
    let rs = plan(&mk_fixed_view(), &options);
    syncer(&ns).sync(&rs).unwrap();
    syncer(&fresh).sync(&rs).unwrap();
    let set = affinity_set(&ns);
    // A client's affinity entry, as its first packet would have left it.
    ns.nft(&[
        "add",
        "element",
        "ip",
        "berth",
        &set,
        &format!("{{ {CLIENT} }}"),
    ]);
    let before = table(&ns, true);
    assert!(before.to_string().contains(CLIENT), "{before}");

    // A restart: a new Syncer, the same plan. Nothing is written.
    let mut restarted = syncer(&ns);
    let report = restarted.sync(&rs).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(
        (report.rewritten_chains, report.payload_bytes),
        (0, 0),
        "{report:?}"
    );
    assert_eq!(
        table(&ns, true),
        before,
        "the table and its handles are untouched"
    );
    // And partial syncs go on from the adopted state.
    assert_eq!(restarted.sync(&rs).unwrap().kind, SyncKind::Partial);

    // Someone changes the table: a rule gone from a Service chain, a map element and a ClusterIP
    // gone, a stray chain and set.
    let svc_chain = ns
        .nft(&["-a", "list", "table", "ip", "berth"])
        .lines()
        .skip_while(|l| !l.contains("chain nat-BERTH-SVC-"))
        .skip(1)
        .find_map(|l| l.split("# handle ").nth(1).map(str::to_string))
        .unwrap();
    let chain_name = ns
        .nft(&["list", "table", "ip", "berth"])
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("chain nat-BERTH-SVC-")
                .map(|r| r.trim_end_matches(" {").to_string())
        })
        .unwrap();
    ns.nft(&[
        "delete",
        "rule",
        "ip",
        "berth",
        &format!("nat-BERTH-SVC-{chain_name}"),
        "handle",
        svc_chain.trim(),
    ]);
    ns.nft(&[
        "delete",
        "element",
        "ip",
        "berth",
        "service-ips",
        "{ 10.96.0.10 . tcp . 80 }",
    ]);
    ns.nft(&[
        "delete",
        "element",
        "ip",
        "berth",
        "cluster-ips",
        "{ 10.96.0.10 }",
    ]);
    ns.nft(&["add", "chain", "ip", "berth", "nat-BERTH-STALE"]);
    ns.nft(&[
        "add",
        "set",
        "ip",
        "berth",
        "BERTH-SEP-STALE",
        "{ type ipv4_addr ; flags dynamic,timeout ; timeout 10s ; }",
    ]);
    assert_ne!(table(&ns, false), table(&fresh, false));

    // The periodic full reconciliation repairs exactly that.
    restarted.force_full_sync();
    let report = restarted.sync(&rs).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(
        (report.rewritten_chains, report.deleted_chains),
        (1, 1),
        "{report:?}"
    );
    let repaired = table(&ns, false);
    let without_client = {
        let text = repaired.to_string();
        assert!(
            text.contains(CLIENT),
            "the affinity entry survived the repair"
        );
        // The fresh table has no client entry; drop it to compare the rest.
        let mut json = repaired.clone();
        strip_dynamic_elements(&mut json);
        json
    };
    let mut fresh_table = table(&fresh, false);
    strip_dynamic_elements(&mut fresh_table);
    assert_eq!(
        without_client, fresh_table,
        "repaired to what a fresh write holds"
    );

    // A new plan after a restart: only the difference is written, and the result is the plan.
    let mut view = mk_fixed_view();
    view.services.remove(0);
    view.services[0].endpoints.edit(Vec::pop);
    let next = plan(&view, &options);
    let report = syncer(&ns).sync(&next).unwrap();
    assert!(
        report.rewritten_chains > 0 && report.rewritten_chains < 10,
        "{report:?}"
    );
    syncer(&fresh).sync(&next).unwrap();
    let mut got = table(&ns, false);
    strip_dynamic_elements(&mut got);
    let mut want = table(&fresh, false);
    strip_dynamic_elements(&mut want);
    assert_same(&got, &want, "a new plan adopted");
    assert!(want.to_string().contains("cluster-ips"), "{want}");

    // A table written before berth had `cluster-ips` (its REJECTs a chain of rules; here the
    // chain emptied and the set gone): a restart declares the set and fills it, in place.
    ns.nft(&["flush", "chain", "ip", "berth", "filter-BERTH-CLUSTER-IPS"]);
    ns.nft(&["delete", "set", "ip", "berth", "cluster-ips"]);
    let report = syncer(&ns).sync(&next).unwrap();
    assert_eq!(report.rewritten_chains, 1, "{report:?}");
    let mut got = table(&ns, false);
    strip_dynamic_elements(&mut got);
    // Declared last, the set is listed after the others: compared apart, the rest in order.
    let take_set = |v: &mut Value| {
        let objects = v["nftables"].as_array_mut().unwrap();
        let at = objects
            .iter()
            .position(|o| o["set"]["name"] == "cluster-ips")
            .expect("the cluster-ips set");
        objects.remove(at)
    };
    assert_eq!(take_set(&mut got), take_set(&mut want));
    assert_same(&got, &want, "the cluster-ips set added to an older table");
}

fn sharded(ns: &Netns, k: u16) -> NftSyncer<NetlinkNft> {
    syncer(ns).with_shards(Shards::new(k).unwrap())
}

/// The shard table holding the fixed set's affinity set, and the set's name.
fn sharded_affinity_set(ns: &Netns, k: u16) -> (String, String) {
    (1..=k)
        .find_map(|shard| {
            let table = format!("berth-{shard}");
            let listing = ns.nft(&["list", "table", "ip", &table]);
            listing.lines().find_map(|l| {
                l.trim().strip_prefix("set BERTH-SEP-").map(|rest| {
                    (
                        table.clone(),
                        format!("BERTH-SEP-{}", rest.trim_end_matches(" {")),
                    )
                })
            })
        })
        .expect("an affinity set in a shard")
}

/// berth's tables and any other of the family, dynamic set entries left out, objects sorted
/// (a repaired table lists its chains in another creation order).
fn ruleset(ns: &Netns) -> Value {
    let mut json = ns.ruleset(IpFamily::V4).expect("a ruleset");
    strip_dynamic_elements(&mut json);
    if let Some(items) = json["nftables"].as_array_mut() {
        items.sort_by_key(|item| item.to_string());
    }
    json
}

#[test]
fn sharded_tables_are_adopted_repaired_and_follow_a_new_shard_count() {
    require!(Requirement::Netns, Requirement::Nft);
    let ns = netns("s");
    let fresh = netns("sfresh");
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Linear));
    sharded(&ns, 4).sync(&rs).unwrap();
    sharded(&fresh, 4).sync(&rs).unwrap();
    let (shard_table, set) = sharded_affinity_set(&ns, 4);
    ns.nft(&[
        "add",
        "element",
        "ip",
        &shard_table,
        &set,
        &format!("{{ {CLIENT} }}"),
    ]);
    let with_client = ns.ruleset(IpFamily::V4).unwrap();
    assert!(with_client.to_string().contains(CLIENT));

    // A restart with the same count: nothing written, the entry kept.
    let mut restarted = sharded(&ns, 4);
    let report = restarted.sync(&rs).unwrap();
    assert_eq!(
        (report.rewritten_chains, report.payload_bytes),
        (0, 0),
        "{report:?}"
    );
    assert_eq!(ns.ruleset(IpFamily::V4).unwrap(), with_client);

    // Someone changes a shard: a map element gone, a stray chain. Repaired in place.
    ns.nft(&["flush", "map", "ip", &shard_table, "service-ips"]);
    ns.nft(&["add", "chain", "ip", &shard_table, "nat-BERTH-STALE"]);
    restarted.force_full_sync();
    let report = restarted.sync(&rs).unwrap();
    assert_eq!(report.deleted_chains, 1, "{report:?}");
    assert!(ns
        .ruleset(IpFamily::V4)
        .unwrap()
        .to_string()
        .contains(CLIENT));
    assert_same(&ruleset(&ns), &ruleset(&fresh), "a repaired shard");

    // Tables that are not berth's, with names close to its own, are never touched.
    for other in ["berth-07", "berthx", "berth-probe-not"] {
        ns.nft(&["add", "table", "ip", other]);
        ns.nft(&["add", "chain", "ip", other, "keep"]);
    }
    // Another count after a restart: the stale shards go, the plan is what a fresh write of
    // that count holds.
    for k in [2, 1, 16] {
        sharded(&ns, k).sync(&rs).unwrap();
        let once = netns(&format!("k{k}"));
        sharded(&once, k).sync(&rs).unwrap();
        let mut got = ruleset(&ns);
        if let Some(items) = got["nftables"].as_array_mut() {
            items.retain(|item| {
                let table = item
                    .as_object()
                    .and_then(|o| o.values().next())
                    .and_then(|v| v.get("table").or_else(|| v.get("name")))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                !["berth-07", "berthx", "berth-probe-not", "keep"].contains(&table)
            });
        }
        assert_same(&got, &ruleset(&once), &format!("{k} shards after 4"));
        for other in ["berth-07", "berthx", "berth-probe-not"] {
            assert!(
                ns.nft(&["list", "table", "ip", other])
                    .contains("chain keep"),
                "{other} untouched"
            );
        }
    }
}

/// Elements of the affinity sets removed: state, not configuration.
fn strip_dynamic_elements(json: &mut Value) {
    for item in json["nftables"].as_array_mut().unwrap() {
        if let Some(set) = item.get_mut("set") {
            if set["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("BERTH-SEP-"))
            {
                set.as_object_mut().unwrap().remove("elem");
            }
        }
    }
}

/// Equal listings, or a panic naming the first object that differs.
fn assert_same(got: &Value, want: &Value, what: &str) {
    if got == want {
        return;
    }
    let (a, b) = (
        got["nftables"].as_array().unwrap(),
        want["nftables"].as_array().unwrap(),
    );
    let first = a.iter().zip(b.iter()).find(|(x, y)| x != y);
    panic!(
        "{what}: {} objects, want {}; first difference:\n got:  {}\n want: {}",
        a.len(),
        b.len(),
        first.map_or("-".to_string(), |(x, _)| x.to_string()),
        first.map_or("-".to_string(), |(_, y)| y.to_string()),
    );
}

/// A netlink writer whose staged load stops after `stages` stages, as a killed agent's would.
struct CutShort {
    nft: NetlinkNft,
    stages: usize,
}

impl Nft for CutShort {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        self.nft.apply(tx)
    }

    fn tables(
        &mut self,
        family: IpFamily,
    ) -> Result<Option<std::collections::BTreeSet<Shard>>, Error> {
        self.nft.tables(family)
    }

    fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
    ) -> Result<usize, Error> {
        self.nft.apply_staged(&mut stages.take(self.stages))?;
        Err(Error::Restore {
            reason: "cut short".to_string(),
        })
    }
}

/// A cold load in stages cut short (the main table only, some shards, everything but the base
/// chains) hooks nothing, and the next start completes it (reading what it left and writing the
/// rest in one transaction): the tables a load of the plan in one go holds.
#[test]
fn a_cold_load_cut_short_is_completed_by_the_next_start() {
    require!(Requirement::Netns, Requirement::Nft);
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Linear));
    let fresh = netns("cfresh");
    sharded(&fresh, 4).sync(&rs).unwrap();
    // Stages: the main table, four shards, the hairpin pairs, the base chains.
    for cut in [1, 3, 6] {
        let ns = netns(&format!("cut{cut}"));
        let mut killed = NftSyncer::new(
            CutShort {
                nft: NetlinkNft::in_netns(&ns.0),
                stages: cut,
            },
            IpFamily::V4,
        )
        .with_shards(Shards::new(4).unwrap())
        .with_staged_cold_load(true);
        assert!(killed.sync(&rs).is_err());
        let left = ns.nft(&["list", "ruleset", "ip"]);
        assert!(left.contains("table ip berth"), "cut {cut}: {left}");
        assert!(!left.contains(" hook "), "cut {cut}: a base chain: {left}");
        let report = sharded(&ns, 4)
            .with_staged_cold_load(true)
            .sync(&rs)
            .unwrap();
        assert!(report.rewritten_chains > 0, "cut {cut}: {report:?}");
        assert_same(
            &ruleset(&ns),
            &ruleset(&fresh),
            &format!("cut after {cut} stages"),
        );
    }
}

/// The writer, counting how the Syncer read the kernel: whole (`read`) or table by table
/// (`read_each`).
struct Reads {
    nft: NetlinkNft,
    whole: usize,
    each: usize,
}

impl Nft for Reads {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        self.nft.apply(tx)
    }

    fn can_read(&self) -> bool {
        true
    }

    fn read(&mut self, family: IpFamily) -> Result<Option<adopt::ObservedTables>, Error> {
        self.whole += 1;
        self.nft.read(family)
    }

    fn read_each(
        &mut self,
        family: IpFamily,
        each: &mut dyn FnMut(Shard, adopt::Observed) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        self.each += 1;
        self.nft.read_each(family, each)
    }

    fn tables(
        &mut self,
        family: IpFamily,
    ) -> Result<Option<std::collections::BTreeSet<Shard>>, Error> {
        self.nft.tables(family)
    }

    fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
    ) -> Result<usize, Error> {
        self.nft.apply_staged(stages)
    }
}

/// A full sync as the agent runs one: a lean planner that keeps no Service chain, each shard's
/// planned as the sync reaches it.
fn streamed_full_sync(
    syncer: &mut NftSyncer<Reads>,
    view: &NodeView,
    options: &PlanOptions,
) -> SyncReport {
    let mut planner = Planner::new(options.clone()).lean();
    let shards = syncer.shards();
    let ports = apply::plan_for_sync(&mut planner, view, true, Some(shards), |p| p.update(view));
    let mut changes = planner.take_changes();
    apply::apply_planned(syncer, &mut planner, &mut changes, ports, |p| p.fill(view)).unwrap()
}

fn streamed(ns: &Netns, k: u16) -> NftSyncer<Reads> {
    NftSyncer::new(
        Reads {
            nft: NetlinkNft::in_netns(&ns.0),
            whole: 0,
            each: 0,
        },
        IpFamily::V4,
    )
    .with_shards(Shards::new(k).unwrap())
    .with_staged_cold_load(true)
}

/// The agent's restarts and periodic full passes adopt table by table, never reading or
/// planning the whole at once: tables that match are left as they are (no write, the affinity
/// entry kept); a flushed map, a stray chain, a flushed hairpin set and a deleted shard table
/// are repaired to exactly what a fresh write holds; another shard count, and a cold load cut
/// short, end as a fresh write of the plan. Each time the kernel was read table by table.
#[test]
fn an_agents_restart_adopts_table_by_table_as_a_whole_adoption_does() {
    require!(Requirement::Netns, Requirement::Nft);
    let view = mk_fixed_view();
    let options = PlanOptions {
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
        ..mk_options(Dispatch::Linear)
    };
    let rs = plan(&view, &options);
    let ns = netns("t");
    let fresh = netns("tfresh");
    sharded(&fresh, 4).sync(&rs).unwrap();
    let cold = streamed_full_sync(&mut streamed(&ns, 4), &view, &options);
    assert!(cold.rewritten_chains > 0, "{cold:?}");
    assert_same(&ruleset(&ns), &ruleset(&fresh), "a streamed cold load");
    let (shard_table, set) = sharded_affinity_set(&ns, 4);
    ns.nft(&[
        "add",
        "element",
        "ip",
        &shard_table,
        &set,
        &format!("{{ {CLIENT} }}"),
    ]);
    let with_client = ns.ruleset(IpFamily::V4).unwrap();

    // A restart over matching tables: read table by table, nothing written.
    let mut restarted = streamed(&ns, 4);
    let report = streamed_full_sync(&mut restarted, &view, &options);
    assert_eq!(
        (report.rewritten_chains, report.payload_bytes),
        (0, 0),
        "{report:?}"
    );
    assert_eq!(report.rule_count, cold.rule_count);
    assert_eq!((restarted.nft().whole, restarted.nft().each), (0, 1));
    assert_eq!(ns.ruleset(IpFamily::V4).unwrap(), with_client);

    // The periodic pass after someone changed the tables: repaired in place.
    let other = if shard_table == "berth-1" { "2" } else { "1" };
    ns.nft(&["flush", "map", "ip", &shard_table, "service-ips"]);
    ns.nft(&["add", "chain", "ip", &shard_table, "nat-BERTH-STALE"]);
    ns.nft(&["flush", "set", "ip", "berth", "hairpin"]);
    ns.nft(&["delete", "table", "ip", &format!("berth-{other}")]);
    let report = streamed_full_sync(&mut restarted, &view, &options);
    assert_eq!(report.deleted_chains, 1, "{report:?}");
    assert_eq!((restarted.nft().whole, restarted.nft().each), (0, 2));
    assert!(ns
        .ruleset(IpFamily::V4)
        .unwrap()
        .to_string()
        .contains(CLIENT));
    assert_same(&ruleset(&ns), &ruleset(&fresh), "repaired table by table");

    // Another shard count after a restart: what a fresh write of that count holds.
    for k in [2, 16] {
        let mut recount = streamed(&ns, k);
        streamed_full_sync(&mut recount, &view, &options);
        assert_eq!((recount.nft().whole, recount.nft().each), (0, 1));
        let once = netns(&format!("t{k}"));
        sharded(&once, k).sync(&rs).unwrap();
        assert_same(
            &ruleset(&ns),
            &ruleset(&once),
            &format!("{k} shards after 4"),
        );
    }

    // A cold load cut short (the main table and two shards): the next start completes it.
    let cut = netns("tcut");
    let mut killed = NftSyncer::new(
        CutShort {
            nft: NetlinkNft::in_netns(&cut.0),
            stages: 3,
        },
        IpFamily::V4,
    )
    .with_shards(Shards::new(4).unwrap())
    .with_staged_cold_load(true);
    assert!(killed.sync(&rs).is_err());
    let mut next = streamed(&cut, 4);
    let report = streamed_full_sync(&mut next, &view, &options);
    assert!(report.rewritten_chains > 0, "{report:?}");
    assert_eq!((next.nft().whole, next.nft().each), (0, 1));
    assert_same(
        &ruleset(&cut),
        &ruleset(&fresh),
        "a cut-short load completed",
    );
}
