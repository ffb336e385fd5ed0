//! A packet tracer over a typed ruleset: follows the first packet of a connection through the
//! built-in hooks and berth's chains, exploring every `statistic` branch, and reports the outcomes
//! with their probabilities (DNAT to which endpoint, REJECT, DROP, masqueraded or not).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use crate::error::Error;
use crate::plan::model::{
    AddrSide, ChainName, CtState, MarkOp, Match, RecentAction, Rule, Ruleset, Table, Target,
};
use berth_core::Protocol;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Arrives on one of the node's interfaces (from a pod or from off the node).
    Network,
    /// Sent by a process on the node itself.
    LocalProcess,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub dport: u16,
    pub origin: Origin,
    pub bridged: bool,
}

/// What the kernel would know besides the packet: the node's own addresses and `-m recent` lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceEnv {
    pub local_addresses: Vec<IpAddr>,
    /// Recent list name -> sources seen within its timeout.
    pub recent: BTreeMap<ChainName, BTreeSet<IpAddr>>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Dnat(SocketAddr),
    /// Accepted to its original destination without translation.
    Delivered,
    Reject,
    Drop,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Outcome {
    pub verdict: Verdict,
    pub masqueraded: bool,
    /// The recent list the packet's source was added to (ClientIP affinity).
    pub affinity_set: Option<ChainName>,
}

/// One rule a packet matched: where it stands and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub table: Table,
    pub chain: ChainName,
    pub rule: Rule,
}

/// One way through the ruleset: the rules matched in order, the outcome and its probability.
#[derive(Debug, Clone, PartialEq)]
pub struct TracedPath {
    pub hits: Vec<Hit>,
    pub outcome: Outcome,
    pub probability: f64,
}

#[derive(Debug, Clone)]
struct State {
    dst: IpAddr,
    dport: u16,
    mark: u32,
    dnat: Option<SocketAddr>,
    masq: bool,
    recent_set: Option<ChainName>,
    prob: f64,
    hits: Vec<Hit>,
}

impl State {
    /// The packet as it enters the ruleset: untouched, on the one path it certainly takes.
    fn arriving(packet: &Packet) -> Self {
        State {
            dst: packet.dst,
            dport: packet.dport,
            mark: 0,
            dnat: None,
            masq: false,
            recent_set: None,
            prob: 1.0,
            hits: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Return,
    Accept,
    Drop,
    Reject,
    /// A terminating NAT target (DNAT, MASQUERADE): ends this table's traversal of the hook.
    NatDone,
}

/// Ends runaway recursion on a ruleset with a jump cycle, which iptables itself rejects.
const MAX_DEPTH: usize = 64;

struct Tracer<'a> {
    rs: &'a Ruleset,
    env: &'a TraceEnv,
    packet: &'a Packet,
}

impl Tracer<'_> {
    /// Probability that the rule's matches hold (0, 1, or the statistic's 1/n).
    fn match_probability(&self, rule: &Rule, state: &State) -> f64 {
        let mut p = 1.0;
        for m in rule.matches.iter() {
            let ok = match m {
                Match::Comment(_) => true,
                Match::Source { net, negated } => net.contains(&self.packet.src) != *negated,
                Match::Destination { net, negated } => net.contains(&state.dst) != *negated,
                Match::Protocol(proto) => *proto == self.packet.protocol,
                Match::DestPort(ports) => ports.contains(state.dport),
                Match::Mark {
                    value,
                    mask,
                    negated,
                } => (state.mark & mask == *value) != *negated,
                Match::Random { one_in } => {
                    p /= f64::from((*one_in).max(1));
                    true
                }
                Match::Recent {
                    name,
                    action: RecentAction::Set,
                } => {
                    let _ = name;
                    true
                }
                Match::Recent {
                    name,
                    action: RecentAction::Rcheck { .. },
                } => self
                    .env
                    .recent
                    .get(name)
                    .is_some_and(|sources| sources.contains(&self.packet.src)),
                Match::AddrTypeLocal { side, negated } => {
                    let addr = match side {
                        AddrSide::Src => self.packet.src,
                        AddrSide::Dst => state.dst,
                    };
                    self.env.local_addresses.contains(&addr) != *negated
                }
                // The tracer follows the first packet of a connection.
                Match::Conntrack { states } => states.contains(&CtState::New),
                Match::PhysDevIsIn { negated } => self.packet.bridged != *negated,
            };
            if !ok {
                return 0.0;
            }
        }
        p
    }

    fn run_rules(
        &self,
        table: Table,
        chain: &ChainName,
        rules: &[Rule],
        state: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, Error> {
        let Some((rule, rest)) = rules.split_first() else {
            return Ok(vec![(state, Flow::Return)]);
        };
        let p = self.match_probability(rule, &state);
        let mut out = Vec::new();
        if p < 1.0 {
            let mut miss = state.clone();
            miss.prob *= 1.0 - p;
            out.extend(self.run_rules(table, chain, rest, miss, depth)?);
        }
        if p <= 0.0 {
            return Ok(out);
        }
        let mut hit = state;
        hit.prob *= p;
        hit.hits.push(Hit {
            table,
            chain: chain.clone(),
            rule: rule.clone(),
        });
        for m in rule.matches.iter() {
            if let Match::Recent {
                name,
                action: RecentAction::Set,
            } = m
            {
                hit.recent_set = Some(name.clone());
            }
        }
        let flow = match &rule.target {
            None => None,
            Some(Target::Jump(to)) => {
                for (s, flow) in self.run_chain(table, to, hit.clone(), depth + 1)? {
                    match flow {
                        Flow::Return => out.extend(self.run_rules(table, chain, rest, s, depth)?),
                        other => out.push((s, other)),
                    }
                }
                return Ok(out);
            }
            Some(Target::Dnat(to)) => {
                hit.dnat = Some(*to);
                hit.dst = to.ip();
                hit.dport = to.port();
                Some(Flow::NatDone)
            }
            Some(Target::Masquerade { .. }) => {
                hit.masq = true;
                Some(Flow::NatDone)
            }
            Some(Target::Mark {
                op: MarkOp::Or,
                value,
            }) => {
                hit.mark |= value;
                None
            }
            Some(Target::Mark {
                op: MarkOp::Xor,
                value,
            }) => {
                hit.mark ^= value;
                None
            }
            Some(Target::Reject) => Some(Flow::Reject),
            Some(Target::Drop) => Some(Flow::Drop),
            Some(Target::Return) => Some(Flow::Return),
            Some(Target::Accept) => Some(Flow::Accept),
        };
        match flow {
            Some(flow) => out.push((hit, flow)),
            None => out.extend(self.run_rules(table, chain, rest, hit, depth)?),
        }
        Ok(out)
    }

    fn run_chain(
        &self,
        table: Table,
        chain: &ChainName,
        state: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, Error> {
        if depth > MAX_DEPTH {
            return Err(Error::Trace {
                reason: format!("jump depth exceeded at {chain}"),
            });
        }
        let rules = self.rs.chain(table, chain).ok_or_else(|| Error::Trace {
            reason: format!("jump to missing chain {table}/{chain}"),
        })?;
        self.run_rules(table, chain, rules, state, depth)
    }

    /// One built-in hook: berth's jumps from it, in order; falling off the end is the ACCEPT policy.
    fn run_hook(
        &self,
        table: Table,
        builtin: &str,
        state: State,
    ) -> Result<Vec<(State, Flow)>, Error> {
        let rules: Vec<Rule> = self
            .rs
            .jumps
            .iter()
            .filter(|jump| jump.table == table && jump.from.as_str() == builtin)
            .map(|jump| jump.rule.clone())
            .collect();
        self.run_rules(table, &ChainName::new(builtin), &rules, state, 0)
    }
}

fn then_hook(
    tracer: &Tracer<'_>,
    states: Vec<State>,
    table: Table,
    builtin: &str,
    finished: &mut Vec<(State, Flow)>,
) -> Result<Vec<State>, Error> {
    let mut next = Vec::new();
    for state in states {
        for (s, flow) in tracer.run_hook(table, builtin, state)? {
            match flow {
                Flow::Drop | Flow::Reject => finished.push((s, flow)),
                _ => next.push(s),
            }
        }
    }
    Ok(next)
}

/// Every outcome of the packet with its probability, sorted and merged.
pub fn trace(rs: &Ruleset, env: &TraceEnv, packet: &Packet) -> Result<Vec<(Outcome, f64)>, Error> {
    let mut merged: BTreeMap<Outcome, f64> = BTreeMap::new();
    for path in trace_paths(rs, env, packet)? {
        *merged.entry(path.outcome).or_default() += path.probability;
    }
    Ok(merged.into_iter().collect())
}

/// Every way the packet can take, each with the rules it matched in order (built-in hooks'
/// jumps included), its outcome and probability; not merged, so two endpoints are two paths.
pub fn trace_paths(
    rs: &Ruleset,
    env: &TraceEnv,
    packet: &Packet,
) -> Result<Vec<TracedPath>, Error> {
    let tracer = Tracer { rs, env, packet };
    let start = State::arriving(packet);
    let mut finished = Vec::new();
    let mut delivered = Vec::new();
    match packet.origin {
        Origin::Network => {
            let states = then_hook(
                &tracer,
                vec![start],
                Table::Nat,
                "PREROUTING",
                &mut finished,
            )?;
            let (local, forwarded): (Vec<State>, Vec<State>) = states
                .into_iter()
                .partition(|s| env.local_addresses.contains(&s.dst));
            delivered.extend(then_hook(
                &tracer,
                local,
                Table::Filter,
                "INPUT",
                &mut finished,
            )?);
            let forwarded = then_hook(&tracer, forwarded, Table::Filter, "FORWARD", &mut finished)?;
            delivered.extend(then_hook(
                &tracer,
                forwarded,
                Table::Nat,
                "POSTROUTING",
                &mut finished,
            )?);
        }
        Origin::LocalProcess => {
            let states = then_hook(&tracer, vec![start], Table::Nat, "OUTPUT", &mut finished)?;
            let states = then_hook(&tracer, states, Table::Filter, "OUTPUT", &mut finished)?;
            delivered.extend(then_hook(
                &tracer,
                states,
                Table::Nat,
                "POSTROUTING",
                &mut finished,
            )?);
        }
    }
    let finished = finished.into_iter().map(|(s, flow)| {
        let verdict = if flow == Flow::Reject {
            Verdict::Reject
        } else {
            Verdict::Drop
        };
        (s, verdict)
    });
    let delivered = delivered.into_iter().map(|s| {
        let verdict = s.dnat.map_or(Verdict::Delivered, Verdict::Dnat);
        (s, verdict)
    });
    Ok(finished
        .chain(delivered)
        .map(|(s, verdict)| TracedPath {
            outcome: Outcome {
                verdict,
                masqueraded: s.masq,
                affinity_set: s.recent_set,
            },
            probability: s.prob,
            hits: s.hits,
        })
        .collect())
}

fn is_dispatch_chain(chain: &ChainName) -> bool {
    let name = chain.as_str();
    name.starts_with("BERTH-DST-")
        || name.starts_with("BERTH-NP-")
        || name == crate::plan::names::NODEPORTS
}

fn walk(
    tracer: &Tracer<'_>,
    chain: &ChainName,
    state: &State,
    depth: usize,
) -> Result<(usize, bool), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::Trace {
            reason: format!("jump depth exceeded at {chain}"),
        });
    }
    let rules = tracer
        .rs
        .chain(Table::Nat, chain)
        .ok_or_else(|| Error::Trace {
            reason: format!("jump to missing chain nat/{chain}"),
        })?;
    let mut walked = 0;
    for rule in rules {
        walked += 1;
        if tracer.match_probability(rule, state) <= 0.0 {
            continue;
        }
        match rule.jump_target() {
            Some(next) if is_dispatch_chain(next) => {
                let (n, found) = walk(tracer, next, state, depth + 1)?;
                walked += n;
                if found {
                    return Ok((walked, true));
                }
            }
            Some(_) => return Ok((walked, true)),
            None => {}
        }
    }
    Ok((walked, false))
}

/// How many rules the first packet evaluates in the nat entry chains before it reaches its
/// Service's own chain (`None` if it reaches none): the cost that dispatch is about.
pub fn dispatch_rules_walked(
    rs: &Ruleset,
    env: &TraceEnv,
    packet: &Packet,
) -> Result<Option<usize>, Error> {
    let tracer = Tracer { rs, env, packet };
    let state = State::arriving(packet);
    let (walked, found) = walk(
        &tracer,
        &crate::plan::names::fixed(crate::plan::names::SERVICES),
        &state,
        0,
    )?;
    Ok(found.then_some(walked))
}
