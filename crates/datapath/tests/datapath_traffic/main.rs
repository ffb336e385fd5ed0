//! berth's real datapath with real traffic: the planned rules applied by the real
//! `CommandIptables` inside node namespaces, exercised by TCP and UDP between pod, node and client
//! namespaces. Root only (skips with a message elsewhere, fails under `CI=true`); runs serially.
//! Each scenario is reported on libtest's lines, and the standard `test result:` line counts them,
//! skipped ones as ignored.
//!
//! Address plan (docs/architecture.md):
//! - LAN 198.18.0.0/24: node1 .11, node2 .12, client .100, other .101; LB IPs .200-.203, steered
//!   by the clients' routes to the node that would announce them.
//! - node1 pods a1 10.244.1.2, a2 10.244.1.3, c1 10.244.1.4 (a client pod); node2 pods
//!   b1 10.244.2.2, b2 10.244.2.3. Each node is its pods' gateway at 10.244.<n>.1.
//! - Services 10.96.0.0/16 (topology ones at .30-.32), node ports 30080-30087. Echo servers: TCP 8080, UDP 8053.
//! - The cluster is dual-stack: every address above has an IPv6 twin in ULA space
//!   (198.18.0.11 -> fd00:198:18::b, 10.244.1.2 -> fd00:244:1::2, 10.96.0.10 -> fd00:96::a;
//!   `family.rs`), and every Service both families.
//!
//! One cluster is built, every scenario runs with tree dispatch, then every scenario again after
//! a restart of the agents with linear dispatch, then again on the nftables backend (berth's
//! iptables rules removed, its own nftables tables `ip berth` and `ip6 berth` programmed by
//! berth's netlink writer); in each mode, every scenario runs in IPv4, then in IPv6 (`ip6tables`, `ip6 berth`).
//! The namespaces are deleted at the end, also when a scenario fails.
//! `cargo test --test datapath_traffic -- <substring>` runs the scenarios whose label
//! (`<mode>::<family>::<name>`, e.g. `nftables::ipv6::hairpin_lands_on_the_pod_itself`) matches.

#![allow(clippy::unwrap_used)]

mod cluster;
mod family;
mod flows;
mod node_port_addresses;
mod service_cidrs;
mod split;
mod topology;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;

use berth_core::IpFamily;
use berth_datapath::backend::SyncKind;
use berth_datapath::plan::builtin_jumps;
use berth_datapath::{plan, Dispatch};
use berth_lab::echo::{udp_echo, EchoConnection};
use berth_lab::topology::{remove_orphans, TopologyError};
use berth_testing::require::{decide, missing, strict, Verdict};
use berth_testing::{Requirement, DATAPATH_NEEDS};

use cluster::*;

fn cluster_ip_from_a_pod(c: &mut Cluster) {
    let replies = ask_many(c, "c1", sa(svc_ip(10), 80), 20);
    let pods = pods_of(&replies);
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["a1", "b1"], "{pods:?}");
    let c1 = c.ip(pod_ip(&c.topo, "c1"));
    assert!(
        replies.iter().all(|r| r.client.ip() == c1),
        "pod traffic is not masqueraded"
    );
}

fn cluster_ip_udp_from_a_pod(c: &mut Cluster) {
    let reply = udp_echo(&c.netns("c1"), in_plan(c, sa(svc_ip(10), 53)), OK_TIMEOUT).unwrap();
    assert!(["a1", "b1"].contains(&reply.pod.as_str()), "{reply:?}");
    assert_eq!(reply.client.ip(), c.ip(pod_ip(&c.topo, "c1")));
}

fn cluster_ip_from_the_nodes(c: &mut Cluster) {
    for node in NODES {
        let replies = ask_many(c, node, sa(svc_ip(10), 80), 10);
        assert!(
            replies.iter().all(|r| r.pod == "a1" || r.pod == "b1"),
            "{node}: {replies:?}"
        );
    }
}

fn node_port_with_cluster_policy_masquerades(c: &mut Cluster) {
    // Endpoint a2 lives on node1: through node2 the pod sees node2's LAN address.
    let reply = ask(c, "client", sa(node_ip(c, "node2"), 30080));
    assert_eq!(reply.pod, "a2");
    assert_eq!(reply.client.ip(), node_ip(c, "node2"));
    // Through node1 itself the source is node1's address on the pod's link.
    let reply = ask(c, "client", sa(node_ip(c, "node1"), 30080));
    assert_eq!(reply.pod, "a2");
    assert_eq!(reply.client.ip(), c.ip(v4(10, 244, 1, 1)));
}

fn load_balancer_ip_with_cluster_policy(c: &mut Cluster) {
    let reply = ask(c, "client", sa(v4(198, 18, 0, 203), 80));
    assert_eq!(reply.pod, "a2");
    assert_eq!(
        reply.client.ip(),
        node_ip(c, "node2"),
        "masqueraded by node2"
    );
}

fn local_policy_keeps_the_client_address(c: &mut Cluster) {
    let client_ip = c.ip(v4(198, 18, 0, 100));
    let reply = ask(c, "client", sa(v4(198, 18, 0, 200), 80));
    assert_eq!(reply.pod, "b2");
    assert_eq!(reply.client.ip(), client_ip);
    let reply = ask(c, "client", sa(node_ip(c, "node2"), 30081));
    assert_eq!(reply.pod, "b2");
    assert_eq!(reply.client.ip(), client_ip);
}

fn local_policy_drops_on_a_node_without_endpoints(c: &mut Cluster) {
    assert_dropped(c, "client", sa(v4(198, 18, 0, 201), 80));
    assert_dropped(c, "client", sa(node_ip(c, "node1"), 30081));
    // Inside the cluster the Service still reaches its endpoint from every node.
    let reply = ask(c, "c1", sa(svc_ip(12), 80));
    assert_eq!(reply.pod, "b2");
}

fn client_ip_affinity_sticks(c: &mut Cluster) {
    for from in ["c1", "node2"] {
        let pods = pods_of(&ask_many(c, from, sa(svc_ip(13), 80), 30));
        assert_eq!(
            pods.len(),
            1,
            "{from} should stick to one endpoint: {pods:?}"
        );
    }
}

/// The client's entries in node1's affinity sets (nftables), as `nft` lists them.
fn affinity_entries(c: &mut Cluster, client: std::net::IpAddr) -> usize {
    let listing = c.nft_listing_of("node1", "ip");
    let mut in_set = false;
    let mut count = 0;
    for line in listing.lines().map(str::trim) {
        if line.starts_with("set BERTH-SEP-") {
            in_set = true;
        } else if line == "}" {
            in_set = false;
        } else if in_set && line.starts_with("elements") && line.contains(&client.to_string()) {
            count += 1;
        }
    }
    count
}

/// ClientIP affinity and an open connection survive an agent restart: the restarted agent
/// adopts its nftables table (nothing rewritten, the dynamic sets' entries kept) or restores the
/// same iptables chains (the `recent` lists live on), so the client keeps its endpoint.
fn client_ip_affinity_survives_an_agent_restart(c: &mut Cluster) {
    let (mut conn, first) =
        EchoConnection::open(&c.netns("c1"), sa(svc_ip(10), 80), OK_TIMEOUT).unwrap();
    let before = pods_of(&ask_many(c, "c1", sa(svc_ip(13), 80), 10));
    assert_eq!(before.len(), 1, "c1 sticks to one endpoint: {before:?}");
    let client = pod_ip(&c.topo, "c1");
    let nftables = c.backend == Backend::Nftables;
    if nftables {
        assert_eq!(affinity_entries(c, client), 1, "c1's affinity entry");
    }
    let dispatch = c.dispatch;
    for round in 0..2 {
        c.restart_agents(dispatch);
        assert_eq!(
            conn.ping().unwrap(),
            first,
            "round {round}: the open connection"
        );
        if nftables {
            assert_eq!(
                affinity_entries(c, client),
                1,
                "round {round}: c1's entry kept"
            );
        }
        let after = pods_of(&ask_many(c, "c1", sa(svc_ip(13), 80), 10));
        assert_eq!(
            after.keys().collect::<Vec<_>>(),
            before.keys().collect::<Vec<_>>(),
            "round {round}: c1 keeps its endpoint across the restart"
        );
    }
}

fn three_endpoints_share_the_load(c: &mut Cluster) {
    const N: usize = 300;
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(14), 80), N));
    // Binomial(300, 1/3): mean 100, sigma 8.2; 5 sigma either side.
    let (mean, sigma) = (
        N as f64 / 3.0,
        (N as f64 * (1.0 / 3.0) * (2.0 / 3.0)).sqrt(),
    );
    let (low, high) = (mean - 5.0 * sigma, mean + 5.0 * sigma);
    assert_eq!(pods.len(), 3, "{pods:?}");
    for (pod, count) in &pods {
        let count = *count as f64;
        assert!(
            (low..=high).contains(&count),
            "{pod} got {count} of {N} (expected {low:.0}..={high:.0}): {pods:?}"
        );
    }
}

fn no_endpoints_is_refused(c: &mut Cluster) {
    assert_refused(c, "c1", sa(svc_ip(15), 80));
    assert_refused(c, "node2", sa(svc_ip(15), 80));
    assert_refused(c, "client", sa(node_ip(c, "node1"), 30085));
}

fn terminating_endpoints_serve_when_none_is_ready(c: &mut Cluster) {
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(16), 80), 20));
    assert_eq!(
        pods.keys().collect::<Vec<_>>(),
        ["a1"],
        "only the serving one: {pods:?}"
    );
}

fn load_balancer_source_ranges(c: &mut Cluster) {
    let reply = ask(c, "client", sa(v4(198, 18, 0, 202), 80));
    assert_eq!(reply.pod, "a2");
    assert_dropped(c, "other", sa(v4(198, 18, 0, 202), 80));
    // The ranges guard the load-balancer address, not the node port.
    let reply = ask(c, "other", sa(node_ip(c, "node1"), 30087));
    assert_eq!(reply.pod, "a2");
}

fn hairpin_lands_on_the_pod_itself(c: &mut Cluster) {
    let reply = ask(c, "a1", sa(svc_ip(18), 80));
    assert_eq!(reply.pod, "a1");
    // Masqueraded to the gateway, or a1 would answer itself directly and drop the reply.
    assert_eq!(reply.client.ip(), c.ip(v4(10, 244, 1, 1)));
}

fn node_port_on_localhost(c: &mut Cluster) {
    match c.family {
        IpFamily::V4 => {
            let reply = ask(c, "node1", sa(v4(127, 0, 0, 1), 30080));
            assert_eq!(reply.pod, "a2");
        }
        // As with kube-proxy, never in IPv6: the kernel drops a packet from ::1 that leaves the
        // loopback device, so the node port must not capture it; nothing listens there.
        IpFamily::V6 => assert_refused(c, "node1", sa(v4(127, 0, 0, 1), 30080)),
    }
}

fn a_partial_sync_moves_traffic_and_removes_stale_chains(c: &mut Cluster) {
    let original = c.services.clone();
    let a1 = pod_ip(&c.topo, "a1");
    let a1_twins = FAMILIES.map(|f| family::in_family(a1, f));
    let seps_before = c.programmed_endpoints("node1");
    for port in c.services.iter_mut().filter(|p| p.name.name == "spread") {
        port.endpoints
            .edit(|eps| eps.retain(|ep| a1_twins.contains(&ep.ip)));
    }
    c.sync_all(SyncKind::Partial);
    assert_eq!(c.programmed_endpoints("node1"), seps_before - 2);
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(14), 80), 30));
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["a1"], "{pods:?}");

    c.services = original;
    c.sync_all(SyncKind::Partial);
    assert_eq!(c.programmed_endpoints("node1"), seps_before);
    // Missing one of three endpoints in 60 tries has a probability of about 1e-10.
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(14), 80), 60));
    assert_eq!(pods.len(), 3, "{pods:?}");
}

/// `iptables-save` (of the family under test) without berth's own lines and without packet
/// counters.
fn foreign_rules(c: &mut Cluster, node: &str) -> Vec<String> {
    let ns = c.netns(node);
    let save = c.iptables_save_cmd();
    let dump = c.topo.exec(&ns, &[save]).unwrap();
    dump.lines()
        .filter(|l| !l.starts_with('#') && !l.contains("BERTH-"))
        .map(|l| match l.strip_prefix(':') {
            Some(decl) => decl
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
            None => l.to_string(),
        })
        .collect()
}

fn iptables(c: &mut Cluster, ns: &str, line: &str) -> Result<String, TopologyError> {
    let argv: Vec<&str> = std::iter::once(c.iptables_cmd())
        .chain(line.split_whitespace())
        .collect();
    c.topo.exec(ns, &argv)
}

/// Removes the foreign chains of [`agent_restart_breaks_and_flushes_nothing`], whatever state an
/// earlier failed run left them in.
fn remove_foreign_chains(c: &mut Cluster, ns: &str) {
    for line in [
        "-t filter -D INPUT -j KEEP-FILTER",
        "-t filter -F KEEP-FILTER",
        "-t filter -X KEEP-FILTER",
        "-t nat -F KEEP-NAT",
        "-t nat -X KEEP-NAT",
    ] {
        // Absent chains are what this wants.
        let _ = iptables(c, ns, line);
    }
}

fn agent_restart_breaks_and_flushes_nothing(c: &mut Cluster) {
    let ns = c.netns("node1");
    remove_foreign_chains(c, &ns);
    let stranger = c.ip(v4(10, 244, 9, 9));
    for line in [
        "-t nat -N KEEP-NAT".to_string(),
        format!("-t nat -A KEEP-NAT -s {stranger} -j RETURN"),
        "-t filter -N KEEP-FILTER".to_string(),
        format!("-t filter -A KEEP-FILTER -s {stranger} -j DROP"),
        "-t filter -A INPUT -j KEEP-FILTER".to_string(),
    ] {
        iptables(c, &ns, &line).unwrap();
    }
    let before = foreign_rules(c, "node1");
    assert!(before.iter().any(|l| l.contains("KEEP-NAT")), "{before:?}");
    // Another program's nftables table too, where `nft` is installed.
    let with_nft = missing(&[Requirement::Nft]).is_empty();
    let nft_family = c.nft_family();
    let foreign_before = with_nft.then(|| {
        let _ = c.topo.exec(&ns, &["nft", "delete", "table", nft_family, "keep"]);
        let script = format!(
            "add table {nft_family} keep; add chain {nft_family} keep input {{ type filter hook input priority 10 ; }}; add rule {nft_family} keep input {nft_family} saddr {stranger} drop"
        );
        c.topo.exec(&ns, &["nft", &script]).unwrap();
        foreign_table(c, &ns)
    });

    let (mut conn, first) =
        EchoConnection::open(&c.netns("c1"), in_plan(c, sa(svc_ip(10), 80)), OK_TIMEOUT).unwrap();
    let dispatch = c.dispatch;
    c.restart_agents(dispatch);
    for _ in 0..3 {
        assert_eq!(
            conn.ping().unwrap(),
            first,
            "the open connection keeps its endpoint"
        );
    }
    assert_eq!(
        foreign_rules(c, "node1"),
        before,
        "rules berth does not own are untouched"
    );
    if let Some(foreign_before) = foreign_before {
        assert_eq!(
            foreign_table(c, &ns),
            foreign_before,
            "other programs' nftables tables are untouched"
        );
        c.topo
            .exec(&ns, &["nft", "delete", "table", nft_family, "keep"])
            .unwrap();
    }
    if c.backend == Backend::Nftables {
        // The restart replaced berth's table in one transaction; the steady state follows.
        steady_state_after_restart(c, dispatch);
        remove_foreign_chains(c, &ns);
        return;
    }
    // The restarted agent found its jumps in place rather than inserting them again.
    let save = c.iptables_save_cmd();
    let dump = c.topo.exec(&ns, &[save]).unwrap();
    let jumps = dump
        .lines()
        .filter(|l| {
            let chain = l
                .strip_prefix("-A ")
                .and_then(|r| r.split_whitespace().next());
            chain.is_some_and(|chain| !chain.starts_with("BERTH-")) && l.contains("-j BERTH-")
        })
        .count();
    assert_eq!(jumps, builtin_jumps().len(), "{dump}");
    steady_state_after_restart(c, dispatch);
    remove_foreign_chains(c, &ns);
}

/// A steady state after a restart: the next sync writes nothing but what linear iptables
/// dispatch rewrites every time.
fn steady_state_after_restart(c: &mut Cluster, dispatch: Dispatch) {
    let view = c.view("node1");
    let family = c.family;
    let syncer = c.syncers.get_mut(&("node1", family)).unwrap();
    let report = syncer
        .sync(&plan(&view, &Cluster::options(dispatch, family)))
        .unwrap();
    assert_eq!(report.kind, SyncKind::Partial);
    if dispatch == Dispatch::Tree || c.backend == Backend::Nftables {
        assert_eq!(report.payload_bytes, 0, "{report:?}");
    }
}

/// Another program's nftables table, its rules as `nft` lists them.
fn foreign_table(c: &mut Cluster, ns: &str) -> String {
    let family = c.nft_family();
    c.topo
        .exec(ns, &["nft", "list", "table", family, "keep"])
        .unwrap()
}

/// berth's rules live in one backend only: after a switch the other holds nothing of berth's.
fn the_other_backend_holds_no_berth_rules(c: &mut Cluster) {
    let (save, family) = (c.iptables_save_cmd(), c.nft_family());
    for node in NODES {
        let ns = c.netns(node);
        let iptables = c.topo.exec(&ns, &[save]).unwrap();
        let nft_table = c.topo.exec(&ns, &["nft", "list", "table", family, "berth"]);
        match c.backend {
            Backend::Iptables => {
                assert!(iptables.contains(":BERTH-SERVICES"), "{node}");
                assert!(nft_table.is_err(), "{node}: {nft_table:?}");
            }
            Backend::Nftables => {
                assert!(!iptables.contains("BERTH-"), "{node}: {iptables}");
                assert!(nft_table.unwrap().contains("service-ips"), "{node}");
            }
        }
    }
}

type Scenario = fn(&mut Cluster);

const SCENARIOS: &[(&str, Scenario)] = &[
    ("cluster_ip_from_a_pod", cluster_ip_from_a_pod),
    ("cluster_ip_udp_from_a_pod", cluster_ip_udp_from_a_pod),
    ("cluster_ip_from_the_nodes", cluster_ip_from_the_nodes),
    (
        "node_port_with_cluster_policy_masquerades",
        node_port_with_cluster_policy_masquerades,
    ),
    (
        "load_balancer_ip_with_cluster_policy",
        load_balancer_ip_with_cluster_policy,
    ),
    (
        "local_policy_keeps_the_client_address",
        local_policy_keeps_the_client_address,
    ),
    (
        "local_policy_drops_on_a_node_without_endpoints",
        local_policy_drops_on_a_node_without_endpoints,
    ),
    ("client_ip_affinity_sticks", client_ip_affinity_sticks),
    (
        "client_ip_affinity_survives_an_agent_restart",
        client_ip_affinity_survives_an_agent_restart,
    ),
    (
        "three_endpoints_share_the_load",
        three_endpoints_share_the_load,
    ),
    ("no_endpoints_is_refused", no_endpoints_is_refused),
    (
        "terminating_endpoints_serve_when_none_is_ready",
        terminating_endpoints_serve_when_none_is_ready,
    ),
    ("load_balancer_source_ranges", load_balancer_source_ranges),
    (
        "hairpin_lands_on_the_pod_itself",
        hairpin_lands_on_the_pod_itself,
    ),
    ("node_port_on_localhost", node_port_on_localhost),
    (
        "a_partial_sync_moves_traffic_and_removes_stale_chains",
        a_partial_sync_moves_traffic_and_removes_stale_chains,
    ),
    (
        "agent_restart_breaks_and_flushes_nothing",
        agent_restart_breaks_and_flushes_nothing,
    ),
    (
        "the_other_backend_holds_no_berth_rules",
        the_other_backend_holds_no_berth_rules,
    ),
    (
        "split_trees_reach_every_leaf",
        split::split_trees_reach_every_leaf,
    ),
    (
        "udp_node_port_load_balancer_and_a_replaced_endpoint",
        flows::udp_node_port_load_balancer_and_a_replaced_endpoint,
    ),
    (
        "client_ip_affinity_expires",
        flows::client_ip_affinity_expires,
    ),
    (
        "service_address_wins_over_a_node_port_in_another_shard",
        flows::service_address_wins_over_a_node_port_in_another_shard,
    ),
    (
        "node_ports_answer_only_inside_the_cidrs",
        node_port_addresses::node_ports_answer_only_inside_the_cidrs,
    ),
    (
        "topology_same_zone_endpoints_only",
        topology::same_zone_endpoints_only,
    ),
    (
        "topology_same_node_endpoints_only",
        topology::same_node_endpoints_only,
    ),
    (
        "topology_no_endpoint_in_the_zone_falls_back_to_all",
        topology::no_endpoint_in_the_zone_falls_back_to_all,
    ),
    (
        "service_cidrs_refuse_undefined_ports_and_drop_unallocated_addresses",
        service_cidrs::undefined_ports_are_refused_and_unallocated_addresses_dropped,
    ),
];

/// The backends and dispatch modes every scenario runs in, in this order: iptables with both
/// dispatch modes, then nftables (whose verdict maps linear dispatch becomes).
const MODES: [(Backend, Dispatch); 3] = [
    (Backend::Iptables, Dispatch::Tree),
    (Backend::Iptables, Dispatch::Linear),
    (Backend::Nftables, Dispatch::Linear),
];

fn label((backend, dispatch): (Backend, Dispatch)) -> String {
    match backend {
        Backend::Iptables => format!("{dispatch:?}").to_lowercase(),
        Backend::Nftables => "nftables".to_string(),
    }
}

fn family_label(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    }
}

/// What a mode needs beyond [`DATAPATH_NEEDS`].
fn mode_needs((backend, _): (Backend, Dispatch)) -> &'static [Requirement] {
    match backend {
        Backend::Iptables => &[Requirement::Ip6tables],
        Backend::Nftables => &[Requirement::Nft],
    }
}

/// libtest's summary line, so `make test` counts these scenarios with every other test.
fn result_line(passed: usize, failed: usize, ignored: usize, filtered: usize) -> String {
    format!(
        "test result: {}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out",
        if failed == 0 { "ok" } else { "FAILED" }
    )
}

/// One scenario in one family, as libtest names it: `<mode>::<family>::<name>`.
struct Case {
    family: IpFamily,
    name: &'static str,
    scenario: Scenario,
}

fn case_label(mode: (Backend, Dispatch), case: &Case) -> String {
    format!(
        "{}::{}::{}",
        label(mode),
        family_label(case.family),
        case.name
    )
}

/// The cases of `mode` whose label matches a filter (every case without filters).
fn selected_cases(mode: (Backend, Dispatch), filters: &[String]) -> Vec<Case> {
    FAMILIES
        .into_iter()
        .flat_map(|family| {
            SCENARIOS.iter().map(move |(name, scenario)| Case {
                family,
                name,
                scenario: *scenario,
            })
        })
        .filter(|case| {
            let label = case_label(mode, case);
            filters.is_empty() || filters.iter().any(|f| label.contains(f.as_str()))
        })
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for mode in MODES {
            for case in selected_cases(mode, &[]) {
                println!("{}: test", case_label(mode, &case));
            }
        }
        return ExitCode::SUCCESS;
    }
    let filters: Vec<String> = args.into_iter().filter(|a| !a.starts_with('-')).collect();
    let plan: Vec<((Backend, Dispatch), Vec<Case>)> = MODES
        .into_iter()
        .map(|mode| (mode, selected_cases(mode, &filters)))
        .collect();
    let total: usize = plan.iter().map(|(_, cases)| cases.len()).sum();
    let filtered = SCENARIOS.len() * FAMILIES.len() * MODES.len() - total;
    println!("\nrunning {total} tests");
    match decide(&missing(DATAPATH_NEEDS), strict()) {
        Verdict::Run => {}
        Verdict::Skip(reason) => {
            for (mode, cases) in &plan {
                for case in cases {
                    println!("test {} ... ignored, {reason}", case_label(*mode, case));
                }
            }
            println!("\n{}\n", result_line(0, 0, total, filtered));
            return ExitCode::SUCCESS;
        }
        Verdict::Fail(reason) => {
            println!(
                "datapath traffic tests cannot run: {reason} (CI=true or BERTH_REQUIRE_ROOT=1)"
            );
            println!("\n{}\n", result_line(0, total, 0, filtered));
            return ExitCode::FAILURE;
        }
    }
    if total == 0 {
        println!("\n{}\n", result_line(0, 0, 0, filtered));
        return ExitCode::SUCCESS;
    }
    // Namespaces of an earlier run that was killed before it could clean up.
    if let Ok(removed) = remove_orphans(TAG) {
        if !removed.is_empty() {
            eprintln!("removed leftover namespaces {removed:?}");
        }
    }

    let mut cluster = Cluster::build();
    let mut failed = Vec::new();
    let mut passed = 0;
    let mut ignored = 0;
    for (mode, cases) in &plan {
        let (backend, dispatch) = *mode;
        if cases.is_empty() {
            continue;
        }
        match decide(&missing(mode_needs(*mode)), strict()) {
            Verdict::Run => {}
            Verdict::Skip(reason) => {
                for case in cases {
                    println!("test {} ... ignored, {reason}", case_label(*mode, case));
                    ignored += 1;
                }
                continue;
            }
            Verdict::Fail(reason) => {
                for case in cases {
                    let label = case_label(*mode, case);
                    println!("test {label} ... FAILED ({reason})");
                    failed.push(label);
                }
                continue;
            }
        }
        let start = || {
            if cluster.backend != backend {
                cluster.switch_backend(backend);
            }
            cluster.restart_agents(dispatch)
        };
        if let Err(panic) = catch_unwind(AssertUnwindSafe(start)) {
            // Every scenario of this mode counts as failed: none of them ran.
            for case in cases {
                let label = case_label(*mode, case);
                println!("test {label} ... FAILED (the sync before it failed)");
                failed.push(label);
            }
            println!("sync {}: {panic:?}", label(*mode));
            continue;
        }
        for case in cases {
            cluster.family = case.family;
            let label = case_label(*mode, case);
            let result = catch_unwind(AssertUnwindSafe(|| (case.scenario)(&mut cluster)));
            match result {
                Ok(()) => {
                    passed += 1;
                    println!("test {label} ... ok");
                }
                Err(_) => {
                    println!("test {label} ... FAILED");
                    failed.push(label);
                }
            }
        }
    }
    let Cluster { topo, echoes, .. } = cluster;
    drop(echoes);
    let cleanup = topo.destroy();
    println!(
        "\n{}\n",
        result_line(passed, failed.len(), ignored, filtered)
    );
    if let Err(err) = cleanup {
        println!("cleanup: {err}");
        return ExitCode::FAILURE;
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failures: {failed:?}");
        ExitCode::FAILURE
    }
}
