//! The typed ruleset: tables, chains and rules with typed matches and targets.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

use berth_core::Protocol;

/// Every chain berth owns starts with this; nothing else is ever flushed or deleted.
pub const CHAIN_PREFIX: &str = "BERTH-";
/// iptables limits chain names to 28 characters.
pub const MAX_CHAIN_NAME: usize = 28;

pub const MASQ_MARK: u32 = 0x4000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Filter,
    Nat,
    Mangle,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Filter, Table::Nat, Table::Mangle];

    pub fn as_str(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Nat => "nat",
            Table::Mangle => "mangle",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Table::ALL.into_iter().find(|table| table.as_str() == value)
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A chain name; construction through [`crate::plan::names`] keeps berth's own chains prefixed.
/// Shared, not copied: a name is the key of its chain, the target of every jump to it and an
/// entry in the Syncer's hashes, and 10,000 Services plan over 100,000 chains.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChainName(Arc<str>);

impl ChainName {
    pub fn new(name: impl AsRef<str>) -> Self {
        ChainName(Arc::from(name.as_ref()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_berth(&self) -> bool {
        self.0.starts_with(CHAIN_PREFIX)
    }

    pub fn is_builtin(&self) -> bool {
        matches!(
            &*self.0,
            "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
        )
    }
}

impl fmt::Display for ChainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrSide {
    Src,
    Dst,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CtState {
    New,
    Established,
    Related,
    Invalid,
}

impl CtState {
    pub fn as_str(self) -> &'static str {
        match self {
            CtState::New => "NEW",
            CtState::Established => "ESTABLISHED",
            CtState::Related => "RELATED",
            CtState::Invalid => "INVALID",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "NEW" => Some(CtState::New),
            "ESTABLISHED" => Some(CtState::Established),
            "RELATED" => Some(CtState::Related),
            "INVALID" => Some(CtState::Invalid),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RecentAction {
    Set,
    /// `--rcheck --seconds N --reap`: matches a source seen within N seconds and forgets older ones.
    Rcheck {
        seconds: u32,
        reap: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortMatch {
    Single(u16),
    Range(u16, u16),
}

impl PortMatch {
    pub fn contains(self, port: u16) -> bool {
        match self {
            PortMatch::Single(p) => p == port,
            PortMatch::Range(lo, hi) => (lo..=hi).contains(&port),
        }
    }
}

/// One match of a rule. Rendering keeps the order in which matches are listed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// Shared: every rule planned for one Service port carries the same few comments.
    Comment(Arc<str>),
    Source {
        net: IpNet,
        negated: bool,
    },
    Destination {
        net: IpNet,
        negated: bool,
    },
    /// `-m <proto> -p <proto>`: loads the protocol module so a following `--dport` is valid.
    Protocol(Protocol),
    DestPort(PortMatch),
    /// `-m mark [!] --mark value/mask`.
    Mark {
        value: u32,
        mask: u32,
        negated: bool,
    },
    /// `-m statistic --mode random --probability 1/one_in`.
    Random {
        one_in: u32,
    },
    Recent {
        name: ChainName,
        action: RecentAction,
    },
    /// `-m addrtype --src-type|--dst-type LOCAL`.
    AddrTypeLocal {
        side: AddrSide,
        negated: bool,
    },
    /// Boxed, not a `Vec`: it keeps every match at 24 bytes rather than 32.
    Conntrack {
        states: Box<[CtState]>,
    },
    /// `-m physdev [!] --physdev-is-in`: the packet entered through a bridge port.
    PhysDevIsIn {
        negated: bool,
    },
}

impl Match {
    pub fn comment(text: impl AsRef<str>) -> Self {
        Match::Comment(Arc::from(text.as_ref()))
    }

    pub fn src(addr: IpAddr) -> Self {
        Match::Source {
            net: IpNet::from(addr),
            negated: false,
        }
    }

    pub fn dst(addr: IpAddr) -> Self {
        Match::Destination {
            net: IpNet::from(addr),
            negated: false,
        }
    }

    pub fn dst_net(net: IpNet) -> Self {
        Match::Destination {
            net,
            negated: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkOp {
    Or,
    Xor,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Jump(ChainName),
    Dnat(SocketAddr),
    Masquerade { random_fully: bool },
    Mark { op: MarkOp, value: u32 },
    Reject,
    Drop,
    Return,
    Accept,
}

/// A rule; `target: None` is a counting rule that only documents where traffic goes next.
/// Matches are a shared slice: a planned rule never grows (a `Vec` built by pushing would keep
/// room for twice its matches), rules that differ only in their target share one list (the
/// DNAT rules of a Service's endpoints), and the planner's copies of a rule cost a count.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub matches: Arc<[Match]>,
    pub target: Option<Target>,
}

impl Rule {
    pub fn new(matches: Vec<Match>, target: Target) -> Self {
        Rule {
            matches: Arc::from(matches),
            target: Some(target),
        }
    }

    /// A rule without a target, counting what passes it.
    pub fn counting(matches: Vec<Match>) -> Self {
        Rule {
            matches: Arc::from(matches),
            target: None,
        }
    }

    /// A rule whose matches other rules hold too.
    pub fn shared(matches: &Arc<[Match]>, target: Target) -> Self {
        Rule {
            matches: Arc::clone(matches),
            target: Some(target),
        }
    }

    pub fn jump(matches: Vec<Match>, chain: &ChainName) -> Self {
        Rule::new(matches, Target::Jump(chain.clone()))
    }

    pub fn jump_target(&self) -> Option<&ChainName> {
        match &self.target {
            Some(Target::Jump(chain)) => Some(chain),
            _ => None,
        }
    }
}

/// All chains of one table. Chains are kept sorted by name so output is deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableRules {
    pub chains: BTreeMap<ChainName, Vec<Rule>>,
}

impl TableRules {
    /// Declares the chain (empty chains are meaningful: the canary, for one).
    pub fn chain_mut(&mut self, chain: &ChainName) -> &mut Vec<Rule> {
        self.chains.entry(chain.clone()).or_default()
    }

    pub fn push(&mut self, chain: &ChainName, rule: Rule) {
        // Look up before inserting: cloning the name for every rule dominated planning time.
        match self.chains.get_mut(chain) {
            Some(rules) => rules.push(rule),
            None => {
                self.chains.insert(chain.clone(), vec![rule]);
            }
        }
    }

    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum()
    }
}

/// Where a jump from a built-in chain goes, kept out of the restore payload: the built-in chains are
/// shared with other programs, so berth only ever checks for and inserts its own jump rule there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JumpRule {
    pub table: Table,
    pub from: ChainName,
    pub rule: Rule,
}

/// The planned state of every berth chain for one address family, plus the built-in jumps
/// (listed in the order they should appear from the top of each built-in chain).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    pub tables: BTreeMap<Table, TableRules>,
    pub jumps: Vec<JumpRule>,
}

impl Ruleset {
    pub fn table(&self, table: Table) -> Option<&TableRules> {
        self.tables.get(&table)
    }

    pub fn table_mut(&mut self, table: Table) -> &mut TableRules {
        self.tables.entry(table).or_default()
    }

    pub fn chain(&self, table: Table, chain: &ChainName) -> Option<&Vec<Rule>> {
        self.tables
            .get(&table)
            .and_then(|rules| rules.chains.get(chain))
    }

    pub fn rule_count(&self) -> usize {
        self.tables.values().map(TableRules::rule_count).sum()
    }
}

/// A protocol's keyword, spelled alike by iptables (`-p tcp`) and nftables (`meta l4proto tcp`).
pub fn protocol_keyword(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The planner holds hundreds of thousands of these at 10,000 Services; growing one is a
    /// memory regression the agent's RSS bench would otherwise catch only later.
    #[test]
    fn rules_and_matches_stay_compact() {
        assert!(std::mem::size_of::<Match>() <= 24);
        assert!(std::mem::size_of::<ChainName>() <= 16);
        assert!(std::mem::size_of::<Rule>() <= 48);
    }

    #[test]
    fn rules_with_the_same_matches_share_them() {
        let matches: Arc<[Match]> = Arc::from(vec![
            Match::comment("ns/svc:p"),
            Match::Protocol(Protocol::Tcp),
        ]);
        let a = Rule::shared(&matches, Target::Drop);
        let b = Rule::shared(&matches, Target::Accept);
        assert!(Arc::ptr_eq(&a.matches, &b.matches));
        assert_eq!(a.matches, Rule::new(matches.to_vec(), Target::Drop).matches);
    }
}
