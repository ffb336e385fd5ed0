//! What a kubectl user sees of berth's controller on the lab API server: `kubectl get svc` with the
//! allocated CLUSTER-IP, node port and EXTERNAL-IP, and the controller's events.k8s.io Events in
//! `kubectl get events` and `kubectl describe svc`. Skipped, with a message, where kubectl is
//! missing; a failure under CI.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;
use std::process::Command;

fn kubectl(kubeconfig: &std::path::Path, home: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn kubectl_shows_the_controllers_allocations_and_events() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map_or(true, |o| !o.status.success())
    {
        let required = std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var("BERTH_REQUIRE_ROOT").is_ok_and(|v| v == "1");
        assert!(!required, "kubectl is not installed (required under CI)");
        eprintln!("SKIPPED: kubectl is not installed (Debian package kubernetes-client)");
        return;
    }
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "lan",
        json!({"addresses": ["198.18.0.200-198.18.0.250"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(
        &client,
        "web",
        json!({"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80}]}),
    )
    .await;
    wait_until("the controller's events", || async {
        let reasons: Vec<String> = events_for(&client, "web")
            .await
            .into_iter()
            .map(|e| e.0)
            .collect();
        ["EnsuredLoadBalancer", "IPAllocated"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r))
    })
    .await;
    let web = get_svc(&client, "web").await;
    let node_port = node_ports(&web)[0].unwrap();

    let dir = berth_testing::unique_dir("berth-controller-kubectl");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (kc, home) = (kubeconfig.clone(), dir.clone());
    let (table, events, described) = tokio::task::spawn_blocking(move || {
        (
            kubectl(&kc, &home, &["get", "svc", "-A"]),
            kubectl(&kc, &home, &["get", "events"]),
            kubectl(&kc, &home, &["describe", "svc", "web"]),
        )
    })
    .await
    .unwrap();
    let row: Vec<&str> = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.get(1) == Some(&"web"))
        .unwrap_or_else(|| panic!("no web in\n{table}"));
    assert_eq!(
        row[..6],
        [
            "default",
            "web",
            "LoadBalancer",
            cluster_ip(&web).unwrap().as_str(),
            "198.18.0.200",
            format!("80:{node_port}/TCP").as_str()
        ],
        "{table}"
    );
    assert!(
        events.contains("IPAllocated") && events.contains("service/web"),
        "{events}"
    );
    let listed = described
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("{described}"));
    assert!(
        listed.contains("EnsuredLoadBalancer") && listed.contains("IPAllocated"),
        "{described}"
    );
    ctrl.stop().await;
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
