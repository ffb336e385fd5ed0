//! The announcer's gauges, which the shipped alerts read: across the agents, each answered address
//! has exactly one `berth_l2_announced` series, and an address nobody can announce shows as
//! `unowned` in every agent's `berth_l2_addresses`.
//!
//! Address plan: pool `default` 198.18.0.200-198.18.0.250 (advertised), pool `quiet`
//! 198.18.0.100/30 (not advertised); nodes node-1..3, all live.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_l2::{L2Index, L2Metrics};
use common::*;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use serde_json::json;

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

/// Every node's exposition after it observed its answers for the same objects.
fn expositions() -> Vec<String> {
    NODES
        .iter()
        .map(|name| {
            let mut index = L2Index::new(name);
            index.reset_pools(&[
                mk_pool("default", json!(null), &["198.18.0.200-198.18.0.250"]),
                mk_pool("quiet", json!(null), &["198.18.0.100/30"]),
            ]);
            index.reset_advertisements(&[mk_adv("lan", json!({"ipPools": ["default"]}))]);
            index.reset_nodes(&NODES.map(mk_plain_node));
            index.reset_services(&[
                mk_lb("web", &["198.18.0.200"], "Cluster", json!(null)),
                mk_lb("db", &["198.18.0.201"], "Cluster", json!(null)),
                // Local policy and no endpoint anywhere: no node may announce it.
                mk_lb("local", &["198.18.0.202"], "Local", json!(null)),
                mk_lb("hidden", &["198.18.0.101"], "Cluster", json!(null)),
            ]);
            index.reset_slices(&[]);
            index.set_live(Arc::new(NODES.iter().map(|n| n.to_string()).collect()));
            index.set_local_up(["eth0".to_string()].into());
            let mut registry = Registry::with_prefix("berth_l2");
            let metrics = L2Metrics::register(&mut registry);
            metrics.observe_answers(&index.answers());
            let mut out = String::new();
            encode(&mut out, &registry).unwrap();
            out
        })
        .collect()
}

fn samples<'a>(exposition: &'a str, name: &str) -> Vec<&'a str> {
    exposition
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .collect()
}

#[test]
fn each_answered_address_has_one_announced_series_across_the_agents() {
    let mut announcers: BTreeMap<String, usize> = BTreeMap::new();
    for exposition in expositions() {
        for line in samples(&exposition, "berth_l2_announced") {
            assert!(line.ends_with(" 1"), "{line}");
            *announcers.entry(line.to_owned()).or_default() += 1;
        }
    }
    assert_eq!(
        announcers.into_iter().collect::<Vec<_>>(),
        vec![
            (
                "berth_l2_announced{address=\"198.18.0.200\"} 1".to_owned(),
                1
            ),
            (
                "berth_l2_announced{address=\"198.18.0.201\"} 1".to_owned(),
                1
            ),
        ]
    );
}

#[test]
fn every_agent_counts_the_addresses_by_election_outcome() {
    for exposition in expositions() {
        let mut states: BTreeMap<&str, i64> = BTreeMap::new();
        for line in samples(&exposition, "berth_l2_addresses") {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let state = series
                .trim_start_matches("berth_l2_addresses{state=\"")
                .trim_end_matches("\"}");
            states.insert(state, value.parse().unwrap());
        }
        let owned_or_elsewhere = states["owned"] + states["elsewhere"];
        assert_eq!(owned_or_elsewhere, 2, "{exposition}");
        assert_eq!(states["unowned"], 1, "{exposition}");
        assert_eq!(states["not_advertised"], 1, "{exposition}");
    }
}

#[test]
fn a_given_up_address_loses_its_series() {
    let mut index = L2Index::new("node-1");
    index.reset_pools(&[mk_pool("default", json!(null), &["198.18.0.200/32"])]);
    index.reset_advertisements(&[mk_adv("lan", json!({}))]);
    index.reset_nodes(&[mk_plain_node("node-1")]);
    index.reset_services(&[mk_lb("web", &["198.18.0.200"], "Cluster", json!(null))]);
    index.reset_slices(&[]);
    index.set_local_up(["eth0".to_string()].into());
    let mut registry = Registry::with_prefix("berth_l2");
    let metrics = L2Metrics::register(&mut registry);
    metrics.observe_answers(&index.answers());
    assert_eq!(
        metrics
            .announced
            .get_or_create(&berth_l2::speaker::AddressLabels {
                address: "198.18.0.200".to_owned(),
            })
            .get(),
        1
    );
    index.reset_services(&[]);
    metrics.observe_answers(&index.answers());
    let mut out = String::new();
    encode(&mut out, &registry).unwrap();
    assert!(samples(&out, "berth_l2_announced").is_empty(), "{out}");
}
