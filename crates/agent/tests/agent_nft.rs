//! The agent on the nftables backend against the lab API server, with in-memory nftables and
//! iptables: objects in the API become berth's table, the iptables rules an earlier run left are
//! removed (and nobody else's), and going back to iptables removes berth's table.
//!
//! Address plan: see `common`. Nothing here needs root or touches the host's rules.

#![allow(clippy::unwrap_used)]

mod common;
mod harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_agent::{Agent, AgentOptions, AgentStatus, Backend, BoxedNft, SharedIptables};
use berth_core::IpFamily;
use berth_datapath::fake::MemoryIptables;
use berth_datapath::fake::MemoryNft;
use berth_datapath::iptables::Syncer;
use berth_datapath::nft::Nft;
use berth_datapath::nft::Transaction;
use berth_datapath::plan::convert::ProxyMode;
use berth_datapath::trace::{trace, Origin, Packet, TraceEnv, Verdict};
use berth_datapath::{plan, Table};
use berth_lab::LabApiServerHandle;
use berth_telemetry::{MetricsRegistry, Readiness};
use berth_testing::start_lab;
use common::*;
use harness::{mk_options, synced, RecordingConntrack};
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One in-memory nftables shared between the agent and the test.
#[derive(Clone)]
struct SharedNft(Arc<Mutex<MemoryNft>>);

impl Nft for SharedNft {
    fn apply(&mut self, tx: &Transaction) -> Result<(), berth_datapath::Error> {
        self.0.lock().unwrap().apply(tx)
    }
}

struct Running {
    status: watch::Receiver<AgentStatus>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), berth_agent::Error>>,
}

fn start_agent(
    server: &LabApiServerHandle,
    options: AgentOptions,
    iptables: SharedIptables<MemoryIptables>,
    nft: SharedNft,
) -> Running {
    let mut registry = MetricsRegistry::new();
    let readiness = Readiness::new();
    let agent = Agent::with_nft(
        options.validate().unwrap(),
        server.client().unwrap(),
        move |_| iptables.clone(),
        move |_| -> BoxedNft { Box::new(nft.clone()) },
        RecordingConntrack::default(),
        &mut registry,
        &readiness,
    )
    .unwrap();
    let status = agent.status();
    let stop = CancellationToken::new();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    admin.set_nonblocking(true).unwrap();
    let admin = tokio::net::TcpListener::from_std(admin).unwrap();
    let task = tokio::spawn(agent.run(
        admin,
        registry.into_shared(),
        stop.clone().cancelled_owned(),
    ));
    Running { status, stop, task }
}

async fn create(server: &LabApiServerHandle, obj: Value) {
    let client = server.client().unwrap();
    let kind = obj["kind"].as_str().unwrap().to_string();
    let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
    let ar = match kind.as_str() {
        "Node" => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Node>(&()),
        "Service" => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
        _ => kube::api::ApiResource::erase::<k8s_openapi::api::discovery::v1::EndpointSlice>(&()),
    };
    let api: Api<kube::api::DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client, &ns, &ar),
        None => Api::all_with(client, &ar),
    };
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj).unwrap(),
    )
    .await
    .unwrap();
}

async fn wait_until(running: &mut Running, what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ok = synced(&running.status.borrow_and_update()) && check();
        if ok {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), running.status.changed()).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
    }
}

#[tokio::test]
async fn the_nftables_backend_programs_berths_table_and_removes_its_iptables_rules() {
    let (server, _) = start_lab().await;
    // What an earlier run on the iptables backend left, beside another program's chain.
    let mut ipt = MemoryIptables::default();
    ipt.restore_text("*nat\n:KEEP-NAT - [0:0]\n-A KEEP-NAT -s 10.244.9.9/32 -j RETURN\nCOMMIT\n")
        .unwrap();
    let foreign = ipt.tables.clone();
    let mut earlier = Syncer::new(ipt);
    let old_view = berth_datapath::NodeView {
        node: berth_testing::mk_node_info(NODE, "198.18.0.11".parse().unwrap()),
        services: vec![berth_testing::mk_service_port(
            berth_testing::port_name("default", "old", "http"),
            "10.96.0.99".parse().unwrap(),
            80,
            vec![],
        )],
    };
    earlier.sync(&plan(&old_view, &Default::default())).unwrap();
    let iptables = SharedIptables::new(earlier.iptables().clone());
    let nft = SharedNft(Arc::new(Mutex::new(MemoryNft::new(IpFamily::V4))));

    let options = AgentOptions {
        backend: Backend::Nftables,
        ..mk_options(ProxyMode::Full)
    };
    let mut running = start_agent(&server, options, iptables.clone(), nft.clone());
    create(&server, mk_node_json(NODE, "198.18.0.11")).await;
    create(
        &server,
        mk_service_json(
            "default",
            "web",
            "10.96.0.10",
            json!([{"name": "http", "port": 80}]),
        ),
    )
    .await;
    create(
        &server,
        mk_slice_json(
            "default",
            "web",
            "web-1",
            "TCP",
            &[("10.244.1.5", true, NODE)],
        ),
    )
    .await;
    wait_until(&mut running, "web in berth's table", || {
        nft.0
            .lock()
            .unwrap()
            .table
            .as_ref()
            .is_some_and(|t| !t.services.is_empty())
    })
    .await;
    assert_eq!(
        iptables.lock().tables,
        foreign,
        "only berth's iptables rules are gone"
    );
    let traced = nft.0.lock().unwrap().traceable();
    let packet = Packet {
        src: "10.244.1.77".parse().unwrap(),
        dst: "10.96.0.10".parse().unwrap(),
        protocol: berth_core::Protocol::Tcp,
        dport: 80,
        origin: Origin::Network,
        bridged: false,
    };
    let outcomes = trace(&traced, &TraceEnv::default(), &packet).unwrap();
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(
        outcomes[0].0.verdict,
        Verdict::Dnat("10.244.1.5:8080".parse().unwrap())
    );
    running.stop.cancel();
    running.task.await.unwrap().unwrap();

    // Back to iptables: berth's table goes, its chains come back.
    let options = AgentOptions {
        backend: Backend::Iptables,
        ..mk_options(ProxyMode::Full)
    };
    let mut running = start_agent(&server, options, iptables.clone(), nft.clone());
    wait_until(&mut running, "berth's table removed", || {
        nft.0.lock().unwrap().table.is_none()
    })
    .await;
    assert!(iptables
        .lock()
        .tables
        .get(&Table::Nat)
        .unwrap()
        .keys()
        .any(|c| c.as_str() == "BERTH-SERVICES"));
    running.stop.cancel();
    running.task.await.unwrap().unwrap();
}
