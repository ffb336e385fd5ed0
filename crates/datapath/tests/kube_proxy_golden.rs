//! berth's rules compared with kube-proxy's own: the input of kube-proxy's
//! `TestOverallIPTablesRules` (pkg/proxy/iptables/proxier_test.go), planned by berth with linear
//! dispatch, against that test's expected dump (`golden/kube_proxy/overall.txt`, kept as kube-proxy
//! wrote it, `KUBE-` chains and all). Compared chain by chain after renaming `KUBE-` to `BERTH-`:
//! the same chains, with the same rules in the same order, except where berth differs on
//! purpose; each such difference is listed in `DIFFERENCES` with the reason, and a difference
//! not listed fails the test.
//!
//! Address plan: kube-proxy's test's own (Services 172.30.0.0/16, endpoints 10.180.0.0/24, pod
//! CIDR 10.0.0.0/8, node ports 3001-3003), so the dump is comparable line by line. Nothing here
//! touches a kernel.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use berth_datapath::plan::names;
use berth_datapath::*;

mod common;
use common::kube_proxy::kube_proxy_overall_view;

/// `--comment "x"` as `--comment x` where `x` has no space: iptables-restore reads both alike, and
/// kube-proxy writes the bare form.
fn unquote_single_words(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find("--comment \"") {
        let (head, tail) = rest.split_at(at + "--comment ".len());
        out.push_str(head);
        let body = &tail[1..];
        match body.find('"') {
            Some(end) if !body[..end].contains(' ') => {
                out.push_str(&body[..end]);
                rest = &body[end + 1..];
            }
            _ => {
                out.push('"');
                rest = body;
            }
        }
    }
    out.push_str(rest);
    out
}

/// kube-proxy's hashed chain names for the view's Services and endpoints, mapped to berth's.
/// Both hash the Service port name and protocol (and the endpoint for SEP chains) with SHA-256
/// and base32; kube-proxy spells the protocol `tcp`, berth `TCP`, so the names differ while the
/// chains play the same roles. Recorded, not hidden: see the README of the golden directory.
fn chain_names(view: &NodeView) -> Vec<(String, String)> {
    let mut names = Vec::new();
    for svc in &view.services {
        let proto = svc.protocol.as_str();
        let theirs = names::hash16(&format!("{}{}", svc.name, proto.to_lowercase()));
        let ours = names::hash16(&format!("{}{proto}", svc.name));
        for kind in ["SVC", "SVL", "EXT", "FW"] {
            names.push((
                format!("KUBE-{kind}-{theirs}"),
                format!("BERTH-{kind}-{ours}"),
            ));
        }
        for ep in &svc.endpoints {
            let theirs = names::hash16(&format!(
                "{}{}{}",
                svc.name,
                proto.to_lowercase(),
                ep.address()
            ));
            names.push((
                format!("KUBE-SEP-{theirs}"),
                names::endpoint_chain(&svc.name, svc.protocol, ep)
                    .as_str()
                    .to_string(),
            ));
        }
    }
    names
}

/// One dump's chains: (table, chain) to its rules (the text after `-A <chain> `), in order.
type Chains = BTreeMap<(String, String), Vec<String>>;

fn chains(dump: &str) -> Chains {
    let mut out = Chains::new();
    let mut table = String::new();
    for line in dump.lines() {
        let line = &unquote_single_words(line);
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
        } else if let Some(chain) = line.strip_prefix(':') {
            let name = chain.split_whitespace().next().unwrap().to_string();
            out.entry((table.clone(), name)).or_default();
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let (chain, rest) = rule.split_once(' ').unwrap_or((rule, ""));
            out.entry((table.clone(), chain.to_string()))
                .or_default()
                .push(rest.to_string());
        }
    }
    out
}

/// Where berth's rules differ from kube-proxy's on purpose, as edits to kube-proxy's dump:
/// (table, chain, kube-proxy's rule or `None` for the whole chain, berth's rule or `None` when
/// berth has none, why).
/// One difference: (table, chain, kube-proxy's rule, berth's rule, why).
type Difference = (
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    &'static str,
);

const DIFFERENCES: &[Difference] = &[
    (
        "filter",
        "BERTH-FIREWALL",
        None,
        None,
        "the localnet guard belongs to route_localnet, which berth does not set on nodes",
    ),
    (
        "filter",
        "BERTH-FORWARD",
        Some("-m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"),
        Some("-m conntrack --ctstate INVALID -j DROP"),
        "no nfacct counters: berth's metrics come from its own syncs, and nfacct is not on every kernel",
    ),
    (
        "filter",
        "BERTH-FORWARD",
        Some(r#"-m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT"#),
        Some(r#"-m comment --comment "berth forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT"#),
        "berth names itself in its comments",
    ),
    (
        "filter",
        "BERTH-FORWARD",
        Some(r#"-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"#),
        Some(r#"-m comment --comment "berth forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"#),
        "berth names itself in its comments",
    ),
    (
        "nat",
        "BERTH-NODEPORTS",
        Some("-m comment --comment ns2/svc2:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3001 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j BERTH-EXT-GNZBNJ2PO5MGZ6GT"),
        None,
        "no nfacct counter for node ports on localhost; the next rule accepts them all the same",
    ),
    (
        "nat",
        "BERTH-NODEPORTS",
        Some("-m comment --comment ns3/svc3:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3003 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j BERTH-EXT-X27LE4BHSL4DOUIK"),
        None,
        "no nfacct counter for node ports on localhost",
    ),
    (
        "nat",
        "BERTH-NODEPORTS",
        Some("-m comment --comment ns5/svc5:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j BERTH-EXT-NUKIZ6OKUXPJNT4C"),
        None,
        "no nfacct counter for node ports on localhost",
    ),
    (
        "nat",
        "BERTH-SERVICES",
        Some(r#"-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j BERTH-NODEPORTS"#),
        Some(r#"-m comment --comment "berth service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j BERTH-NODEPORTS"#),
        "berth names itself in its comments",
    ),
    (
        "nat",
        "BERTH-POSTROUTING",
        Some(r#"-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE"#),
        Some(r#"-m comment --comment "berth service traffic requiring SNAT" -j MASQUERADE"#),
        "berth names itself in its comments",
    ),
];

/// kube-proxy's dump with the prefix renamed and the listed differences applied.
fn expected(view: &NodeView) -> Chains {
    let mut text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/kube_proxy/overall.txt"),
    )
    .unwrap();
    text = text.replace("KUBE-", "BERTH-");
    let mut chains = chains(&text);
    for (table, chain, theirs, ours, why) in DIFFERENCES {
        let key = (table.to_string(), chain.to_string());
        let Some(theirs) = theirs else {
            assert!(
                chains.remove(&key).is_some(),
                "{chain}: not in kube-proxy's dump ({why})"
            );
            continue;
        };
        let rules = chains
            .get_mut(&key)
            .unwrap_or_else(|| panic!("{chain}: absent ({why})"));
        let at = rules
            .iter()
            .position(|r| r == theirs)
            .unwrap_or_else(|| panic!("{chain}: kube-proxy has no rule {theirs} ({why})"));
        match ours {
            Some(ours) => rules[at] = ours.to_string(),
            None => {
                rules.remove(at);
            }
        }
    }
    // Then kube-proxy's hashed names become berth's (see `chain_names`).
    let rename = |text: &str| {
        chain_names(view)
            .iter()
            .fold(text.to_string(), |t, (theirs, ours)| {
                t.replace(&theirs.replacen("KUBE-", "BERTH-", 1), ours)
            })
    };
    chains
        .into_iter()
        .map(|((table, chain), rules)| {
            (
                (table, rename(&chain)),
                rules.iter().map(|r| rename(r)).collect(),
            )
        })
        .collect()
}

#[test]
fn berth_plans_kube_proxys_overall_rules_chain_by_chain() {
    let options = PlanOptions {
        dispatch: Dispatch::Linear,
        cluster_cidr: Some("10.0.0.0/8".parse().unwrap()),
        // kube-proxy's test runs without --random-fully.
        random_fully: false,
        ..PlanOptions::default()
    };
    let view = kube_proxy_overall_view();
    let rs = plan(&view, &options);
    let ours = chains(&render(&rs, &ChainSelection::all()));
    let theirs = expected(&view);
    let mut report = Vec::new();
    for key in theirs
        .keys()
        .chain(ours.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        match (theirs.get(key), ours.get(key)) {
            (Some(t), Some(o)) if t == o => {}
            (t, o) => report.push(format!(
                "{} {}:\n  kube-proxy: {t:#?}\n  berth:      {o:#?}",
                key.0, key.1
            )),
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}
