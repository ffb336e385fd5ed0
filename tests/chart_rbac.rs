//! The chart's RBAC from what berth really calls. The lab API server records every request
//! (verb, API group, resource, subresource, namespace) per bearer token; each component gets its
//! own token. The real `berth controller` (endpoints off; endpoints on; leader election off; the
//! aws-nlb class against `moto_server`) and the agent (full proxy mode, in-memory iptables: nothing
//! touches this host's rules) go through their scenarios; then the chart is rendered with the real
//! Helm engine (`scripts/chart.py rbac`) and
//! - every request a component made must be allowed by the rules bound to its ServiceAccount, and
//! - every verb on every resource those rules grant must have been used (the few kept on purpose
//!   are listed in `KEPT`, each with its reason).
//!
//! Needs the Python venv (`make deps`); without it the test skips with a message, and fails under
//! `CI=true`. Uses loopback only.

#![allow(clippy::unwrap_used)]

mod rbac;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use berth_lab::{LabApiServer, LabApiServerBuilder, LabApiServerHandle, RecordedRequest};
use berth_testing::{eventually, install_crds, start_lab_with, unique_dir};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::Client;
use rbac::{
    chart_agent_container, chart_rules, check_docs, compare, python, rbac_resource, requests_of,
    summary, table, Run,
};
use serde_json::{json, Value};

/// The release namespace `scripts/chart.py` renders into: the chart's default lease namespace.
const LEASE_NAMESPACE: &str = "berth-system";
const WAIT: Duration = Duration::from_secs(60);
/// The agent's scenarios, by their names in docs/rbac.md: the chart's defaults (membership on,
/// the L2 announcer on), liveness by Lease only, and the datapath alone (the aws value set).
const AGENT_DEFAULTS: &str = "defaults";
const AGENT_LEASE_ONLY: &str = "membership off";
const AGENT_DATAPATH_ONLY: &str = "liveness and announcer off";
const AGENT_BGP: &str = "bgp speaker";

/// The agent's values with the BGP speaker on, one password Secret it may read, and liveness and
/// the L2 announcer off (the bgp value set).
fn agent_bgp() -> Value {
    json!({"agent": {"config": {"membership": "", "l2Announcer": false, "bgpSpeaker": true},
                     "frr": {"passwordSecrets": ["bgp-password"]}}})
}
/// The node the agents run as: the Node `start_with` makes, the topology's first node.
const NODE: &str = "node-1";

/// The agent's values with liveness and the L2 announcer off (the aws value set).
fn agent_datapath_only() -> Value {
    json!({"agent": {"config": {"membership": "", "l2Announcer": false}}})
}

/// The tests of this binary run one at a time: each starts real processes, and one builds
/// network namespaces.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}
const POLL: Duration = Duration::from_millis(100);
// ---------------------------------------------------------------------------------------------
// The lab and the components.

async fn start() -> (LabApiServerHandle, Client) {
    start_with(LabApiServer::builder().record_requests(true)).await
}

/// The lab with the namespaces, berth's CRDs and the Node `node-1` at 198.18.0.11.
async fn start_with(builder: LabApiServerBuilder) -> (LabApiServerHandle, Client) {
    let (server, admin) = start_lab_with(builder).await;
    install_crds(&admin).await;
    for ns in [LEASE_NAMESPACE, "web"] {
        create(
            &admin,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    create(
        &admin,
        berth_testing::mk_node_json(
            "node-1",
            json!({"kubernetes.io/hostname": "node-1"}),
            &[("InternalIP", "198.18.0.11")],
        ),
    )
    .await;
    (server, admin)
}

/// A kubeconfig for the lab whose user authenticates with `token`.
fn kubeconfig(dir: &Path, server: &LabApiServerHandle, token: &str) -> PathBuf {
    kubeconfig_at(dir, &server.url(), token)
}

fn kubeconfig_at(dir: &Path, url: &str, token: &str) -> PathBuf {
    let path = dir.join(format!("{token}.kubeconfig"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {url}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {token}\ncurrent-context: lab\nusers:\n- name: {token}\n  user:\n    token: {token}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn client_for(kubeconfig: &Path) -> Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    Client::try_from(config).unwrap()
}

/// Creates any object the lab serves, from its JSON.
async fn create(client: &Client, obj: Value) {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let kind = obj["kind"].as_str().unwrap();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let plural = format!("{}s", kind.to_lowercase());
    let resource = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural,
    };
    let object: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {kind}: {e}"));
}

/// The controller settings a scenario runs with; each has its own token and chart rendering.
#[derive(Debug, Clone, Copy)]
struct ControllerRun {
    endpoints: bool,
    leader_election: bool,
    /// The `aws-nlb` class as the default, served with `--aws-nlb on` against moto.
    aws: bool,
}

impl ControllerRun {
    fn token(self) -> String {
        format!(
            "controller-endpoints-{}-leader-election-{}{}",
            if self.endpoints { "on" } else { "off" },
            self.leader_election,
            if self.aws { "-aws" } else { "" }
        )
    }

    /// The scenario's name in docs/rbac.md.
    fn label(self) -> &'static str {
        match (self.endpoints, self.leader_election, self.aws) {
            (_, _, true) => "aws-nlb class (moto)",
            (true, _, _) => "endpoints on",
            (false, false, _) => "leader election off",
            (false, true, false) => "defaults",
        }
    }

    fn values(self) -> Value {
        // No lease namespace given: the chart's default, the release namespace.
        let mut values = json!({"controller": {"config": {
            "endpoints": if self.endpoints { "on" } else { "off" },
            "leaderElection": self.leader_election,
        }}});
        if self.aws {
            let config = &mut values["controller"]["config"];
            config["defaultClass"] = json!("aws-nlb");
            config["awsNlb"] = json!("on");
            config["clusterName"] = json!("rbac");
        }
        values
    }
}

/// A real `berth controller`, stopped with SIGTERM (so it hands its Lease back) or killed on drop.
struct ControllerProcess(Child);

impl ControllerProcess {
    fn start(kubeconfig: &Path, run: ControllerRun, aws: &[String], log: &Path) -> Self {
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["controller", "--kubeconfig"])
            .arg(kubeconfig)
            .args([
                "--endpoints",
                if run.endpoints { "on" } else { "off" },
                "--leader-election",
                if run.leader_election { "true" } else { "false" },
                "--lease-namespace",
                LEASE_NAMESPACE,
                "--identity",
                "rbac-test",
                "--retry-period",
                "500ms",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(aws)
            // Only for moto (the endpoint is always given): never real credentials.
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_PROFILE")
            .env_remove("RUST_LOG")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        ControllerProcess(child)
    }

    /// SIGTERM, then waits up to `grace` for the process to end; `false` when it did not (it is
    /// killed on drop).
    async fn stop(mut self, grace: Duration) -> bool {
        let pid = self.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if self.0.try_wait().unwrap().is_some() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mk_pod(name: &str, ip: &str, ready: bool) -> Pod {
    berth_testing::mk_pod(&berth_testing::PodFacts {
        namespace: "web",
        name: name.into(),
        uid: format!("uid-{name}"),
        app: "api",
        node: "node-1".into(),
        ip: ip.into(),
        ready,
        deleted_at: None,
        ports: &[("http", 8080)],
    })
}

/// The controller's scenario: pools, a LoadBalancer and a ClusterIP Service allocated, a
/// conflicting request refused (Warning Event), a type change and a deletion; with endpoints
/// on, pods coming, turning ready and going.
async fn controller_scenario(run: ControllerRun) -> Vec<RecordedRequest> {
    let ControllerRun {
        endpoints,
        leader_election: _,
        aws: _,
    } = run;
    let (server, admin) = start().await;
    let dir = unique_dir("berth-chart-rbac");
    let token = run.token();
    let process = ControllerProcess::start(
        &kubeconfig(&dir, &server, &token),
        run,
        &[],
        &dir.join(format!("{token}.log")),
    );
    create(
        &admin,
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "default"},
               "spec": {"addresses": ["198.18.0.200-198.18.0.250"]}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "web");
    let lb = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb", "namespace": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "api"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}});
    create(&admin, lb).await;
    create(
        &admin,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "web"},
               "spec": {"selector": {"app": "api"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )
    .await;
    let ingress = eventually(
        "the LoadBalancer Service gets an address",
        WAIT,
        POLL,
        || {
            let services = services.clone();
            async move {
                let svc = services.get("lb").await.ok()?;
                let ip = svc.status?.load_balancer?.ingress?.first()?.ip.clone()?;
                Some(ip)
            }
        },
    )
    .await;
    // A second Service asking for the same address and ports is refused: a Warning Event.
    create(
        &admin,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "thief", "namespace": "web",
               "annotations": {"berth.dev/load-balancer-ips": ingress}},
               "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}),
    )
    .await;
    if endpoints {
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "web");
        for (name, ip, ready) in [
            ("api-1", "10.244.1.5", false),
            ("api-2", "10.244.1.6", true),
        ] {
            pods.create(&PostParams::default(), &mk_pod(name, ip, ready))
                .await
                .unwrap();
            set_pod_status(&pods, name, ip, ready).await;
        }
        wait_for_endpoints(&admin, 1).await;
        set_pod_status(&pods, "api-1", "10.244.1.5", true).await;
        wait_for_endpoints(&admin, 2).await;
    }
    // LoadBalancer -> ClusterIP: the address and node ports are dropped; then deletions.
    services
        .patch(
            "thief",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    services
        .delete("api", &DeleteParams::default())
        .await
        .unwrap();
    services
        .delete("lb", &DeleteParams::default())
        .await
        .unwrap();
    if endpoints {
        let endpoints: Api<Endpoints> = Api::namespaced(admin.clone(), "web");
        let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), "web");
        eventually(
            "the deleted Services' Endpoints and slices go",
            WAIT,
            POLL,
            || {
                let (endpoints, slices) = (endpoints.clone(), slices.clone());
                async move {
                    let left = endpoints.list(&Default::default()).await.ok()?.items.len()
                        + slices.list(&Default::default()).await.ok()?.items.len();
                    (left == 0).then_some(())
                }
            },
        )
        .await;
    }
    // Events are sent off the write path; the pool status follows the releases.
    eventually(
        "the controller's Events and pool status",
        WAIT,
        POLL,
        || {
            let (server, token) = (&server, &token);
            async move {
                let requests = requests_of(server, token);
                let has = |verb: &str, resource: &str| {
                    requests
                        .iter()
                        .any(|r| r.verb == verb && rbac_resource(r) == resource)
                };
                (has("create", "events") && has("patch", "ippools/status")).then_some(())
            }
        },
    )
    .await;
    assert!(
        process.stop(Duration::from_secs(10)).await,
        "berth controller did not stop within 10 s of SIGTERM"
    );
    let requests = requests_of(&server, &token);
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await.unwrap();
    requests
}

/// The AWS provider's scenario against moto: a LoadBalancer Service of the default class
/// `aws-nlb` gets its finalizer and an NLB's hostname, then is deleted and let go.
async fn aws_scenario(python: &Path, run: ControllerRun) -> Vec<RecordedRequest> {
    let moto = berth_testing::moto::start_with(python, 0).unwrap_or_else(|e| panic!("{e}"));
    let (server, admin) = start().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0"}})),
        )
        .await
        .unwrap();
    let dir = unique_dir("berth-chart-rbac");
    let token = run.token();
    let aws = [
        "--default-class".to_owned(),
        "aws-nlb".to_owned(),
        "--aws-nlb".to_owned(),
        "on".to_owned(),
        "--cluster-name".to_owned(),
        "rbac".to_owned(),
        "--aws-subnets".to_owned(),
        moto.subnets.join(","),
        "--aws-endpoint-url".to_owned(),
        moto.url.clone(),
    ];
    let process = ControllerProcess::start(
        &kubeconfig(&dir, &server, &token),
        run,
        &aws,
        &dir.join(format!("{token}.log")),
    );
    create(
        &admin,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "nlb", "namespace": "web"},
               "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
    )
    .await;
    // The allocation loop keeps pools' status whatever the default class.
    create(
        &admin,
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "default"},
               "spec": {"addresses": ["198.18.0.200-198.18.0.250"]}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "web");
    eventually("the NLB's hostname on the Service", WAIT, POLL, || {
        let services = services.clone();
        async move {
            let svc = services.get("nlb").await.ok()?;
            svc.status?
                .load_balancer?
                .ingress?
                .first()?
                .hostname
                .clone()
        }
    })
    .await;
    services
        .delete("nlb", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the Service let go once its NLB is gone",
        WAIT,
        POLL,
        || {
            let services = services.clone();
            async move { services.get_opt("nlb").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    eventually("the pool's status", WAIT, POLL, || {
        let (server, token) = (&server, &token);
        async move {
            requests_of(server, token)
                .iter()
                .any(|r| r.verb == "patch" && rbac_resource(r) == "ippools/status")
                .then_some(())
        }
    })
    .await;
    // With `--aws-nlb on` the controller has been seen not to stop on SIGTERM after its Service
    // was deleted; that is a shutdown bug of its own, not an RBAC question, so it is reported
    // here and the process killed.
    if !process.stop(Duration::from_secs(10)).await {
        eprintln!("warning: berth controller --aws-nlb on did not stop within 10 s of SIGTERM");
    }
    let requests = requests_of(&server, &token);
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await.unwrap();
    requests
}

/// Reports a pod's IP and readiness, as a kubelet does (the API server drops status on create).
async fn set_pod_status(pods: &Api<Pod>, name: &str, ip: &str, ready: bool) {
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// Waits until the Service `api` has `ready` ready endpoints in its Endpoints and slices.
async fn wait_for_endpoints(admin: &Client, ready: usize) {
    let endpoints: Api<Endpoints> = Api::namespaced(admin.clone(), "web");
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), "web");
    eventually(&format!("{ready} ready endpoints"), WAIT, POLL, || {
        let (endpoints, slices) = (endpoints.clone(), slices.clone());
        async move {
            let e = endpoints.get("api").await.ok()?;
            let in_endpoints: usize = e
                .subsets
                .unwrap_or_default()
                .iter()
                .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
                .sum();
            let in_slices: usize = slices
                .list(&kube::api::ListParams::default().labels("kubernetes.io/service-name=api"))
                .await
                .ok()?
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .count();
            (in_endpoints == ready && in_slices == ready).then_some(())
        }
    })
    .await;
}

/// Waits until the agent has synced `at_least` times with rules in place; the sync count.
async fn synced(
    status: &mut tokio::sync::watch::Receiver<berth_agent::AgentStatus>,
    at_least: u64,
) -> u64 {
    tokio::time::timeout(
        WAIT,
        status.wait_for(|s| s.syncs >= at_least && s.rules > 0),
    )
    .await
    .expect("the agent syncs")
    .map(|s| s.syncs)
    .unwrap()
}

#[derive(Clone, Default)]
struct NoConntrack;

impl berth_agent::Conntrack for NoConntrack {
    fn delete(&mut self, _flow: &berth_agent::ConntrackFlow) -> Result<(), berth_agent::Error> {
        Ok(())
    }
}

/// The agent's scenario: its node, a Service with endpoints here and a change to them, synced
/// into in-memory iptables (full proxy mode: every watch and the whole datapath path).
async fn agent_scenario() -> Vec<RecordedRequest> {
    use berth_datapath::fake::MemoryIptables;
    let (server, admin) = start().await;
    let dir = unique_dir("berth-chart-rbac");
    let client = client_for(&kubeconfig(&dir, &server, "agent")).await;
    let options = berth_agent::AgentOptions {
        node_name: "node-1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        min_sync_interval: Duration::from_millis(50),
        healthz_bind_address: "127.0.0.1".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    };
    let mut registry = berth_telemetry::MetricsRegistry::new();
    let readiness = berth_telemetry::Readiness::new();
    let agent = berth_agent::Agent::new(
        options.validate().unwrap(),
        client,
        |_| berth_agent::SharedIptables::new(MemoryIptables::default()),
        NoConntrack,
        &mut registry,
        &readiness,
    )
    .unwrap();
    let mut status = agent.status();
    let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = berth_controller::CancellationToken::new();
    let task = tokio::spawn(agent.run(
        admin_listener,
        registry.into_shared(),
        stop.clone().cancelled_owned(),
    ));
    create(
        &admin,
        berth_testing::mk_service_json(
            "web",
            "api",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
        ),
    )
    .await;
    let endpoint = |ready: bool| {
        json!([{"addresses": ["10.244.1.5"], "nodeName": "node-1",
                "conditions": {"ready": ready, "serving": ready, "terminating": false}}])
    };
    create(
        &admin,
        berth_testing::mk_slice_json(
            "web",
            "api",
            "api-1",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            endpoint(true),
        ),
    )
    .await;
    let first = synced(&mut status, 1).await;
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), "web");
    slices
        .patch(
            "api-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": endpoint(false)})),
        )
        .await
        .unwrap();
    synced(&mut status, first + 1).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "a"}}})),
        )
        .await
        .unwrap();
    stop.cancel();
    task.await.unwrap().unwrap();
    let requests = requests_of(&server, "agent");
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await.unwrap();
    requests
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_is_exactly_what_berth_calls() {
    let _serial = serial().await;
    let Some(python) = python() else { return };
    let mut problems = Vec::new();
    let mut called = Vec::new();
    let mut controller_runs = Vec::new();
    for run in [
        ControllerRun {
            endpoints: false,
            leader_election: true,
            aws: false,
        },
        ControllerRun {
            endpoints: true,
            leader_election: true,
            aws: false,
        },
        ControllerRun {
            endpoints: false,
            leader_election: false,
            aws: false,
        },
        ControllerRun {
            endpoints: false,
            leader_election: true,
            aws: true,
        },
    ] {
        let rules = chart_rules(&python, run.values());
        let requests = if run.aws {
            aws_scenario(&python, run).await
        } else {
            controller_scenario(run).await
        };
        problems.extend(compare(&run.token(), &rules.controller, &requests));
        controller_runs.push((run.label(), rules.controller, requests.clone()));
        called.push((run.token(), requests));
    }
    let runs: Vec<Run> = controller_runs
        .iter()
        .map(|(label, rules, requests)| Run {
            label,
            rules,
            requests,
        })
        .collect();
    problems.extend(check_docs("controller", &table("controller", &runs)));
    // The agent's rights do not depend on the controller's settings, nor its calls on the proxy
    // mode (every mode runs the same watches). This scenario runs the datapath only, with
    // liveness and the L2 announcer off (the aws value set); the chart's defaults, with both on,
    // are `chart_agent_defaults_are_exactly_what_the_agent_calls` below.
    let agent = agent_scenario().await;
    problems.extend(compare(
        "agent",
        &chart_rules(&python, agent_datapath_only()).agent,
        &agent,
    ));
    called.push(("agent".to_owned(), agent));

    for (name, requests) in &called {
        eprintln!("{name} called:");
        for line in summary(requests) {
            eprintln!("  {line}");
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The agent as the chart's defaults run it: liveness and the L2 announcer on.

/// A real `berth agent` in a node's network namespace, stopped with SIGTERM or killed on drop.
struct AgentProcess(Child);

impl AgentProcess {
    /// Runs the agent with the arguments and environment of the chart's DaemonSet rendered with
    /// `values`: the Downward API's node name is `NODE`, the mounted membership Secret a key file
    /// in `dir`, and the in-cluster configuration a kubeconfig for the lab on the LAN.
    fn start(netns: &str, python: &Path, values: Value, dir: &Path, kubeconfig: &Path) -> Self {
        let (args, env) = chart_agent_container(python, values);
        let key = dir.join("membership-key");
        std::fs::write(&key, "k".repeat(64)).unwrap();
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", netns, env!("CARGO_BIN_EXE_berth")])
            .args(&args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for var in &env {
            let name = var["name"].as_str().unwrap();
            let value = match (&var["value"], &var["valueFrom"]["fieldRef"]["fieldPath"]) {
                (Value::String(v), _) if name == "BERTH_MEMBERSHIP_KEY_FILE" => {
                    assert!(v.starts_with("/etc/berth/membership/"), "{name}={v}");
                    key.display().to_string()
                }
                // The sidecar's shared directory: a scratch one here, never the host's.
                (Value::String(_), _) if name == "BERTH_FRR_DIR" => {
                    let frr = dir.join("frr");
                    std::fs::create_dir_all(&frr).unwrap();
                    frr.display().to_string()
                }
                (Value::String(v), _) => v.clone(),
                (_, Value::String(field)) if field == "spec.nodeName" => NODE.to_owned(),
                _ => panic!("the agent's variable {var} is neither a value nor the node name"),
            };
            command.env(name, value);
        }
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let child = command
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        AgentProcess(child)
    }

    /// SIGTERM, then waits up to `grace`; the exit status, or `None` if it is still running.
    async fn stop(mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.0.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The chart's agent rendered with `values` (liveness and the L2 announcer on), in a node
/// namespace of a lab topology (`berth-rbac<pid>-*`, deleted when it is dropped, also on failure),
/// with the lab API server in a client namespace on the LAN. It keeps its Lease (with SWIM, reading
/// its Node for the address to advertise), elects itself for a LoadBalancer Service's address,
/// writes its ServiceL2Status record and the Event, renews its Lease, and deletes the Lease and
/// the record on SIGTERM.
async fn agent_netns_scenario(python: &Path, values: Value, token: &str) -> Vec<RecordedRequest> {
    use berth_lab::netns::bind_tcp_in_netns;
    use berth_lab::topology::{Topology, TopologySpec};
    use k8s_openapi::api::coordination::v1::Lease;

    let spec = TopologySpec::new(TopologySpec::unique_prefix("rbac"))
        .node("n1", Vec::<String>::new())
        .client("cp");
    let topo = Topology::create(&spec).unwrap();
    let node = topo.layout().node("n1").unwrap();
    assert_eq!(
        node.lan_ip.to_string(),
        "198.18.0.11",
        "the Node's InternalIP"
    );
    let api = std::net::SocketAddr::new(topo.layout().client("cp").unwrap().ip.into(), 6443);
    let inside = bind_tcp_in_netns(topo.netns("cp").unwrap(), api).unwrap();
    let (server, admin) = start_with(
        LabApiServer::builder()
            .record_requests(true)
            .listen("127.0.0.1:0".parse().unwrap())
            .listener(berth_lab::Listener::Bound(inside)),
    )
    .await;
    create(
        &admin,
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "default"},
               "spec": {"addresses": ["198.18.0.200-198.18.0.250"]}}),
    )
    .await;
    create(
        &admin,
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "L2Advertisement",
               "metadata": {"name": "lan"}, "spec": {"ipPools": ["default"]}}),
    )
    .await;
    create(
        &admin,
        berth_testing::mk_service_json(
            "web",
            "lb",
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                   "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]}),
        ),
    )
    .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "web");
    services
        .patch_status(
            "lb",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}}),
            ),
        )
        .await
        .unwrap();
    create(
        &admin,
        berth_testing::mk_slice_json(
            "web",
            "lb",
            "lb-1",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            json!([{"addresses": ["10.244.1.2"], "nodeName": NODE,
                    "conditions": {"ready": true, "serving": true, "terminating": false}}]),
        ),
    )
    .await;

    let dir = unique_dir("berth-chart-rbac");
    let agent = AgentProcess::start(
        topo.netns("n1").unwrap(),
        python,
        values,
        &dir,
        &kubeconfig_at(&dir, &format!("http://{api}"), token),
    );
    let log = dir.join("agent.log");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let lease = berth_api::names::lease::agent_lease_name(NODE);
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let records: Api<berth_api::ServiceL2Status> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let announced = tokio::time::timeout(WAIT, async {
        loop {
            let recorded_here = records
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .any(|r| {
                    r.spec.node == NODE
                        && r.spec.service_name == "lb"
                        && r.spec.addresses == ["198.18.0.200"]
                });
            let events =
                Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), "web")
                    .list(&Default::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
            let recorded = events.iter().any(|e| {
                e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("announcing from node {NODE}")))
            });
            // The Lease is renewed (a second apply) before the agent stops.
            let renewed = requests_of(&server, token).iter().any(|r| {
                r.verb == "patch" && r.resource == "leases" && r.name == lease && r.count >= 2
            });
            if recorded_here && recorded && renewed {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(
        announced.is_ok(),
        "no ServiceL2Status record, Event and Lease renewal; the agent's log:\n{}",
        agent_log()
    );
    assert!(
        leases.get_opt(&lease).await.unwrap().is_some(),
        "no Lease {lease}"
    );
    let status = agent.stop(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "berth agent did not stop cleanly within 15 s of SIGTERM ({status:?}); its log:\n{}",
        agent_log()
    );
    assert!(
        leases.get_opt(&lease).await.unwrap().is_none(),
        "the Lease {lease} outlived its agent's graceful stop"
    );
    assert!(
        records
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "the agent's ServiceL2Status records outlived its graceful stop"
    );
    let requests = requests_of(&server, token);
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await.unwrap();
    topo.destroy().unwrap();
    requests
}

/// The chart's agent with the BGP speaker on, in a node namespace (its `berth-bgp` device needs
/// one), with no FRR beside it: it reads the BGP objects, the pools and the peer's password
/// Secret, writes its `BGPSessionState` records (FRR unavailable; a peer with a missing
/// BFDProfile left out, with a Warning Event), and deletes them on SIGTERM.
async fn agent_bgp_scenario(python: &Path, token: &str) -> Vec<RecordedRequest> {
    use berth_lab::netns::bind_tcp_in_netns;
    use berth_lab::topology::{Topology, TopologySpec};

    let spec = TopologySpec::new(TopologySpec::unique_prefix("rbacbgp"))
        .node("n1", Vec::<String>::new())
        .client("cp");
    let topo = Topology::create(&spec).unwrap();
    let api = std::net::SocketAddr::new(topo.layout().client("cp").unwrap().ip.into(), 6443);
    let inside = bind_tcp_in_netns(topo.netns("cp").unwrap(), api).unwrap();
    let (server, admin) = start_with(
        LabApiServer::builder()
            .record_requests(true)
            .listen("127.0.0.1:0".parse().unwrap())
            .listener(berth_lab::Listener::Bound(inside)),
    )
    .await;
    for object in [
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "bgp"},
               "spec": {"addresses": ["198.19.10.0/24"]}}),
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "BFDProfile", "metadata": {"name": "fast"},
               "spec": {}}),
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "BGPAdvertisement", "metadata": {"name": "bgp"},
               "spec": {"ipPools": ["bgp"]}}),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "bgp-password", "namespace": LEASE_NAMESPACE},
               "type": "kubernetes.io/basic-auth", "data": {"password": "czNjcmV0"}}),
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "BGPPeer", "metadata": {"name": "tor"},
               "spec": {"myASN": 64512, "peerASN": 64513, "peerAddress": "198.18.0.1",
                        "bfdProfile": "fast", "passwordSecret": {"name": "bgp-password"}}}),
        // Left out for its missing BFDProfile: a Warning Event on it.
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "BGPPeer", "metadata": {"name": "tor-b"},
               "spec": {"myASN": 64512, "peerASN": 64513, "peerAddress": "198.18.0.2",
                        "bfdProfile": "missing"}}),
    ] {
        create(&admin, object).await;
    }
    let dir = unique_dir("berth-chart-rbac");
    let agent = AgentProcess::start(
        topo.netns("n1").unwrap(),
        python,
        agent_bgp(),
        &dir,
        &kubeconfig_at(&dir, &format!("http://{api}"), token),
    );
    let log = dir.join("agent.log");
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let records: Api<berth_api::BGPSessionState> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let recorded = tokio::time::timeout(WAIT, async {
        loop {
            let here = records
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .any(|r| r.spec.node == NODE && r.spec.peer == "tor");
            let requests = requests_of(&server, token);
            let read_secret = requests
                .iter()
                .any(|r| r.verb == "get" && r.resource == "secrets");
            let warned = requests
                .iter()
                .any(|r| r.verb == "create" && r.resource == "events");
            if here && read_secret && warned {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(
        recorded.is_ok(),
        "no BGPSessionState record and Secret read; the agent's log:\n{}",
        agent_log()
    );
    let status = agent.stop(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "berth agent did not stop cleanly within 15 s of SIGTERM ({status:?}); its log:\n{}",
        agent_log()
    );
    assert!(
        records
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "the agent's BGPSessionState record outlived its graceful stop"
    );
    let requests = requests_of(&server, token);
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await.unwrap();
    topo.destroy().unwrap();
    requests
}

/// The agent with the chart's default values (membership on with its key, the L2 announcer on),
/// and with liveness by Lease only: every request allowed by the agent's rendered rules, every
/// rule used. The datapath-only scenario runs again here (it is quick), so that the agent's table
/// in docs/rbac.md covers every value set.
/// Needs root, network namespaces and iptables: skips without, fails under `CI=true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_agent_defaults_are_exactly_what_the_agent_calls() {
    let _serial = serial().await;
    let Some(python) = python() else { return };
    if !berth_testing::require(berth_testing::DATAPATH_NEEDS) {
        return;
    }
    let defaults_rules = chart_rules(&python, json!({})).agent;
    let defaults = agent_netns_scenario(&python, json!({}), "agent-defaults").await;
    let lease_only_values = json!({"agent": {"config": {"membership": "off"}}});
    let lease_only_rules = chart_rules(&python, lease_only_values.clone()).agent;
    let lease_only = agent_netns_scenario(&python, lease_only_values, "agent-lease-only").await;
    let datapath_rules = chart_rules(&python, agent_datapath_only()).agent;
    let datapath = agent_scenario().await;
    let bgp_rules = chart_rules(&python, agent_bgp()).agent;
    let bgp = agent_bgp_scenario(&python, "agent-bgp").await;
    let mut problems = compare("agent", &defaults_rules, &defaults);
    problems.extend(compare("agent", &lease_only_rules, &lease_only));
    problems.extend(compare("agent", &datapath_rules, &datapath));
    problems.extend(compare("agent", &bgp_rules, &bgp));
    let runs = [
        Run {
            label: AGENT_DEFAULTS,
            rules: &defaults_rules,
            requests: &defaults,
        },
        Run {
            label: AGENT_LEASE_ONLY,
            rules: &lease_only_rules,
            requests: &lease_only,
        },
        Run {
            label: AGENT_DATAPATH_ONLY,
            rules: &datapath_rules,
            requests: &datapath,
        },
        Run {
            label: AGENT_BGP,
            rules: &bgp_rules,
            requests: &bgp,
        },
    ];
    problems.extend(check_docs("agent", &table("agent", &runs)));
    eprintln!("agent with the chart's defaults called:");
    for line in summary(&defaults) {
        eprintln!("  {line}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
