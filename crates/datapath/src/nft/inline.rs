//! Endpoint chains folded into the rules that jump to them, for the nftables backend.
//!
//! `nft` (1.0.x) reads every chain of the ruleset into its cache on each invocation, so every
//! transaction, however small, costs time in proportion to the chains the table holds. A
//! planned endpoint chain (`BERTH-SEP-…`) holds two rules: the hairpin mark (`-s <ep> -j
//! BERTH-MARK-MASQ`) and the DNAT (with `-m recent --set` under ClientIP affinity). Both fold
//! into the rule that chose the endpoint, one rule with several statements:
//! - the DNAT, and the affinity `update @set { ip saddr }` before it, are appended to the
//!   choosing rule (`numgen random mod k == 0`, `ip saddr @set`, or none): `dnat` ends the
//!   chain's evaluation exactly where the endpoint chain's DNAT did;
//! - the hairpin mark moves to postrouting, where the DNAT is visible: one set per family table
//!   of `ep . ep` pairs (`ct status dnat ip saddr . ip daddr @hairpin` jumps to the mark chain),
//!   so a pod reaching itself through a Service is masqueraded as before.
//!
//! So 10,000 Services × 10 endpoints are 10,000 Service chains, not 110,000 chains. A chain of
//! another shape is never folded and stays a chain.

use std::net::{IpAddr, SocketAddr};

use crate::plan::model::{ChainName, Match, RecentAction, Rule, Target};
use crate::plan::names;

/// The set of hairpin pairs in each family table.
pub const HAIRPIN_SET: &str = "hairpin";

/// What an endpoint chain does, ready to be appended to the rule that jumps to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inlined {
    /// The DNAT rule's matches and statements without its comments (protocol, affinity update).
    pub matches: Vec<Match>,
    pub to: SocketAddr,
}

impl Inlined {
    /// The endpoint whose own traffic through the Service is masqueraded (its hairpin pair).
    pub fn hairpin(&self) -> IpAddr {
        self.to.ip()
    }
}

/// A planned endpoint chain (`BERTH-SEP-…`), folded or not.
pub fn is_endpoint_chain(name: &ChainName) -> bool {
    name.as_str().starts_with(names::ENDPOINT_CHAIN_PREFIX)
}

/// `-s <ep>` with only comments beside it, jumping to the mark chain: the hairpin rule.
fn hairpin_source(rule: &Rule) -> Option<IpAddr> {
    if rule.jump_target()?.as_str() != names::MARK_MASQ {
        return None;
    }
    let mut source = None;
    for m in rule.matches.iter() {
        match m {
            Match::Comment(_) => {}
            Match::Source {
                net,
                negated: false,
            } if net.prefix_len() == net.max_prefix_len() && source.is_none() => {
                source = Some(net.addr());
            }
            _ => return None,
        }
    }
    source
}

/// An endpoint chain's rules as one inlined DNAT, when they are exactly the hairpin mark of the
/// endpoint followed by its DNAT (protocol and affinity update the only matches).
pub fn inline_endpoint(chain: &ChainName, rules: &[Rule]) -> Option<Inlined> {
    if !is_endpoint_chain(chain) {
        return None;
    }
    let [hairpin, dnat] = rules else {
        return None;
    };
    let Some(Target::Dnat(to)) = &dnat.target else {
        return None;
    };
    if hairpin_source(hairpin)? != to.ip() {
        return None;
    }
    let mut matches = Vec::new();
    for m in dnat.matches.iter() {
        match m {
            Match::Comment(_) => {}
            Match::Protocol(_)
            | Match::Recent {
                action: RecentAction::Set,
                ..
            } => matches.push(m.clone()),
            _ => return None,
        }
    }
    Some(Inlined { matches, to: *to })
}

/// `rule` with its jump to an endpoint chain replaced by what the chain does; `None` when the
/// rule jumps elsewhere or the chain cannot be folded. Comments are left out: the DNAT names the
/// endpoint, and at 100,000 endpoints they are a tenth of what `nft` parses on a cold load.
pub fn inline_rule<'a>(
    rule: &Rule,
    endpoint: impl Fn(&ChainName) -> Option<&'a [Rule]>,
) -> Option<(Rule, ChainName, Inlined)> {
    let target = rule.jump_target()?;
    let inlined = inline_endpoint(target, endpoint(target)?)?;
    let mut matches: Vec<Match> = rule
        .matches
        .iter()
        .filter(|m| !matches!(m, Match::Comment(_)))
        .cloned()
        .collect();
    matches.extend(inlined.matches.iter().cloned());
    Some((
        Rule::new(matches, Target::Dnat(inlined.to)),
        target.clone(),
        inlined,
    ))
}
