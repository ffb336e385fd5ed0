//! The two nftables writers agree: every golden ruleset, and a run of partial syncs after it, is
//! written through berth's netlink batches ([`NetlinkNft`]) into one network namespace and as
//! text through the real `nft -f` into another, and `nft -j list table` must read both back
//! identical (handles aside, set elements in any order). After every step both tables are also
//! dumped by netlink and decoded ([`decode_table`], what `berth explain` traces): each must be
//! the typed table the in-memory nftables holds after the same transactions, as the kernel can
//! hold it. Also: a refused batch names the object, and changes nothing.
//!
//! Root, iproute2 and nft (skips with a message elsewhere, fails under `CI=true`).
//! Address plan: the datapath tests' own (tests/common), kube-proxy's for its golden input, and
//! for IPv6 Services fd00:96::/112, pods fd00:244:1::/64 and fd00:244:2::/64, node fd00:18::11.
//! The namespaces `berth-nq<pid>-{nl,nft}` have no interfaces, only tables.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use berth_core::IpFamily;
use berth_datapath::fake::MemoryNft;
use berth_datapath::nft::decode::decode_table;
use berth_datapath::nft::dump::RawTable;
use berth_datapath::nft::shard::{Shard, MAIN};
use berth_datapath::nft::{CommandNft, NetlinkNft, Nft, NftSyncer, NftTable, Shards, Transaction};
use berth_datapath::*;
use berth_testing::{require, Requirement};
use common::netns::Netns;
use common::*;
use serde_json::Value;

/// Applies every transaction through both writers, each into its own namespace, and to the
/// in-memory nftables (the typed table the decoded ones must equal).
struct Both {
    netlink: NetlinkNft,
    text: CommandNft,
    model: MemoryNft,
    /// Loads that went in stages.
    staged_loads: usize,
}

impl Nft for Both {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        let by_text = self.text.apply(tx);
        let by_netlink = self.netlink.apply(tx);
        assert_eq!(
            by_text.is_ok(),
            by_netlink.is_ok(),
            "the writers disagree on whether to apply:\n{}\nnft: {by_text:?}\nnetlink: {by_netlink:?}",
            tx.text()
        );
        let by_model = self.model.apply(tx);
        assert_eq!(by_text.is_ok(), by_model.is_ok(), "{by_model:?}");
        by_text
    }

    /// berth's tables as the kernel holds them in the netlink writer's namespace (the text
    /// writer's holds the same; the model starts empty with each history).
    fn tables(&mut self, family: IpFamily) -> Result<Option<BTreeSet<Shard>>, Error> {
        self.netlink.tables(family)
    }

    /// A staged load: `nft` and the model take the stages one by one, the netlink writer as
    /// the agent's does, building each batch while the kernel takes the last.
    fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
    ) -> Result<usize, Error> {
        self.staged_loads += 1;
        let stages: Vec<Transaction> = stages.collect();
        for tx in &stages {
            self.text.apply(tx)?;
            self.model.apply(tx)?;
        }
        self.netlink.apply_staged(&mut stages.into_iter())
    }
}

/// The first chain (or else the first other part) in which two typed tables differ.
fn first_difference(got: &NftTable, want: &NftTable) -> String {
    let chains = want.chains.keys().chain(got.chains.keys());
    for chain in chains {
        let (g, w) = (got.chains.get(chain), want.chains.get(chain));
        if g != w {
            return format!("chain {chain}:\n decoded: {g:?}\n planned: {w:?}");
        }
    }
    format!("decoded: {got:?}\nplanned: {want:?}")
}

struct Pair {
    netlink: Netns,
    text: Netns,
}

impl Pair {
    /// Two fresh namespaces, `tag` keeping them apart from another test's.
    fn new(tag: &str) -> Pair {
        Pair {
            netlink: Netns::new("nq", &format!("{tag}-nl")),
            text: Netns::new("nq", &format!("{tag}-nft")),
        }
    }

    fn syncer(&self, family: IpFamily, shards: u16) -> NftSyncer<Both> {
        NftSyncer::new(
            Both {
                netlink: NetlinkNft::in_netns(&self.netlink.0),
                text: CommandNft::in_netns(&self.text.0),
                model: MemoryNft::new(family),
                staged_loads: 0,
            },
            family,
        )
        .with_shards(Shards::new(shards).unwrap())
        .with_staged_cold_load(true)
    }

    /// Both tables, dumped and decoded as `berth explain` does (through the bytes the agent
    /// sends), are the model's table as the kernel can hold it.
    fn assert_decoded(&self, family: IpFamily, model: &MemoryNft, what: &str) {
        let want = model.table.as_ref().expect("a table").kernel_form();
        for ns in [&self.netlink, &self.text] {
            let raw = NetlinkNft::in_netns(&ns.0)
                .dump(family)
                .unwrap()
                .expect("a table to dump");
            let raw = RawTable::from_bytes(&raw.to_bytes()).unwrap();
            let got =
                decode_table(family, &raw).unwrap_or_else(|e| panic!("{what}: {}: {e}", ns.0));
            assert!(
                got == want,
                "{what}: {} decodes to another table; {}",
                ns.0,
                first_difference(&got, &want)
            );
        }
    }

    /// Both namespaces' tables (berth's only: the main one and its shards) read back alike;
    /// the listing, for more checks.
    fn assert_equal(&self, family: IpFamily, what: &str) -> Value {
        let by_text = self.text.ruleset(family).expect("nft wrote the tables");
        let by_netlink = self
            .netlink
            .ruleset(family)
            .expect("netlink wrote the tables");
        if by_text != by_netlink {
            let (a, b) = (
                by_text["nftables"].as_array().unwrap(),
                by_netlink["nftables"].as_array().unwrap(),
            );
            let first = a.iter().zip(b.iter()).find(|(x, y)| x != y);
            panic!(
                "{what}: the tables differ ({} objects by nft, {} by netlink); first difference:\n nft:     {}\n netlink: {}",
                a.len(),
                b.len(),
                first.map_or("-".to_string(), |(x, _)| x.to_string()),
                first.map_or("-".to_string(), |(_, y)| y.to_string()),
            );
        }
        by_text
    }
}

fn linear(family: IpFamily) -> PlanOptions {
    let mut options = mk_options(Dispatch::Linear);
    if family == IpFamily::V6 {
        options.family = IpFamily::V6;
        options.cluster_cidr = Some("fd00:244::/48".parse().unwrap());
    }
    options
}

/// IPv6 Services of every kind the planner writes: endpoints here and elsewhere, node port,
/// external IP, load balancer with source ranges and ClientIP affinity, none ready.
fn mk_v6_view() -> NodeView {
    let mut a = mk_svc(
        "v6-a",
        "fd00:96::10",
        80,
        vec![
            mk_ep("fd00:244:1::5", 8080, "node-a"),
            mk_ep("fd00:244:2::5", 8080, "node-b"),
        ],
    );
    a.node_port = Some(30080);
    a.external_ips = vec![ip("fd00:18::150")];
    let mut b = mk_svc(
        "v6-b",
        "fd00:96::20",
        443,
        vec![
            mk_ep("fd00:244:1::6", 8443, "node-a"),
            mk_ep("fd00:244:2::7", 8443, "node-b"),
        ],
    );
    b.node_port = Some(30443);
    b.load_balancer_ingress = vec![lb("fd00:18::200")];
    b.source_ranges = vec![
        "fd00:203::/56".parse().unwrap(),
        "fd00:18::/124".parse().unwrap(),
    ];
    b.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 600,
    };
    b.external_traffic_policy = berth_core::TrafficPolicy::Local;
    b.health_check_node_port = Some(30200);
    let mut none = mk_svc("v6-none", "fd00:96::30", 80, vec![]);
    none.node_port = Some(30090);
    let mut node = mk_node();
    node.addresses = vec![ip("fd00:18::11")];
    NodeView {
        node,
        services: vec![a, b, none],
    }
}

/// Changes a partial sync must carry: an endpoint gone, a Service gone, affinity's timeout
/// changed, a new Service with affinity and a node port.
fn changes(view: &NodeView, family: IpFamily) -> Vec<(&'static str, NodeView)> {
    let mut steps = Vec::new();
    let mut next = view.clone();
    if let Some(svc) = next.services.iter_mut().find(|s| s.endpoints.len() > 1) {
        svc.endpoints.edit(Vec::pop);
    }
    steps.push(("an endpoint removed", next.clone()));
    next.services.remove(0);
    steps.push(("a Service removed", next.clone()));
    for svc in &mut next.services {
        if let SessionAffinity::ClientIp { timeout_seconds } = &mut svc.session_affinity {
            *timeout_seconds += 60;
        }
    }
    steps.push(("affinity timeout changed", next.clone()));
    let (cluster_ip, ep) = match family {
        IpFamily::V4 => ("10.96.0.99", "10.244.1.99"),
        IpFamily::V6 => ("fd00:96::99", "fd00:244:1::99"),
    };
    let mut added = mk_svc(
        "svc-added",
        cluster_ip,
        8081,
        vec![mk_ep(ep, 9090, "node-a")],
    );
    added.node_port = Some(30099);
    added.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 30,
    };
    next.services.push(added);
    steps.push(("a Service added", next));
    steps
}

/// A history of `view` in `family` over `shards` tables, the agent knowing the Service CIDRs
/// `service_cidrs` (then the ClusterIPs are elements of `cluster-ips`).
fn equal_through_a_history(
    pair: &Pair,
    family: IpFamily,
    name: &str,
    view: &NodeView,
    shards: u16,
    service_cidrs: &[&str],
) {
    let mut options = linear(family);
    options.service_cidrs = service_cidrs.iter().map(|c| c.parse().unwrap()).collect();
    let mut syncer = pair.syncer(family, shards);
    let cold = syncer.nft_mut().tables(family).unwrap() == Some(BTreeSet::new());
    // The agent's path: the partial syncs get the planner's changes, dispatch entries included.
    let mut planner = Planner::new(options.clone());
    planner.update(view);
    let changed = planner.take_changes();
    let report = syncer.sync_changes(planner.ruleset(), &changed).unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    // Into empty namespaces a load goes in stages, over berth's tables in one transaction.
    assert_eq!(syncer.nft().staged_loads, usize::from(cold), "{name}");
    let listing = pair.assert_equal(family, &format!("{name}: full sync"));
    pair.assert_decoded(family, &syncer.nft().model, &format!("{name}: full sync"));
    assert!(
        listing.to_string().contains("\"dnat\""),
        "{name}: nothing programmed"
    );
    let cluster_ips = syncer
        .nft()
        .model
        .table
        .as_ref()
        .map_or(0, |t| t.cluster_ips.len());
    assert_eq!(cluster_ips > 0, !service_cidrs.is_empty(), "{name}");
    for (step, next) in changes(view, family) {
        planner.update(&next);
        assert_eq!(planner.ruleset(), &plan(&next, &options), "{name}: {step}");
        let changed = planner.take_changes();
        let report = syncer.sync_changes(planner.ruleset(), &changed).unwrap();
        assert_eq!(report.kind, SyncKind::Partial, "{name}: {step}");
        pair.assert_equal(family, &format!("{name}: {step}"));
        pair.assert_decoded(family, &syncer.nft().model, &format!("{name}: {step}"));
    }
    // And the hourly full sync over a table that holds everything.
    syncer.force_full_sync();
    syncer.sync(&plan(view, &options)).unwrap();
    pair.assert_equal(family, &format!("{name}: full sync again"));
    pair.assert_decoded(
        family,
        &syncer.nft().model,
        &format!("{name}: full sync again"),
    );
}

#[test]
fn netlink_and_nft_write_the_same_tables() {
    require!(Requirement::Netns, Requirement::Nft);
    let pair = Pair::new("hist");
    equal_through_a_history(
        &pair,
        IpFamily::V4,
        "fixed set (golden fixed_nft.txt)",
        &mk_fixed_view(),
        1,
        &[],
    );
    equal_through_a_history(
        &pair,
        IpFamily::V4,
        "kube-proxy's TestOverallIPTablesRules",
        &kube_proxy::kube_proxy_overall_view(),
        1,
        &[],
    );
    equal_through_a_history(&pair, IpFamily::V6, "IPv6 Services", &mk_v6_view(), 1, &[]);
    // With Service CIDRs: the ClusterIPs' set and its reject rule, elements added and deleted
    // by the partial syncs.
    equal_through_a_history(
        &pair,
        IpFamily::V4,
        "fixed set with Service CIDRs",
        &mk_fixed_view(),
        1,
        &["10.96.0.0/16"],
    );
    // nat sharded, over the single tables before: the shards are added, the main table's nat
    // dispatch moves into them.
    equal_through_a_history(
        &pair,
        IpFamily::V4,
        "fixed set in four shards (golden fixed_nft_shards.txt)",
        &mk_fixed_view(),
        4,
        &[],
    );
    equal_through_a_history(
        &pair,
        IpFamily::V6,
        "IPv6 Services in three shards with Service CIDRs",
        &mk_v6_view(),
        3,
        &["fd00:96::/112"],
    );
    // And back to one table: the shards are removed.
    equal_through_a_history(
        &pair,
        IpFamily::V4,
        "fixed set in one table again",
        &mk_fixed_view(),
        1,
        &[],
    );
    let tables = pair.netlink.ruleset(IpFamily::V4).unwrap().to_string();
    assert!(!tables.contains("berth-1"), "{tables}");
}

/// A cold load in stages through the netlink writer's pipeline (the agent's, and `nft -f` taking
/// the same stages one by one) into empty namespaces: the same tables as ever, over nat shards
/// and in both families; and the history after it.
#[test]
fn a_cold_load_in_stages_writes_the_same_tables() {
    require!(Requirement::Netns, Requirement::Nft);
    for (family, view, name) in [
        (IpFamily::V4, mk_fixed_view(), "fixed set"),
        (IpFamily::V6, mk_v6_view(), "IPv6 Services"),
    ] {
        let pair = Pair::new(&format!("stage{family:?}"));
        equal_through_a_history(&pair, family, &format!("{name} in stages"), &view, 5, &[]);
    }
}

/// The pipeline stops at a refused stage: the stages before it are in the kernel, the one
/// refused and every later one are not, and the error names the refused object.
#[test]
fn a_staged_load_stops_at_a_refused_stage() {
    require!(Requirement::Netns, Requirement::Nft);
    use berth_datapath::nft::{Command as NftCommand, NftChain, NftRule};
    let ns = Netns::new("nq", "stage");
    let table = |shard: Shard| {
        let mut tx = Transaction::new(IpFamily::V4);
        tx.push(NftCommand::AddTable(shard));
        tx
    };
    let mut refused = table(2);
    refused.push(NftCommand::AddChain(
        NftChain::in_shard(Table::Nat, &ChainName::new("BERTH-SERVICES"), 2),
        None,
    ));
    refused.push(NftCommand::AddRule(
        NftChain::in_shard(Table::Nat, &ChainName::new("BERTH-SERVICES"), 2),
        NftRule::Rule(Rule::jump(vec![], &ChainName::new("BERTH-NO-SUCH-CHAIN"))),
    ));
    let stages = vec![table(MAIN), table(1), refused, table(3), table(4)];
    let err = NetlinkNft::in_netns(&ns.0)
        .apply_staged(&mut stages.into_iter())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("add rule ip berth-2 nat-BERTH-SERVICES jump nat-BERTH-NO-SUCH-CHAIN"),
        "{err}"
    );
    let left = NetlinkNft::in_netns(&ns.0).tables(IpFamily::V4).unwrap();
    assert_eq!(left, Some(BTreeSet::from([MAIN, 1])));
}

#[test]
fn a_refused_batch_names_the_object_and_changes_nothing() {
    require!(Requirement::Netns, Requirement::Nft);
    let ns = Netns::new("nq", "err");
    let mut syncer = NftSyncer::new(NetlinkNft::in_netns(&ns.0), IpFamily::V4);
    syncer
        .sync(&plan(&mk_fixed_view(), &linear(IpFamily::V4)))
        .unwrap();
    let before = ns.table(IpFamily::V4, false).unwrap();
    // A rule that jumps to a chain that does not exist, after valid commands.
    let mut tx = Transaction::new(IpFamily::V4);
    let chain = berth_datapath::nft::NftChain::new(Table::Nat, &ChainName::new("BERTH-SERVICES"));
    tx.push(berth_datapath::nft::Command::FlushChain(chain.clone()));
    tx.push(berth_datapath::nft::Command::AddRule(
        chain,
        berth_datapath::nft::NftRule::Rule(Rule::jump(
            vec![],
            &ChainName::new("BERTH-NO-SUCH-CHAIN"),
        )),
    ));
    let err = syncer.nft_mut().apply(&tx).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("add rule ip berth nat-BERTH-SERVICES jump nat-BERTH-NO-SUCH-CHAIN"),
        "{text}"
    );
    assert!(
        matches!(err, Error::Netlink { errno, .. } if errno == 2),
        "{err:?}"
    );
    assert_eq!(
        ns.table(IpFamily::V4, false).unwrap(),
        before,
        "the flush was not applied either"
    );
}

#[test]
fn the_probe_is_accepted_and_leaves_nothing() {
    require!(Requirement::Netns, Requirement::Nft);
    let ns = Netns::new("nq", "probe");
    assert!(NetlinkNft::in_netns(&ns.0).usable());
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.0, "nft", "list", "ruleset"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");
    // A namespace that does not exist: not usable, and no panic.
    assert!(!NetlinkNft::in_netns("berth-nq-no-such-namespace").usable());
}

/// What another program does to berth's table with `nft`, and the words the decoder's error
/// must contain: the decoder refuses it by name rather than guess.
#[test]
fn a_table_changed_by_nft_is_refused_by_name() {
    require!(Requirement::Netns, Requirement::Nft);
    let ns = Netns::new("nq", "tamper");
    let mut syncer = NftSyncer::new(NetlinkNft::in_netns(&ns.0), IpFamily::V4);
    syncer
        .sync(&plan(&mk_fixed_view(), &linear(IpFamily::V4)))
        .unwrap();
    let decode = || {
        let raw = NetlinkNft::in_netns(&ns.0)
            .dump(IpFamily::V4)
            .unwrap()
            .unwrap();
        decode_table(IpFamily::V4, &raw)
    };
    assert!(decode().is_ok(), "berth's own table decodes");
    let rows: [(&str, &str); 3] = [
        (
            "add rule ip berth nat-BERTH-SERVICES log prefix \"seen\"",
            "of chain nat-BERTH-SERVICES: expression \"log\"",
        ),
        (
            "add chain ip berth audit",
            "chain audit: not a chain berth plans",
        ),
        (
            "add set ip berth blocked { type ipv4_addr ; }",
            "set blocked: neither a map of berth's nor an affinity set",
        ),
    ];
    for (command, words) in rows {
        let status = Command::new("ip")
            .args(["netns", "exec", &ns.0, "nft", command])
            .status()
            .unwrap();
        assert!(status.success(), "{command}");
        let err = decode().expect_err(command);
        assert!(err.to_string().contains(words), "{command}: {err}");
        // The agent's next full sync repairs the table, which then decodes again.
        syncer.force_full_sync();
        syncer
            .sync(&plan(&mk_fixed_view(), &linear(IpFamily::V4)))
            .unwrap();
        assert!(decode().is_ok(), "{command}: repaired");
    }
}
