//! The real `kubectl` against the lab API server: manifests, patches, apply, watch, and what makes
//! it look like a cluster — the server's Table columns, Events from both groups, the protobuf bodies
//! of its generators. Skipped, with a message, where kubectl is missing; a failure under CI.

#![allow(clippy::unwrap_used)]

mod common;

use berth_apiserver::LabApiServer;
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
    // `before`) has been printed, so it can only arrive through the watch. The watch asks for
    // Tables, one row per change; the generator that creates `late` sends protobuf.
    let before = k.manifest(
        "before.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: before\n",
    );
    k.ok(&["create", "-f", &before]);
    let mut watcher = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args(["get", "configmaps", "-w", "--request-timeout=30s"])
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
        if line.starts_with("before ") {
            break;
        }
    }
    assert!(
        seen.first().is_some_and(|l| l.starts_with("NAME")),
        "{seen:?}"
    );
    assert!(
        seen.last().is_some_and(|l| l.starts_with("before ")),
        "{seen:?}"
    );
    k.ok(&["create", "configmap", "late", "--from-literal=a=1"]);
    let watched = lines
        .map(Result::unwrap)
        .find(|line| line.starts_with("late "));
    let _ = watcher.kill();
    let _ = watcher.wait();
    let row = watched.unwrap_or_else(|| panic!("the watch never showed late after {seen:?}"));
    assert_eq!(columns(&row)[..2], ["late", "1"], "{row}");

    // delete
    assert!(k.ok(&["delete", "service", "web"]).contains("deleted"));
    let out = k.run(&["get", "service", "web"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
}

/// The whitespace-separated cells of one printed row.
fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// The printed row whose first cell is `name`.
fn row_of<'a>(table: &'a str, name: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(columns)
        .find(|c| c.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row {name} in\n{table}"))
}

/// `kubectl get` prints the server's Table: upstream's columns and cells.
fn tables(k: &Kubectl) {
    let svc = k.manifest(
        "tables.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: tables\n  labels:\n    app: tables\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.20\n  clusterIPs: [10.96.0.20]\n  selector:\n    app: tables\n  ports:\n  - port: 80\n    nodePort: 30080\n",
    );
    k.ok(&["create", "-f", &svc]);
    let table = k.ok(&["get", "svc"]);
    assert_eq!(
        columns(table.lines().next().unwrap()),
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ],
        "{table}"
    );
    assert_eq!(
        row_of(&table, "tables")[..5],
        [
            "tables",
            "LoadBalancer",
            "10.96.0.20",
            "<pending>",
            "80:30080/TCP"
        ]
    );
    // The controller's part, written by hand: the address shows in EXTERNAL-IP.
    k.ok(&[
        "patch",
        "svc",
        "tables",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"loadBalancer":{"ingress":[{"ip":"198.18.0.200"}]}}}"#,
    ]);
    let wide = k.ok(&["get", "svc", "-A", "-o", "wide"]);
    assert_eq!(
        columns(wide.lines().next().unwrap()),
        [
            "NAMESPACE",
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE",
            "SELECTOR"
        ]
    );
    let row: Vec<&str> = wide
        .lines()
        .map(columns)
        .find(|c| c.get(1) == Some(&"tables"))
        .unwrap_or_else(|| panic!("no row tables in\n{wide}"));
    assert_eq!(row[4], "198.18.0.200", "{wide}");
    assert_eq!(row[7], "app=tables", "{wide}");
    // Label columns and sorting read the object each row carries.
    let labelled = k.ok(&["get", "svc", "-L", "app", "--sort-by=.metadata.name"]);
    assert!(
        labelled.lines().next().unwrap().ends_with("APP"),
        "{labelled}"
    );
    assert_eq!(row_of(&labelled, "tables").last(), Some(&"tables"));
    let all = k.ok(&["get", "all"]);
    assert!(all.contains("service/tables"), "{all}");
    let namespaces = k.ok(&["get", "namespaces"]);
    assert_eq!(row_of(&namespaces, "kube-system")[1], "Active");

    // ServiceCIDRs, cluster-scoped, with upstream's columns.
    let cidr = k.manifest(
        "servicecidr.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: extra\nspec:\n  cidrs: [10.97.0.0/24, fd00:97::/112]\n",
    );
    k.ok(&["create", "-f", &cidr]);
    let cidrs = k.ok(&["get", "servicecidrs"]);
    assert_eq!(
        columns(cidrs.lines().next().unwrap()),
        ["NAME", "CIDRS", "AGE"],
        "{cidrs}"
    );
    assert_eq!(
        row_of(&cidrs, "extra")[..2],
        ["extra", "10.97.0.0/24,fd00:97::/112"]
    );

    // A custom resource prints its CRD's additionalPrinterColumns.
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds/berth.dev.yaml");
    k.ok(&["create", "-f", crds]);
    let pool = k.manifest(
        "pool.yaml",
        "apiVersion: berth.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: lan\nspec:\n  addresses: [198.18.0.200-198.18.0.250]\n  autoAssign: true\n",
    );
    k.ok(&["create", "-f", &pool]);
    let pools = k.ok(&["get", "ipp"]);
    assert!(
        pools.starts_with("NAME") && pools.contains("ADDRESSES") && pools.contains("AUTO ASSIGN"),
        "{pools}"
    );
    assert_eq!(
        row_of(&pools, "lan")[1..3],
        ["[\"198.18.0.200-198.18.0.250\"]", "true"]
    );
    let crd_table = k.ok(&["get", "crd"]);
    assert_eq!(
        columns(crd_table.lines().next().unwrap()),
        ["NAME", "CREATED", "AT"]
    );
}

/// Events written through events.k8s.io (as berth's controller does) are what `kubectl get events`
/// and `kubectl describe` read through core/v1.
fn events(k: &Kubectl) {
    let uid = k.ok(&["get", "svc", "tables", "-o", "jsonpath={.metadata.uid}"]);
    let event = k.manifest(
        "event.yaml",
        &format!(
            "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata:\n  name: tables.1\neventTime: \"{}\"\nreportingController: berth.dev/controller\nreportingInstance: controller-0\naction: Allocate\nreason: IPAllocated\nregarding:\n  apiVersion: v1\n  kind: Service\n  name: tables\n  namespace: default\n  uid: {uid}\nnote: assigned 198.18.0.200\ntype: Normal\n",
            chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ")
        ),
    );
    k.ok(&["create", "-f", &event]);
    let listed = k.ok(&["get", "events"]);
    assert_eq!(
        columns(listed.lines().next().unwrap()),
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{listed}"
    );
    assert!(
        listed.contains("IPAllocated") && listed.contains("service/tables"),
        "{listed}"
    );
    let described = k.ok(&["describe", "svc", "tables"]);
    let line = described
        .lines()
        .find(|l| l.contains("IPAllocated"))
        .unwrap_or_else(|| panic!("no event in\n{described}"));
    assert!(
        line.contains("berth.dev/controller") && line.contains("assigned 198.18.0.200"),
        "{described}"
    );
    // `kubectl events` reads core Events and prints them itself.
    let for_svc = k.ok(&["events", "--for", "service/tables"]);
    assert!(for_svc.contains("IPAllocated"), "{for_svc}");
    // The same object through both groups.
    assert_eq!(
        k.ok(&[
            "get",
            "events",
            "tables.1",
            "-o",
            "jsonpath={.message}/{.involvedObject.name}"
        ]),
        "assigned 198.18.0.200/tables"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "events.events.k8s.io",
            "tables.1",
            "-o",
            "jsonpath={.note}/{.regarding.name}"
        ]),
        "assigned 198.18.0.200/tables"
    );
}

/// kubectl's generators send protobuf; what they create reads back as JSON.
fn generators(k: &Kubectl) {
    assert!(k
        .ok(&["create", "service", "loadbalancer", "gen", "--tcp=80:8080"])
        .contains("service/gen created"));
    assert_eq!(
        k.ok(&["get", "svc", "gen", "-o", "jsonpath={.spec.type} {.spec.ports[0].port} {.spec.ports[0].targetPort} {.spec.selector.app}"]),
        "LoadBalancer 80 8080 gen"
    );
    k.ok(&["create", "namespace", "team"]);
    k.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "team",
        "--from-literal=a=1",
    ]);
    assert_eq!(
        k.ok(&[
            "get",
            "cm",
            "settings",
            "-n",
            "team",
            "-o",
            "jsonpath={.data.a}"
        ]),
        "1"
    );
    assert!(k
        .ok(&[
            "expose",
            "service",
            "gen",
            "--name=gen-copy",
            "--port=81",
            "--target-port=8080"
        ])
        .contains("service/gen-copy exposed"));
    assert_eq!(
        k.ok(&[
            "get",
            "svc",
            "gen-copy",
            "-o",
            "jsonpath={.spec.ports[0].port} {.spec.selector.app}"
        ]),
        "81 gen"
    );
    // kubectl's Deployment generator sends protobuf too (its rollouts: tests/kubectl_deployments.rs).
    assert!(k
        .ok(&["create", "deployment", "gen", "--image=echo", "--port=8080"])
        .contains("deployment.apps/gen created"));
    assert_eq!(
        k.ok(&["get", "deploy", "gen", "-o", "jsonpath={.spec.template.spec.containers[0].ports[0].containerPort} {.spec.strategy.type}"]),
        "8080 RollingUpdate"
    );
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
    let k = Kubectl {
        kubeconfig: dir.join("kubeconfig"),
        dir: dir.clone(),
        validate,
    };
    tokio::task::spawn_blocking(move || {
        tables(&k);
        events(&k);
        generators(&k);
    })
    .await
    .unwrap();
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
