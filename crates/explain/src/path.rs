//! A packet's path through a node's current ruleset (pure): what the agent read back from the
//! kernel becomes berth's typed ruleset, and the datapath's tracer follows the packet through
//! it, rule by rule. On iptables that is `iptables-save` text ([`ruleset_from_save`]); on
//! nftables a netlink dump of berth's table, decoded into the typed table berth wrote
//! ([`table_from_netlink`]), whose hops are shown in nft's words.
//!
//! Only berth's part of the ruleset is traced: `BERTH-*` chains and the jumps from built-in
//! chains into them (on nftables, berth's own table). Other programs' rules (kube-proxy's,
//! Docker's, another nftables table) are not followed; a built-in chain's own verdicts besides
//! those jumps are not either.

use std::net::{IpAddr, SocketAddr};

use berth_core::{IpFamily, Protocol};
use berth_datapath::iptables::rule_text::rule_args;
use berth_datapath::iptables::rule_text::{parse_rule, split_words};
use berth_datapath::nft::decode::decode_table;
use berth_datapath::nft::dump::RawTable;
use berth_datapath::nft::table::traced_shard;
use berth_datapath::nft::NftTable;
use berth_datapath::trace::{trace_paths, Hit, Origin, Packet, TraceEnv, TracedPath, Verdict};
use berth_datapath::{ChainName, JumpRule, Ruleset, Table};

use crate::Error;

fn is_builtin(chain: &str) -> bool {
    matches!(
        chain,
        "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
    )
}

/// berth's part of `iptables-save` output, as a restore payload: the table headers, berth's
/// chains and built-in chain declarations, berth's rules and the built-ins' jumps into berth.
pub fn berth_lines(save: &str) -> String {
    let mut out = String::new();
    for line in save.lines().map(str::trim) {
        let keep = if line.starts_with('*') || line == "COMMIT" {
            true
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or_default();
            chain.starts_with("BERTH-") || is_builtin(chain)
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or_default();
            chain.starts_with("BERTH-") || (is_builtin(chain) && rule.contains(" -j BERTH-"))
        } else {
            false
        };
        if !keep {
            continue;
        }
        if line.starts_with("-A ") {
            out.push_str(&berth_form(line));
        } else {
            // Counters (`[0:0]`) mean nothing to a restore.
            out.push_str(line.split(" [").next().unwrap_or(line));
        }
        out.push('\n');
    }
    out
}

/// A rule as `iptables-save` prints it, in the form berth writes it: `--set-xmark` back to
/// `--or-mark`/`--xor-mark`, `-m recent`'s options in berth's order without the default mask
/// and side, REJECT without its default `--reject-with`. A line that cannot be split is kept
/// as it is (and then refused by the parser, with its text).
pub fn berth_form(line: &str) -> String {
    let Ok(words) = berth_datapath::iptables::rule_text::split_words(line) else {
        return line.to_owned();
    };
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        let next = words.get(i + 1).map(String::as_str);
        match (w, next) {
            ("--set-xmark", Some(value)) => {
                match value.split_once('/') {
                    Some((v, mask)) if v == mask => out.extend(["--or-mark".into(), v.into()]),
                    Some((v, "0x0")) => out.extend(["--xor-mark".into(), v.into()]),
                    _ => out.extend([w.into(), value.into()]),
                }
                i += 2;
            }
            ("--reject-with", Some("icmp-port-unreachable" | "icmp6-port-unreachable")) => i += 2,
            ("-m", Some("recent")) => {
                let mut name = None;
                let mut action: Vec<String> = Vec::new();
                let mut j = i + 2;
                while let Some(opt) = words.get(j).map(String::as_str) {
                    match opt {
                        "--name" | "--mask" | "--seconds" => {
                            let value = words.get(j + 1).cloned().unwrap_or_default();
                            match opt {
                                "--name" => name = Some(value),
                                "--seconds" => action.extend(["--seconds".into(), value]),
                                _ => {}
                            }
                            j += 2;
                        }
                        "--set" | "--rcheck" => {
                            action.insert(0, opt.to_owned());
                            j += 1;
                        }
                        "--reap" => {
                            action.push(opt.to_owned());
                            j += 1;
                        }
                        "--rsource" => j += 1,
                        _ => break,
                    }
                }
                out.extend(["-m".into(), "recent".into(), "--name".into()]);
                out.push(name.unwrap_or_default());
                out.extend(action);
                i = j;
            }
            _ => {
                out.push(w.to_owned());
                i += 1;
            }
        }
    }
    out.iter()
        .map(|w| {
            if w.contains(' ') || w.is_empty() {
                format!("\"{w}\"")
            } else {
                w.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The typed ruleset of `iptables-save` text: berth's chains (declared ones stay, empty or
/// not) and the jumps from built-in chains into them. A jump to a chain the text does not
/// declare is refused, as iptables-restore would refuse it.
pub fn ruleset_from_save(save: &str) -> Result<Ruleset, Error> {
    let mut rs = Ruleset::default();
    let mut table: Option<Table> = None;
    let bad = |line: &str, reason: &str| Error::Ruleset {
        source: berth_datapath::Error::Parse {
            line: line.to_owned(),
            reason: reason.to_owned(),
        },
    };
    for line in berth_lines(save).lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Some(Table::parse(name).ok_or_else(|| bad(line, "unknown table"))?);
        } else if line == "COMMIT" {
            table = None;
        } else if let Some(decl) = line.strip_prefix(':') {
            let t = table.ok_or_else(|| bad(line, "outside a table"))?;
            let chain = ChainName::new(decl.split_whitespace().next().unwrap_or_default());
            if chain.is_berth() {
                rs.table_mut(t).chain_mut(&chain);
            }
        } else if line.starts_with("-A ") {
            let t = table.ok_or_else(|| bad(line, "outside a table"))?;
            let mut words = split_words(line).map_err(|source| Error::Ruleset { source })?;
            let chain = ChainName::new(words.get(1).cloned().unwrap_or_default());
            let rule =
                parse_rule(line, words.split_off(2)).map_err(|source| Error::Ruleset { source })?;
            if chain.is_builtin() {
                rs.jumps.push(JumpRule {
                    table: t,
                    from: chain,
                    rule,
                });
            } else {
                rs.table_mut(t).chain_mut(&chain).push(rule);
            }
        }
    }
    for (t, rules) in &rs.tables {
        let targets = rules
            .chains
            .values()
            .flatten()
            .chain(rs.jumps.iter().filter(|j| j.table == *t).map(|j| &j.rule))
            .filter_map(|r| r.jump_target());
        for target in targets {
            if !rules.chains.contains_key(target) {
                return Err(bad(
                    target.as_str(),
                    "jump to a chain the ruleset does not declare",
                ));
            }
        }
    }
    Ok(rs)
}

/// The typed table of berth's nftables table of `family`, from the dump an agent sent
/// ([`RawTable::to_bytes`]); anything in it berth never writes is an error naming it.
pub fn table_from_netlink(family: IpFamily, bytes: &[u8]) -> Result<NftTable, Error> {
    RawTable::from_bytes(bytes)
        .and_then(|raw| decode_table(family, &raw))
        .map_err(|source| Error::Ruleset { source })
}

/// A hop of an iptables path: `table/chain: rule`, as `iptables-save` prints the rule.
pub fn iptables_hop(hit: &Hit) -> String {
    format!("{}/{}: {}", hit.table, hit.chain, rule_args(&hit.rule))
}

/// The packet to explain: TCP unless said otherwise, arriving on the node from the network.
pub fn packet(from: IpAddr, to: SocketAddr, protocol: Protocol) -> Packet {
    Packet {
        src: from,
        dst: to.ip(),
        protocol,
        dport: to.port(),
        origin: Origin::Network,
        bridged: false,
    }
}

/// Every path of `packet` through `rs` on a node whose own addresses are `local`.
pub fn explain_paths(
    rs: &Ruleset,
    local: &[IpAddr],
    packet: &Packet,
) -> Result<Vec<TracedPath>, Error> {
    let env = TraceEnv {
        local_addresses: local.to_vec(),
        recent: Default::default(),
    };
    trace_paths(rs, &env, packet).map_err(|source| Error::Trace { source })
}

/// The paths as text: each rule hit (as `hop` writes it), then where the packet ends.
pub fn render_paths(
    packet: &Packet,
    node: &str,
    paths: &[TracedPath],
    hop: &dyn Fn(&Hit) -> String,
) -> String {
    let mut out = format!(
        "Path of {} {} -> {}:{} arriving on {node}:\n",
        berth_datapath::protocol_keyword(packet.protocol),
        packet.src,
        packet.dst,
        packet.dport
    );
    let mut sorted: Vec<&TracedPath> = paths.iter().collect();
    sorted.sort_by(|a, b| a.outcome.cmp(&b.outcome));
    for (i, path) in sorted.iter().enumerate() {
        out.push_str(&format!(
            "  path {} (probability {:.3}):\n",
            i + 1,
            path.probability
        ));
        let (hits, passed) = skip_shard_passes(&path.hits);
        if !passed.is_empty() {
            out.push_str(&format!(
                "    (nothing matched in the lookups of {} of the nat shards: {})\n",
                passed.len(),
                shard_list(&passed)
            ));
        }
        for hit in hits {
            out.push_str(&format!("    {}\n", hop(hit)));
        }
        let masq = if path.outcome.masqueraded {
            "masqueraded (the endpoint sees the node's address)"
        } else {
            "not masqueraded (the endpoint sees the client's address)"
        };
        let end = match path.outcome.verdict {
            Verdict::Dnat(to) => format!("DNAT to {to}, {masq}"),
            Verdict::Delivered => "not translated by berth: delivered to its own destination".to_owned(),
            Verdict::Reject => "REJECTED: the Service has no endpoint for it (the client sees connection refused)".to_owned(),
            Verdict::Drop => "DROPPED: no local endpoint for externalTrafficPolicy Local, or outside loadBalancerSourceRanges".to_owned(),
        };
        out.push_str(&format!("    => {end}\n"));
    }
    if paths.is_empty() {
        out.push_str("  no path: the tracer found none\n");
    }
    out
}

/// The nat shard a traced hit is in.
fn hit_shard(hit: &Hit) -> Option<u16> {
    traced_shard(&hit.chain).map(|(_, shard)| shard)
}

/// The hits worth showing, and the shards the packet only passed through: with nat shards every
/// packet enters each shard's lookup in turn, and a shard whose lookup matched nothing leaves one
/// hit (its base chain's jump) between hits in other tables, where a lookup that matched leaves
/// at least two in a row. Those lone hits are counted, not listed.
fn skip_shard_passes(hits: &[Hit]) -> (Vec<&Hit>, Vec<u16>) {
    let mut shown = Vec::new();
    let mut passed = Vec::new();
    for (i, hit) in hits.iter().enumerate() {
        let neighbour_in = |j: Option<usize>, shard: u16| {
            j.and_then(|j| hits.get(j)).and_then(hit_shard) == Some(shard)
        };
        match hit_shard(hit) {
            Some(shard)
                if !neighbour_in(i.checked_sub(1), shard) && !neighbour_in(Some(i + 1), shard) =>
            {
                if !passed.contains(&shard) {
                    passed.push(shard);
                }
            }
            _ => shown.push(hit),
        }
    }
    (shown, passed)
}

/// `berth-1…26, berth-28…32`: shard numbers as runs.
fn shard_list(shards: &[u16]) -> String {
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for n in sorted {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == n => *end = n,
            _ => runs.push((n, n)),
        }
    }
    runs.iter()
        .map(|(a, b)| {
            if a == b {
                format!("berth-{a}")
            } else {
                format!("berth-{a}…{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_datapath::Target;

    /// What iptables-save printed for a small ruleset on a lab node (kube-proxy's and Docker's
    /// lines mixed in, counters included).
    const SAVE: &str = r#"# Generated by iptables-save v1.8.9 (nf_tables) on Sat Nov 28 09:00:00 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:BERTH-SERVICES - [0:0]
:BERTH-SVC-AAAA - [0:0]
:BERTH-SEP-BBBB - [0:0]
:BERTH-SEP-CCCC - [0:0]
:BERTH-MARK-MASQ - [0:0]
:BERTH-POSTROUTING - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m comment --comment "berth service portals" -j BERTH-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -m comment --comment "berth postrouting rules" -j BERTH-POSTROUTING
-A BERTH-SERVICES -d 198.18.0.200/32 -p tcp -m comment --comment "default/web:http loadbalancer IP" -m tcp --dport 80 -j BERTH-SVC-AAAA
-A BERTH-SVC-AAAA ! -s 10.244.0.0/16 -d 198.18.0.200/32 -p tcp -m comment --comment "default/web:http loadbalancer IP" -m tcp --dport 80 -j BERTH-MARK-MASQ
-A BERTH-SVC-AAAA -m comment --comment "default/web:http -> 10.244.1.2:8080" -m statistic --mode random --probability 0.50000000000 -j BERTH-SEP-BBBB
-A BERTH-SVC-AAAA -m comment --comment "default/web:http -> 10.244.2.2:8080" -j BERTH-SEP-CCCC
-A BERTH-SEP-BBBB -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.1.2:8080
-A BERTH-SEP-CCCC -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.2.2:8080
-A BERTH-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A BERTH-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A BERTH-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A BERTH-POSTROUTING -m comment --comment "berth service traffic requiring SNAT" -j MASQUERADE --random-fully
-A DOCKER -i docker0 -j RETURN
COMMIT
"#;

    #[test]
    fn only_berths_lines_are_kept() {
        let kept = berth_lines(SAVE);
        assert!(!kept.contains("DOCKER"), "{kept}");
        assert!(!kept.contains("[0:0]"), "{kept}");
        assert!(kept.contains(":PREROUTING ACCEPT\n"), "{kept}");
        assert!(kept.contains(
            "-A PREROUTING -m comment --comment \"berth service portals\" -j BERTH-SERVICES"
        ));
    }

    #[test]
    fn a_saved_ruleset_is_traced_to_each_endpoint() {
        let rs = ruleset_from_save(SAVE).unwrap();
        let node: IpAddr = "198.18.0.11".parse().unwrap();
        let p = packet(
            "198.18.0.100".parse().unwrap(),
            "198.18.0.200:80".parse().unwrap(),
            Protocol::Tcp,
        );
        let paths = explain_paths(&rs, &[node], &p).unwrap();
        let mut ends: Vec<(Verdict, bool)> = paths
            .iter()
            .map(|p| (p.outcome.verdict.clone(), p.outcome.masqueraded))
            .collect();
        ends.sort();
        assert_eq!(
            ends,
            [
                (Verdict::Dnat("10.244.1.2:8080".parse().unwrap()), true),
                (Verdict::Dnat("10.244.2.2:8080".parse().unwrap()), true)
            ]
        );
        for path in &paths {
            assert!((path.probability - 0.5).abs() < 1e-6);
            let dnat = path
                .hits
                .iter()
                .find(|h| matches!(h.rule.target, Some(Target::Dnat(_))))
                .unwrap();
            assert!(dnat.chain.as_str().starts_with("BERTH-SEP-"));
        }
        let text = render_paths(&p, "node1", &paths, &iptables_hop);
        assert!(text.contains("nat/PREROUTING:"), "{text}");
        assert!(
            text.contains("DNAT to 10.244.1.2:8080, masqueraded"),
            "{text}"
        );
        assert!(text.contains("probability 0.500"), "{text}");
    }

    #[test]
    fn another_port_is_left_alone() {
        let rs = ruleset_from_save(SAVE).unwrap();
        let p = packet(
            "198.18.0.100".parse().unwrap(),
            "198.18.0.200:81".parse().unwrap(),
            Protocol::Tcp,
        );
        let paths = explain_paths(&rs, &[], &p).unwrap();
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0].outcome.verdict, Verdict::Delivered);
    }

    /// berth's nftables table for one Service with two endpoints, as a node's agent dumps it.
    fn nft_dump() -> Vec<u8> {
        use berth_datapath::nft::render::{Command, Element, Hook, NftChain, NftRule, TABLE};
        use berth_datapath::nft::{netlink::build_batch, Transaction};
        use berth_datapath::{Match, Rule};
        let chain = |name: &str| NftChain::new(Table::Nat, &ChainName::new(name));
        let (pre, services, svc) = (
            chain("PREROUTING"),
            chain("BERTH-SERVICES"),
            chain("BERTH-SVC-AAAA"),
        );
        let mut tx = Transaction::new(IpFamily::V4);
        tx.push(Command::AddTable(0));
        tx.push(Command::AddMaps(0));
        tx.push(Command::AddChain(
            pre.clone(),
            Hook::of_builtin(Table::Nat, &pre.name),
        ));
        tx.push(Command::AddChain(services.clone(), None));
        tx.push(Command::AddChain(svc.clone(), None));
        tx.push(Command::AddRule(
            pre,
            NftRule::Rule(Rule::jump(
                vec![Match::comment("berth service portals")],
                &services.name,
            )),
        ));
        tx.push(Command::AddRule(services, NftRule::ServiceMap));
        for (rule, to) in [
            (vec![Match::Random { one_in: 2 }], "10.244.1.2:8080"),
            (vec![], "10.244.2.2:8080"),
        ] {
            tx.push(Command::AddRule(
                svc.clone(),
                NftRule::Rule(Rule::new(rule, Target::Dnat(to.parse().unwrap()))),
            ));
        }
        tx.push(Command::AddElement(Element::Service(
            ("198.18.0.200".parse().unwrap(), Protocol::Tcp, 80),
            svc,
        )));
        RawTable::of_batch(&build_batch(&tx, TABLE, 1).bytes).to_bytes()
    }

    #[test]
    fn an_nftables_dump_is_traced_to_each_endpoint_in_nfts_words() {
        let table = table_from_netlink(IpFamily::V4, &nft_dump()).unwrap();
        let p = packet(
            "198.18.0.100".parse().unwrap(),
            "198.18.0.200:80".parse().unwrap(),
            Protocol::Tcp,
        );
        let paths = explain_paths(&table.traceable(), &[], &p).unwrap();
        let text = render_paths(&p, "node1", &paths, &|hit| {
            table.hop_text(IpFamily::V4, hit)
        });
        for line in [
            "  path 1 (probability 0.500):",
            "    nat-PREROUTING: jump nat-BERTH-SERVICES comment \"berth service portals\"",
            "    nat-BERTH-SERVICES: ip daddr . meta l4proto . th dport vmap @service-ips (element 198.18.0.200 . tcp . 80 : jump nat-BERTH-SVC-AAAA)",
            "    nat-BERTH-SVC-AAAA: numgen random mod 2 == 0 dnat to 10.244.1.2:8080",
            "    => DNAT to 10.244.1.2:8080, not masqueraded (the endpoint sees the client's address)",
            "    nat-BERTH-SVC-AAAA: dnat to 10.244.2.2:8080",
            "    => DNAT to 10.244.2.2:8080, not masqueraded (the endpoint sees the client's address)",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\nnot in\n{text}");
        }
    }

    #[test]
    fn a_dump_that_is_not_berths_table_is_an_error() {
        let err = table_from_netlink(IpFamily::V4, &[1, 0, 0, 0, 9]).unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(source.contains("cut short"), "{source}");
        // berth's table of the other family: its addresses are of another length.
        let err = table_from_netlink(IpFamily::V6, &nft_dump()).unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(source.contains("set service-ips"), "{source}");
    }

    #[test]
    fn text_that_is_not_a_ruleset_is_an_error() {
        let err = ruleset_from_save("*nat\n-A BERTH-X -j BERTH-MISSING\nCOMMIT\n").unwrap_err();
        assert!(err.to_string().contains("ruleset"), "{err}");
    }

    /// With nat shards every packet passes the lookups of the shards before its own; those passes
    /// are counted in one line, and the hits in the shard that matched and in the main table shown.
    #[test]
    fn shards_that_matched_nothing_are_counted_not_listed() {
        use berth_datapath::trace::Outcome;
        use berth_datapath::Rule;
        let hit = |chain: &str, to: &str| Hit {
            table: Table::Nat,
            chain: ChainName::new(chain),
            rule: Rule::new(vec![], Target::Jump(ChainName::new(to))),
        };
        let hits = vec![
            hit("PREROUTING@1", "BERTH-SERVICES@1"),
            hit("PREROUTING@2", "BERTH-SERVICES@2"),
            hit("PREROUTING@4", "BERTH-SERVICES@4"),
            hit("PREROUTING@3", "BERTH-SERVICES@3"),
            hit("BERTH-SERVICES@3", "BERTH-SVC-AAAA@3"),
            hit("POSTROUTING", "BERTH-POSTROUTING"),
        ];
        let path = TracedPath {
            hits,
            outcome: Outcome {
                verdict: Verdict::Dnat("10.244.1.2:8080".parse().unwrap()),
                masqueraded: false,
                affinity_set: None,
            },
            probability: 1.0,
        };
        let p = Packet {
            src: "198.18.0.100".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            dport: 80,
            origin: Origin::Network,
            bridged: false,
        };
        let text = render_paths(&p, "node1", &[path], &|h| {
            format!("{} -> {}", h.chain, h.rule.jump_target().unwrap())
        });
        let lines: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(
            lines,
            [
                "    (nothing matched in the lookups of 3 of the nat shards: berth-1…2, berth-4)",
                "    PREROUTING@3 -> BERTH-SERVICES@3",
                "    BERTH-SERVICES@3 -> BERTH-SVC-AAAA@3",
                "    POSTROUTING -> BERTH-POSTROUTING",
                "    => DNAT to 10.244.1.2:8080, not masqueraded (the endpoint sees the client's address)",
            ],
            "{text}"
        );
        assert_eq!(shard_list(&[5, 1, 2, 3, 7]), "berth-1…3, berth-5, berth-7");
    }
}
