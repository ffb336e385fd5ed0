//! The `nft -f` text of a transaction: each command as a line of `nft` input, with the rules and
//! elements inside it. It is the `nft` program's form of a transaction, and the words berth shows
//! for a rule or element (a traced packet's hits, the netlink writer's errors); the conversion
//! never needs the syntax, so it lives apart.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::SocketAddr;

use ipnet::IpNet;

use crate::backend::Payload;
use crate::error::Error;
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{
    NftChain, NftRule, CLUSTER_IP_COMMENT, CLUSTER_IP_SET, NODE_PORT_MAP, SERVICE_MAP, TABLE,
};
use crate::nft::shard::{table_name, MAIN};
use crate::nft::transaction::{element_set, Command, Element, Transaction};
use crate::plan::model::protocol_keyword;
use crate::plan::model::{
    AddrSide, CtState, MarkOp, Match, PortMatch, RecentAction, Rule, Table, Target,
};
use berth_core::IpFamily;

/// nft refuses longer comments.
const MAX_COMMENT: usize = 128;

pub fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// Renders one command as a line of `nft` input.
pub fn command_text(family: IpFamily, command: &Command) -> String {
    let fam = family_keyword(family);
    let t = format!("{fam} {}", table_name(TABLE, command.shard()));
    let addr_type = match family {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    };
    match command {
        Command::AddTable(_) => format!("add table {t}\n"),
        Command::DeleteTable(_) => format!("delete table {t}\n"),
        Command::AddMaps(shard) => {
            let mut maps = format!(
                "add map {t} {SERVICE_MAP} {{ type {addr_type} . inet_proto . inet_service : verdict ; }}\n\
                 add map {t} {NODE_PORT_MAP} {{ type inet_proto . inet_service : verdict ; }}\n"
            );
            if *shard == MAIN {
                let _ = writeln!(maps, "add set {t} {HAIRPIN_SET} {{ type {addr_type} . {addr_type} ; }}");
                let _ = writeln!(maps, "add set {t} {CLUSTER_IP_SET} {{ type {addr_type} ; }}");
            }
            maps
        }
        Command::AddChain(chain, None) => format!("add chain {t} {chain}\n"),
        Command::AddChain(chain, Some(hook)) => format!(
            "add chain {t} {chain} {{ type {} hook {} priority {} ; policy accept ; }}\n",
            hook.kind(),
            hook.hook,
            hook.priority
        ),
        Command::FlushChain(chain) => format!("flush chain {t} {chain}\n"),
        Command::DeleteChain(chain) => format!("delete chain {t} {chain}\n"),
        Command::AddRule(chain, rule) => {
            format!("add rule {t} {chain} {}\n", rule_text(family, chain.table, rule))
        }
        Command::AddAffinitySet(_, name, seconds) => format!(
            "add set {t} {name} {{ type {addr_type} ; flags dynamic,timeout ; timeout {seconds}s ; }}\n"
        ),
        Command::DeleteAffinitySet(_, name) => format!("delete set {t} {name}\n"),
        Command::AddElement(element) => format!(
            "add element {t} {} {{ {} }}\n",
            element_set(element),
            element_text(element, true)
        ),
        Command::DeleteElement(element) => format!(
            "delete element {t} {} {{ {} }}\n",
            element_set(element),
            element_text(element, false)
        ),
    }
}

/// An element as `nft` writes it: its key, and with `with_target` its verdict.
pub fn element_text(element: &Element, with_target: bool) -> String {
    let (key, target) = match element {
        Element::Service((addr, proto, port), target) => (
            format!("{addr} . {} . {port}", protocol_keyword(*proto)),
            target,
        ),
        Element::NodePort((proto, port), target) => {
            (format!("{} . {port}", protocol_keyword(*proto)), target)
        }
        Element::Hairpin(addr) => return format!("{addr} . {addr}"),
        Element::ClusterIp(addr) => return addr.to_string(),
    };
    if with_target {
        format!("{key} : jump {target}")
    } else {
        key
    }
}

/// Most elements one `add element` line carries.
const ELEMENTS_PER_LINE: usize = 1024;

impl Payload for Transaction {
    /// One line per command, except that a run of element additions to one map or set becomes
    /// one `add element` line per `ELEMENTS_PER_LINE`: the same change, parsed faster.
    fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut written = 0;
        let mut rest = self.commands.as_slice();
        while let Some(first) = rest.first() {
            let (run, set) = match first {
                Command::AddElement(element) => {
                    let set = element_set(element);
                    let shard = element.shard();
                    let run = rest
                        .iter()
                        .take(ELEMENTS_PER_LINE)
                        .take_while(|c| {
                            matches!(c, Command::AddElement(e)
                                if element_set(e) == set && e.shard() == shard)
                        })
                        .count();
                    (run, set)
                }
                _ => (1, ""),
            };
            let line = if run > 1 {
                let elements: Vec<String> = rest[..run]
                    .iter()
                    .filter_map(|c| match c {
                        Command::AddElement(e) => Some(element_text(e, true)),
                        _ => None,
                    })
                    .collect();
                format!(
                    "add element {} {} {} {{ {} }}\n",
                    family_keyword(self.family),
                    table_name(TABLE, first.shard()),
                    set,
                    elements.join(", ")
                )
            } else {
                command_text(self.family, first)
            };
            written += line.len();
            out.write_all(line.as_bytes())?;
            rest = &rest[run..];
        }
        self.set_written(written);
        Ok(())
    }
}

fn addr_keyword(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    }
}

fn net_text(net: &IpNet) -> String {
    if net.prefix_len() == net.max_prefix_len() {
        net.addr().to_string()
    } else {
        net.trunc().to_string()
    }
}

fn op(negated: bool) -> &'static str {
    if negated {
        "!= "
    } else {
        ""
    }
}

fn ct_state(state: CtState) -> &'static str {
    match state {
        CtState::New => "new",
        CtState::Established => "established",
        CtState::Related => "related",
        CtState::Invalid => "invalid",
    }
}

fn saddr_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip saddr",
        IpFamily::V6 => "ip6 saddr",
    }
}

/// One match in nft syntax; `None` for a comment (written last, as nft wants).
fn match_text(family: IpFamily, m: &Match) -> Option<String> {
    Some(match m {
        Match::Comment(_) => return None,
        Match::Source { net, negated } => {
            format!(
                "{} saddr {}{}",
                addr_keyword(net),
                op(*negated),
                net_text(net)
            )
        }
        Match::Destination { net, negated } => {
            format!(
                "{} daddr {}{}",
                addr_keyword(net),
                op(*negated),
                net_text(net)
            )
        }
        Match::Protocol(p) => format!("meta l4proto {}", protocol_keyword(*p)),
        Match::DestPort(PortMatch::Single(port)) => format!("th dport {port}"),
        Match::DestPort(PortMatch::Range(lo, hi)) => format!("th dport {lo}-{hi}"),
        Match::Mark {
            value,
            mask,
            negated,
        } => format!(
            "meta mark & {mask:#x} {} {value:#x}",
            if *negated { "!=" } else { "==" }
        ),
        Match::Random { one_in } => format!("numgen random mod {} == 0", (*one_in).max(1)),
        Match::Recent {
            name,
            action: RecentAction::Set,
        } => format!("update @{name} {{ {} }}", saddr_keyword(family)),
        Match::Recent {
            name,
            action: RecentAction::Rcheck { .. },
        } => format!("{} @{name}", saddr_keyword(family)),
        Match::AddrTypeLocal { side, negated } => format!(
            "fib {} type {}local",
            match side {
                AddrSide::Src => "saddr",
                AddrSide::Dst => "daddr",
            },
            op(*negated)
        ),
        Match::Conntrack { states } => format!(
            "ct state {}",
            states
                .iter()
                .map(|s| ct_state(*s))
                .collect::<Vec<_>>()
                .join(",")
        ),
        // Bridged traffic is invisible to the ip family; rules never plan this match (see
        // [`check_expressible`]).
        Match::PhysDevIsIn { .. } => "meta ibrname != \"\"".to_string(),
    })
}

fn target_text(family: IpFamily, table: Table, target: &Target) -> String {
    match target {
        // Jumps stay within the iptables table the rule was planned in.
        Target::Jump(chain) => format!("jump {}", NftChain::new(table, chain)),
        Target::Dnat(SocketAddr::V4(addr)) => format!("dnat to {addr}"),
        Target::Dnat(SocketAddr::V6(addr)) => format!("dnat to [{}]:{}", addr.ip(), addr.port()),
        Target::Masquerade { random_fully } => {
            if *random_fully {
                "masquerade fully-random".to_string()
            } else {
                "masquerade".to_string()
            }
        }
        Target::Mark {
            op: MarkOp::Or,
            value,
        } => format!("meta mark set meta mark | {value:#x}"),
        Target::Mark {
            op: MarkOp::Xor,
            value,
        } => format!("meta mark set meta mark ^ {value:#x}"),
        Target::Reject => match family {
            IpFamily::V4 => "reject with icmp type port-unreachable".to_string(),
            IpFamily::V6 => "reject with icmpv6 type port-unreachable".to_string(),
        },
        Target::Drop => "drop".to_string(),
        Target::Return => "return".to_string(),
        Target::Accept => "accept".to_string(),
    }
}

/// A rule's text after `add rule <table> <chain>`, for a chain planned in `table`.
pub fn rule_text(family: IpFamily, table: Table, rule: &NftRule) -> String {
    match rule {
        NftRule::ServiceMap => format!(
            "{} daddr . meta l4proto . th dport vmap @{SERVICE_MAP}",
            family_keyword(family)
        ),
        NftRule::NodePortMap => format!("meta l4proto . th dport vmap @{NODE_PORT_MAP}"),
        NftRule::ClusterIpSet => format!(
            "{} daddr @{CLUSTER_IP_SET} {} comment \"{CLUSTER_IP_COMMENT}\"",
            family_keyword(family),
            target_text(family, table, &Target::Reject)
        ),
        NftRule::Hairpin(target) => {
            let fam = family_keyword(family);
            format!(
                "ct status dnat {fam} saddr . {fam} daddr @{HAIRPIN_SET} jump {}",
                NftChain::new(table, target)
            )
        }
        NftRule::Rule(rule) => plain_rule_text(family, table, rule),
    }
}

fn plain_rule_text(family: IpFamily, table: Table, rule: &Rule) -> String {
    let mut out = String::new();
    let mut comment = None;
    for m in rule.matches.iter() {
        match match_text(family, m) {
            Some(text) => {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(&text);
            }
            None => {
                if let (None, Match::Comment(text)) = (&comment, m) {
                    comment = Some(text.clone());
                }
            }
        }
    }
    let verdict = match &rule.target {
        Some(target) => target_text(family, table, target),
        None => "counter".to_string(),
    };
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(&verdict);
    if let Some(text) = comment.as_deref().map(clean_comment) {
        let _ = write!(out, " comment \"{text}\"");
    }
    out
}

/// A comment as nft takes it: no quotes or backslashes, shorter than [`MAX_COMMENT`].
fn clean_comment(text: &str) -> String {
    let mut text: String = text.chars().filter(|c| *c != '"' && *c != '\\').collect();
    if text.len() >= MAX_COMMENT {
        let mut end = MAX_COMMENT - 1;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The comment a rule carries in berth's table (its first), as the text renderer writes it.
pub fn comment_text(rule: &Rule) -> Option<String> {
    rule.matches.iter().find_map(|m| match m {
        Match::Comment(text) => Some(clean_comment(text)),
        _ => None,
    })
}

/// nft cannot express a match the planner never uses for the ip families: refuse it clearly
/// rather than program something else.
pub fn check_expressible(rule: &NftRule) -> Result<(), Error> {
    if let NftRule::Rule(rule) = rule {
        if rule
            .matches
            .iter()
            .any(|m| matches!(m, Match::PhysDevIsIn { .. }))
        {
            return Err(Error::InvalidInput {
                object: "rule".to_string(),
                field: "match".to_string(),
                value: "physdev-is-in has no nftables form in the ip families".to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_ip_set_is_declared_in_the_main_table_and_its_rule_rejects() {
        let text = command_text(IpFamily::V6, &Command::AddMaps(MAIN));
        assert!(
            text.contains("add set ip6 berth cluster-ips { type ipv6_addr ; }"),
            "{text}"
        );
        let text = command_text(IpFamily::V4, &Command::AddMaps(2));
        assert!(!text.contains(CLUSTER_IP_SET), "{text}");
        assert_eq!(
            rule_text(IpFamily::V4, Table::Filter, &NftRule::ClusterIpSet),
            "ip daddr @cluster-ips reject with icmp type port-unreachable \
             comment \"berth: cluster IP, on a port it does not have\""
        );
        assert_eq!(
            rule_text(IpFamily::V6, Table::Filter, &NftRule::ClusterIpSet),
            "ip6 daddr @cluster-ips reject with icmpv6 type port-unreachable \
             comment \"berth: cluster IP, on a port it does not have\""
        );
        let element = Element::ClusterIp("fd00:96::10".parse().unwrap());
        assert_eq!(element.shard(), MAIN);
        assert_eq!(
            command_text(IpFamily::V6, &Command::DeleteElement(element)),
            "delete element ip6 berth cluster-ips { fd00:96::10 }\n"
        );
    }
}
