//! What the kernel holds of a planned rule ([`kernel_rule`]): what the decoder reads back when
//! berth wrote the rule. Not recovered on the way: comments beyond the first (and the first as
//! nft stores it, in front), conntrack states' order, host bits of an address under its prefix,
//! an affinity check's timeout (it is the set's) and its reaping (a timeout set always reaps),
//! `physdev` (never planned for nftables), and `or 0` (the same statement as `xor 0`).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::nft::render::{comment_text, NftRule};
use crate::plan::model::{ChainName, MarkOp, Match, RecentAction, Rule, Target};

/// What the kernel holds of a planned rule, as the decoder reads it back; `affinity` gives
/// each affinity set's timeout.
pub fn kernel_rule(rule: &NftRule, affinity: &BTreeMap<ChainName, u32>) -> NftRule {
    let NftRule::Rule(rule) = rule else {
        return rule.clone();
    };
    let mut matches: Vec<Match> = comment_text(rule)
        .map(|c| Match::Comment(Arc::from(c)))
        .into_iter()
        .collect();
    for m in rule.matches.iter() {
        matches.push(match m {
            Match::Comment(_) | Match::PhysDevIsIn { .. } => continue,
            Match::Source { net, negated } => Match::Source {
                net: net.trunc(),
                negated: *negated,
            },
            Match::Destination { net, negated } => Match::Destination {
                net: net.trunc(),
                negated: *negated,
            },
            Match::Random { one_in } => Match::Random {
                one_in: (*one_in).max(1),
            },
            Match::Recent {
                name,
                action: RecentAction::Rcheck { seconds, .. },
            } => Match::Recent {
                name: name.clone(),
                action: RecentAction::Rcheck {
                    seconds: affinity.get(name).copied().unwrap_or(*seconds),
                    reap: true,
                },
            },
            Match::Conntrack { states } => {
                let mut states = states.to_vec();
                states.sort();
                states.dedup();
                Match::Conntrack {
                    states: states.into(),
                }
            }
            other => other.clone(),
        });
    }
    let target = match &rule.target {
        Some(Target::Mark {
            op: MarkOp::Or,
            value: 0,
        }) => Some(Target::Mark {
            op: MarkOp::Xor,
            value: 0,
        }),
        other => other.clone(),
    };
    NftRule::Rule(Rule {
        matches: Arc::from(matches),
        target,
    })
}
