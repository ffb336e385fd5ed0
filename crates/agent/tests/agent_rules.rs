//! The agent against the lab API server (real HTTP, real watches) with in-memory iptables:
//! objects in the API become rules, small changes sync partially, proxy modes, the agent's own
//! Node, restarts.
//!
//! Address plan: see `common`. No test here needs root or touches the host's iptables.

#![allow(clippy::unwrap_used)]

mod common;
mod harness;
mod http;

use std::time::Duration;

use berth_agent::SharedIptables;
use berth_datapath::backend::SyncKind;
use berth_datapath::fake::MemoryIptables;
use berth_datapath::plan::convert::ProxyMode;
use berth_datapath::Table;
use common::*;
use harness::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn services_and_slices_become_rules_and_small_changes_sync_partially() {
    let mut h = start(ProxyMode::Full).await;
    h.create(mk_node_json(NODE, "198.18.0.11")).await;
    h.create(mk_service_json(
        "default",
        "api",
        "10.96.0.11",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "api",
        "api-1",
        "TCP",
        &[("10.244.1.9", true, NODE)],
    ))
    .await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE), ("10.244.2.5", true, "node-2")],
    ))
    .await;
    h.wait_for("web's endpoints", |_, ipt| {
        nat(ipt).contains("--to-destination 10.244.2.5:8080")
    })
    .await;
    h.wait_for("api's endpoints", |_, ipt| {
        nat(ipt).contains("--to-destination 10.244.1.9:8080")
    })
    .await;
    let expected = h.expected_rules().await;
    assert_eq!(h.programmed(), expected);

    // A pod turning unready: one partial sync that touches web only.
    let restores_before = h.iptables.lock().restores.len();
    h.patch_slice(
        "web-1",
        json!({"endpoints": [
            {"addresses": ["10.244.1.5"], "conditions": {"ready": false, "serving": false, "terminating": false}, "nodeName": NODE},
            {"addresses": ["10.244.2.5"], "conditions": {"ready": true}, "nodeName": "node-2"}
        ]}),
    )
    .await;
    h.wait_for("the unready endpoint to go", |_, ipt| {
        !nat(ipt).contains("10.244.1.5:8080")
    })
    .await;
    assert_eq!(h.status.borrow().last_kind, Some(SyncKind::Partial));
    {
        let ipt = h.iptables.lock();
        let payloads = &ipt.restores[restores_before..];
        assert!(!payloads.is_empty());
        for payload in payloads {
            assert!(
                !payload.contains("default/api"),
                "partial sync rewrote api:\n{payload}"
            );
        }
    }
    let expected = h.expected_rules().await;
    assert_eq!(h.programmed(), expected);

    // Deleting the Service removes its chains.
    assert!(h.iptables.lock().tables[&Table::Nat].contains_key(&web_chain()));
    Api::<Service>::namespaced(h.client.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_for("web's chains to go", |_, ipt| {
        !ipt.tables[&Table::Nat].contains_key(&web_chain())
    })
    .await;
    assert!(!nat(&h.iptables.lock()).contains("default/web"));
    let expected = h.expected_rules().await;
    assert_eq!(h.programmed(), expected);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn labeled_mode_programs_only_services_labelled_for_berth() {
    let mut h = start(ProxyMode::Labeled).await;
    let mut mine = mk_service_json(
        "default",
        "mine",
        "10.96.0.20",
        json!([{"name": "http", "port": 80}]),
    );
    mine["metadata"]["labels"] = json!({"service.kubernetes.io/service-proxy-name": "berth"});
    h.create(mine).await;
    h.create(mk_service_json(
        "default",
        "kube-proxys",
        "10.96.0.21",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "mine",
        "mine-1",
        "TCP",
        &[("10.244.1.20", true, NODE)],
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "kube-proxys",
        "kp-1",
        "TCP",
        &[("10.244.1.21", true, NODE)],
    ))
    .await;
    h.wait_for("mine", |_, ipt| nat(ipt).contains("10.244.1.20:8080"))
        .await;
    assert!(!nat(&h.iptables.lock()).contains("10.244.1.21"));
    let expected = h.expected_rules().await;
    assert_eq!(h.programmed(), expected);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn none_mode_never_touches_iptables() {
    let mut h = start(ProxyMode::None).await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE)],
    ))
    .await;
    h.wait_for("a sync", |status, _| {
        status.syncs >= 2 || (synced(status) && status.rules == 0)
    })
    .await;
    // Give the change time to arrive; it must still produce nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(h.iptables.lock().restores.is_empty());
    assert_eq!(
        h.iptables.lock().berth_ruleset(),
        MemoryIptables::default().berth_ruleset()
    );
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_agents_own_node_addresses_enter_the_rules() {
    let mut h = start(ProxyMode::Full).await;
    // Source ranges that include the node: the node itself may reach the VIP.
    h.create(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "default", "name": "fw"},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.30",
            "clusterIPs": ["10.96.0.30"],
            "loadBalancerSourceRanges": ["198.18.0.0/24"],
            "ports": [{"name": "http", "port": 80, "nodePort": 30030}]
        }
    }))
    .await;
    // Status is not taken on create, as on a real apiserver.
    Api::<Service>::namespaced(h.client.clone(), "default")
        .patch_status(
            "fw",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.201", "ipMode": "VIP"}]}}})),
        )
        .await
        .unwrap();
    h.create(mk_slice_json(
        "default",
        "fw",
        "fw-1",
        "TCP",
        &[("10.244.1.30", true, NODE)],
    ))
    .await;
    h.wait_for("fw's rules", |_, ipt| {
        nat(ipt).contains("10.244.1.30:8080") && nat(ipt).contains("198.18.0.201")
    })
    .await;
    let without_node = h.iptables.lock().berth_ruleset();
    assert_eq!(without_node, h.expected_rules().await);

    // Another node's object changes nothing; ours does.
    h.create(mk_node_json("node-2", "198.18.0.12")).await;
    h.create(mk_node_json(NODE, "198.18.0.11")).await;
    let expected = h.expected_rules().await;
    assert_ne!(
        expected, without_node,
        "the node address must matter to this Service"
    );
    h.wait_for("the node's address", |_, ipt| {
        ipt.berth_ruleset() == expected
    })
    .await;
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_restarted_agent_keeps_every_rule_in_place() {
    let mut h = start(ProxyMode::Full).await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE)],
    ))
    .await;
    h.wait_for("web", |_, ipt| nat(ipt).contains("10.244.1.5:8080"))
        .await;
    let options = h.options.clone();
    let (server, iptables) = h.stop().await;
    let programmed = iptables.lock().berth_ruleset();
    assert!(programmed.chain(Table::Nat, &web_chain()).is_some());
    let restores_before = iptables.lock().restores.len();

    let mut h = start_agent(server, options, iptables.clone()).await;
    h.wait_for("the new agent's first sync", |s, _| synced(s))
        .await;
    assert_eq!(iptables.lock().berth_ruleset(), programmed);
    // Its first sync never dropped web's chain, not even for a moment.
    for payload in &iptables.lock().restores[restores_before..] {
        assert!(
            !payload.contains(&format!("-X {}", web_chain().as_str())),
            "{payload}"
        );
    }
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn dual_stack_programs_each_family_in_its_own_iptables() {
    let server = berth_lab::LabApiServer::builder().start().await.unwrap();
    let options = berth_agent::AgentOptions {
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/48".parse().unwrap(),
        ],
        ..mk_options(ProxyMode::Full)
    };
    let mut h = start_agent(
        server,
        options,
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
    h.create(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10", "fd00:10:96::10"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "RequireDualStack",
            "ports": [{"name": "http", "port": 80}]
        }
    }))
    .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-v4",
        "TCP",
        &[("10.244.1.5", true, NODE)],
    ))
    .await;
    let mut v6 = mk_slice_json(
        "default",
        "web",
        "web-v6",
        "TCP",
        &[("fd00:10:244:1::5", true, NODE)],
    );
    v6["addressType"] = json!("IPv6");
    h.create(v6).await;
    let v6_iptables = h.iptables_v6.clone();
    h.wait_for("both families", move |_, ipt| {
        nat(ipt).contains("10.244.1.5:8080")
            && nat(&v6_iptables.lock()).contains("[fd00:10:244:1::5]:8080")
    })
    .await;
    let expected_v4 = h.expected_rules_for(berth_core::IpFamily::V4).await;
    let expected_v6 = h.expected_rules_for(berth_core::IpFamily::V6).await;
    assert_eq!(h.programmed(), expected_v4);
    assert_eq!(h.iptables_v6.lock().berth_ruleset(), expected_v6);
    assert!(!nat(&h.iptables.lock()).contains("fd00"));
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_kubernetes_service_a_lab_starts_with_is_programmed_like_any_other() {
    let (server, _) = berth_testing::start_lab_with(
        berth_lab::LabApiServer::builder().kubernetes_endpoint("198.18.0.2:6443".parse().unwrap()),
    )
    .await;
    let mut h = start_agent(
        server,
        mk_options(ProxyMode::Full),
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
    h.create(mk_node_json(NODE, "198.18.0.11")).await;
    h.wait_for("default/kubernetes", |_, ipt| {
        let nat = nat(ipt);
        nat.contains("10.96.0.1") && nat.contains("--to-destination 198.18.0.2:6443")
    })
    .await;
    let expected = h.expected_rules().await;
    assert_eq!(h.programmed(), expected);
}

/// The lab's default ServiceCIDR (as an API server keeps it) and one created later enter the
/// agent's rules through its ServiceCIDR watch: new connections into either that no Service
/// translated go to `BERTH-CLUSTER-IPS`, which rejects the ClusterIPs and drops the rest. The
/// `--service-cidr` fallback is not used where the kind is served.
#[tokio::test]
async fn service_cidr_objects_enter_the_rules_through_the_watch() {
    let (server, _) = berth_testing::start_lab_with(
        berth_lab::LabApiServer::builder().service_cidrs(vec!["10.96.0.0/16".into()]),
    )
    .await;
    let mut options = mk_options(ProxyMode::Full);
    options.service_cidrs = vec!["192.0.2.0/24".parse().unwrap()];
    let mut h = start_agent(
        server,
        options,
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
    h.create(mk_node_json(NODE, "198.18.0.11")).await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    let filter = |ipt: &MemoryIptables| {
        berth_datapath::iptables::Iptables::save(&mut ipt.clone(), Table::Filter).unwrap()
    };
    h.wait_for("the default ServiceCIDR and web's ClusterIP", |_, ipt| {
        let filter = filter(ipt);
        filter.contains("-d 10.96.0.0/16 -j BERTH-CLUSTER-IPS")
            && filter.contains("-d 10.96.0.10 -j REJECT")
    })
    .await;
    h.create(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": "extra"},
        "spec": {"cidrs": ["10.97.0.0/24"]}
    }))
    .await;
    h.wait_for("the second ServiceCIDR", |_, ipt| {
        filter(ipt).contains("-d 10.97.0.0/24")
    })
    .await;
    let filter = filter(&h.iptables.lock());
    assert!(filter.contains("-A BERTH-CLUSTER-IPS"), "{filter}");
    assert!(
        !filter.contains("192.0.2.0/24"),
        "the flag holds only without the kind: {filter}"
    );
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

/// The periodic sync plans every Service again and writes what differs, which with nothing
/// changed is nothing: a partial sync, no rule written (a full rewrite of every chain is the
/// hourly pass's, and the first sync's).
#[tokio::test]
async fn periodic_syncs_write_nothing_when_nothing_changed() {
    let (server, _) = berth_testing::start_lab().await;
    let options = berth_agent::AgentOptions {
        sync_period: Duration::from_millis(200),
        ..mk_options(ProxyMode::Full)
    };
    let mut h = start_agent(
        server,
        options,
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE)],
    ))
    .await;
    h.wait_for("web", |_, ipt| nat(ipt).contains("10.244.1.5:8080"))
        .await;
    let syncs = h.status.borrow().syncs;
    let restores_before = h.iptables.lock().restores.len();
    let programmed = h.iptables.lock().berth_ruleset();
    h.wait_for("three periodic syncs", |s, _| s.syncs >= syncs + 3)
        .await;
    assert_eq!(h.status.borrow().last_kind, Some(SyncKind::Partial));
    for payload in &h.iptables.lock().restores[restores_before..] {
        assert!(
            !payload.contains("-A "),
            "a periodic sync wrote rules: {payload}"
        );
    }
    assert_eq!(h.iptables.lock().berth_ruleset(), programmed);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}
