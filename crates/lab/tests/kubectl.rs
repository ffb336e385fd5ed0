//! The real `kubectl` against the lab API server. Skipped, with a message, where kubectl is missing
//! (a failure under `CI=true`).

#![allow(clippy::unwrap_used)]

mod common;

use berth_lab::LabApiServer;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// kubectl's minor version, if kubectl runs at all.
fn kubectl_minor() -> Option<u32> {
    let out = Command::new("kubectl")
        .args(["version", "--client", "-o", "json"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["clientVersion"]["minor"]
        .as_str()?
        .trim_end_matches('+')
        .parse()
        .ok()
}

struct Kubectl {
    kubeconfig: PathBuf,
    dir: PathBuf,
    /// kubectl before 1.27 validates against `/openapi/v2` (protobuf), which the lab does not serve.
    validate: &'static str,
}

impl Kubectl {
    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        if matches!(args.first(), Some(&"create") | Some(&"apply")) {
            cmd.arg(self.validate);
        }
        cmd.env("HOME", &self.dir)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    }

    /// Run, require success, return stdout.
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

    fn manifest(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: web
  labels:
    app: web
spec:
  type: LoadBalancer
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
";

fn check(k: &Kubectl, dir: &Path) {
    // create, get (plain, -o yaml, -A, -l), describe
    let svc = k.manifest("svc.yaml", SERVICE);
    assert!(k
        .ok(&["create", "-f", &svc])
        .contains("service/web created"));
    let table = k.ok(&["get", "services"]);
    assert!(table.contains("web"), "{table}");
    let yaml = k.ok(&["get", "service", "web", "-o", "yaml"]);
    assert!(
        yaml.contains("targetPort: 8080") && yaml.contains("resourceVersion:"),
        "{yaml}"
    );
    assert!(k.ok(&["get", "svc", "-A"]).contains("default"));
    assert!(k
        .ok(&["get", "svc", "-l", "app=web", "-o", "name"])
        .contains("service/web"));
    assert!(!k
        .ok(&["get", "svc", "-l", "app=other", "-o", "name"])
        .contains("service/web"));
    assert!(k.ok(&["get", "namespaces"]).contains("kube-system"));
    let described = k.ok(&["describe", "service", "web"]);
    assert!(
        described.contains("Name:") && described.contains("web"),
        "{described}"
    );

    // patch (strategic by default, and merge)
    k.ok(&[
        "patch",
        "service",
        "web",
        "-p",
        r#"{"spec":{"ports":[{"port":80,"targetPort":9090}]}}"#,
    ]);
    assert!(k
        .ok(&[
            "get",
            "svc",
            "web",
            "-o",
            "jsonpath={.spec.ports[0].targetPort}"
        ])
        .contains("9090"));
    k.ok(&[
        "patch",
        "service",
        "web",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"tier":"front"}}}"#,
    ]);
    assert!(k
        .ok(&["get", "svc", "-l", "tier=front", "-o", "name"])
        .contains("service/web"));

    // plain (client-side) apply, twice: create then update
    let cm = k.manifest(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n",
    );
    assert!(k
        .ok(&["apply", "-f", &cm])
        .contains("configmap/settings created"));
    let cm = k.manifest(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"2\"\n",
    );
    assert!(k
        .ok(&["apply", "-f", &cm])
        .contains("configmap/settings configured"));
    assert_eq!(
        k.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.a}"]),
        "2"
    );

    // server-side apply, and its conflict with another manager
    let lease = k.manifest("lease.yaml", "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: berth-controller\nspec:\n  holderIdentity: a\n");
    assert!(k
        .ok(&["apply", "--server-side", "-f", &lease])
        .contains("serverside-applied"));
    let lease_b = k.manifest("lease-b.yaml", "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: berth-controller\nspec:\n  holderIdentity: b\n");
    let out = k.run(&[
        "apply",
        "--server-side",
        "--field-manager",
        "other",
        "-f",
        &lease_b,
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("conflict") && stderr.contains(".spec.holderIdentity"),
        "{stderr}"
    );
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager",
        "other",
        "--force-conflicts",
        "-f",
        &lease_b,
    ]);
    assert_eq!(
        k.ok(&[
            "get",
            "lease",
            "berth-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}"
        ]),
        "b"
    );

    // watch sees a change made after its list: `late` is created only once the list (which names
    // `before`) has been printed, so it can only arrive through the watch.
    let before = k.manifest(
        "before.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: before\n",
    );
    k.ok(&["create", "-f", &before]);
    let mut watcher = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args([
            "get",
            "configmaps",
            "-w",
            "--request-timeout=30s",
            "-o",
            "name",
        ])
        .env("HOME", dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(watcher.stdout.take().unwrap()));
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line == "configmap/before" {
            break;
        }
    }
    assert_eq!(
        seen.last().map(String::as_str),
        Some("configmap/before"),
        "{seen:?}"
    );
    // `kubectl create configmap ...` (the typed generators) would send protobuf, which the lab does
    // not decode; manifests go as JSON.
    let late = k.manifest(
        "late.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: late\n",
    );
    k.ok(&["create", "-f", &late]);
    let watched = lines
        .map(Result::unwrap)
        .find(|line| line == "configmap/late");
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(
        watched.is_some(),
        "the watch never showed configmap/late after {seen:?}"
    );

    // delete
    assert!(k.ok(&["delete", "service", "web"]).contains("deleted"));
    let out = k.run(&["get", "service", "web"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_the_lab() {
    berth_testing::require!(berth_testing::Requirement::Kubectl);
    let minor = kubectl_minor().expect("`kubectl version --client` reports a version");
    let validate = if minor >= 27 {
        "--validate=true"
    } else {
        "--validate=false"
    };
    let server = LabApiServer::builder().start().await.unwrap();
    let dir = common::unique_dir("kubectl");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let k = Kubectl {
        kubeconfig,
        dir: dir.clone(),
        validate,
    };
    let d = dir.clone();
    tokio::task::spawn_blocking(move || check(&k, &d))
        .await
        .unwrap();
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
