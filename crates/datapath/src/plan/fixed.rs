//! The chains every node has regardless of Services: entry chains, masquerading, forwarding,
//! and the jumps from the built-in chains.

use crate::plan::model::{
    ChainName, CtState, JumpRule, MarkOp, Match, Rule, Ruleset, Table, Target, MASQ_MARK,
};
use crate::plan::names;

fn masq() -> ChainName {
    names::fixed(names::MARK_MASQ)
}

fn ct_new() -> Match {
    Match::Conntrack {
        states: Box::new([CtState::New]),
    }
}

/// The built-in jumps, top of each built-in chain first.
pub fn builtin_jumps() -> Vec<JumpRule> {
    let jump = |table, from: &str, to: &'static str, comment: &str, new_only: bool| {
        let mut matches = vec![Match::comment(comment)];
        if new_only {
            matches.push(ct_new());
        }
        JumpRule {
            table,
            from: ChainName::new(from),
            rule: Rule::jump(matches, &names::fixed(to)),
        }
    };
    let firewall = "berth load balancer firewall";
    let portals = "berth service portals";
    let external = "berth externally-visible service portals";
    let mut jumps = vec![
        jump(
            Table::Filter,
            "INPUT",
            names::PROXY_FIREWALL,
            firewall,
            true,
        ),
        jump(
            Table::Filter,
            "INPUT",
            names::NODEPORTS,
            "berth health check service ports",
            false,
        ),
        jump(
            Table::Filter,
            "INPUT",
            names::EXTERNAL_SERVICES,
            external,
            true,
        ),
        jump(
            Table::Filter,
            "FORWARD",
            names::PROXY_FIREWALL,
            firewall,
            true,
        ),
        jump(
            Table::Filter,
            "FORWARD",
            names::FORWARD,
            "berth forwarding rules",
            false,
        ),
        jump(Table::Filter, "FORWARD", names::SERVICES, portals, true),
        jump(
            Table::Filter,
            "FORWARD",
            names::EXTERNAL_SERVICES,
            external,
            true,
        ),
        jump(
            Table::Filter,
            "OUTPUT",
            names::PROXY_FIREWALL,
            firewall,
            true,
        ),
        jump(Table::Filter, "OUTPUT", names::SERVICES, portals, true),
        jump(Table::Nat, "PREROUTING", names::SERVICES, portals, false),
        jump(Table::Nat, "OUTPUT", names::SERVICES, portals, false),
        jump(
            Table::Nat,
            "POSTROUTING",
            names::POSTROUTING,
            "berth postrouting rules",
            false,
        ),
    ];
    // Grouped the way iptables-save lists them; the order within one built-in chain is kept.
    jumps.sort_by(|a, b| (a.table, &a.from).cmp(&(b.table, &b.from)));
    jumps
}

pub(crate) fn plan_fixed_chains(rs: &mut Ruleset, random_fully: bool) {
    for chain in [
        names::SERVICES,
        names::EXTERNAL_SERVICES,
        names::FORWARD,
        names::NODEPORTS,
        names::PROXY_FIREWALL,
    ] {
        rs.table_mut(Table::Filter).chain_mut(&names::fixed(chain));
    }
    for chain in [
        names::SERVICES,
        names::NODEPORTS,
        names::POSTROUTING,
        names::MARK_MASQ,
    ] {
        rs.table_mut(Table::Nat).chain_mut(&names::fixed(chain));
    }
    let nat = rs.table_mut(Table::Nat);
    let post = names::fixed(names::POSTROUTING);
    nat.push(
        &post,
        Rule::new(
            vec![Match::Mark {
                value: MASQ_MARK,
                mask: MASQ_MARK,
                negated: true,
            }],
            Target::Return,
        ),
    );
    // Clear the mark so a packet that traverses the stack again is not masqueraded twice.
    nat.push(
        &post,
        Rule::new(
            vec![],
            Target::Mark {
                op: MarkOp::Xor,
                value: MASQ_MARK,
            },
        ),
    );
    nat.push(
        &post,
        Rule::new(
            vec![Match::comment("berth service traffic requiring SNAT")],
            Target::Masquerade { random_fully },
        ),
    );
    nat.push(
        &masq(),
        Rule::new(
            vec![],
            Target::Mark {
                op: MarkOp::Or,
                value: MASQ_MARK,
            },
        ),
    );

    let filter = rs.table_mut(Table::Filter);
    let forward = names::fixed(names::FORWARD);
    filter.push(
        &forward,
        Rule::new(
            vec![Match::Conntrack {
                states: Box::new([CtState::Invalid]),
            }],
            Target::Drop,
        ),
    );
    // Marked traffic is forwarded even when the FORWARD policy is DROP (node ports to other nodes).
    filter.push(
        &forward,
        Rule::new(
            vec![
                Match::comment("berth forwarding rules"),
                Match::Mark {
                    value: MASQ_MARK,
                    mask: MASQ_MARK,
                    negated: false,
                },
            ],
            Target::Accept,
        ),
    );
    filter.push(
        &forward,
        Rule::new(
            vec![
                Match::comment("berth forwarding conntrack rule"),
                Match::Conntrack {
                    states: Box::new([CtState::Related, CtState::Established]),
                },
            ],
            Target::Accept,
        ),
    );
}
