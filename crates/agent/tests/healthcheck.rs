//! Health-check targets from the view, the response, and real servers on 127.0.0.1.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use berth_agent::healthcheck::{
    build_health_check_addresses, build_health_targets, fetch_local_addresses, health_response,
    HealthCheckServers, HealthTarget,
};
use berth_agent::index::Index;
use berth_agent::schedule::AgentHealth;
use berth_core::IpFamily;
use berth_datapath::plan::convert::ProxyMode;
use berth_datapath::{NodeInfo, NodePortAddresses};
use berth_testing::Requirement;
use common::*;
use std::net::{IpAddr, SocketAddr};

mod http;

fn mk_target(n: usize) -> HealthTarget {
    HealthTarget {
        namespace: "default".into(),
        name: "web".into(),
        local_endpoints: n,
    }
}

#[test]
fn targets_count_ready_endpoints_on_this_node_only() {
    let mut index = Index::new(NODE, ProxyMode::Full, chrono::Utc::now());
    let svc: k8s_openapi::api::core::v1::Service =
        serde_json::from_value(mk_local_lb_json("default", "web", "10.96.0.10", 32000)).unwrap();
    index.apply_service(&svc);
    index.apply_service(&mk_service("default", "plain", "10.96.0.11"));
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-a",
        &[
            ("10.244.1.5", true, NODE),
            ("10.244.1.6", false, NODE),
            ("10.244.2.5", true, "node-2"),
        ],
    ));
    let targets = build_health_targets(index.view());
    assert_eq!(targets, BTreeMap::from([(32000, mk_target(1))]));
}

#[test]
fn responses_are_200_only_with_local_endpoints_and_a_healthy_agent() {
    let body = r#"{"localEndpoints":2,"service":{"name":"web","namespace":"default"}}"#;
    assert_eq!(
        health_response(&mk_target(2), true),
        (StatusCode::OK, body.to_string())
    );
    assert_eq!(
        health_response(&mk_target(2), false),
        (StatusCode::SERVICE_UNAVAILABLE, body.to_string())
    );
    let (status, body) = health_response(&mk_target(0), true);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["localEndpoints"], 0);
    assert_eq!(json["service"]["namespace"], "default");
}

#[tokio::test]
async fn servers_start_answer_follow_counts_and_stop() {
    let health = AgentHealth::new(Duration::from_secs(30), Instant::now());
    let mut servers = HealthCheckServers::new("127.0.0.1".parse().unwrap(), health);
    let port = http::free_port();
    servers
        .update(&BTreeMap::from([(port, mk_target(1))]))
        .await;
    assert_eq!(servers.ports(), vec![port]);
    let (status, body) = http::get(port, "/healthz").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"localEndpoints":1,"service":{"name":"web","namespace":"default"}}"#
    );

    servers
        .update(&BTreeMap::from([(port, mk_target(0))]))
        .await;
    let (status, _) = http::get(port, "/").await.unwrap();
    assert_eq!(status, 503);

    servers.stop_all().await;
    assert!(servers.ports().is_empty());
    assert!(http::get(port, "/").await.is_err(), "still listening");
}

#[tokio::test]
async fn an_unhealthy_agent_answers_503_even_with_endpoints() {
    // Last success long ago: more than two periods.
    let health = AgentHealth::new(Duration::from_millis(1), Instant::now());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut servers = HealthCheckServers::new("127.0.0.1".parse().unwrap(), health);
    let port = http::free_port();
    servers
        .update(&BTreeMap::from([(port, mk_target(3))]))
        .await;
    let (status, body) = http::get(port, "/").await.unwrap();
    assert_eq!(status, 503);
    assert!(body.contains(r#""localEndpoints":3"#), "{body}");
    servers.stop_all().await;
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|ip| ip.parse().unwrap()).collect()
}

/// Health-check node ports listen where node ports answer (kube-proxy serves them on its
/// node-port addresses): the node's addresses inside `--nodeport-addresses`, its primary
/// address with `primary`, and `--healthz-bind-address` (every address) without the flag.
#[test]
fn health_check_addresses_follow_nodeport_addresses() {
    let local = ips(&[
        "127.0.0.1",
        "198.18.0.11",
        "10.244.1.1",
        "::1",
        "fd00:198:18::b",
    ]);
    let node = NodeInfo {
        name: NODE.into(),
        addresses: ips(&["198.18.0.11", "fd00:198:18::b"]),
        zone: None,
    };
    let v4 = [IpFamily::V4];
    let dual = [IpFamily::V4, IpFamily::V6];
    // (--nodeport-addresses, families, listened on)
    let rows: &[(&str, &[IpFamily], &[&str])] = &[
        ("", &v4, &["0.0.0.0"]),
        ("0.0.0.0/0", &v4, &["0.0.0.0"]),
        ("198.18.0.0/24,::/0", &dual, &["0.0.0.0"]),
        ("198.18.0.0/24", &v4, &["198.18.0.11"]),
        (
            "198.18.0.0/24,fd00:198:18::/64",
            &dual,
            &["198.18.0.11", "fd00:198:18::b"],
        ),
        (
            "10.244.1.0/24,127.0.0.0/8",
            &v4,
            &["10.244.1.1", "127.0.0.1"],
        ),
        ("primary", &v4, &["198.18.0.11"]),
        ("primary", &dual, &["198.18.0.11", "fd00:198:18::b"]),
        ("primary,198.18.0.0/24", &v4, &["198.18.0.11"]),
        // Nothing of the node's inside: no health-check port answers, as no node port does.
        ("192.0.2.0/24", &v4, &[]),
    ];
    for (value, families, want) in rows {
        let wanted: NodePortAddresses = value.parse().unwrap();
        let got = build_health_check_addresses(
            &wanted,
            "0.0.0.0".parse().unwrap(),
            &local,
            &node,
            families,
        );
        assert_eq!(got, ips(want), "{value:?} {families:?}");
    }
}

async fn answers(addr: SocketAddr) -> bool {
    matches!(http::get_at(addr, "/").await, Ok((200, _)))
}

/// Real servers in a private network namespace whose loopback also holds 198.18.0.11: with
/// `--nodeport-addresses 198.18.0.0/24` they answer there and nowhere else, and without it on
/// every address again.
async fn listening_scenario() {
    let local = fetch_local_addresses().unwrap();
    assert!(local.contains(&"198.18.0.11".parse().unwrap()), "{local:?}");
    let node = NodeInfo {
        name: NODE.into(),
        addresses: ips(&["198.18.0.11"]),
        zone: None,
    };
    let all: IpAddr = "0.0.0.0".parse().unwrap();
    let at = |value: &str| {
        build_health_check_addresses(&value.parse().unwrap(), all, &local, &node, &[IpFamily::V4])
    };
    let health = AgentHealth::new(Duration::from_secs(30), Instant::now());
    let mut servers = HealthCheckServers::new(all, health);
    let port = http::free_port();
    let (lan, loopback) = (
        SocketAddr::from(([198, 18, 0, 11], port)),
        SocketAddr::from(([127, 0, 0, 1], port)),
    );
    let targets = BTreeMap::from([(port, mk_target(1))]);
    servers.update(&targets).await;
    assert!(
        answers(lan).await && answers(loopback).await,
        "unset: every address"
    );
    for value in ["198.18.0.0/24", "primary"] {
        servers.set_addresses(at(value)).await;
        servers.update(&targets).await;
        assert_eq!(servers.addresses(), ips(&["198.18.0.11"]), "{value}");
        assert!(answers(lan).await, "{value}: on the node-port address");
        assert!(
            http::get_at(loopback, "/").await.is_err(),
            "{value}: nothing listens on 127.0.0.1"
        );
    }
    servers.set_addresses(at("")).await;
    servers.update(&targets).await;
    assert!(answers(lan).await && answers(loopback).await, "unset again");
    servers.stop_all().await;
}

#[test]
fn servers_listen_only_on_the_node_port_addresses() {
    berth_testing::require!(Requirement::Netns);
    std::thread::spawn(|| {
        // Only this thread enters the namespace, which goes with it.
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        for args in [
            &["link", "set", "lo", "up"][..],
            &["addr", "add", "198.18.0.11/32", "dev", "lo"],
        ] {
            let status = std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap();
            assert!(status.success(), "ip {args:?}");
        }
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(listening_scenario());
    })
    .join()
    .unwrap();
}
