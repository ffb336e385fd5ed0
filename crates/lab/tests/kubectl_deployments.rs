//! Deployments through the real `kubectl` against the lab API server and the lab's workload
//! controllers: create (protobuf), the printer columns, `scale` (the subresource), `set image`,
//! `rollout status|history|undo|restart`, a rollout that stalls on pods that never get Ready,
//! and `delete` collecting the ReplicaSets and pods. A stand-in kubelet in the test marks pods
//! Ready unless their image is `never-ready` (the lab kubelet probes real pods; its end-to-end
//! journey is e2e/local/80-deployment-rollout.sh). Skipped, with a message, where kubectl is
//! missing; a failure under CI.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use berth_lab::workloads::{Workloads, WorkloadsConfig};
use berth_lab::LabApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Kubectl {
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", &self.dir)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Polls `args` until its output satisfies `want` (10 s at most).
    fn until(&self, args: &[&str], want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.ok(args);
            if want(&out) {
                return out;
            }
            assert!(Instant::now() < deadline, "kubectl {args:?}: still {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Marks pods Running and Ready (with a pod IP) unless their image is `never-ready`.
async fn stand_in_kubelet(client: kube::Client, stop: CancellationToken) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut n = 0u32;
    while !stop.is_cancelled() {
        for pod in pods.list(&ListParams::default()).await.unwrap() {
            let spec = pod.spec.clone().unwrap_or_default();
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready"));
            let image = spec.containers[0].image.clone().unwrap_or_default();
            if ready || image.ends_with("never-ready") {
                continue;
            }
            n += 1;
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let status = json!({"status": {"phase": "Running", "podIP": format!("10.244.1.{}", n % 250 + 2),
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
            let ns = pod.metadata.namespace.clone().unwrap();
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let _ = api
                .patch_status(
                    pod.metadata.name.as_deref().unwrap(),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn rollouts(k: &Kubectl) {
    let created = k.ok(&[
        "create",
        "deployment",
        "web",
        "--image=berth.dev/lab-echo",
        "--replicas=3",
        "--port=8080",
    ]);
    assert!(created.contains("deployment.apps/web created"), "{created}");
    k.ok(&["rollout", "status", "deployment/web", "--timeout=20s"]);
    let row = k.ok(&["get", "deployment", "web", "--no-headers"]);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..4], ["web", "3/3", "3", "3"], "{row}");
    let wide = k.ok(&["get", "deploy", "web", "-o", "wide"]);
    assert!(
        wide.contains("lab-echo") && wide.contains("app=web"),
        "{wide}"
    );

    // One ReplicaSet, its pods labelled with the template hash and owned by it.
    let rs = k.ok(&[
        "get",
        "rs",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    let hash = rs.strip_prefix("web-").expect("web-<hash>").to_owned();
    let rs_row = k.ok(&["get", "rs", &rs, "--no-headers"]);
    assert_eq!(
        rs_row.split_whitespace().collect::<Vec<_>>()[..4],
        [rs.as_str(), "3", "3", "3"]
    );
    let owners = k.ok(&["get", "pods", "-l", &format!("pod-template-hash={hash}"), "-o",
        "jsonpath={range .items[*]}{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {end}"]);
    assert_eq!(owners.split_whitespace().count(), 3, "{owners}");
    assert!(
        owners
            .split_whitespace()
            .all(|o| o == format!("ReplicaSet/{rs}")),
        "{owners}"
    );
    let rs_owner = k.ok(&[
        "get",
        "rs",
        &rs,
        "-o",
        "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    ]);
    assert_eq!(rs_owner, "Deployment/web");

    // scale: through the subresource, as kubectl does it.
    k.ok(&["scale", "deployment/web", "--replicas=4"]);
    let scale = k.ok(&[
        "get",
        "--raw",
        "/apis/apps/v1/namespaces/default/deployments/web/scale",
    ]);
    let scale: serde_json::Value = serde_json::from_str(&scale).unwrap();
    assert_eq!(
        (&scale["kind"], &scale["spec"]["replicas"]),
        (&json!("Scale"), &json!(4))
    );
    assert_eq!(scale["status"]["selector"], "app=web");
    k.until(&["get", "pods", "-l", "app=web", "-o", "name"], |o| {
        o.lines().count() == 4
    });
    k.ok(&["rollout", "status", "deployment/web", "--timeout=20s"]);

    // A new image rolls out to a second ReplicaSet; history shows both revisions.
    k.ok(&[
        "set",
        "image",
        "deployment/web",
        "lab-echo=berth.dev/lab-echo:v2",
    ]);
    k.ok(&["rollout", "status", "deployment/web", "--timeout=20s"]);
    k.until(
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].spec.containers[0].image}",
        ],
        |o| o.split_whitespace().count() == 4 && o.split_whitespace().all(|i| i.ends_with(":v2")),
    );
    let history = k.ok(&["rollout", "history", "deployment/web"]);
    assert!(
        history.contains("\n1 ") && history.contains("\n2 "),
        "{history}"
    );

    // undo goes back to revision 1's ReplicaSet (now revision 3), no third ReplicaSet.
    k.ok(&["rollout", "undo", "deployment/web"]);
    k.ok(&["rollout", "status", "deployment/web", "--timeout=20s"]);
    assert_eq!(
        k.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.template.spec.containers[0].image} {.metadata.annotations.deployment\\.kubernetes\\.io/revision}"]),
        "berth.dev/lab-echo 3"
    );
    assert_eq!(
        k.ok(&["get", "rs", "-l", "app=web", "-o", "name"])
            .lines()
            .count(),
        2
    );
    assert_eq!(
        k.ok(&["get", "rs", &rs, "-o", "jsonpath={.spec.replicas}"]),
        "4",
        "revision 1's ReplicaSet is the live one again"
    );

    // restart: a new template annotation, a third ReplicaSet.
    k.ok(&["rollout", "restart", "deployment/web"]);
    k.ok(&["rollout", "status", "deployment/web", "--timeout=20s"]);
    assert_eq!(
        k.ok(&["get", "rs", "-l", "app=web", "-o", "name"])
            .lines()
            .count(),
        3
    );

    // A template whose pods never get Ready: the rollout stops within 25% of 4 (one pod more,
    // one pod unavailable): two new pods that never serve, three old ones that keep serving,
    // and rollout status does not report success.
    k.ok(&["set", "image", "deployment/web", "lab-echo=never-ready"]);
    let out = k.run(&["rollout", "status", "deployment/web", "--timeout=3s"]);
    assert!(!out.status.success(), "a stalled rollout reported success");
    let row = k.ok(&["get", "deployment", "web", "--no-headers"]);
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>()[..4],
        ["web", "3/4", "2", "3"],
        "{row}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let row = k.ok(&["get", "deployment", "web", "--no-headers"]);
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>()[..4],
        ["web", "3/4", "2", "3"],
        "and stays there: {row}"
    );
    k.ok(&["rollout", "undo", "deployment/web"]);
    k.ok(&["rollout", "status", "deployment/web", "--timeout=20s"]);
    k.until(&["get", "pods", "-l", "app=web", "-o", "name"], |o| {
        o.lines().count() == 4
    });

    // `get all` lists Deployments and ReplicaSets beside pods and Services.
    let all = k.ok(&["get", "all"]);
    assert!(
        all.contains("deployment.apps/web") && all.contains("replicaset.apps/web-"),
        "{all}"
    );

    // delete: the garbage collector removes the ReplicaSets, then their pods.
    k.ok(&["delete", "deployment", "web"]);
    k.until(
        &["get", "rs,pods", "-l", "app=web", "-o", "name"],
        str::is_empty,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_roll_out_through_kubectl() {
    berth_testing::require!(berth_testing::Requirement::Kubectl);
    let server = LabApiServer::builder().start().await.unwrap();
    let dir = common::unique_dir("kubectl-deploy");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let stop = CancellationToken::new();
    let config = WorkloadsConfig {
        resync: Duration::from_millis(100),
        ..WorkloadsConfig::default()
    };
    let controllers =
        tokio::spawn(Workloads::new(server.client().unwrap(), config).run(stop.clone()));
    let kubelet = tokio::spawn(stand_in_kubelet(server.client().unwrap(), stop.clone()));
    let k = Kubectl {
        kubeconfig,
        dir: dir.clone(),
    };
    let result = tokio::task::spawn_blocking(move || rollouts(&k)).await;
    stop.cancel();
    controllers.await.unwrap().unwrap();
    kubelet.await.unwrap();
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
    result.unwrap();
}
