//! Golden rulesets for the fixed Service set, compared whole; `UPDATE_GOLDEN=1` rewrites them.
#![allow(clippy::unwrap_used)]

mod common;

use berth_core::IpFamily;
use berth_datapath::iptables::rule_text::rule_args;
use berth_datapath::*;
use common::*;

fn golden_text(rs: &Ruleset) -> String {
    let mut out = String::new();
    for jump in &rs.jumps {
        out.push_str(&format!(
            "# ensure -t {} {} {}\n",
            jump.table,
            jump.from,
            rule_args(&jump.rule)
        ));
    }
    out.push_str(&render(rs, &ChainSelection::all()));
    out
}

fn check_golden(file: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {file}; run with UPDATE_GOLDEN=1"));
    // Chains are sorted by name and rules keep their order; compare line sets too for a readable diff.
    let (mut a, mut e): (Vec<_>, Vec<_>) = (actual.lines().collect(), expected.lines().collect());
    a.sort();
    e.sort();
    let missing: Vec<_> = e.iter().filter(|l| !a.contains(l)).collect();
    let extra: Vec<_> = a.iter().filter(|l| !e.contains(l)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{file}: missing {missing:#?}\nextra {extra:#?}"
    );
    assert_eq!(actual, expected, "{file}: same lines, different order");
}

#[test]
fn fixed_set_linear() {
    let rs = plan(&mk_fixed_view(), &mk_options(Dispatch::Linear));
    check_consistency(&rs);
    check_golden("fixed_linear.txt", &golden_text(&rs));
}

#[test]
fn fixed_set_tree() {
    let mut options = mk_options(Dispatch::Tree);
    // Small leaves, so the fixed set really builds a tree.
    options.leaf_size = 2;
    let rs = plan(&mk_fixed_view(), &options);
    check_consistency(&rs);
    check_golden("fixed_tree.txt", &golden_text(&rs));
}

#[test]
fn fixed_set_ipv6_plans_nothing_for_v4_services() {
    let mut options = mk_options(Dispatch::Tree);
    options.family = IpFamily::V6;
    options.cluster_cidr = None;
    let rs = plan(&mk_fixed_view(), &options);
    check_consistency(&rs);
    assert!(rs
        .table(Table::Nat)
        .unwrap()
        .chains
        .keys()
        .all(|c| !c.as_str().starts_with("BERTH-SVC-")));
}

#[test]
fn plan_is_deterministic_and_order_independent() {
    let view = mk_fixed_view();
    let mut reversed = view.clone();
    reversed.services.reverse();
    for dispatch in [Dispatch::Linear, Dispatch::Tree] {
        assert_eq!(
            plan(&view, &mk_options(dispatch)),
            plan(&reversed, &mk_options(dispatch))
        );
    }
}
