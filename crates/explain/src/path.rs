//! A packet's path through a node's current ruleset (pure): the text the agent read back from
//! the kernel (`iptables-save`) becomes berth's typed ruleset, and the datapath's tracer follows
//! the packet through it, rule by rule.
//!
//! Only berth's part of the ruleset is traced: `BERTH-*` chains and the jumps from built-in
//! chains into them. Other programs' rules (kube-proxy's, Docker's) are not followed; a
//! built-in chain's own verdicts besides those jumps are not either. An nftables ruleset is
//! shown but not traced yet: berth reads nftables text back into no typed ruleset today.

use std::net::{IpAddr, SocketAddr};

use berth_core::Protocol;
use berth_datapath::iptables::rule_text::rule_args;
use berth_datapath::iptables::rule_text::{parse_rule, split_words};
use berth_datapath::trace::{trace_paths, Origin, Packet, TraceEnv, TracedPath, Verdict};
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

/// The paths as text: each rule hit, then where the packet ends.
pub fn render_paths(packet: &Packet, node: &str, paths: &[TracedPath]) -> String {
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
        for hit in &path.hits {
            out.push_str(&format!(
                "    {}/{}: {}\n",
                hit.table,
                hit.chain,
                rule_args(&hit.rule)
            ));
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
        let text = render_paths(&p, "node1", &paths);
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

    #[test]
    fn text_that_is_not_a_ruleset_is_an_error() {
        let err = ruleset_from_save("*nat\n-A BERTH-X -j BERTH-MISSING\nCOMMIT\n").unwrap_err();
        assert!(err.to_string().contains("ruleset"), "{err}");
    }
}
