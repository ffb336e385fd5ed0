//! The agent with real iptables (`CommandIptables`), inside a private network namespace that
//! this test creates for one thread (with the lab API server, on that namespace's loopback).
//! Needs root and iptables; without them the test says why and skips (fails under `CI=true`). The namespace has
//! no interface but `lo` and disappears with the thread, so nothing reaches the host's rules.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use berth_agent::{Agent, AgentOptions, AgentStatus, CommandConntrack, CommandIptables};
use berth_datapath::plan::convert::ProxyMode;
use berth_telemetry::{MetricsRegistry, Readiness};
use berth_testing::Requirement;
use common::*;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use nix::sched::CloneFlags;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Berth's lines of `iptables-save`, without counters, sorted.
fn berth_lines() -> Vec<String> {
    let mut lines: Vec<String> = ["nat", "filter"]
        .iter()
        .flat_map(|table| {
            run("iptables-save", &["-t", table])
                .lines()
                .filter(|l| l.contains("BERTH-"))
                .map(|l| l.split(" [").next().unwrap_or(l).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    lines.sort();
    lines
}

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), berth_agent::Error>>,
    status: watch::Receiver<AgentStatus>,
}

fn start_agent(client: Client) -> Running {
    let options = AgentOptions {
        node_name: NODE.into(),
        proxy_mode: ProxyMode::Full,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        min_sync_interval: Duration::from_millis(50),
        healthz_bind_address: "127.0.0.1".parse().unwrap(),
        ..AgentOptions::default()
    };
    let mut registry = MetricsRegistry::new();
    let agent = Agent::new(
        options.validate().unwrap(),
        client,
        CommandIptables::new,
        CommandConntrack::new(),
        &mut registry,
        &Readiness::new(),
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
    Running { stop, task, status }
}

async fn wait_until(
    status: &mut watch::Receiver<AgentStatus>,
    what: &str,
    check: impl Fn() -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        let _ = tokio::time::timeout(Duration::from_millis(200), status.changed()).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
    }
}

async fn scenario() {
    // Another program's chain, which berth must leave alone.
    run("iptables", &["-t", "nat", "-N", "OTHER-PROXY"]);
    run(
        "iptables",
        &["-t", "nat", "-A", "OTHER-PROXY", "-j", "RETURN"],
    );

    let (server, client) = berth_testing::start_lab().await;
    Api::<Service>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(mk_service_json(
                "default",
                "web",
                "10.96.0.10",
                json!([{"name": "http", "port": 80}]),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(mk_slice_json(
                "default",
                "web",
                "web-1",
                "TCP",
                &[("10.244.1.5", true, NODE)],
            ))
            .unwrap(),
        )
        .await
        .unwrap();

    let mut agent = start_agent(client.clone());
    wait_until(&mut agent.status, "the DNAT rule", || {
        run("iptables-save", &["-t", "nat"]).contains("--to-destination 10.244.1.5:8080")
    })
    .await;
    let nat = run("iptables-save", &["-t", "nat"]);
    assert!(
        nat.contains(
            "-A PREROUTING -m comment --comment \"berth service portals\" -j BERTH-SERVICES"
        ),
        "{nat}"
    );
    assert!(nat.contains("-A OTHER-PROXY -j RETURN"), "{nat}");
    let programmed = berth_lines();

    // Stopping leaves everything; a new agent converges without changing a line.
    agent.stop.cancel();
    agent.task.await.unwrap().unwrap();
    assert_eq!(berth_lines(), programmed);
    let mut agent = start_agent(client.clone());
    agent.status.wait_for(|s| s.syncs > 0).await.unwrap();
    assert_eq!(berth_lines(), programmed);

    // Deleting the Service removes its chains, and only berth's.
    Api::<Service>::namespaced(client.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(&mut agent.status, "web's rules to go", || {
        !run("iptables-save", &["-t", "nat"]).contains("default/web")
    })
    .await;
    assert!(run("iptables-save", &["-t", "nat"]).contains("-A OTHER-PROXY -j RETURN"));
    agent.stop.cancel();
    agent.task.await.unwrap().unwrap();
    server.shutdown().await.unwrap();
}

#[test]
fn real_iptables_in_a_private_network_namespace() {
    berth_testing::require!(Requirement::Netns, Requirement::Iptables);
    std::thread::spawn(|| {
        // Only this thread (and the processes and threads it starts) enter the namespace.
        if let Err(err) = nix::sched::unshare(CloneFlags::CLONE_NEWNET) {
            panic!("cannot create a network namespace: {err}");
        }
        run("ip", &["link", "set", "lo", "up"]);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(scenario());
    })
    .join()
    .unwrap();
}
