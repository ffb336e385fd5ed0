//! The agent against the lab API server (real HTTP, real watches) with in-memory iptables:
//! objects in the API become rules, partial syncs follow small changes, health-check ports and
//! the admin endpoint answer over 127.0.0.1.
//!
//! Address plan: see `common`. No test here needs root or touches the host's iptables.

#![allow(clippy::unwrap_used)]

mod common;
mod http;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth_agent::{Agent, AgentOptions, AgentStatus, Conntrack, ConntrackFlow, SharedIptables};
use berth_datapath::convert::{build_node_view, ProxyMode};
use berth_datapath::memory::MemoryIptables;
use berth_datapath::names::{service_chain, ServiceChain};
use berth_datapath::sync::{Iptables, SyncKind};
use berth_datapath::{plan, ChainName, Dispatch, JumpRule, Protocol, ServicePortName, Table};
use berth_lab::{LabApiServer, LabApiServerHandle};
use berth_telemetry::{MetricsRegistry, Readiness};
use common::*;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// In-memory iptables whose restores fail while `fail` is set.
#[derive(Clone)]
struct Flaky {
    inner: SharedIptables<MemoryIptables>,
    fail: Arc<AtomicBool>,
}

impl Iptables for Flaky {
    fn restore(&mut self, payload: &str) -> Result<(), berth_datapath::Error> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(berth_datapath::Error::Restore {
                reason: "injected failure".into(),
            });
        }
        self.inner.restore(payload)
    }

    fn save(&mut self, table: Table) -> Result<String, berth_datapath::Error> {
        self.inner.save(table)
    }

    fn ensure_chain(
        &mut self,
        table: Table,
        chain: &ChainName,
    ) -> Result<(), berth_datapath::Error> {
        self.inner.ensure_chain(table, chain)
    }

    fn chain_exists(
        &mut self,
        table: Table,
        chain: &ChainName,
    ) -> Result<bool, berth_datapath::Error> {
        self.inner.chain_exists(table, chain)
    }

    fn ensure_jump(&mut self, jump: &JumpRule) -> Result<(), berth_datapath::Error> {
        self.inner.ensure_jump(jump)
    }
}

#[derive(Clone, Default)]
struct RecordingConntrack(Arc<std::sync::Mutex<Vec<ConntrackFlow>>>);

impl Conntrack for RecordingConntrack {
    fn delete(&mut self, flow: &ConntrackFlow) -> Result<(), berth_agent::Error> {
        self.0.lock().unwrap().push(flow.clone());
        Ok(())
    }
}

struct Harness {
    server: LabApiServerHandle,
    client: Client,
    iptables: SharedIptables<MemoryIptables>,
    fail: Arc<AtomicBool>,
    conntrack: RecordingConntrack,
    status: watch::Receiver<AgentStatus>,
    admin_port: u16,
    stop: CancellationToken,
    task: JoinHandle<Result<(), berth_agent::Error>>,
    options: AgentOptions,
}

fn mk_options(mode: ProxyMode) -> AgentOptions {
    AgentOptions {
        node_name: NODE.into(),
        proxy_mode: mode,
        dispatch: Dispatch::Tree,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        min_sync_interval: Duration::from_millis(50),
        sync_period: Duration::from_secs(30),
        healthz_bind_address: "127.0.0.1".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..AgentOptions::default()
    }
}

async fn start_agent(
    server: LabApiServerHandle,
    options: AgentOptions,
    iptables: SharedIptables<MemoryIptables>,
) -> Harness {
    let client = server.client().unwrap();
    let fail = Arc::new(AtomicBool::new(false));
    let flaky = Flaky {
        inner: iptables.clone(),
        fail: fail.clone(),
    };
    let conntrack = RecordingConntrack::default();
    let mut registry = MetricsRegistry::new();
    let readiness = Readiness::new();
    let agent = Agent::new(
        options.clone().validate().unwrap(),
        client.clone(),
        |_| flaky.clone(),
        conntrack.clone(),
        &mut registry,
        &readiness,
    )
    .unwrap();
    let status = agent.status();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_port = admin.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let task = tokio::spawn(agent.run(
        admin,
        registry.into_shared(),
        stop.clone().cancelled_owned(),
    ));
    Harness {
        server,
        client,
        iptables,
        fail,
        conntrack,
        status,
        admin_port,
        stop,
        task,
        options,
    }
}

async fn start(mode: ProxyMode) -> Harness {
    let server = LabApiServer::builder().start().await.unwrap();
    start_agent(
        server,
        mk_options(mode),
        SharedIptables::new(MemoryIptables::default()),
    )
    .await
}

impl Harness {
    async fn create(&self, obj: Value) {
        let kind = obj["kind"].as_str().unwrap().to_string();
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let pp = PostParams::default();
        match kind.as_str() {
            "Service" => {
                Api::<Service>::namespaced(self.client.clone(), &ns)
                    .create(&pp, &serde_json::from_value(obj).unwrap())
                    .await
                    .unwrap();
            }
            "EndpointSlice" => {
                Api::<EndpointSlice>::namespaced(self.client.clone(), &ns)
                    .create(&pp, &serde_json::from_value(obj).unwrap())
                    .await
                    .unwrap();
            }
            "Node" => {
                Api::<Node>::all(self.client.clone())
                    .create(&pp, &serde_json::from_value(obj).unwrap())
                    .await
                    .unwrap();
            }
            other => panic!("no builder for {other}"),
        }
    }

    async fn patch_slice(&self, name: &str, patch: Value) {
        Api::<EndpointSlice>::namespaced(self.client.clone(), "default")
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }

    /// Waits until `check` holds for the status (and what the agent programmed).
    async fn wait_for(
        &mut self,
        what: &str,
        check: impl Fn(&AgentStatus, &MemoryIptables) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            {
                let status = self.status.borrow_and_update().clone();
                if check(&status, &self.iptables.lock()) {
                    return;
                }
            }
            let wait = tokio::time::timeout_at(deadline, self.status.changed()).await;
            assert!(
                wait.is_ok(),
                "timed out waiting for {what}; status {:?}",
                *self.status.borrow()
            );
        }
    }

    /// The rules `plan` gives for what the API server holds now.
    async fn expected_rules(&self) -> berth_datapath::Ruleset {
        let services = Api::<Service>::all(self.client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let slices = Api::<EndpointSlice>::all(self.client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let node = Api::<Node>::all(self.client.clone())
            .get_opt(NODE)
            .await
            .unwrap()
            .unwrap_or_else(|| {
                serde_json::from_value(json!({"metadata": {"name": NODE}})).unwrap()
            });
        let (view, errors) = build_node_view(&node, &services, &slices, self.options.proxy_mode);
        assert!(errors.is_empty(), "{errors:?}");
        let config = self.options.clone().validate().unwrap();
        plan(&view, &config.plan_options(berth_datapath::IpFamily::V4))
    }

    fn programmed(&self) -> berth_datapath::Ruleset {
        self.iptables.lock().berth_ruleset()
    }

    async fn stop(self) -> (LabApiServerHandle, SharedIptables<MemoryIptables>) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        (self.server, self.iptables)
    }
}

fn nat(iptables: &MemoryIptables) -> String {
    iptables.clone().save(Table::Nat).unwrap()
}

fn web_chain() -> ChainName {
    service_chain(
        ServiceChain::Cluster,
        &ServicePortName {
            namespace: "default".into(),
            name: "web".into(),
            port: "http".into(),
        },
        Protocol::Tcp,
    )
}

fn synced(status: &AgentStatus) -> bool {
    status.syncs > 0
}

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
async fn health_check_ports_follow_local_endpoints() {
    let mut h = start(ProxyMode::Full).await;
    let port = http::free_port();
    h.create(mk_local_lb_json("default", "web", "10.96.0.10", port))
        .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE), ("10.244.2.5", true, "node-2")],
    ))
    .await;
    h.wait_for("the health-check server", |s, _| {
        s.health_check_ports == vec![port]
    })
    .await;
    let mut answer = (0, String::new());
    for _ in 0..100 {
        answer = http::get(port, "/healthz").await.unwrap();
        if answer.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        answer,
        (
            200,
            r#"{"localEndpoints":1,"service":{"name":"web","namespace":"default"}}"#.to_string()
        )
    );

    // The local pod goes unready: 503, same body shape.
    h.patch_slice(
        "web-1",
        json!({"endpoints": [
            {"addresses": ["10.244.1.5"], "conditions": {"ready": false}, "nodeName": NODE},
            {"addresses": ["10.244.2.5"], "conditions": {"ready": true}, "nodeName": "node-2"}
        ]}),
    )
    .await;
    for _ in 0..100 {
        answer = http::get(port, "/").await.unwrap();
        if answer.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        answer,
        (
            503,
            r#"{"localEndpoints":0,"service":{"name":"web","namespace":"default"}}"#.to_string()
        )
    );

    // The Service goes: so does its server.
    Api::<Service>::namespaced(h.client.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_for("the server to stop", |s, _| s.health_check_ports.is_empty())
        .await;
    assert!(http::get(port, "/").await.is_err());
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn healthz_fails_while_syncs_fail_and_recovers() {
    let server = LabApiServer::builder().start().await.unwrap();
    let options = AgentOptions {
        sync_period: Duration::from_millis(200),
        ..mk_options(ProxyMode::Full)
    };
    let mut h = start_agent(
        server,
        options,
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
    h.wait_for("the first sync", |s, _| synced(s)).await;
    assert_eq!(http::get(h.admin_port, "/healthz").await.unwrap().0, 200);
    assert_eq!(http::get(h.admin_port, "/readyz").await.unwrap().0, 200);

    h.fail.store(true, Ordering::SeqCst);
    h.wait_for("a failed sync", |s, _| s.failures > 0).await;
    let mut code = 0;
    for _ in 0..100 {
        code = http::get(h.admin_port, "/healthz").await.unwrap().0;
        if code == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(code, 503);
    let (_, metrics) = http::get(h.admin_port, "/metrics").await.unwrap();
    let failures = metric(&metrics, "berth_agent_restore_failures_total");
    assert!(failures >= 1.0, "{metrics}");

    h.fail.store(false, Ordering::SeqCst);
    let failures_seen = h.status.borrow().failures;
    h.wait_for("a sync after the failures", |s, _| {
        s.failures == failures_seen && s.last_error.is_none()
    })
    .await;
    assert_eq!(http::get(h.admin_port, "/healthz").await.unwrap().0, 200);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

#[tokio::test]
async fn metrics_report_syncs_rules_and_network_programming_latency() {
    let mut h = start(ProxyMode::Full).await;
    h.wait_for("the first sync", |s, _| synced(s)).await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    let mut slice = mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE)],
    );
    // The annotation has second precision: make sure it is not before the agent started.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let trigger = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    slice["metadata"]["annotations"] =
        json!({"endpoints.kubernetes.io/last-change-trigger-time": trigger});
    h.create(slice).await;
    h.wait_for("web", |_, ipt| nat(ipt).contains("10.244.1.5:8080"))
        .await;
    let (status, metrics) = http::get(h.admin_port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        metric(
            &metrics,
            "berth_agent_sync_duration_seconds_count{kind=\"full\"}"
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "berth_agent_sync_duration_seconds_count{kind=\"partial\"}"
        ) >= 1.0,
        "{metrics}"
    );
    let rules = metric(&metrics, "berth_agent_rules");
    assert_eq!(
        rules as usize,
        h.iptables.lock().berth_ruleset().rule_count()
    );
    assert_eq!(
        metric(
            &metrics,
            "berth_agent_network_programming_duration_seconds_count"
        ),
        1.0,
        "{metrics}"
    );
    let latency = metric(
        &metrics,
        "berth_agent_network_programming_duration_seconds_sum",
    );
    assert!((0.0..60.0).contains(&latency), "{latency}");
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn udp_endpoint_removal_clears_conntrack_after_the_sync() {
    let mut h = start(ProxyMode::Full).await;
    h.create(mk_service_json(
        "kube-system",
        "dns",
        "10.96.0.10",
        json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
    ))
    .await;
    h.create(mk_slice_json(
        "kube-system",
        "dns",
        "dns-1",
        "UDP",
        &[("10.244.1.5", true, NODE), ("10.244.1.6", true, NODE)],
    ))
    .await;
    h.wait_for("dns", |_, ipt| nat(ipt).contains("10.244.1.6:5353"))
        .await;
    Api::<EndpointSlice>::namespaced(h.client.clone(), "kube-system")
        .patch(
            "dns-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": true}, "nodeName": NODE}]})),
        )
        .await
        .unwrap();
    h.wait_for("the endpoint to go", |_, ipt| {
        !nat(ipt).contains("10.244.1.6:5353")
    })
    .await;
    let flows = h.conntrack.0.lock().unwrap().clone();
    assert!(
        flows.contains(&ConntrackFlow::ServiceToEndpoint {
            service_ip: "10.96.0.10".parse().unwrap(),
            endpoint_ip: "10.244.1.6".parse().unwrap(),
        }),
        "{flows:?}"
    );
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
