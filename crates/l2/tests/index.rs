//! The announcer's index fed as the watches feed it, asserting on the table of answers.
//!
//! Address plan: LAN 198.18.0.0/24, pool `default` 198.18.0.200-198.18.0.250, pool `quiet`
//! 198.18.0.100/30 (advertised only when a test says so), IPv6 pool `v6` fd00:198:18::/120.
//! Nodes node-1..node-3; the index computes as node-1.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use berth_l2::{diff_ownership, election_key, IpAnswer, L2Index, Refusal};
mod common;

use berth_testing::{from_json, mk_node};
use common::*;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn owner_of(candidates: &[&str], address: &str) -> String {
    candidates
        .iter()
        .min_by_key(|n| election_key(n, ip(address)))
        .unwrap()
        .to_string()
}

/// An address in `default` that node-1 owns among all three nodes, and one it does not.
fn ours_and_theirs() -> (String, String) {
    let all: Vec<String> = (200..=250).map(|i| format!("198.18.0.{i}")).collect();
    let ours = all
        .iter()
        .find(|a| owner_of(&NODES, a) == "node-1")
        .unwrap();
    let theirs = all
        .iter()
        .find(|a| owner_of(&NODES, a) != "node-1")
        .unwrap();
    (ours.clone(), theirs.clone())
}

fn live(nodes: &[&str]) -> Arc<BTreeSet<String>> {
    Arc::new(nodes.iter().map(|s| s.to_string()).collect())
}

/// node-1's index with everything listed: three live nodes, `default` and `quiet` pools, one
/// advertisement of `default`, eth0 up.
fn listed_index() -> L2Index {
    let mut index = L2Index::new("node-1");
    assert!(!index.is_listed());
    index.reset_pools(&[
        mk_pool("default", json!(null), &["198.18.0.200-198.18.0.250"]),
        mk_pool("quiet", json!({"tier": "b"}), &["198.18.0.100/30"]),
        mk_pool("v6", json!(null), &["fd00:198:18::/120"]),
    ]);
    index.reset_advertisements(&[mk_adv("lan", json!({"ipPools": ["default", "v6"]}))]);
    index.reset_nodes(&NODES.map(mk_plain_node));
    index.reset_services(&[]);
    assert!(!index.is_listed(), "slices not listed yet");
    index.reset_slices(&[]);
    assert!(index.is_listed());
    index.set_live(live(&NODES));
    index.set_local_up(["eth0".to_string()].into());
    index
}

#[test]
fn only_the_elected_node_answers_and_every_refusal_is_typed() {
    let (ours, theirs) = ours_and_theirs();
    let mut index = listed_index();
    assert!(index.apply_service(&mk_lb("a", &[&ours], "Cluster", json!(null))));
    assert!(index.apply_service(&mk_lb("b", &[&theirs], "Cluster", json!("berth.dev/l2"))));
    assert!(index.apply_service(&mk_lb("c", &["198.18.0.101"], "Cluster", json!(null))));
    assert!(index.apply_service(&mk_lb("d", &["198.18.1.7"], "Cluster", json!(null))));
    let answers = index.answers();
    assert_eq!(answers.decide(ip(&ours), "eth0"), Ok(()));
    assert_eq!(
        answers.decide(ip(&theirs), "eth0"),
        Err(Refusal::NotElected {
            owner: Some(owner_of(&NODES, &theirs))
        })
    );
    assert_eq!(
        answers.decide(ip("198.18.0.101"), "eth0"),
        Err(Refusal::NotAdvertised)
    );
    assert_eq!(
        answers.decide(ip("198.18.1.7"), "eth0"),
        Err(Refusal::NotInPool),
        "an address outside every pool, though a Service holds it"
    );
    assert_eq!(
        answers.decide(ip("198.18.0.249"), "eth0"),
        Err(Refusal::NotOurs),
        "in a pool, held by no Service"
    );
    assert_eq!(
        answers.decide(ip(&ours), "eth1"),
        Err(Refusal::InterfaceNotSelected),
        "eth1 is not up"
    );
    let owned: Vec<IpAddr> = answers.owned().map(|o| o.ip).collect();
    assert_eq!(owned, [ip(&ours)]);
}

#[test]
fn other_classes_and_other_types_are_not_announced() {
    let (ours, _) = ours_and_theirs();
    let mut index = listed_index();
    assert!(!index.apply_service(&mk_lb(
        "aws",
        &[&ours],
        "Cluster",
        json!("berth.dev/aws-nlb")
    )));
    assert!(!index.apply_service(&mk_lb(
        "mlb",
        &[&ours],
        "Cluster",
        json!("metallb.io/metallb")
    )));
    let mut cluster_ip = mk_lb("cip", &[&ours], "Cluster", json!(null));
    cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
    assert!(!index.apply_service(&cluster_ip));
    assert_eq!(index.answers().owned().count(), 0);
}

#[test]
fn a_shared_ip_is_elected_once_and_names_every_service() {
    let (ours, _) = ours_and_theirs();
    let mut index = listed_index();
    index.apply_service(&mk_lb("web", &[&ours], "Cluster", json!(null)));
    index.apply_service(&mk_lb("dns", &[&ours], "Cluster", json!(null)));
    let answers = index.answers();
    let owned: Vec<_> = answers.owned().collect();
    assert_eq!(owned.len(), 1);
    let services: Vec<String> = owned[0].services.iter().map(|(_, n)| n.clone()).collect();
    assert_eq!(services, ["dns", "web"]);
}

#[test]
fn local_policy_follows_ready_endpoints_and_moves_when_the_last_goes() {
    let (ours, _) = ours_and_theirs();
    let mut index = listed_index();
    index.apply_service(&mk_lb("web", &[&ours], "Local", json!(null)));
    // No endpoint anywhere: nobody answers.
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotElected { owner: None })
    );
    // Ready endpoints on node-1 and node-3: the smaller key of the two owns it.
    let slice = mk_endpoints("web", "web-1", &[("node-1", true), ("node-3", true)]);
    assert!(index.apply_slice(&slice));
    let expected = owner_of(&["node-1", "node-3"], &ours);
    let before = index.answers();
    assert_eq!(
        before.decide(ip(&ours), "eth0").is_ok(),
        expected == "node-1"
    );
    // node-1's endpoint turns unready: node-3 must own it.
    let slice = mk_endpoints("web", "web-1", &[("node-1", false), ("node-3", true)]);
    assert!(index.apply_slice(&slice));
    let after = index.answers();
    assert_eq!(
        after.decide(ip(&ours), "eth0"),
        Err(Refusal::NotElected {
            owner: Some("node-3".into())
        })
    );
    // Sharing with a Cluster-policy Service keeps the Local one's gate: node-3 still.
    index.apply_service(&mk_lb("dns", &[&ours], "Cluster", json!(null)));
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotElected {
            owner: Some("node-3".into())
        })
    );
    // Deleting the slice of a Local-only address leaves no candidate.
    index.delete_service(&mk_lb("dns", &[&ours], "Cluster", json!(null)));
    index.delete_slice(&slice);
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotElected { owner: None })
    );
}

/// Two Local Services without selectors share an address, their endpoints on different nodes:
/// a node with only one of them would time the other's port out, so only a node with both may
/// answer, and none when no node has both.
#[test]
fn local_services_sharing_an_address_are_answered_where_every_one_has_an_endpoint() {
    let (ours, _) = ours_and_theirs();
    let mut index = listed_index();
    index.apply_service(&mk_lb("web", &[&ours], "Local", json!(null)));
    index.apply_service(&mk_lb("dns", &[&ours], "Local", json!(null)));
    index.apply_slice(&mk_endpoints("web", "web-1", &[("node-1", true)]));
    index.apply_slice(&mk_endpoints("dns", "dns-1", &[("node-2", true)]));
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotElected { owner: None }),
        "no node has both"
    );
    // dns gains a Ready endpoint on node-3, web too: node-3 is the only node with both.
    index.apply_slice(&mk_endpoints(
        "dns",
        "dns-1",
        &[("node-2", true), ("node-3", true)],
    ));
    index.apply_slice(&mk_endpoints(
        "web",
        "web-1",
        &[("node-1", true), ("node-3", true)],
    ));
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotElected {
            owner: Some("node-3".into())
        })
    );
    // And node-1 once it has both.
    index.apply_slice(&mk_endpoints(
        "dns",
        "dns-1",
        &[("node-1", true), ("node-2", true)],
    ));
    assert_eq!(index.answers().decide(ip(&ours), "eth0"), Ok(()));
}

#[test]
fn node_facts_disqualify() {
    let (ours, _) = ours_and_theirs();
    let next = owner_of(&["node-2", "node-3"], &ours);
    let cases: Vec<(&str, Node)> = vec![
        (
            "excluded by label",
            mk_node(
                "node-1",
                json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""}),
                &[],
            ),
        ),
        ("NetworkUnavailable", {
            let mut node = mk_plain_node("node-1");
            node.status = Some(from_json(json!({"conditions": [
                {"type": "NetworkUnavailable", "status": "True"}]})));
            node
        }),
        ("being deleted", {
            let mut node = mk_plain_node("node-1");
            node.metadata.deletion_timestamp = Some(from_json(json!("2026-01-01T00:00:00Z")));
            node
        }),
    ];
    for (what, node) in cases {
        let mut index = listed_index();
        index.apply_service(&mk_lb("web", &[&ours], "Cluster", json!(null)));
        assert_eq!(index.answers().decide(ip(&ours), "eth0"), Ok(()), "{what}");
        assert!(index.apply_node(&node), "{what}");
        assert_eq!(
            index.answers().decide(ip(&ours), "eth0"),
            Err(Refusal::NotElected {
                owner: Some(next.clone())
            }),
            "{what}"
        );
        // Back to normal: node-1 owns it again.
        assert!(index.apply_node(&mk_plain_node("node-1")), "{what}");
        assert_eq!(index.answers().decide(ip(&ours), "eth0"), Ok(()), "{what}");
    }
    // NetworkUnavailable False changes nothing.
    let mut index = listed_index();
    let mut node = mk_plain_node("node-1");
    node.status = Some(from_json(json!({"conditions": [
        {"type": "NetworkUnavailable", "status": "False"}]})));
    index.apply_node(&node);
    index.apply_service(&mk_lb("web", &[&ours], "Cluster", json!(null)));
    assert_eq!(index.answers().decide(ip(&ours), "eth0"), Ok(()));
}

#[test]
fn node_selectors_and_interfaces_of_advertisements() {
    let (ours, _) = ours_and_theirs();
    let mut index = listed_index();
    index.apply_service(&mk_lb("web", &[&ours], "Cluster", json!(null)));
    // Only node-2 and node-3 selected, on eth1.
    index.apply_advertisement(&mk_adv(
        "lan",
        json!({"ipPools": ["default"], "interfaces": ["eth1"],
               "nodeSelectors": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                   "operator": "In", "values": ["node-2", "node-3"]}]}]}),
    ));
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotElected {
            owner: Some(owner_of(&["node-2", "node-3"], &ours))
        })
    );
    // Every node, eth1 only: node-1 has no eth1 up, so it is no candidate.
    index.apply_advertisement(&mk_adv(
        "lan",
        json!({"ipPools": ["default"], "interfaces": ["eth1"]}),
    ));
    assert!(index.answers().decide(ip(&ours), "eth0").is_err());
    // eth1 comes up: node-1 answers on eth1, never on eth0.
    assert!(index.set_local_up(["eth0".to_string(), "eth1".to_string()].into()));
    let answers = index.answers();
    assert_eq!(answers.decide(ip(&ours), "eth1"), Ok(()));
    assert_eq!(
        answers.decide(ip(&ours), "eth0"),
        Err(Refusal::InterfaceNotSelected)
    );
}

#[test]
fn liveness_changes_move_addresses_and_the_diff_reports_them() {
    let (ours, theirs) = ours_and_theirs();
    let mut index = listed_index();
    index.apply_service(&mk_lb("a", &[&ours], "Cluster", json!(null)));
    index.apply_service(&mk_lb("b", &[&theirs], "Cluster", json!(null)));
    let before = index.answers();
    // The owner of `theirs` dies: does node-1 take it over?
    let dead = owner_of(&NODES, &theirs);
    let rest: Vec<&str> = NODES.iter().copied().filter(|n| *n != dead).collect();
    assert!(index.set_live(live(&rest)));
    assert!(!index.set_live(live(&rest)), "same set, no change");
    let after = index.answers();
    let changes = diff_ownership(&before, &after);
    let takes_over = owner_of(&rest, &theirs) == "node-1";
    assert_eq!(changes.gained.contains(&ip(&theirs)), takes_over);
    if takes_over {
        assert_eq!(
            changes.services,
            [(("default".to_string(), "b".to_string()), ip(&theirs))]
        );
    }
    assert!(changes.lost.is_empty());
    // node-1 itself is dropped from the live set: it loses everything.
    index.set_live(live(&["node-2", "node-3"]));
    let gone = diff_ownership(&after, &index.answers());
    assert!(gone.gained.is_empty());
    assert!(gone.lost.contains(&ip(&ours)));
    // No change, no diff.
    assert!(diff_ownership(&after, &after).is_empty());
}

#[test]
fn relists_forget_what_they_do_not_name_and_bad_updates_keep_the_last_good_version() {
    let (ours, _) = ours_and_theirs();
    let mut index = listed_index();
    index.apply_service(&mk_lb("web", &[&ours], "Cluster", json!(null)));
    assert_eq!(index.answers().owned().count(), 1);
    // An invalid update of the pool is ignored; the address stays answered.
    assert!(!index.apply_pool(&mk_pool("default", json!(null), &["198.18.0.1/24"])));
    assert_eq!(index.answers().owned().count(), 1);
    // A relist without the advertisement removes it.
    assert!(index.reset_advertisements(&[]));
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotAdvertised)
    );
    // A relist of Services without `web` drops the address.
    index.reset_advertisements(&[mk_adv("lan", json!({}))]);
    assert!(index.reset_services(&[]));
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotOurs)
    );
    // Pools gone: nothing is in a pool any more.
    assert!(index.reset_pools(&[]));
    assert_eq!(
        index.answers().decide(ip(&ours), "eth0"),
        Err(Refusal::NotInPool)
    );
}

#[test]
fn ipv6_addresses_share_the_election() {
    let mut index = listed_index();
    let address = (1..=255)
        .map(|i| format!("fd00:198:18::{i:x}"))
        .find(|a| owner_of(&NODES, a) == "node-1")
        .unwrap();
    index.apply_service(&mk_lb("v6", &[&address], "Cluster", json!(null)));
    let answers = index.answers();
    assert_eq!(answers.decide(ip(&address), "eth0"), Ok(()));
    assert!(matches!(
        answers.entry(ip(&address)).unwrap().answer,
        IpAnswer::Owned(_)
    ));
}
