//! Entry dispatch: kube-proxy's linear `BERTH-SERVICES`, or a tree of chains.
//!
//! The tree splits the sorted destination addresses on their first differing prefix bit, so each
//! level costs a new connection at most two rules and a leaf holds at most `leaf_size` rules. A
//! leaf's content is exactly the rules linear dispatch would have had for those addresses, and a
//! chain's name is derived from the prefix it covers, so a Service change rewrites one leaf.
//! Node ports are split the same way by port range, one tree per protocol, and the filter
//! chain `BERTH-CLUSTER-IPS` lays out its ClusterIP rejects the same way by address.

use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

use crate::plan::input::NodeInfo;
use crate::plan::model::protocol_keyword;
use crate::plan::model::{AddrSide, ChainName, Match, PortMatch, Rule, Ruleset, Table, Target};
use crate::plan::names;
use crate::plan::options::{Dispatch, PlanOptions};
use berth_core::{IpFamily, Protocol};

/// The rules that select a Service, before they are laid out.
#[derive(Debug, Default)]
pub struct DispatchEntries {
    pub(crate) by_dst: Vec<(u128, Rule)>,
    pub(crate) by_node_port: Vec<(Protocol, u128, Rule)>,
    /// The filter REJECT of each ClusterIP inside the Service CIDRs, laid out below
    /// `BERTH-CLUSTER-IPS` as the Service addresses are below `BERTH-SERVICES`.
    pub(crate) by_cluster_ip: Vec<(u128, Rule)>,
}

pub(crate) fn addr_key(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

impl DispatchEntries {
    pub fn push_dst(&mut self, addr: IpAddr, rule: Rule) {
        self.by_dst.push((addr_key(addr), rule));
    }

    pub fn push_node_port(&mut self, protocol: Protocol, port: u16, rule: Rule) {
        self.by_node_port.push((protocol, u128::from(port), rule));
    }

    pub fn push_cluster_ip(&mut self, addr: IpAddr, rule: Rule) {
        self.by_cluster_ip.push((addr_key(addr), rule));
    }
}

/// A key space (addresses of one family, or ports) and how to name and match a prefix of it.
pub(crate) trait KeySpace {
    const BITS: u32;
    fn kind(&self) -> &'static str;
    fn label(&self, prefix: u128, len: u32) -> String;
    fn matches(&self, prefix: u128, len: u32) -> Vec<Match>;
}

pub(crate) fn range_of(bits: u32, prefix: u128, len: u32) -> (u128, u128) {
    let host_bits = bits - len;
    let span = if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    (prefix, prefix | span)
}

/// Addresses of one family, and the kind of tree they name ([`names::DISPATCH_DST`] or
/// [`names::DISPATCH_CLUSTER_IP`]).
pub(crate) struct AddrSpace(pub(crate) IpFamily, pub(crate) &'static str);

impl AddrSpace {
    fn net(&self, prefix: u128, len: u32) -> Option<IpNet> {
        let addr = match self.0 {
            IpFamily::V4 => IpAddr::V4(u32::try_from(prefix).ok()?.into()),
            IpFamily::V6 => IpAddr::V6(prefix.into()),
        };
        IpNet::new(addr, u8::try_from(len).ok()?).ok()
    }
}

pub(crate) struct V4Space(pub(crate) AddrSpace);
pub(crate) struct V6Space(pub(crate) AddrSpace);

macro_rules! addr_space {
    ($ty:ident, $bits:expr) => {
        impl KeySpace for $ty {
            const BITS: u32 = $bits;
            fn kind(&self) -> &'static str {
                self.0 .1
            }
            fn label(&self, prefix: u128, len: u32) -> String {
                self.0
                    .net(prefix, len)
                    .map(|net| net.to_string())
                    .unwrap_or_default()
            }
            fn matches(&self, prefix: u128, len: u32) -> Vec<Match> {
                self.0
                    .net(prefix, len)
                    .map(|net| vec![Match::comment(net.to_string()), Match::dst_net(net)])
                    .unwrap_or_default()
            }
        }
    };
}
addr_space!(V4Space, 32);
addr_space!(V6Space, 128);

pub(crate) struct PortSpace(pub(crate) Protocol);

impl KeySpace for PortSpace {
    const BITS: u32 = 16;
    fn kind(&self) -> &'static str {
        names::DISPATCH_NODE_PORT
    }
    fn label(&self, prefix: u128, len: u32) -> String {
        let (lo, hi) = range_of(Self::BITS, prefix, len);
        format!("{} {lo}-{hi}", protocol_keyword(self.0))
    }
    fn matches(&self, prefix: u128, len: u32) -> Vec<Match> {
        let (lo, hi) = range_of(Self::BITS, prefix, len);
        // Keys come from u16 ports, so the range always fits.
        let (lo, hi) = (lo as u16, hi as u16);
        let port = if lo == hi {
            PortMatch::Single(lo)
        } else {
            PortMatch::Range(lo, hi)
        };
        vec![Match::Protocol(self.0), Match::DestPort(port)]
    }
}

/// Writes `entries` (sorted by key) into `chain` of `table`: the rules themselves when they fit a
/// leaf, else one jump per half of the first bit where the keys differ.
fn fill<S: KeySpace>(
    rs: &mut Ruleset,
    table: Table,
    space: &S,
    chain: &ChainName,
    entries: &[(u128, Rule)],
    leaf_size: usize,
) {
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
        return;
    };
    let common = if first.0 == last.0 {
        S::BITS
    } else {
        // Keys live in the low S::BITS bits of a u128.
        (first.0 ^ last.0).leading_zeros() - (128 - S::BITS)
    };
    if entries.len() <= leaf_size.max(1) || common >= S::BITS {
        let rules = rs.table_mut(table);
        for (_, rule) in entries {
            rules.push(chain, rule.clone());
        }
        return;
    }
    let split_bit = S::BITS - common - 1;
    let child_len = common + 1;
    let mask = if child_len == 0 {
        0
    } else {
        !((1u128 << (S::BITS - child_len)) - 1)
    };
    let at = entries.partition_point(|(key, _)| (key >> split_bit) & 1 == 0);
    for half in [&entries[..at], &entries[at..]] {
        let Some((key, _)) = half.first() else {
            continue;
        };
        let prefix = key & mask & range_of(S::BITS, 0, 0).1;
        let child = names::dispatch_chain(space.kind(), &space.label(prefix, child_len));
        rs.table_mut(table)
            .push(chain, Rule::jump(space.matches(prefix, child_len), &child));
        rs.table_mut(table).chain_mut(&child);
        fill(rs, table, space, &child, half, leaf_size);
    }
}

/// Lays out `entries` by destination address in `table`'s `chain` (sorted first: rules of one
/// address keep their Service order), as a tree of `kind` or as one list.
fn lay_out_by_address(
    rs: &mut Ruleset,
    table: Table,
    chain: &ChainName,
    kind: &'static str,
    mut entries: Vec<(u128, Rule)>,
    options: &PlanOptions,
) {
    match options.dispatch {
        Dispatch::Linear => {
            let rules = rs.table_mut(table);
            for (_, rule) in entries {
                rules.push(chain, rule);
            }
        }
        Dispatch::Tree => {
            entries.sort_by_key(|(key, _)| *key);
            let space = AddrSpace(options.family, kind);
            match options.family {
                IpFamily::V4 => fill(
                    rs,
                    table,
                    &V4Space(space),
                    chain,
                    &entries,
                    options.leaf_size,
                ),
                IpFamily::V6 => fill(
                    rs,
                    table,
                    &V6Space(space),
                    chain,
                    &entries,
                    options.leaf_size,
                ),
            }
        }
    }
}

/// Lays out the nat entry chains `BERTH-SERVICES` and `BERTH-NODEPORTS`, and with Service
/// CIDRs the filter chain `BERTH-CLUSTER-IPS`.
pub fn build_dispatch(rs: &mut Ruleset, entries: DispatchEntries, options: &PlanOptions) {
    let services = names::fixed(names::SERVICES);
    let node_ports = names::fixed(names::NODEPORTS);
    let DispatchEntries {
        by_dst,
        mut by_node_port,
        by_cluster_ip,
    } = entries;
    lay_out_by_address(
        rs,
        Table::Nat,
        &services,
        names::DISPATCH_DST,
        by_dst,
        options,
    );
    if !options.family_service_cidrs().is_empty() {
        let cluster_ips = names::fixed(names::CLUSTER_IPS);
        rs.table_mut(Table::Filter).chain_mut(&cluster_ips);
        lay_out_by_address(
            rs,
            Table::Filter,
            &cluster_ips,
            names::DISPATCH_CLUSTER_IP,
            by_cluster_ip,
            options,
        );
        rs.table_mut(Table::Filter)
            .push(&cluster_ips, unallocated_drop());
    }
    match options.dispatch {
        Dispatch::Linear => {
            let nat = rs.table_mut(Table::Nat);
            for (_, _, rule) in by_node_port {
                nat.push(&node_ports, rule);
            }
        }
        Dispatch::Tree => {
            by_node_port.sort_by_key(|(proto, key, _)| (*proto, *key));
            for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                let of_proto: Vec<(u128, Rule)> = by_node_port
                    .iter()
                    .filter(|(p, _, _)| *p == proto)
                    .map(|(_, key, rule)| (*key, rule.clone()))
                    .collect();
                fill(
                    rs,
                    Table::Nat,
                    &PortSpace(proto),
                    &node_ports,
                    &of_proto,
                    options.leaf_size,
                );
            }
        }
    }
}

/// The last rule of `BERTH-CLUSTER-IPS`: a new connection into a Service CIDR that no ClusterIP
/// rule took goes to an address no Service holds.
pub(crate) fn unallocated_drop() -> Rule {
    Rule::new(
        vec![Match::comment(
            "berth: drop traffic to unallocated cluster IPs",
        )],
        Target::Drop,
    )
}

/// The rules that end the filter `BERTH-SERVICES`: a new connection still addressed into one of
/// the family's Service CIDRs after DNAT was not taken by any Service port, and is checked in
/// `BERTH-CLUSTER-IPS`. After the no-endpoint rules, so those keep their REJECT or DROP.
pub(crate) fn service_cidr_jumps(options: &PlanOptions) -> Vec<Rule> {
    let target = names::fixed(names::CLUSTER_IPS);
    options
        .family_service_cidrs()
        .into_iter()
        .map(|cidr| {
            Rule::jump(
                vec![
                    Match::comment("berth: untranslated traffic to a Service CIDR"),
                    Match::dst_net(cidr),
                ],
                &target,
            )
        })
        .collect()
}

/// The jump from `BERTH-SERVICES` to `BERTH-NODEPORTS`. In IPv6 it leaves out `::1`, as
/// kube-proxy does: a packet from `::1` never leaves the loopback device, so a node port reached
/// on `::1` could only time out; left alone, it is refused at once (nothing listens there).
/// IPv4 node ports answer on 127.0.0.1 (`route_localnet`).
pub(crate) fn node_ports_jump(family: IpFamily) -> Rule {
    let mut matches = vec![
        Match::comment("berth service nodeports; NOTE: this must be the last rule in this chain"),
        Match::AddrTypeLocal {
            side: AddrSide::Dst,
            negated: false,
        },
    ];
    if family == IpFamily::V6 {
        matches.push(Match::Destination {
            net: IpNet::from(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            negated: true,
        });
    }
    // Must stay last: node ports are tried only after every Service address.
    Rule::jump(matches, &names::fixed(names::NODEPORTS))
}

/// The jumps from `BERTH-SERVICES` to `BERTH-NODEPORTS`, which end that chain: one for every
/// local address, or (`--nodeport-addresses`) one per CIDR of the family for the node's own
/// addresses inside it, and one for its primary address. No node known yet with only `primary`:
/// no jump, so no node port answers anywhere until the node's address is known.
pub(crate) fn node_ports_jumps(options: &PlanOptions, node: Option<&NodeInfo>) -> Vec<Rule> {
    const COMMENT: &str = "berth service nodeports; NOTE: this must be the last rule in this chain";
    let local = Match::AddrTypeLocal {
        side: AddrSide::Dst,
        negated: false,
    };
    let target = names::fixed(names::NODEPORTS);
    let wanted = &options.node_port_addresses;
    if !wanted.is_set()
        || wanted
            .cidrs
            .iter()
            .any(|c| c.prefix_len() == 0 && options.family.contains(c.addr()))
    {
        return vec![node_ports_jump(options.family)];
    }
    let mut rules: Vec<Rule> = wanted
        .cidrs
        .iter()
        .filter(|cidr| options.family.contains(cidr.addr()))
        .map(|cidr| {
            Rule::jump(
                vec![
                    Match::comment(COMMENT),
                    Match::dst_net(*cidr),
                    local.clone(),
                ],
                &target,
            )
        })
        .collect();
    let primary = node.and_then(|node| node.primary_address(options.family));
    if let Some(ip) = primary.filter(|_| wanted.primary) {
        rules.push(Rule::jump(
            vec![Match::comment(COMMENT), Match::dst(ip)],
            &target,
        ));
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::input::NodeView;
    use crate::plan::{plan, Planner};

    /// The jumps' destination matches, `local` for each that also asks for a local address.
    fn jumps(value: &str, family: IpFamily, node: Option<&NodeInfo>) -> Vec<(String, bool)> {
        let options = PlanOptions {
            family,
            node_port_addresses: value.parse().unwrap_or_else(|err| panic!("{value}: {err}")),
            ..PlanOptions::default()
        };
        node_ports_jumps(&options, node)
            .iter()
            .map(|rule| {
                assert_eq!(
                    rule.jump_target().map(ChainName::as_str),
                    Some(names::NODEPORTS)
                );
                let dst = rule.matches.iter().find_map(|m| match m {
                    Match::Destination { net, .. } => Some(net.to_string()),
                    _ => None,
                });
                let local = rule
                    .matches
                    .iter()
                    .any(|m| matches!(m, Match::AddrTypeLocal { .. }));
                (dst.unwrap_or_else(|| "any".into()), local)
            })
            .collect()
    }

    fn node(addresses: &[&str]) -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
            zone: None,
        }
    }

    #[test]
    fn node_port_jumps_follow_nodeport_addresses() {
        let n = node(&["198.18.0.11", "fd00::11", "198.18.1.11"]);
        let own = |rows: &[(&str, bool)]| -> Vec<(String, bool)> {
            rows.iter().map(|(d, l)| (d.to_string(), *l)).collect()
        };
        let v4 = IpFamily::V4;
        type Row<'a> = (&'a str, IpFamily, Option<&'a NodeInfo>, Vec<(String, bool)>);
        let rows: Vec<Row> = vec![
            ("", v4, Some(&n), own(&[("any", true)])),
            (
                "198.18.0.0/24",
                v4,
                Some(&n),
                own(&[("198.18.0.0/24", true)]),
            ),
            (
                "198.18.0.0/24,primary",
                v4,
                Some(&n),
                own(&[("198.18.0.0/24", true), ("198.18.0.11/32", false)]),
            ),
            (
                "primary",
                IpFamily::V6,
                Some(&n),
                own(&[("fd00::11/128", false)]),
            ),
            // No node yet: nothing to name, so no node port answers.
            ("primary", v4, None, own(&[])),
            // Only the other family's CIDR: none in this one.
            ("fd00::/64", v4, Some(&n), own(&[])),
            (
                "fd00::/64",
                IpFamily::V6,
                Some(&n),
                own(&[("fd00::/64", true)]),
            ),
            // A CIDR of all addresses is every local address, whatever else is listed.
            (
                "198.18.0.0/24,0.0.0.0/0",
                v4,
                Some(&n),
                own(&[("any", true)]),
            ),
            ("::/0", v4, Some(&n), own(&[])),
        ];
        for (value, family, node, want) in rows {
            assert_eq!(jumps(value, family, node), want, "{value} {family:?}");
        }
    }

    #[test]
    fn a_new_primary_address_is_planned_incrementally_as_in_full() {
        let options = PlanOptions {
            node_port_addresses: "primary".parse().unwrap(),
            ..PlanOptions::default()
        };
        let mut planner = Planner::new(options.clone());
        for addresses in [&[][..], &["198.18.0.11"], &["198.18.0.12", "198.18.0.11"]] {
            let view = NodeView {
                node: node(addresses),
                services: Vec::new(),
            };
            planner.update(&view);
            assert_eq!(planner.ruleset(), &plan(&view, &options), "{addresses:?}");
        }
    }
}
