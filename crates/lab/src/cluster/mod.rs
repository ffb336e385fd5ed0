//! `berth lab up | down | status`: the whole system on one host.
//!
//! [`plan`] says what a lab is made of (pure): its topology (a control-plane namespace, N nodes,
//! a client, on the LAN) and its processes, each a real `berth` process of the same binary: the
//! API server (loopback and the LAN), the lab kubelet, the controller in the control-plane
//! namespace, an agent in every node namespace. [`Lab::start`] builds it and records every
//! namespace prefix and process in `lab.json` ([`state`]) as it goes, so [`down`] removes
//! everything even after `lab up` was killed with SIGKILL; dropping a [`Lab`] removes it too.
//! A second `up` with the same state directory refuses while the first still runs, and cleans
//! up after one that is gone (saying so).

pub mod apply;
pub mod bgp;
mod component;
mod families;
pub mod plan;
pub mod proof;
pub mod state;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::netns::http_get;
use crate::topology::{layout, remove_leftovers, Layout, Topology, TopologyError};
use plan::{Files, AGENT_ADMIN_PORT, CONTROLLER_ADMIN_PORT};
use state::{LabState, Process};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{0}")]
    Invalid(String),
    #[error("a lab is already up (pid {pid}, state in {dir}): run `berth lab down` first")]
    AlreadyUp { pid: u32, dir: String },
    #[error("lab state {path}: {reason}")]
    State { path: String, reason: String },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("starting {name}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{origin}: {reason}")]
    Manifest { origin: String, reason: String },
    #[error("timed out after {secs} s waiting for {what} (logs in {logs})")]
    Timeout {
        what: String,
        secs: u64,
        logs: String,
    },
    #[error("{0} exited while the lab was starting (see its log)")]
    Exited(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Shows the steps of `up` as they happen.
pub trait Progress {
    /// A step starts.
    fn start(&self, step: &str);
    /// The step that started last is done; `detail` says what came of it.
    fn done(&self, detail: &str);
}

/// No progress display.
pub struct Quiet;

impl Progress for Quiet {
    fn start(&self, _: &str) {}
    fn done(&self, _: &str) {}
}

/// What `up` needs.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub name: String,
    pub nodes: usize,
    /// The cluster's address families (`--ip-family`).
    pub families: plan::LabFamilies,
    pub state_dir: PathBuf,
    /// The `berth` binary the components run.
    pub exe: PathBuf,
    /// How long each wait may take.
    pub timeout: Duration,
    /// A BGP router with a client behind it, FRR on every node, the agents BGP speakers
    /// ([`bgp`]).
    pub bgp: bool,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// A running lab. Dropping it stops every process and deletes every namespace.
pub struct Lab {
    files: Files,
    state: LabState,
    layout: Layout,
    topology: Option<Topology>,
    children: Vec<(String, Child)>,
    client: Option<Client>,
    timeout: Duration,
    families: plan::LabFamilies,
    /// With `--bgp`: the node names of the next hops the router may learn.
    bgp: Option<BTreeMap<IpAddr, String>>,
}

impl Lab {
    pub fn kubeconfig(&self) -> &Path {
        &self.files.kubeconfig
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn state_dir(&self) -> &Path {
        &self.files.dir
    }

    /// The cluster's address families.
    pub fn families(&self) -> plan::LabFamilies {
        self.families
    }

    /// A client for the lab's API server (loopback).
    pub fn client(&self) -> Result<Client, ClusterError> {
        self.client
            .clone()
            .ok_or_else(|| ClusterError::Invalid("the API server is not up yet".into()))
    }

    /// Builds the lab, starts every component and waits until they are ready.
    pub async fn start(opts: &UpOptions, progress: &dyn Progress) -> Result<Lab, ClusterError> {
        let prefix = plan::lab_prefix(&opts.name)?;
        let mut spec = plan::lab_topology_for(&prefix, opts.nodes, opts.families)?;
        if opts.bgp {
            spec = spec.client(bgp::ROUTER);
        }
        let layout = layout(&spec)?;
        let files = Files::new(&opts.state_dir);

        progress.start("checking for a lab already there");
        let stale = clean_stale(&files, &prefix)?;
        progress.done(&stale);

        std::fs::create_dir_all(&files.logs)
            .map_err(io_err(format!("creating {}", files.logs.display())))?;
        let state = LabState {
            name: opts.name.clone(),
            prefix: prefix.clone(),
            nodes: opts.nodes,
            up: Process::current("up")?,
            components: Vec::new(),
        };
        state.write(&files.state)?;
        let mut lab = Lab {
            files,
            state,
            layout,
            topology: None,
            children: Vec::new(),
            client: None,
            timeout: opts.timeout,
            families: opts.families,
            bgp: None,
        };

        progress.start("building the network (LAN, control plane, nodes, client)");
        lab.topology = Some(Topology::create(&spec)?);
        progress.done(&format!(
            "{} namespaces named {prefix}-*",
            lab.layout.namespaces().len()
        ));

        if opts.bgp {
            progress.start("building the BGP router and the client behind it");
            lab.build_bgp_network()?;
            progress.done(&bgp::describe(&lab.layout, opts.families)?);
        }

        write_membership_key(&lab.files.membership_key)?;
        let components = plan::plan_components(
            &opts.name,
            opts.nodes,
            opts.families,
            &lab.layout,
            &lab.files,
            opts.bgp,
        )?;
        let lan_api = plan::lan_api(&lab.layout, opts.families)?;
        std::fs::write(
            &lab.files.lan_kubeconfig,
            crate::apiserver::kubeconfig_yaml(&format!("http://{lan_api}")),
        )
        .map_err(io_err("writing the LAN kubeconfig"))?;
        for component in components {
            progress.start(&format!("starting {}", component.name));
            lab.spawn(&component, &opts.exe)?;
            if component.name == "apiserver" {
                lab.wait_for_apiserver().await?;
                lab.install_basics().await?;
                progress.done(&format!("kubeconfig {}", lab.files.kubeconfig.display()));
            } else {
                progress.done(&format!("log {}", component.log.display()));
            }
        }

        progress.start("waiting for the nodes to be Ready and every agent healthy");
        lab.wait_for_nodes().await?;
        lab.wait_for_admin().await?;
        progress.done(&format!("{} nodes", opts.nodes));
        if opts.bgp {
            progress.start("configuring the router's FRR");
            lab.configure_router().await?;
            progress.done("frr.conf applied with frr-reload.py");
        }
        Ok(lab)
    }

    /// The outside namespace behind the router, the routes to it, and a directory per FRR
    /// owned by the `frr` user; remembers the nodes' link-local addresses, which IPv6 routes
    /// learnt over BGP name as next hops.
    fn build_bgp_network(&mut self) -> Result<(), ClusterError> {
        use crate::topology::Runner;
        let mut runner = crate::topology::IpCommand;
        let frr = nix::unistd::User::from_name("frr")
            .ok()
            .flatten()
            .ok_or_else(|| {
                ClusterError::Invalid(
                    "--bgp needs FRR (Debian package frr, which makes the user frr)".into(),
                )
            })?;
        for step in bgp::plan_network(&self.layout)? {
            runner.run(&step)?;
        }
        let router = bgp::router(&self.layout)?.name.clone();
        let owners =
            std::iter::once(router).chain(self.layout.nodes.iter().map(|n| n.name.clone()));
        for owner in owners {
            let dir = bgp::frr_dir(&self.files.dir, &owner);
            std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
            nix::unistd::chown(&dir, Some(frr.uid), Some(frr.gid)).map_err(|e| {
                ClusterError::Io {
                    what: format!("handing {} to the frr user", dir.display()),
                    source: std::io::Error::from(e),
                }
            })?;
        }
        let mut link_locals = BTreeMap::new();
        for node in &self.layout.nodes {
            let json = runner.run(&[
                "ip".into(),
                "-6".into(),
                "-j".into(),
                "-n".into(),
                node.netns.clone(),
                "addr".into(),
                "show".into(),
                "dev".into(),
                crate::topology::ETH0.into(),
            ])?;
            link_locals.insert(node.name.clone(), bgp::parse_link_locals(&json));
        }
        self.bgp = Some(bgp::hop_names(&self.layout, &link_locals));
        Ok(())
    }

    /// Writes the router's `frr.conf` and applies it once its daemons answer.
    async fn configure_router(&mut self) -> Result<(), ClusterError> {
        let router = bgp::router(&self.layout)?.clone();
        let dir = bgp::frr_dir(&self.files.dir, &router.name);
        let deadline = Instant::now() + self.timeout;
        while !bgp::DAEMONS
            .iter()
            .all(|d| dir.join(format!("{d}.vty")).exists())
        {
            self.check_children()?;
            if Instant::now() >= deadline {
                return Err(self.timed_out("the router's FRR"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let conf = dir.join("frr.conf");
        std::fs::write(&conf, bgp::render_router_config(&self.layout)?)
            .map_err(io_err(format!("writing {}", conf.display())))?;
        let argv = bgp::reload_argv(&router.netns, &dir);
        tokio::task::spawn_blocking(move || {
            use crate::topology::Runner;
            crate::topology::IpCommand.run(&argv)
        })
        .await
        .map_err(|e| ClusterError::Io {
            what: "applying the router's configuration".into(),
            source: std::io::Error::other(e),
        })??;
        Ok(())
    }

    /// With `--bgp`: every route in the router's kernel FIB (both families) with its next hops'
    /// node names (an address a name does not cover stays as it is).
    async fn router_fib(&self) -> Option<BTreeMap<IpAddr, Vec<String>>> {
        let names = self.bgp.clone()?;
        let netns = bgp::router(&self.layout).ok()?.netns.clone();
        let fib = tokio::task::spawn_blocking(move || {
            let mut fib = BTreeMap::new();
            for family in ["-4", "-6"] {
                let out = Command::new("ip")
                    .args([family, "-j", "-n", &netns, "route", "show"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                fib.extend(bgp::parse_fib(&out));
            }
            fib
        })
        .await
        .ok()?;
        Some(
            fib.into_iter()
                .map(|(dst, hops)| {
                    let nodes = hops
                        .iter()
                        .map(|h| names.get(h).cloned().unwrap_or_else(|| h.to_string()))
                        .collect();
                    (dst, nodes)
                })
                .collect(),
        )
    }

    fn spawn(&mut self, component: &plan::Component, exe: &Path) -> Result<(), ClusterError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&component.log)
            .map_err(io_err(format!("opening {}", component.log.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io_err(format!("opening {}", component.log.display())))?;
        let argv = component.argv(exe);
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| ClusterError::Invalid("an empty command line".into()))?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group: Ctrl-C reaches `lab up`, which stops the components in
            // order, not every process at once.
            .process_group(0)
            .spawn()
            .map_err(|source| ClusterError::Spawn {
                name: component.name.clone(),
                source,
            })?;
        let pid = child.id();
        self.children.push((component.name.clone(), child));
        // `ip netns exec` execs the component, so the pid stays; its start time is read once the
        // program is running.
        let start_time = state::start_time_of(pid).unwrap_or_default();
        self.state.components.push(Process {
            name: component.name.clone(),
            pid,
            start_time,
        });
        self.state.write(&self.files.state)
    }

    fn check_children(&mut self) -> Result<(), ClusterError> {
        for (name, child) in &mut self.children {
            if let Ok(Some(_)) = child.try_wait() {
                return Err(ClusterError::Exited(name.clone()));
            }
        }
        Ok(())
    }

    fn timed_out(&self, what: &str) -> ClusterError {
        ClusterError::Timeout {
            what: what.into(),
            secs: self.timeout.as_secs(),
            logs: self.files.logs.display().to_string(),
        }
    }

    async fn wait_for_apiserver(&mut self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            self.check_children()?;
            if let Ok(kubeconfig) = kube::config::Kubeconfig::read_from(&self.files.kubeconfig) {
                let options = kube::config::KubeConfigOptions::default();
                if let Ok(config) = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
                {
                    if let Ok(client) = Client::try_from(config) {
                        if client.apiserver_version().await.is_ok() {
                            self.client = Some(client);
                            return Ok(());
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(self.timed_out("the API server"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// berth's CRDs and the namespaces a cluster starts with.
    async fn install_basics(&self) -> Result<(), ClusterError> {
        let client = self.client()?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in berth_api::crds() {
            create_or_keep(&crds, &crd, "a CRD").await?;
        }
        let namespaces: Api<Namespace> = Api::all(client);
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let ns = Namespace {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            create_or_keep(&namespaces, &ns, "a namespace").await?;
        }
        Ok(())
    }

    async fn wait_for_nodes(&mut self) -> Result<(), ClusterError> {
        let client = self.client()?;
        let nodes: Api<Node> = Api::all(client);
        let deadline = Instant::now() + self.timeout;
        loop {
            self.check_children()?;
            let ready = nodes
                .list(&ListParams::default())
                .await
                .map(|list| {
                    list.items
                        .iter()
                        .filter(|n| {
                            n.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|cs| {
                                    cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                                })
                        })
                        .count()
                })
                .unwrap_or(0);
            if ready >= self.layout.nodes.len() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.timed_out("the nodes to be Ready"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The agents' and the controller's `/healthz`, asked from their own namespaces.
    async fn wait_for_admin(&mut self) -> Result<(), ClusterError> {
        let mut checks: Vec<(String, SocketAddr)> = Vec::new();
        for n in &self.layout.nodes {
            let ip = plan::node_primary_ip(n, self.families)?;
            checks.push((n.netns.clone(), SocketAddr::new(ip, AGENT_ADMIN_PORT)));
        }
        if let Some(cp) = &self.layout.control_plane {
            let api = plan::lan_api(&self.layout, self.families)?;
            checks.push((
                cp.netns.clone(),
                SocketAddr::new(api.ip(), CONTROLLER_ADMIN_PORT),
            ));
        }
        let deadline = Instant::now() + self.timeout;
        for (netns, addr) in checks {
            loop {
                self.check_children()?;
                let (ns, a) = (netns.clone(), addr);
                let healthy = tokio::task::spawn_blocking(move || {
                    http_get(&ns, a, "/healthz", Duration::from_secs(1))
                        .is_ok_and(|(code, _)| code == 200)
                })
                .await
                .unwrap_or(false);
                if healthy {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(self.timed_out(&format!("/healthz on {addr} in {netns}")));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// Applies the manifests in `dir`.
    pub async fn apply(&self, dir: &Path) -> Result<Vec<String>, ClusterError> {
        apply::apply_dir(&self.client()?, dir).await
    }

    /// Waits until every Service with a selector has a ready endpoint and every LoadBalancer
    /// Service of berth's classes has an address; then sends a request through every way in to
    /// each. Returns the summary table and whether every request was answered.
    pub async fn prove(&self, progress: &dyn Progress) -> Result<(String, bool), ClusterError> {
        let client = self.client()?;
        let services: Api<Service> = Api::all(client.clone());
        let slices: Api<EndpointSlice> = Api::all(client.clone());
        let records: Api<berth_api::ServiceL2Status> = Api::all(client.clone());
        let pods: Api<Pod> = Api::all(client);
        progress.start("waiting for addresses, announcers and ready pods");
        let deadline = Instant::now() + self.timeout;
        let listed = loop {
            let list = services
                .list(&ListParams::default())
                .await
                .map_err(|source| ClusterError::Api {
                    what: "listing Services".into(),
                    source,
                })?;
            let all_slices = slices
                .list(&ListParams::default())
                .await
                .map_err(|source| ClusterError::Api {
                    what: "listing EndpointSlices".into(),
                    source,
                })?;
            let announced = records
                .list(&ListParams::default())
                .await
                .map_err(|source| ClusterError::Api {
                    what: "listing ServiceL2Status records".into(),
                    source,
                })?;
            let fib = self.router_fib().await;
            let outside = bgp::outside(&self.layout);
            let rows: Vec<(proof::ServiceFacts, Vec<String>)> = list
                .items
                .iter()
                .filter(|s| s.metadata.name.as_deref() != Some("kubernetes"))
                .filter_map(|s| {
                    let mut facts = proof::service_facts(s, &self.layout, &announced.items)?;
                    if let Some(fib) = &fib {
                        proof::route_facts(&mut facts, &self.layout, &outside, fib);
                    }
                    let own: Vec<EndpointSlice> = all_slices
                        .items
                        .iter()
                        .filter(|sl| {
                            sl.metadata.namespace == s.metadata.namespace
                                && sl
                                    .metadata
                                    .labels
                                    .as_ref()
                                    .and_then(|l| l.get("kubernetes.io/service-name"))
                                    == s.metadata.name.as_ref()
                        })
                        .cloned()
                        .collect();
                    Some((facts, proof::ready_endpoints(&own)))
                })
                .collect();
            let all_pods =
                pods.list(&ListParams::default())
                    .await
                    .map_err(|source| ClusterError::Api {
                        what: "listing Pods".into(),
                        source,
                    })?;
            if proof::settled(&rows, &all_pods.items) || Instant::now() >= deadline {
                break rows;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        progress.done(&format!("{} Services", listed.len()));
        let mut table_rows = Vec::new();
        let mut all_ok = true;
        let mut proofs = String::new();
        for (facts, endpoints) in listed {
            let mut answers = Vec::new();
            for target in &facts.targets {
                progress.start(&format!(
                    "{} {} from {} ({})",
                    target.path, target.addr, target.from, facts.key
                ));
                let (t, limit) = (target.clone(), self.timeout);
                let answer = tokio::task::spawn_blocking(move || proof::prove(&t, limit))
                    .await
                    .map_err(|e| ClusterError::Io {
                        what: "sending a request".into(),
                        source: std::io::Error::other(e),
                    })?;
                progress.done(&answer.line());
                all_ok &= answer.result.is_ok();
                proofs.push_str(&format!("  {}\n", answer.line()));
                answers.push(answer);
            }
            if facts.targets.is_empty() {
                all_ok = false;
            }
            table_rows.push(vec![
                facts.key.clone(),
                facts.kind.clone(),
                if facts.lb_ips.is_empty() {
                    "-".into()
                } else {
                    facts
                        .lb_ips
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                },
                facts.announced_by().unwrap_or("-".into()),
                if endpoints.is_empty() {
                    "none ready".into()
                } else {
                    endpoints.join(",")
                },
                proof::proof_cell(&answers),
            ]);
        }
        let mut out = proof::render_table(
            &[
                "SERVICE",
                "TYPE",
                "LB IP",
                "ANNOUNCED BY",
                "READY ENDPOINTS",
                "PROOF",
            ],
            &table_rows,
        );
        out.push_str("\nrequests:\n");
        out.push_str(&proofs);
        Ok((out, all_ok))
    }

    /// Stops every component and deletes every namespace and the state directory; with
    /// `keep_logs`, the component logs stay (for a run that failed).
    pub fn stop(mut self, keep_logs: bool) -> Result<(), ClusterError> {
        self.teardown(keep_logs)
    }

    fn teardown(&mut self, keep_logs: bool) -> Result<(), ClusterError> {
        let processes: Vec<Process> = self.state.components.drain(..).collect();
        stop_processes(&processes);
        for (_, mut child) in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut result = Ok(());
        if let Some(topology) = self.topology.take() {
            result = topology.destroy().map_err(ClusterError::from);
        }
        // Pod namespaces the kubelet made and could not remove.
        remove_leftovers(&self.state.prefix)?;
        if keep_logs {
            for file in [
                &self.files.state,
                &self.files.kubeconfig,
                &self.files.lan_kubeconfig,
            ] {
                let _ = std::fs::remove_file(file);
            }
        } else {
            let _ = std::fs::remove_dir_all(&self.files.dir);
        }
        result
    }
}

impl Drop for Lab {
    /// Reached on the error paths (a failed start, an interrupt): the logs stay for the post
    /// mortem.
    fn drop(&mut self) {
        let _ = self.teardown(true);
    }
}

/// A fresh random key (64 hex digits), readable by root only.
fn write_membership_key(path: &Path) -> Result<(), ClusterError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let bytes: [u8; 32] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(format!("writing {}", path.display())))?;
    file.write_all(hex.as_bytes())
        .map_err(io_err(format!("writing {}", path.display())))
}

async fn create_or_keep<K>(api: &Api<K>, object: &K, what: &str) -> Result<(), ClusterError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => Err(ClusterError::Api {
            what: format!("creating {what}"),
            source,
        }),
    }
}

/// SIGTERM to each process still alive (the last started first), up to 10 s to exit, then
/// SIGKILL.
fn stop_processes(processes: &[Process]) {
    let alive: Vec<&Process> = processes.iter().rev().filter(|p| p.is_alive()).collect();
    for p in &alive {
        if let Ok(pid) = i32::try_from(p.pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive.iter().any(|p| p.is_alive()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in alive.iter().filter(|p| p.is_alive()) {
        if let Ok(pid) = i32::try_from(p.pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Before `up`: refuses when the lab recorded in `files` is still running; removes what a dead
/// one left (processes, namespaces, files) and says what it did.
fn clean_stale(files: &Files, prefix: &str) -> Result<String, ClusterError> {
    let state = LabState::read(&files.state)?;
    if let Some(state) = &state {
        if state.up.is_alive() && state.up.pid != std::process::id() {
            return Err(ClusterError::AlreadyUp {
                pid: state.up.pid,
                dir: files.dir.display().to_string(),
            });
        }
    }
    let removed = down_state(files, prefix, state.as_ref())?;
    if removed.is_empty() {
        return Ok("none".to_string());
    }
    let said = format!("cleaned a stale lab: removed {}", removed.join(", "));
    // Said also without a terminal, where the progress lines are not shown.
    tracing::warn!("{said}");
    Ok(said)
}

/// Removes a lab's processes, namespaces and state directory; returns what it removed.
fn down_state(
    files: &Files,
    prefix: &str,
    state: Option<&LabState>,
) -> Result<Vec<String>, ClusterError> {
    let mut removed = Vec::new();
    if let Some(state) = state {
        // `up` first, so it does not restart or race the teardown; then its components.
        let mut processes = vec![state.up.clone()];
        processes.extend(state.components.iter().cloned());
        processes.retain(|p| p.pid != std::process::id());
        let alive: Vec<String> = processes
            .iter()
            .filter(|p| p.is_alive())
            .map(|p| format!("{} (pid {})", p.name, p.pid))
            .collect();
        stop_processes(&processes);
        if !alive.is_empty() {
            removed.push(format!("processes {}", alive.join(", ")));
        }
    }
    let mut prefixes = vec![prefix.to_string()];
    if let Some(state) = state {
        if state.prefix != prefix {
            prefixes.push(state.prefix.clone());
        }
    }
    for p in prefixes {
        let gone = remove_leftovers(&p)?;
        if !gone.is_empty() {
            removed.push(format!("{} namespaces {p}-*", gone.len()));
        }
    }
    if files.dir.exists() {
        std::fs::remove_dir_all(&files.dir)
            .map_err(io_err(format!("removing {}", files.dir.display())))?;
        removed.push(format!("state {}", files.dir.display()));
    }
    Ok(removed)
}

/// `berth lab down`: stops the lab recorded in `state_dir` (also one whose `up` was killed) and
/// removes every namespace named `berth-<name>-*`.
pub fn down(name: &str, state_dir: &Path) -> Result<Vec<String>, ClusterError> {
    let prefix = plan::lab_prefix(name)?;
    let files = Files::new(state_dir);
    let state = LabState::read(&files.state)?;
    down_state(&files, &prefix, state.as_ref())
}

/// `berth lab status`: the lab's processes (running or not) and namespaces, as lines.
pub fn status(name: &str, state_dir: &Path) -> Result<Vec<String>, ClusterError> {
    let prefix = plan::lab_prefix(name)?;
    let files = Files::new(state_dir);
    let mut out = Vec::new();
    let state = LabState::read(&files.state)?;
    match &state {
        None => out.push(format!("no lab recorded in {}", files.dir.display())),
        Some(state) => {
            let up = if state.up.is_alive() {
                "running"
            } else {
                "gone (run `berth lab down` to clean up)"
            };
            out.push(format!(
                "lab {} ({} nodes): up pid {} {up}",
                state.name, state.nodes, state.up.pid
            ));
            out.push(format!("kubeconfig: {}", files.kubeconfig.display()));
            out.push(format!("logs: {}", files.logs.display()));
            for p in &state.components {
                let alive = if p.is_alive() {
                    "running"
                } else {
                    "not running"
                };
                out.push(format!("  {:<16} pid {:<8} {alive}", p.name, p.pid));
            }
        }
    }
    let names = crate::topology::leftovers(list_netns().iter().map(String::as_str), &prefix);
    out.push(format!("namespaces {prefix}-*: {}", names.len()));
    for n in names {
        out.push(format!("  {n}"));
    }
    Ok(out)
}

fn list_netns() -> Vec<String> {
    std::fs::read_dir(crate::netns::NETNS_RUN_DIR)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}
