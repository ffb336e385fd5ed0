//! One rule to and from its iptables-restore spelling (`-A CHAIN <matches> -j <target>`).

use std::fmt::Write as _;
use std::net::SocketAddr;

use ipnet::IpNet;

use crate::error::Error;
use crate::plan::model::{
    protocol_keyword, AddrSide, ChainName, CtState, MarkOp, Match, PortMatch, RecentAction, Rule,
    Target,
};
use berth_core::Protocol;

fn protocol_from_iptables(value: &str) -> Option<Protocol> {
    [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|p| protocol_keyword(*p) == value)
}

/// kube-proxy prints probabilities with `%0.10f`; the same text keeps rule dumps comparable.
pub fn probability_text(one_in: u32) -> String {
    format!("{:.10}", 1.0 / f64::from(one_in.max(1)))
}

fn net_text(net: &IpNet) -> String {
    if net.prefix_len() == net.max_prefix_len() {
        net.addr().to_string()
    } else {
        net.to_string()
    }
}

/// The `! ` that negates the option it precedes, as iptables-save places it.
fn negation(negated: bool) -> &'static str {
    if negated {
        "! "
    } else {
        ""
    }
}

fn write_match(out: &mut String, m: &Match) {
    // `write!` into a String cannot fail.
    let _ = match m {
        Match::Comment(text) => write!(out, " -m comment --comment \"{}\"", text.replace('"', "'")),
        Match::Source { net, negated } => {
            write!(out, " {}-s {}", negation(*negated), net_text(net))
        }
        Match::Destination { net, negated } => {
            write!(out, " {}-d {}", negation(*negated), net_text(net))
        }
        Match::Protocol(proto) => {
            let p = protocol_keyword(*proto);
            write!(out, " -m {p} -p {p}")
        }
        Match::DestPort(PortMatch::Single(port)) => write!(out, " --dport {port}"),
        Match::DestPort(PortMatch::Range(lo, hi)) => write!(out, " --dport {lo}:{hi}"),
        Match::Mark {
            value,
            mask,
            negated,
        } => write!(
            out,
            " -m mark {}--mark {value:#x}/{mask:#x}",
            negation(*negated)
        ),
        Match::Random { one_in } => write!(
            out,
            " -m statistic --mode random --probability {}",
            probability_text(*one_in)
        ),
        Match::Recent {
            name,
            action: RecentAction::Set,
        } => {
            write!(out, " -m recent --name {name} --set")
        }
        Match::Recent {
            name,
            action: RecentAction::Rcheck { seconds, reap },
        } => write!(
            out,
            " -m recent --name {name} --rcheck --seconds {seconds}{}",
            if *reap { " --reap" } else { "" }
        ),
        Match::AddrTypeLocal { side, negated } => write!(
            out,
            " -m addrtype {}--{}-type LOCAL",
            negation(*negated),
            match side {
                AddrSide::Src => "src",
                AddrSide::Dst => "dst",
            }
        ),
        Match::Conntrack { states } => {
            let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
            write!(out, " -m conntrack --ctstate {}", states.join(","))
        }
        Match::PhysDevIsIn { negated } => {
            write!(out, " -m physdev {}--physdev-is-in", negation(*negated))
        }
    };
}

fn write_target(out: &mut String, target: &Target) {
    let _ = match target {
        Target::Jump(chain) => write!(out, " -j {chain}"),
        Target::Dnat(addr) => write!(out, " -j DNAT --to-destination {addr}"),
        Target::Masquerade { random_fully } => {
            write!(
                out,
                " -j MASQUERADE{}",
                if *random_fully { " --random-fully" } else { "" }
            )
        }
        Target::Mark {
            op: MarkOp::Or,
            value,
        } => write!(out, " -j MARK --or-mark {value:#x}"),
        Target::Mark {
            op: MarkOp::Xor,
            value,
        } => write!(out, " -j MARK --xor-mark {value:#x}"),
        Target::Reject => write!(out, " -j REJECT"),
        Target::Drop => write!(out, " -j DROP"),
        Target::Return => write!(out, " -j RETURN"),
        Target::Accept => write!(out, " -j ACCEPT"),
    };
}

/// The rule's arguments after the chain name (no leading space).
pub fn rule_args(rule: &Rule) -> String {
    let mut out = String::new();
    for m in rule.matches.iter() {
        write_match(&mut out, m);
    }
    if let Some(target) = &rule.target {
        write_target(&mut out, target);
    }
    out.trim_start().to_string()
}

/// `-A CHAIN args`.
pub fn render_rule(chain: &ChainName, rule: &Rule) -> String {
    let args = rule_args(rule);
    if args.is_empty() {
        format!("-A {chain}")
    } else {
        format!("-A {chain} {args}")
    }
}

/// Splits a restore line into words, honouring double quotes as iptables-restore does.
pub fn split_words(line: &str) -> Result<Vec<String>, Error> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            c => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err(Error::Parse {
            line: line.to_string(),
            reason: "unterminated quote".into(),
        });
    }
    if in_word {
        words.push(current);
    }
    Ok(words)
}

struct Words<'a> {
    line: &'a str,
    words: std::iter::Peekable<std::vec::IntoIter<String>>,
}

impl Words<'_> {
    fn fail(&self, reason: impl Into<String>) -> Error {
        Error::Parse {
            line: self.line.to_string(),
            reason: reason.into(),
        }
    }

    fn next_word(&mut self) -> Result<String, Error> {
        self.words
            .next()
            .ok_or_else(|| self.fail("missing argument"))
    }

    /// A match module's option, which a leading `!` negates: whether it did, and the option.
    fn maybe_negated(&mut self) -> Result<(bool, String), Error> {
        let word = self.next_word()?;
        if word == "!" {
            Ok((true, self.next_word()?))
        } else {
            Ok((false, word))
        }
    }

    fn expect(&mut self, word: &str) -> Result<(), Error> {
        let got = self.next_word()?;
        if got == word {
            Ok(())
        } else {
            Err(self.fail(format!("expected {word}, got {got}")))
        }
    }

    fn number<T: std::str::FromStr>(&mut self) -> Result<T, Error> {
        let word = self.next_word()?;
        word.parse()
            .map_err(|_| self.fail(format!("not a number: {word}")))
    }

    fn hex(&mut self, word: &str) -> Result<u32, Error> {
        u32::from_str_radix(word.trim_start_matches("0x"), 16)
            .map_err(|_| self.fail(format!("not a hex value: {word}")))
    }

    fn net(&mut self) -> Result<IpNet, Error> {
        let word = self.next_word()?;
        word.parse::<IpNet>()
            .or_else(|_| word.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| self.fail(format!("not an address: {word}")))
    }
}

impl Words<'_> {
    /// The options of one `-m <module>`: the typed match, or `None` for the protocol module
    /// that only accompanies `-p`.
    fn module_match(&mut self) -> Result<Option<Match>, Error> {
        let module = self.next_word()?;
        let matched = match module.as_str() {
            "tcp" | "udp" | "sctp" => None,
            "comment" => {
                self.expect("--comment")?;
                Some(Match::comment(self.next_word()?))
            }
            "mark" => {
                let (neg, word) = self.maybe_negated()?;
                if word != "--mark" {
                    return Err(self.fail("expected --mark"));
                }
                let spec = self.next_word()?;
                let (value, mask) = spec.split_once('/').unwrap_or((&spec, "0xffffffff"));
                let (value, mask) = (self.hex(value)?, self.hex(mask)?);
                Some(Match::Mark {
                    value,
                    mask,
                    negated: neg,
                })
            }
            "statistic" => {
                self.expect("--mode")?;
                self.expect("random")?;
                self.expect("--probability")?;
                let p: f64 = self.number()?;
                if !(p > 0.0 && p <= 1.0) {
                    return Err(self.fail("probability out of range"));
                }
                // Planned probabilities are always 1/n.
                Some(Match::Random {
                    one_in: (1.0 / p).round() as u32,
                })
            }
            "recent" => {
                self.expect("--name")?;
                let name = ChainName::new(self.next_word()?);
                let action = match self.next_word()?.as_str() {
                    "--set" => RecentAction::Set,
                    "--rcheck" => {
                        self.expect("--seconds")?;
                        let seconds = self.number()?;
                        let reap = self.words.peek().map(String::as_str) == Some("--reap");
                        if reap {
                            self.words.next();
                        }
                        RecentAction::Rcheck { seconds, reap }
                    }
                    other => return Err(self.fail(format!("unknown recent action {other}"))),
                };
                Some(Match::Recent { name, action })
            }
            "addrtype" => {
                let (neg, word) = self.maybe_negated()?;
                let side = match word.as_str() {
                    "--src-type" => AddrSide::Src,
                    "--dst-type" => AddrSide::Dst,
                    _ => return Err(self.fail("expected --src-type or --dst-type")),
                };
                self.expect("LOCAL")?;
                Some(Match::AddrTypeLocal { side, negated: neg })
            }
            "conntrack" => {
                self.expect("--ctstate")?;
                let list = self.next_word()?;
                let states = list
                    .split(',')
                    .map(|s| CtState::parse(s).ok_or_else(|| self.fail("bad ctstate")))
                    .collect::<Result<Vec<_>, _>>()?;
                Some(Match::Conntrack {
                    states: states.into(),
                })
            }
            "physdev" => {
                let (neg, word) = self.maybe_negated()?;
                if word != "--physdev-is-in" {
                    return Err(self.fail("expected --physdev-is-in"));
                }
                Some(Match::PhysDevIsIn { negated: neg })
            }
            other => return Err(self.fail(format!("unknown match module {other}"))),
        };
        Ok(matched)
    }

    /// The target after `-j`, with its options.
    fn target(&mut self) -> Result<Target, Error> {
        let name = self.next_word()?;
        let target = match name.as_str() {
            "DNAT" => {
                self.expect("--to-destination")?;
                let addr = self.next_word()?;
                let addr: SocketAddr = addr
                    .parse()
                    .map_err(|_| self.fail("bad DNAT destination"))?;
                Target::Dnat(addr)
            }
            "MASQUERADE" => {
                let random_fully = self.words.peek().map(String::as_str) == Some("--random-fully");
                if random_fully {
                    self.words.next();
                }
                Target::Masquerade { random_fully }
            }
            "MARK" => {
                let op = match self.next_word()?.as_str() {
                    "--or-mark" => MarkOp::Or,
                    "--xor-mark" => MarkOp::Xor,
                    other => return Err(self.fail(format!("unknown MARK option {other}"))),
                };
                let value = self.next_word()?;
                Target::Mark {
                    op,
                    value: self.hex(&value)?,
                }
            }
            "REJECT" => Target::Reject,
            "DROP" => Target::Drop,
            "RETURN" => Target::Return,
            "ACCEPT" => Target::Accept,
            chain => Target::Jump(ChainName::new(chain)),
        };
        Ok(target)
    }

    /// `--dport` `n` or `lo:hi`.
    fn port(&mut self) -> Result<PortMatch, Error> {
        let spec = self.next_word()?;
        let port = |word: &str| word.parse().map_err(|_| self.fail("bad port"));
        Ok(match spec.split_once(':') {
            Some((lo, hi)) => PortMatch::Range(port(lo)?, port(hi)?),
            None => PortMatch::Single(port(&spec)?),
        })
    }
}

/// Parses the words after `-A CHAIN` back into a typed rule (the inverse of [`rule_args`]).
pub fn parse_rule(line: &str, words: Vec<String>) -> Result<Rule, Error> {
    let mut w = Words {
        line,
        words: words.into_iter().peekable(),
    };
    let mut matches = Vec::new();
    let mut target = None;
    let mut negated = false;
    while let Some(word) = w.words.next() {
        match word.as_str() {
            "!" => {
                negated = true;
                continue;
            }
            "-s" => matches.push(Match::Source {
                net: w.net()?,
                negated,
            }),
            "-d" => matches.push(Match::Destination {
                net: w.net()?,
                negated,
            }),
            "-p" => {
                let proto = w.next_word()?;
                let proto = protocol_from_iptables(&proto)
                    .ok_or_else(|| w.fail(format!("unknown protocol {proto}")))?;
                // `-m tcp -p tcp` is one typed match; the module word was consumed before.
                matches.push(Match::Protocol(proto));
            }
            "--dport" => matches.push(Match::DestPort(w.port()?)),
            "-m" => {
                if let Some(m) = w.module_match()? {
                    matches.push(m);
                }
            }
            "-j" => target = Some(w.target()?),
            other => return Err(w.fail(format!("unknown option {other}"))),
        }
        negated = false;
    }
    Ok(Rule {
        matches: matches.into(),
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(rule: Rule) {
        let text = rule_args(&rule);
        let words = split_words(&text).unwrap();
        assert_eq!(parse_rule(&text, words).unwrap(), rule, "{text}");
    }

    #[test]
    fn probabilities_match_kube_proxy_formatting() {
        assert_eq!(probability_text(2), "0.5000000000");
        assert_eq!(probability_text(3), "0.3333333333");
        assert_eq!(probability_text(7), "0.1428571429");
    }

    #[test]
    fn renders_like_kube_proxy() {
        let rule = Rule::jump(
            vec![
                Match::comment("ns1/svc1:p80 cluster IP"),
                Match::Protocol(Protocol::Tcp),
                Match::dst("10.96.0.41".parse().unwrap()),
                Match::DestPort(PortMatch::Single(80)),
            ],
            &ChainName::new("BERTH-SVC-X"),
        );
        assert_eq!(
            render_rule(&ChainName::new("BERTH-SERVICES"), &rule),
            "-A BERTH-SERVICES -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 10.96.0.41 --dport 80 -j BERTH-SVC-X"
        );
    }

    #[test]
    fn every_match_and_target_round_trips() {
        let chain = ChainName::new("BERTH-SEP-A");
        let matches = vec![
            Match::comment("a \"quoted\" comment"),
            Match::Source {
                net: "10.244.0.0/16".parse().unwrap(),
                negated: true,
            },
            Match::Destination {
                net: "fd00::/64".parse().unwrap(),
                negated: false,
            },
            Match::Protocol(Protocol::Sctp),
            Match::DestPort(PortMatch::Range(30000, 30255)),
            Match::Mark {
                value: 0x4000,
                mask: 0x4000,
                negated: true,
            },
            Match::Random { one_in: 3 },
            Match::Recent {
                name: chain.clone(),
                action: RecentAction::Set,
            },
            Match::Recent {
                name: chain.clone(),
                action: RecentAction::Rcheck {
                    seconds: 10800,
                    reap: true,
                },
            },
            Match::AddrTypeLocal {
                side: AddrSide::Src,
                negated: true,
            },
            Match::AddrTypeLocal {
                side: AddrSide::Dst,
                negated: false,
            },
            Match::Conntrack {
                states: Box::new([CtState::Related, CtState::Established]),
            },
            Match::PhysDevIsIn { negated: true },
        ];
        let targets = [
            Some(Target::Jump(chain.clone())),
            Some(Target::Dnat("[fd00::5]:8080".parse().unwrap())),
            Some(Target::Dnat("10.244.1.5:8080".parse().unwrap())),
            Some(Target::Masquerade { random_fully: true }),
            Some(Target::Masquerade {
                random_fully: false,
            }),
            Some(Target::Mark {
                op: MarkOp::Or,
                value: 0x4000,
            }),
            Some(Target::Mark {
                op: MarkOp::Xor,
                value: 0x4000,
            }),
            Some(Target::Reject),
            Some(Target::Drop),
            Some(Target::Return),
            Some(Target::Accept),
            None,
        ];
        for target in targets {
            let mut expected_matches = matches.clone();
            // Quotes inside comments are rendered as apostrophes.
            expected_matches[0] = Match::comment("a 'quoted' comment");
            let rule = Rule {
                matches: matches.clone().into(),
                target: target.clone(),
            };
            let text = rule_args(&rule);
            let parsed = parse_rule(&text, split_words(&text).unwrap()).unwrap();
            assert_eq!(
                parsed,
                Rule {
                    matches: expected_matches.into(),
                    target
                }
            );
        }
        round_trip(Rule::new(vec![], Target::Accept));
    }

    #[test]
    fn parse_errors_are_reported() {
        for bad in [
            "-m nosuch",
            "-j DNAT --to-destination nope",
            "-m comment --comment \"x",
            "-s",
        ] {
            let words = split_words(bad);
            let parsed = words.and_then(|words| parse_rule(bad, words));
            assert!(parsed.is_err(), "{bad}");
        }
    }
}
