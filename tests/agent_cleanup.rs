//! `berth agent --cleanup` in a node namespace: berth's real rulesets are programmed on every
//! backend at once (nftables `ip berth` and `ip6 berth`, iptables-legacy and iptables-nft for
//! both families) beside rules that are not berth's (a `KUBE-SERVICES` chain with its jump in
//! both iptables variants, an unrelated nftables table); after `--cleanup` no berth table, chain
//! or jump remains and every foreign rule is byte-identical to before. Root, iproute2, nft and
//! the iptables tools (skips with a message elsewhere, fails under `CI=true`).
//!
//! Address plan: the namespace `berth-cl<pid>` has only loopback; the Service is 10.96.0.10 /
//! fd00:96::10 with the endpoint 10.244.1.5 / fd00:244:1::5 (no traffic is sent).

#![allow(clippy::unwrap_used)]

use std::process::Command;

use berth_agent::IpFamily;
use berth_datapath::iptables::{Backend, CommandIptables, Syncer};
use berth_datapath::nft::{CommandNft, NftSyncer, Shards};
use berth_datapath::plan::convert::{build_node_view, ProxyMode};
use berth_datapath::{PlanOptions, Planner};
use berth_testing::{require, Requirement};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("berth-cl{}", std::process::id());
        for args in [
            vec!["netns", "add", &name],
            vec!["-n", &name, "link", "set", "lo", "up"],
        ] {
            assert!(Command::new("ip").args(&args).status().unwrap().success());
        }
        Netns(name)
    }

    fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.0, program])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Everything this namespace's netfilter holds, per tool, without the dump's dated comments
    /// and packet counters.
    fn dumps(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for tool in [
            "iptables-legacy-save",
            "ip6tables-legacy-save",
            "iptables-nft-save",
            "ip6tables-nft-save",
        ] {
            let text: Vec<String> = self
                .run(tool, &[], None)
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| match l.split_once(" [") {
                    Some((chain, _)) if l.starts_with(':') => chain.to_string(),
                    _ => l.to_string(),
                })
                .collect();
            out.push((tool.to_string(), without_empty_tables(&text)));
        }
        // The unrelated program's table, byte for byte; iptables-nft's own tables are compared
        // through iptables-nft-save above (programming berth's jumps made it add empty built-in
        // chains that it keeps, as it does for any rule added and deleted).
        out.push((
            "nft someone-else".into(),
            self.run("nft", &["list", "table", "inet", "someone-else"], None),
        ));
        out.push(("nft".into(), self.run("nft", &["list", "ruleset"], None)));
        out
    }
}

/// The dump without tables that hold no rule and only built-in chains: programming berth's rules
/// makes the kernel create a legacy table (mangle, say) that outlives them, empty, as a table
/// of x_tables cannot be removed. A table with any rule or any user chain is kept whole.
fn without_empty_tables(lines: &[String]) -> String {
    let mut out = Vec::new();
    let mut table: Vec<&String> = Vec::new();
    for line in lines {
        table.push(line);
        if line == "COMMIT" {
            let empty = table.iter().all(|l| {
                l.starts_with('*')
                    || *l == "COMMIT"
                    || (l.ends_with(" ACCEPT") && l.starts_with(':'))
            });
            if !empty {
                out.extend(table.iter().map(|l| l.as_str()));
            }
            table.clear();
        }
    }
    out.extend(table.iter().map(|l| l.as_str()));
    out.join("\n")
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Rules that are not berth's: kube-proxy's entry chain in both iptables variants and both
/// families, and an nftables table of another program.
fn add_foreign(ns: &Netns) {
    for tool in [
        "iptables-legacy",
        "iptables-nft",
        "ip6tables-legacy",
        "ip6tables-nft",
    ] {
        ns.run(tool, &["-t", "nat", "-N", "KUBE-SERVICES"], None);
        ns.run(
            tool,
            &["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"],
            None,
        );
        ns.run(
            tool,
            &[
                "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT",
            ],
            None,
        );
    }
    ns.run(
        "nft",
        &["-f", "-"],
        Some(
            "table inet someone-else {\n chain input {\n type filter hook input priority 0; policy accept;\n tcp dport 9100 counter accept\n }\n}\n",
        ),
    );
}

fn view() -> berth_datapath::NodeView {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node1"}})).unwrap();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.10",
                 "clusterIPs": ["10.96.0.10", "fd00:96::10"], "ipFamilies": ["IPv4", "IPv6"],
                 "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]}}))
    .unwrap();
    let slice = |family: &str, address: &str| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{family}"), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": family,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}, "nodeName": "node1"}]}))
        .unwrap()
    };
    let (view, errors) = build_node_view(
        &node,
        &[service],
        &[slice("IPv4", "10.244.1.5"), slice("IPv6", "fd00:244:1::5")],
        ProxyMode::Full,
    );
    assert!(errors.is_empty(), "{errors:?}");
    view
}

/// berth's real ruleset on every backend of the namespace.
fn program_berth(ns: &Netns) {
    let view = view();
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut planner = Planner::new(PlanOptions {
            family,
            ..PlanOptions::default()
        });
        planner.update(&view);
        let changes = planner.take_changes();
        for backend in [Backend::Legacy, Backend::Nft] {
            let iptables = CommandIptables::with_backend(family, backend).netns_named(&ns.0);
            Syncer::new(iptables)
                .sync_changes(planner.ruleset(), &changes)
                .unwrap();
        }
        // In nat shards, as the agent writes by default: the cleanup removes them too.
        NftSyncer::new(CommandNft::in_netns(&ns.0), family)
            .with_shards(Shards::new(4).unwrap())
            .sync_changes(planner.ruleset(), &changes)
            .unwrap();
    }
}

fn berth_lines(dumps: &[(String, String)]) -> Vec<String> {
    dumps
        .iter()
        .flat_map(|(tool, text)| {
            text.lines()
                .filter(|l| l.contains("BERTH") || l.contains("berth"))
                .map(move |l| format!("{tool}: {l}"))
        })
        .collect()
}

#[test]
fn cleanup_removes_every_berth_rule_and_nothing_else() {
    if !require(&[
        Requirement::Netns,
        Requirement::Iptables,
        Requirement::Ip6tables,
        Requirement::Nft,
    ]) {
        return;
    }
    let ns = Netns::new();
    add_foreign(&ns);
    let foreign = ns.dumps();
    program_berth(&ns);
    let programmed = ns.dumps();
    let berth = berth_lines(&programmed);
    // Every backend holds berth's rules, the jumps from the built-in chains included.
    for (tool, needle) in [
        ("iptables-legacy-save", "-A PREROUTING -m comment"),
        ("ip6tables-legacy-save", "-j BERTH-SERVICES"),
        ("iptables-nft-save", "-j BERTH-SERVICES"),
        ("ip6tables-nft-save", "-j BERTH-SERVICES"),
        ("nft", "table ip berth"),
        ("nft", "table ip6 berth"),
        ("nft", "table ip berth-4"),
        ("nft", "table ip6 berth-4"),
    ] {
        assert!(
            berth
                .iter()
                .any(|l| l.starts_with(&format!("{tool}: ")) && l.contains(needle)),
            "{tool} lacks {needle:?}: {berth:#?}"
        );
    }

    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            env!("CARGO_BIN_EXE_berth"),
            "agent",
            "--cleanup",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "--cleanup failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let after = ns.dumps();
    assert_eq!(berth_lines(&after), Vec::<String>::new());
    for ((tool, before), (_, now)) in foreign.iter().zip(&after) {
        if tool != "nft" {
            assert_eq!(before, now, "{tool} changed beyond berth's rules");
        }
    }

    // Nothing left to do: a second run succeeds and changes nothing.
    let again = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            env!("CARGO_BIN_EXE_berth"),
            "agent",
            "--cleanup",
        ])
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(ns.dumps(), after);
}
