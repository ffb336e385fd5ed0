//! The decoder against berth's own writer: every rule the writer can write reads back as the
//! rule (a property over the whole rule language), a small table of every kind of object reads
//! back as the in-memory nftables holds it, and each way another program could change the table
//! is refused with a message that names the object.

use std::net::IpAddr;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::fake::MemoryNft;
use crate::nft::expr::{rule_userdata, write_rule_exprs};
use crate::nft::netlink::build_batch;
use crate::nft::render::{Command, Element, NftRule, Transaction, TABLE};
use crate::nft::shard::MAIN;
use crate::nft::sync::Nft;
use crate::nft::wire::Writer;
use crate::plan::model::{AddrSide, CtState, MarkOp, Match, PortMatch, RecentAction, Rule, Target};
use berth_core::Protocol;

fn nat(name: &str) -> NftChain {
    NftChain::new(Table::Nat, &ChainName::new(name))
}

fn filter(name: &str) -> NftChain {
    NftChain::new(Table::Filter, &ChainName::new(name))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn base(chain: &NftChain) -> Command {
    Command::AddChain(chain.clone(), Hook::of_builtin(chain.table, &chain.name))
}

/// A table with one of everything berth writes: both hooks' base chains, the maps, the hairpin
/// and `cluster-ips` sets with elements, an affinity set, and rules of every match and target.
fn mk_tx() -> Transaction {
    let mut tx = Transaction::new(IpFamily::V4);
    let (pre, post, fwd) = (nat("PREROUTING"), nat("POSTROUTING"), filter("FORWARD"));
    let (services, svc, mark) = (
        nat("BERTH-SERVICES"),
        nat("BERTH-SVC-A"),
        nat("BERTH-MARK-MASQ"),
    );
    let (node_ports, filter_chain) = (nat("BERTH-NODEPORTS"), filter("BERTH-FORWARD"));
    let affinity = ChainName::new("BERTH-SEP-A1");
    for c in [
        Command::AddTable(MAIN),
        Command::AddMaps(MAIN),
        base(&pre),
        base(&post),
        base(&fwd),
        Command::AddChain(services.clone(), None),
        Command::AddChain(node_ports.clone(), None),
        Command::AddChain(svc.clone(), None),
        Command::AddChain(mark.clone(), None),
        Command::AddChain(filter_chain.clone(), None),
        Command::AddChain(filter("BERTH-CLUSTER-IPS"), None),
        Command::AddAffinitySet(MAIN, affinity.clone(), 300),
    ] {
        tx.push(c);
    }
    let rule = |chain: &NftChain, matches: Vec<Match>, target: Option<Target>| {
        Command::AddRule(
            chain.clone(),
            NftRule::Rule(Rule {
                matches: Arc::from(matches),
                target,
            }),
        )
    };
    let jump = |to: &NftChain| Some(Target::Jump(to.name.clone()));
    let rules = vec![
        rule(
            &pre,
            vec![Match::comment("berth service portals")],
            jump(&services),
        ),
        Command::AddRule(services.clone(), NftRule::ServiceMap),
        rule(
            &services,
            vec![
                Match::comment("berth service nodeports"),
                Match::AddrTypeLocal {
                    side: AddrSide::Dst,
                    negated: false,
                },
            ],
            jump(&node_ports),
        ),
        Command::AddRule(node_ports.clone(), NftRule::NodePortMap),
        rule(
            &svc,
            vec![
                Match::Destination {
                    net: "10.96.0.10/32".parse().unwrap(),
                    negated: false,
                },
                Match::Source {
                    net: "10.244.0.0/16".parse().unwrap(),
                    negated: true,
                },
                Match::Source {
                    net: "198.18.0.0/23".parse().unwrap(),
                    negated: false,
                },
                Match::Protocol(Protocol::Tcp),
                Match::DestPort(PortMatch::Single(80)),
            ],
            jump(&mark),
        ),
        rule(
            &svc,
            vec![
                Match::Source {
                    net: ip("0.0.0.0").into(),
                    negated: false,
                },
                Match::Recent {
                    name: affinity.clone(),
                    action: RecentAction::Rcheck {
                        seconds: 300,
                        reap: true,
                    },
                },
                Match::Recent {
                    name: affinity.clone(),
                    action: RecentAction::Set,
                },
                Match::Protocol(Protocol::Tcp),
            ],
            Some(Target::Dnat("10.244.1.2:8080".parse().unwrap())),
        ),
        rule(
            &svc,
            vec![Match::Random { one_in: 2 }, Match::Protocol(Protocol::Udp)],
            Some(Target::Dnat("10.244.2.2:53".parse().unwrap())),
        ),
        rule(&svc, vec![], Some(Target::Reject)),
        rule(
            &mark,
            vec![],
            Some(Target::Mark {
                op: MarkOp::Or,
                value: 0x4000,
            }),
        ),
        Command::AddRule(post.clone(), NftRule::Hairpin(mark.name.clone())),
        rule(
            &post,
            vec![Match::Mark {
                value: 0,
                mask: 0x4000,
                negated: false,
            }],
            Some(Target::Return),
        ),
        rule(
            &post,
            vec![],
            Some(Target::Mark {
                op: MarkOp::Xor,
                value: 0x4000,
            }),
        ),
        rule(
            &post,
            vec![Match::comment("berth service traffic requiring SNAT")],
            Some(Target::Masquerade { random_fully: true }),
        ),
        rule(&fwd, vec![], jump(&filter_chain)),
        rule(
            &filter_chain,
            vec![Match::Conntrack {
                states: Box::new([CtState::Invalid]),
            }],
            Some(Target::Drop),
        ),
        rule(
            &filter_chain,
            vec![
                Match::comment("berth forwarding conntrack rule"),
                Match::Conntrack {
                    states: Box::new([CtState::Related, CtState::Established]),
                },
            ],
            Some(Target::Accept),
        ),
        rule(
            &filter_chain,
            vec![
                Match::Protocol(Protocol::Sctp),
                Match::DestPort(PortMatch::Range(30000, 32767)),
            ],
            None,
        ),
        Command::AddElement(Element::Service(
            (ip("10.96.0.10"), Protocol::Tcp, 80),
            svc.clone(),
        )),
        Command::AddElement(Element::Service(
            (ip("10.96.0.10"), Protocol::Udp, 53),
            svc.clone(),
        )),
        Command::AddElement(Element::NodePort((Protocol::Tcp, 30080), svc.clone())),
        Command::AddElement(Element::Hairpin(ip("10.244.1.2"))),
        Command::AddRule(filter("BERTH-CLUSTER-IPS"), NftRule::ClusterIpSet),
        rule(
            &filter("BERTH-CLUSTER-IPS"),
            vec![Match::comment(
                "berth: drop traffic to unallocated cluster IPs",
            )],
            Some(Target::Drop),
        ),
        Command::AddElement(Element::ClusterIp(ip("10.96.0.10"))),
        Command::AddElement(Element::ClusterIp(ip("10.96.0.20"))),
    ];
    for c in rules {
        tx.push(c);
    }
    tx
}

fn raw_of(tx: &Transaction) -> RawTable {
    RawTable::of_batch(&build_batch(tx, TABLE, 1).bytes)
}

fn memory_of(tx: &Transaction) -> NftTable {
    let mut memory = MemoryNft::new(tx.family);
    memory.apply(tx).unwrap();
    memory.table.unwrap()
}

#[test]
fn a_table_of_every_kind_of_object_reads_back_as_written() {
    let tx = mk_tx();
    let decoded = decode_table(IpFamily::V4, &raw_of(&tx)).unwrap();
    let want = memory_of(&tx).kernel_form();
    assert_eq!(decoded, want);
    assert_eq!(
        decoded.kernel_form(),
        decoded,
        "a decoded table is its own kernel form"
    );
    // What the kernel form changed: the conntrack states' order and the first comment moved
    // to the front; nothing else.
    assert_ne!(memory_of(&tx), want);
}

#[test]
fn a_table_without_maps_reads_back() {
    let mut tx = Transaction::new(IpFamily::V6);
    tx.push(Command::AddTable(MAIN));
    tx.push(Command::AddChain(nat("BERTH-SVC-X"), None));
    tx.push(Command::AddRule(
        nat("BERTH-SVC-X"),
        NftRule::Rule(Rule::new(
            vec![Match::dst("fd00:96::10".parse().unwrap())],
            Target::Dnat("[fd00:244:1::5]:8080".parse().unwrap()),
        )),
    ));
    tx.push(Command::AddRule(
        nat("BERTH-SVC-X"),
        NftRule::Rule(Rule::new(vec![], Target::Reject)),
    ));
    let decoded = decode_table(IpFamily::V6, &raw_of(&tx)).unwrap();
    assert!(decoded.maps.is_empty());
    assert_eq!(decoded, memory_of(&tx).kernel_form());
}

/// An expression list of one expression `name` with `data`.
fn exprs_of(name: &str, data: impl Fn(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::default();
    let e = w.begin_nest(1);
    w.put_str(1, name);
    let d = w.begin_nest(2);
    data(&mut w);
    w.end_nest(d);
    w.end_nest(e);
    w.into_bytes()
}

/// A rule message of chain `chain` with these expressions.
fn rule_message(chain: &str, exprs: &[u8], userdata: Option<&[u8]>) -> Vec<u8> {
    let mut w = Writer::default();
    w.put_str(1, TABLE);
    w.put_str(2, chain);
    w.put(4, exprs);
    if let Some(u) = userdata {
        w.put(7, u);
    }
    w.into_bytes()
}

/// A planned rule's expressions, as the writer writes them.
fn written(family: IpFamily, table: Table, rule: &NftRule) -> Vec<u8> {
    let mut w = Writer::default();
    write_rule_exprs(&mut w, family, table, rule);
    w.into_bytes()
}

/// (what another program did to the table, words the error must contain)
#[test]
fn a_table_berth_never_wrote_is_refused_by_name() {
    type Tamper = fn(&mut RawTable);
    let rows: Vec<(&str, Tamper, &str)> = vec![
        (
            "a rule with an expression berth never writes",
            |raw| {
                let log = exprs_of("log", |w| w.put_str(2, "hello"));
                raw.rules.push(rule_message("nat-BERTH-SVC-A", &log, None));
            },
            "rule 5 of chain nat-BERTH-SVC-A: expression \"log\"",
        ),
        (
            "an xtables rule",
            |raw| {
                let mut w = Writer::default();
                w.extend(&rule_message("filter-BERTH-FORWARD", &[], None));
                w.put_u32(5, 1);
                raw.rules.push(w.into_bytes());
            },
            "xtables",
        ),
        (
            "a verdict cut from a rule",
            |raw| {
                let rule = NftRule::Rule(Rule::new(
                    vec![Match::Protocol(Protocol::Tcp)],
                    Target::Drop,
                ));
                let mut exprs = written(IpFamily::V4, Table::Nat, &rule);
                // Drop the last expression (the verdict): the list is now a bare match.
                let mut cut = Writer::default();
                for (i, a) in crate::nft::wire::Attrs(&exprs).enumerate() {
                    if i < 2 {
                        cut.put(1 | crate::nft::wire::NLA_F_NESTED, a.value);
                    }
                }
                exprs = cut.into_bytes();
                raw.rules
                    .push(rule_message("nat-BERTH-SVC-A", &exprs, None));
            },
            "without a verdict",
        ),
        (
            "a damaged expression list",
            |raw| {
                let rule = NftRule::Rule(Rule::new(vec![], Target::Accept));
                let mut exprs = written(IpFamily::V4, Table::Nat, &rule);
                exprs.truncate(exprs.len() - 3);
                raw.rules
                    .push(rule_message("nat-BERTH-SVC-A", &exprs, None));
            },
            "damaged attribute",
        ),
        (
            "a jump from a nat chain into a filter chain",
            |raw| {
                let mut w = Writer::default();
                let e = w.begin_nest(1);
                w.put_str(1, "immediate");
                let d = w.begin_nest(2);
                w.put_u32(1, 0);
                let data = w.begin_nest(2);
                crate::nft::expr::put_verdict(
                    &mut w,
                    crate::nft::expr::NFT_JUMP,
                    Some("filter-BERTH-FORWARD"),
                );
                w.end_nest(data);
                w.end_nest(d);
                w.end_nest(e);
                raw.rules
                    .push(rule_message("nat-BERTH-SVC-A", w.bytes(), None));
            },
            "outside the rule's nat chains",
        ),
        (
            "a comment and another userdata",
            |raw| {
                let rule = NftRule::Rule(Rule::new(vec![], Target::Accept));
                let exprs = written(IpFamily::V4, Table::Nat, &rule);
                raw.rules.push(rule_message(
                    "nat-BERTH-SVC-A",
                    &exprs,
                    Some(&[0, 2, b'x', 0, 1, 4, 0, 0, 0, 0]),
                ));
            },
            "userdata of type 1",
        ),
        (
            "a chain of another program",
            |raw| {
                let mut w = Writer::default();
                w.put_str(1, TABLE);
                w.put_str(3, "nat-KUBE-SERVICES");
                raw.chains.push(w.into_bytes());
            },
            "chain nat-KUBE-SERVICES: not a chain berth plans",
        ),
        (
            "a base chain with a drop policy",
            |raw| {
                let chain = raw
                    .chains
                    .iter_mut()
                    .find(|m| chain_msg(m).is_some_and(|c| c.name == "filter-FORWARD"))
                    .unwrap();
                let mut w = Writer::default();
                for a in crate::nft::wire::Attrs(chain) {
                    if a.kind == 5 {
                        w.put_u32(5, 0);
                    } else if a.kind == 4 {
                        w.put(4 | crate::nft::wire::NLA_F_NESTED, a.value);
                    } else {
                        w.put(a.kind, a.value);
                    }
                }
                *chain = w.into_bytes();
            },
            "policy is not accept",
        ),
        (
            "a set of another shape",
            |raw| {
                let mut w = Writer::default();
                w.put_str(1, TABLE);
                w.put_str(2, "allowed");
                w.put_u32(3, 0x1);
                w.put_u32(4, 7);
                w.put_u32(5, 4);
                raw.sets.push(w.into_bytes());
            },
            "set allowed",
        ),
        (
            "a map gone",
            |raw| {
                raw.sets
                    .retain(|m| set_msg(m).is_some_and(|s| s.name != NODE_PORT_MAP))
            },
            "only some of",
        ),
        (
            "a hairpin pair of two addresses",
            |raw| {
                let mut w = Writer::default();
                w.put_str(1, TABLE);
                w.put_str(2, HAIRPIN_SET);
                let list = w.begin_nest(3);
                let e = w.begin_nest(1);
                let k = w.begin_nest(1);
                w.put(1, &[10, 244, 1, 2, 10, 244, 1, 3]);
                w.end_nest(k);
                w.end_nest(e);
                w.end_nest(list);
                raw.elements.push(w.into_bytes());
            },
            "element 1 of hairpin: a pair of two addresses",
        ),
    ];
    for (what, tamper, words) in rows {
        let mut raw = raw_of(&mk_tx());
        tamper(&mut raw);
        let err = decode_table(IpFamily::V4, &raw)
            .map(|_| ())
            .expect_err(what);
        assert!(matches!(err, Error::Decode { .. }), "{what}: {err:?}");
        assert!(err.to_string().contains(words), "{what}: {err}");
    }
}

fn arb_net(v6: bool) -> impl Strategy<Value = ipnet::IpNet> {
    if v6 {
        (any::<u128>(), 0u8..=128)
            .prop_map(|(a, p)| ipnet::IpNet::new(IpAddr::from(a.to_be_bytes()), p).unwrap())
            .boxed()
    } else {
        (any::<u32>(), 0u8..=32)
            .prop_map(|(a, p)| ipnet::IpNet::new(IpAddr::from(a.to_be_bytes()), p).unwrap())
            .boxed()
    }
}

fn arb_match(v6: bool) -> impl Strategy<Value = Match> {
    let set = prop_oneof![Just("BERTH-SEP-A"), Just("BERTH-SEP-B")].prop_map(ChainName::new);
    let state = prop_oneof![
        Just(CtState::New),
        Just(CtState::Established),
        Just(CtState::Related),
        Just(CtState::Invalid)
    ];
    let side = prop_oneof![Just(AddrSide::Src), Just(AddrSide::Dst)];
    prop_oneof![
        "[ -~]{0,40}".prop_map(Match::comment),
        (arb_net(v6), any::<bool>()).prop_map(|(net, negated)| Match::Source { net, negated }),
        (arb_net(v6), any::<bool>()).prop_map(|(net, negated)| Match::Destination { net, negated }),
        prop_oneof![
            Just(Protocol::Tcp),
            Just(Protocol::Udp),
            Just(Protocol::Sctp)
        ]
        .prop_map(Match::Protocol),
        any::<u16>().prop_map(|p| Match::DestPort(PortMatch::Single(p))),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Match::DestPort(PortMatch::Range(a, b))),
        (any::<u32>(), any::<u32>(), any::<bool>()).prop_map(|(value, mask, negated)| {
            Match::Mark {
                value,
                mask,
                negated,
            }
        }),
        (0u32..20).prop_map(|one_in| Match::Random { one_in }),
        set.clone().prop_map(|name| Match::Recent {
            name,
            action: RecentAction::Set
        }),
        set.prop_map(|name| Match::Recent {
            name,
            action: RecentAction::Rcheck {
                seconds: 10,
                reap: false
            }
        }),
        (side, any::<bool>()).prop_map(|(side, negated)| Match::AddrTypeLocal { side, negated }),
        proptest::collection::vec(state, 0..4).prop_map(|states| Match::Conntrack {
            states: states.into()
        }),
    ]
}

fn arb_target(v6: bool) -> impl Strategy<Value = Option<Target>> {
    let addr = if v6 {
        any::<u128>()
            .prop_map(|a| IpAddr::from(a.to_be_bytes()))
            .boxed()
    } else {
        any::<u32>()
            .prop_map(|a| IpAddr::from(a.to_be_bytes()))
            .boxed()
    };
    let op = prop_oneof![Just(MarkOp::Or), Just(MarkOp::Xor)];
    prop_oneof![
        Just(None),
        Just(Some(Target::Jump(ChainName::new("BERTH-SVC-B")))),
        (addr, any::<u16>()).prop_map(|(a, p)| Some(Target::Dnat(std::net::SocketAddr::new(a, p)))),
        any::<bool>().prop_map(|random_fully| Some(Target::Masquerade { random_fully })),
        (op, any::<u32>()).prop_map(|(op, value)| Some(Target::Mark { op, value })),
        Just(Some(Target::Reject)),
        Just(Some(Target::Drop)),
        Just(Some(Target::Return)),
        Just(Some(Target::Accept)),
    ]
}

fn arb_rule() -> impl Strategy<Value = (IpFamily, Rule)> {
    any::<bool>().prop_flat_map(|v6| {
        let family = if v6 { IpFamily::V6 } else { IpFamily::V4 };
        (
            proptest::collection::vec(arb_match(v6), 0..6),
            arb_target(v6),
        )
            .prop_map(move |(matches, target)| {
                (
                    family,
                    Rule {
                        matches: Arc::from(matches),
                        target,
                    },
                )
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Every rule the writer can write decodes to the rule as the kernel holds it.
    #[test]
    fn every_rule_the_writer_writes_reads_back(rule in arb_rule()) {
        let (family, rule) = rule;
        let rule = NftRule::Rule(rule);
        let affinity: BTreeMap<ChainName, u32> = [("BERTH-SEP-A", 600), ("BERTH-SEP-B", 30)]
            .into_iter()
            .map(|(n, s)| (ChainName::new(n), s))
            .collect();
        let exprs = written(family, Table::Nat, &rule);
        let userdata = rule_userdata(&rule);
        let cx = rule::Context { family, table: Table::Nat, affinity: &affinity };
        let parsed = expr::parse_exprs(&exprs).unwrap();
        let decoded = rule::decode_rule(&cx, &parsed, userdata.as_deref()).unwrap();
        prop_assert_eq!(decoded, kernel_rule(&rule, &affinity));
    }
}
