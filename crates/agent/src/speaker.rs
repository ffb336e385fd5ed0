//! The BGP speaker inside the agent (berth-bgp, docs/bgp.md). FRR runs beside the agent (a
//! sidecar in the chart, a process per node namespace in the lab); the agent drives it through
//! two channels:
//!
//! - the configuration, rendered from BGPPeers, BGPAdvertisements, BFDProfiles and IPPools
//!   (watched here: no other part of the agent reads them) and applied with `frr-reload.py`
//!   only when its text changes;
//! - one kernel route per announced address on the `berth-bgp` device, from the Services and
//!   endpoints the datapath's [`Index`] already holds: the speaker opens no watch of its own on
//!   Services or EndpointSlices, and recomputes after each datapath sync, so an address is never
//!   announced before the rules that serve it are in place.
//!
//! Peer passwords are read from their Secrets (`get`, by name: the agent may neither list nor
//! watch Secrets) when the set of referenced Secrets changes and at every resync, so a changed
//! password is applied within [`RESYNC`]. They go into `frr.conf` (mode 0600) and nowhere else:
//! FRR's output is redacted before it is logged.
//!
//! Each node reports its sessions as `BGPSessionState` records ([`crate::bgpstatus`]).
//!
//! Stopping withdraws every route first. A SIGKILLed agent withdraws too: the device, and its
//! routes, die with the process.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use berth_api::{
    BFDProfile, BFDProfileSpec, BGPAdvertisement, BGPAdvertisementSpec, BGPPeer, BGPPeerSpec,
    IPPool,
};
use berth_bgp::{
    compute_announcements, password_from_secret, redact, render_frr_config, KernelRoutes,
    PeerEntry, PoolFacts, ServiceFacts, SpeakerInput, SpeakerNode,
};
use berth_core::TrafficPolicy;
use berth_datapath::NodeView;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::index::Index;
use crate::watch::{run_watch, Feeds, Handlers};
use crate::Error;

/// A full re-render and route check at least this often, whatever was heard.
const RESYNC: Duration = Duration::from_secs(30);
/// Longest a `frr-reload.py` run may take.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the speaker looks for a restarted FRR (new daemon pids), which starts empty and
/// must be configured again.
const FRR_CHECK: Duration = Duration::from_secs(2);

/// FRR's daemons by pid, from their pid files: changes when FRR restarts.
async fn frr_generation(dir: &std::path::Path) -> Option<String> {
    let mut out = String::new();
    for daemon in ["zebra", "bgpd", "bfdd"] {
        let pid = tokio::fs::read_to_string(dir.join(format!("{daemon}.pid")))
            .await
            .ok()?;
        out.push_str(pid.trim());
        out.push(' ');
    }
    Some(out)
}

/// Where FRR is and how to reconfigure it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeakerConfig {
    /// FRR's vty sockets; the rendered `frr.conf` is written here too.
    pub frr_dir: PathBuf,
    /// `frr-reload.py` (package frr-pythontools).
    pub frr_reload: PathBuf,
    /// The agent's namespace: its `BGPSessionState` records, and password Secrets whose
    /// reference names no namespace.
    pub namespace: String,
}

impl Default for SpeakerConfig {
    fn default() -> Self {
        Self {
            frr_dir: PathBuf::from("/var/run/frr"),
            frr_reload: PathBuf::from("/usr/lib/frr/frr-reload.py"),
            namespace: "kube-system".into(),
        }
    }
}

/// One kind of object by name, relisted in a stream (`begin`, `apply`..., `finish`).
#[derive(Debug, Clone)]
struct Kind<T> {
    items: BTreeMap<String, T>,
    relist: Option<BTreeSet<String>>,
    listed: bool,
}

impl<T> Default for Kind<T> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }
}

impl<T> Kind<T> {
    fn apply(&mut self, name: String, item: T) {
        if let Some(seen) = &mut self.relist {
            seen.insert(name.clone());
        }
        self.items.insert(name, item);
    }

    fn delete(&mut self, name: &str) {
        self.items.remove(name);
    }

    fn begin(&mut self) {
        self.relist = Some(BTreeSet::new());
    }

    fn finish(&mut self) {
        if let Some(seen) = self.relist.take() {
            self.items.retain(|name, _| seen.contains(name));
        }
        self.listed = true;
    }

    fn pairs(&self) -> Vec<(String, T)>
    where
        T: Clone,
    {
        self.items
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect()
    }
}

/// The BGP objects and pools, as the watches deliver them.
#[derive(Debug, Clone, Default)]
pub struct BgpObjects {
    peers: Kind<BGPPeerSpec>,
    advertisements: Kind<BGPAdvertisementSpec>,
    profiles: Kind<BFDProfileSpec>,
    pools: Kind<PoolFacts>,
}

impl BgpObjects {
    pub fn is_listed(&self) -> bool {
        self.peers.listed && self.advertisements.listed && self.profiles.listed && self.pools.listed
    }

    pub fn apply_peer(&mut self, peer: &BGPPeer) {
        self.peers.apply(peer.name_any(), peer.spec.clone());
    }

    pub fn apply_advertisement(&mut self, adv: &BGPAdvertisement) {
        self.advertisements.apply(adv.name_any(), adv.spec.clone());
    }

    pub fn apply_profile(&mut self, profile: &BFDProfile) {
        self.profiles
            .apply(profile.name_any(), profile.spec.clone());
    }

    /// A pool whose addresses cannot be read is left out, as the controller leaves it out.
    pub fn apply_pool(&mut self, pool: &IPPool) {
        let name = pool.name_any();
        match pool.spec.ranges() {
            Ok(ranges) => self.pools.apply(
                name.clone(),
                PoolFacts {
                    name,
                    labels: pool.labels().clone(),
                    ranges,
                },
            ),
            Err(err) => {
                tracing::warn!(pool = %name, error = %err, "IPPool has an invalid address; not announced");
                self.pools.delete(&name);
            }
        }
    }
}

/// One entry per Service (its ports merged) from the datapath's view: its `ipMode: VIP`
/// LoadBalancer IPs, its external traffic policy and whether a ready endpoint is on this node.
pub fn build_service_facts(view: &NodeView) -> Vec<ServiceFacts> {
    let mut by_service: BTreeMap<(String, String), ServiceFacts> = BTreeMap::new();
    for port in &view.services {
        let ips: Vec<std::net::IpAddr> = [berth_core::IpFamily::V4, berth_core::IpFamily::V6]
            .into_iter()
            .flat_map(|family| port.load_balancer_vips(family))
            .collect();
        if ips.is_empty() {
            continue;
        }
        let entry = by_service
            .entry((port.name.namespace.clone(), port.name.name.clone()))
            .or_insert_with(|| ServiceFacts {
                key: format!("{}/{}", port.name.namespace, port.name.name),
                ips: Vec::new(),
                local_policy: false,
                local_ready_endpoint: false,
            });
        for ip in ips {
            if !entry.ips.contains(&ip) {
                entry.ips.push(ip);
            }
        }
        entry.local_policy |= port.external_traffic_policy == TrafficPolicy::Local;
        entry.local_ready_endpoint |= port
            .endpoints
            .iter()
            .any(|e| e.ready && e.is_local(&view.node));
    }
    by_service.into_values().collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A peer's password Secret: (namespace, name).
pub type SecretKey = (String, String);

/// Every peer's password Secret, the namespace defaulting to the agent's.
pub fn password_refs(
    peers: &BTreeMap<String, BGPPeerSpec>,
    namespace: &str,
) -> BTreeMap<String, SecretKey> {
    peers
        .iter()
        .filter_map(|(name, spec)| {
            let secret = spec.password_secret.as_ref()?;
            let ns = secret
                .namespace
                .clone()
                .unwrap_or_else(|| namespace.to_string());
            Some((name.clone(), (ns, secret.name.clone())))
        })
        .collect()
}

/// The passwords read, by Secret, and why a Secret gave none.
#[derive(Debug, Clone, Default)]
pub struct Passwords {
    read: BTreeMap<SecretKey, Result<String, String>>,
}

impl Passwords {
    /// Each peer's password, and the peers whose Secret gave none with the reason.
    pub fn for_peers(
        &self,
        refs: &BTreeMap<String, SecretKey>,
    ) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let mut passwords = BTreeMap::new();
        let mut problems = BTreeMap::new();
        for (peer, key) in refs {
            match self.read.get(key) {
                Some(Ok(password)) => {
                    passwords.insert(peer.clone(), password.clone());
                }
                Some(Err(why)) => {
                    problems.insert(
                        peer.clone(),
                        format!("the password Secret {}/{} {why}", key.0, key.1),
                    );
                }
                None => {
                    problems.insert(
                        peer.clone(),
                        format!(
                            "the password Secret {}/{} has not been read yet",
                            key.0, key.1
                        ),
                    );
                }
            }
        }
        (passwords, problems)
    }
}

/// Reads every Secret in `keys` by name; a failure is kept as the Secret's reason. A Secret
/// that cannot be read at all (the API server unreachable, a timeout) keeps the password read
/// before, so a passing API outage never takes a peer, and its session, out of FRR; a Secret
/// that is gone, forbidden or holds no usable password does.
async fn fetch_passwords(
    client: &Client,
    keys: &BTreeSet<SecretKey>,
    before: &Passwords,
) -> Passwords {
    let mut read = BTreeMap::new();
    for (ns, name) in keys {
        let key = (ns.clone(), name.clone());
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let result = match api.get_opt(name).await {
            Ok(Some(secret)) => password_from_secret(&secret),
            Ok(None) => Err("does not exist".to_string()),
            Err(kube::Error::Api(status)) => Err(format!(
                "cannot be read: {} ({})",
                status.message, status.code
            )),
            Err(err) => match before.read.get(&key) {
                Some(Ok(password)) => {
                    tracing::warn!(secret = %format!("{ns}/{name}"), error = %err, "reading a BGP peer's password Secret failed; keeping the password read before");
                    Ok(password.clone())
                }
                _ => Err(format!("cannot be read: {err}")),
            },
        };
        if let Err(why) = &result {
            tracing::warn!(secret = %format!("{ns}/{name}"), reason = %why, "a BGP peer's password Secret gives no password");
        }
        read.insert(key, result);
    }
    Passwords { read }
}

/// What one pass decided, computed under the locks and applied outside them.
struct Pass {
    config: Option<String>,
    skipped: Vec<berth_bgp::Skipped>,
    routes: BTreeSet<IpNet>,
    /// The peers that select this node, kept or left out: one session record each.
    peers: Vec<PeerEntry>,
}

/// The peers that select this node, each with why it was left out of the configuration.
pub fn build_peer_entries(
    peers: &[(String, BGPPeerSpec)],
    labels: &BTreeMap<String, String>,
    skipped: &[berth_bgp::Skipped],
) -> Vec<PeerEntry> {
    peers
        .iter()
        .filter(|(_, spec)| spec.selects_node(labels))
        .map(|(name, spec)| PeerEntry {
            name: name.clone(),
            address: spec.peer_address.clone(),
            left_out: skipped
                .iter()
                .find(|s| s.kind == "BGPPeer" && s.name == *name)
                .map(|s| s.reason.clone()),
        })
        .collect()
}

fn compute_pass(
    objects: &BgpObjects,
    index: &Index,
    announce: bool,
    passwords: &BTreeMap<String, String>,
    password_problems: &BTreeMap<String, String>,
) -> Pass {
    let view = index.view();
    let node_state = index.node_state().cloned().unwrap_or_default();
    let router_id = view.node.addresses.iter().find_map(|ip| match ip {
        std::net::IpAddr::V4(v4) => Some(*v4),
        std::net::IpAddr::V6(_) => None,
    });
    let node = SpeakerNode {
        name: view.node.name.clone(),
        labels: node_state.labels.clone(),
        router_id,
    };
    let peers = objects.peers.pairs();
    let profiles = objects.profiles.pairs();
    let advertisements = objects.advertisements.pairs();
    let pools: Vec<PoolFacts> = objects.pools.items.values().cloned().collect();
    let rendered = render_frr_config(&SpeakerInput {
        node: &node,
        peers: &peers,
        profiles: &profiles,
        advertisements: &advertisements,
        pools: &pools,
        passwords,
    });
    let mut skipped = rendered.skipped;
    // The renderer knows only that a password is missing; the Secret's reading says why.
    for s in &mut skipped {
        if let Some(why) = password_problems
            .get(&s.name)
            .filter(|_| s.kind == "BGPPeer")
        {
            if s.reason.contains("password") {
                s.reason = why.clone();
            }
        }
    }
    let entries = if index.node_state().is_some() {
        build_peer_entries(&peers, &node_state.labels, &skipped)
    } else {
        Vec::new()
    };
    let routes = if announce && index.is_listed() {
        compute_announcements(
            &node_state,
            &build_service_facts(view),
            &pools,
            &advertisements,
        )
        .into_keys()
        .collect()
    } else {
        BTreeSet::new()
    };
    Pass {
        config: index.node_state().map(|_| rendered.text),
        skipped,
        routes,
        peers: entries,
    }
}

/// Runs the speaker until `stop`: renders and applies FRR's configuration, keeps the routes of
/// the announced addresses and the node's session records, and withdraws every route before
/// returning.
pub(crate) async fn run_speaker(
    config: SpeakerConfig,
    client: Client,
    objects: SpeakerObjects,
    index: Arc<Mutex<Index>>,
    mut synced: watch::Receiver<u64>,
    stop: CancellationToken,
) -> Result<(), Error> {
    let routes = KernelRoutes::open().await.map_err(Error::Bgp)?;
    let SpeakerObjects { objects, wake } = objects;
    let mut tasks = spawn_watches(&client, &objects, &wake, &stop);
    let (peers_tx, peers_rx) = watch::channel(None::<Vec<PeerEntry>>);
    let (applied_tx, applied_rx) = watch::channel(0u64);
    let node = lock(&index).view().node.name.clone();
    tasks.push(tokio::spawn(crate::bgpstatus::run_session_status(
        client.clone(),
        crate::bgpstatus::StatusConfig {
            node,
            namespace: config.namespace.clone(),
            frr_dir: config.frr_dir.clone(),
        },
        peers_rx,
        applied_rx,
        stop.clone(),
    )));
    let mut applied: Option<String> = None;
    let mut reported: Vec<berth_bgp::Skipped> = Vec::new();
    let mut passwords = Passwords::default();
    let mut password_keys: Option<BTreeSet<SecretKey>> = None;
    let mut applied_to: Option<String> = None;
    let mut tick = tokio::time::interval(RESYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut frr_check = tokio::time::interval(FRR_CHECK);
    frr_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut resync = false;
        tokio::select! {
            () = stop.cancelled() => break,
            () = wake.notified() => {}
            changed = synced.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = tick.tick() => resync = true,
            _ = frr_check.tick() => {
                if applied.is_none() || frr_generation(&config.frr_dir).await == applied_to {
                    continue;
                }
                tracing::info!("FRR restarted; configuring it again");
                applied = None;
            }
        }
        let refs = {
            let objects = lock(&objects);
            if !objects.is_listed() {
                continue;
            }
            password_refs(&objects.peers.items, &config.namespace)
        };
        let keys: BTreeSet<SecretKey> = refs.values().cloned().collect();
        if resync || password_keys.as_ref() != Some(&keys) {
            passwords = fetch_passwords(&client, &keys, &passwords).await;
            password_keys = Some(keys);
        }
        let (peer_passwords, problems) = passwords.for_peers(&refs);
        let pass = {
            let objects = lock(&objects);
            // Announce only once the datapath has synced: an address must not draw traffic
            // before the rules that serve it exist.
            let announce = *synced.borrow() > 0;
            compute_pass(
                &objects,
                &lock(&index),
                announce,
                &peer_passwords,
                &problems,
            )
        };
        if pass.skipped != reported {
            for s in &pass.skipped {
                tracing::warn!(kind = s.kind, name = %s.name, reason = %s.reason, "left out of the BGP configuration");
            }
            reported = pass.skipped;
        }
        if let Some(text) = pass.config {
            if applied.as_deref() != Some(text.as_str()) {
                let generation = frr_generation(&config.frr_dir).await;
                match apply_frr_config(&config, &text, &peer_passwords).await {
                    Ok(()) => {
                        tracing::info!(bytes = text.len(), "FRR configuration applied");
                        applied = Some(text);
                        applied_to = generation;
                        applied_tx.send_modify(|n| *n += 1);
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "applying the FRR configuration failed; retrying")
                    }
                }
            }
        }
        peers_tx.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&pass.peers);
            if changed {
                *current = Some(pass.peers.clone());
            }
            changed
        });
        match routes.apply_routes(&pass.routes).await {
            Ok(plan) if !plan.is_empty() => tracing::info!(
                announced = ?plan.add.iter().map(ToString::to_string).collect::<Vec<_>>(),
                withdrawn = ?plan.delete.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "BGP routes changed"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "writing the BGP routes failed; retrying"),
        }
    }
    // A graceful stop withdraws first; the datapath's rules stay, so connections in flight
    // keep being served while the routers move away.
    match routes.apply_routes(&BTreeSet::new()).await {
        Ok(plan) => tracing::info!(withdrawn = plan.delete.len(), "BGP routes withdrawn"),
        Err(err) => tracing::warn!(error = %err, "withdrawing the BGP routes failed"),
    }
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}

/// Writes `frr.conf` (atomically, readable by the agent only: it holds the peers' passwords)
/// and runs `frr-reload.py --reload` on it. FRR's output is redacted before it is reported.
async fn apply_frr_config(
    config: &SpeakerConfig,
    text: &str,
    passwords: &BTreeMap<String, String>,
) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let path = config.frr_dir.join("frr.conf");
    let staged = config.frr_dir.join("frr.conf.berth");
    let _ = tokio::fs::remove_file(&staged).await;
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&staged)
        .await
        .map_err(|e| format!("creating {}: {e}", staged.display()))?;
    file.write_all(text.as_bytes())
        .await
        .map_err(|e| format!("writing {}: {e}", staged.display()))?;
    file.sync_all()
        .await
        .map_err(|e| format!("writing {}: {e}", staged.display()))?;
    drop(file);
    tokio::fs::rename(&staged, &path)
        .await
        .map_err(|e| format!("renaming to {}: {e}", path.display()))?;
    let dir = config.frr_dir.display().to_string();
    let run = tokio::process::Command::new("python3")
        .arg(&config.frr_reload)
        .args(["--reload", "--stdout"])
        .args(["--vty_socket", &dir, "--confdir", &dir, "--rundir", &dir])
        .arg(&path)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(RELOAD_TIMEOUT, run)
        .await
        .map_err(|_| format!("frr-reload.py took longer than {RELOAD_TIMEOUT:?}"))?
        .map_err(|e| format!("running {}: {e}", config.frr_reload.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let tail: String = format!("{stdout}{stderr}")
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join(" | ");
        Err(format!(
            "frr-reload.py exited with {}: {}",
            out.status,
            redact(&tail, passwords)
        ))
    }
}

/// The speaker's view of the BGP objects and IPPools, and the signal that it changed; made
/// before the agent's shared watches start, so IPPools are watched once for every reader.
#[derive(Default)]
pub(crate) struct SpeakerObjects {
    objects: Arc<Mutex<BgpObjects>>,
    wake: Arc<Notify>,
}

impl SpeakerObjects {
    pub(crate) fn subscribe(&self, feeds: &mut Feeds) {
        feeds.pools.feed(
            &self.objects,
            &self.wake,
            Handlers {
                kind: "IPPool",
                apply: BgpObjects::apply_pool,
                delete: |o: &mut BgpObjects, p| o.pools.delete(&p.name_any()),
                begin: |o: &mut BgpObjects| o.pools.begin(),
                finish: |o: &mut BgpObjects| o.pools.finish(),
            },
        );
    }
}

/// The watches of the kinds only the speaker reads.
fn spawn_watches(
    client: &Client,
    objects: &Arc<Mutex<BgpObjects>>,
    wake: &Arc<Notify>,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(run_watch(
            Api::<BGPPeer>::all(client.clone()),
            watcher::Config::default(),
            objects.clone(),
            wake.clone(),
            Handlers {
                kind: "BGPPeer",
                apply: BgpObjects::apply_peer,
                delete: |o: &mut BgpObjects, p| o.peers.delete(&p.name_any()),
                begin: |o: &mut BgpObjects| o.peers.begin(),
                finish: |o: &mut BgpObjects| o.peers.finish(),
            },
            stop.clone(),
        )),
        tokio::spawn(run_watch(
            Api::<BGPAdvertisement>::all(client.clone()),
            watcher::Config::default(),
            objects.clone(),
            wake.clone(),
            Handlers {
                kind: "BGPAdvertisement",
                apply: BgpObjects::apply_advertisement,
                delete: |o: &mut BgpObjects, a| o.advertisements.delete(&a.name_any()),
                begin: |o: &mut BgpObjects| o.advertisements.begin(),
                finish: |o: &mut BgpObjects| o.advertisements.finish(),
            },
            stop.clone(),
        )),
        tokio::spawn(run_watch(
            Api::<BFDProfile>::all(client.clone()),
            watcher::Config::default(),
            objects.clone(),
            wake.clone(),
            Handlers {
                kind: "BFDProfile",
                apply: BgpObjects::apply_profile,
                delete: |o: &mut BgpObjects, p| o.profiles.delete(&p.name_any()),
                begin: |o: &mut BgpObjects| o.profiles.begin(),
                finish: |o: &mut BgpObjects| o.profiles.finish(),
            },
            stop.clone(),
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::build_node_state;
    use berth_api::names::label;
    use berth_core::Protocol;
    use berth_datapath::{
        Endpoint, IpMode, LoadBalancerIngress, NodeInfo, ServicePort, ServicePortName,
    };
    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn mk_node(ready: &str, labels: &[(&str, &str)], deleting: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("node1".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                deletion_timestamp: deleting
                    .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn node_eligibility() {
        assert!(build_node_state(&mk_node("True", &[], false)).eligible);
        assert!(!build_node_state(&mk_node("False", &[], false)).eligible);
        assert!(!build_node_state(&mk_node("Unknown", &[], false)).eligible);
        assert!(!build_node_state(&mk_node("True", &[], true)).eligible);
        let excluded = mk_node(
            "True",
            &[(label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, "")],
            false,
        );
        assert!(!build_node_state(&excluded).eligible);
    }

    fn mk_port(
        name: &str,
        port: &str,
        ips: &[(&str, IpMode)],
        local: bool,
        endpoints: &[(&str, bool)],
    ) -> ServicePort {
        ServicePort {
            name: ServicePortName {
                namespace: "default".into(),
                name: name.into(),
                port: port.into(),
            },
            protocol: Protocol::Tcp,
            port: 80,
            cluster_ips: Vec::new(),
            node_port: Some(30080),
            external_ips: Vec::new(),
            load_balancer_ingress: ips
                .iter()
                .map(|(ip, mode)| LoadBalancerIngress {
                    ip: ip.parse().expect("ip"),
                    mode: *mode,
                })
                .collect(),
            source_ranges: Vec::new(),
            session_affinity: Default::default(),
            external_traffic_policy: if local {
                TrafficPolicy::Local
            } else {
                TrafficPolicy::Cluster
            },
            internal_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            endpoints: endpoints
                .iter()
                .map(|(node, ready)| Endpoint {
                    ip: "10.244.1.5".parse().expect("ip"),
                    port: 8080,
                    ready: *ready,
                    serving: *ready,
                    terminating: false,
                    node_name: Some((*node).into()),
                    hints: None,
                })
                .collect(),
        }
    }

    #[test]
    fn service_facts_merge_ports_and_skip_proxy_mode_ingress() {
        let view = NodeView {
            node: NodeInfo {
                name: "node1".into(),
                addresses: Vec::new(),
                zone: None,
            },
            services: vec![
                mk_port(
                    "web",
                    "http",
                    &[("198.19.10.5", IpMode::Vip)],
                    true,
                    &[("node2", true)],
                ),
                mk_port(
                    "web",
                    "https",
                    &[("198.19.10.5", IpMode::Vip)],
                    true,
                    &[("node1", true)],
                ),
                mk_port("proxied", "", &[("198.19.10.6", IpMode::Proxy)], false, &[]),
                mk_port(
                    "not-ready",
                    "",
                    &[("198.19.10.7", IpMode::Vip)],
                    true,
                    &[("node1", false)],
                ),
            ],
        };
        let facts = build_service_facts(&view);
        let summary: Vec<(&str, Vec<String>, bool, bool)> = facts
            .iter()
            .map(|f| {
                (
                    f.key.as_str(),
                    f.ips.iter().map(ToString::to_string).collect(),
                    f.local_policy,
                    f.local_ready_endpoint,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "default/not-ready",
                    vec!["198.19.10.7".to_string()],
                    true,
                    false
                ),
                ("default/web", vec!["198.19.10.5".to_string()], true, true),
            ]
        );
    }

    fn mk_peer(
        address: &str,
        secret: Option<(&str, Option<&str>)>,
        zone: Option<&str>,
    ) -> BGPPeerSpec {
        BGPPeerSpec {
            my_asn: 64512,
            peer_asn: 64513,
            peer_address: address.into(),
            peer_port: None,
            source_address: None,
            hold_time: None,
            keepalive_time: None,
            connect_time: None,
            router_id: None,
            node_selectors: zone
                .map(|z| {
                    vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                            match_labels: Some([("zone".to_string(), z.to_string())].into()),
                            ..Default::default()
                        },
                    ]
                })
                .unwrap_or_default(),
            password_secret: secret.map(|(name, namespace)| berth_api::SecretRef {
                name: name.into(),
                namespace: namespace.map(str::to_string),
            }),
            bfd_profile: None,
            ebgp_multi_hop: None,
            enable_graceful_restart: None,
        }
    }

    #[test]
    fn passwords_by_peer_and_why_a_secret_gave_none() {
        let peers: BTreeMap<String, BGPPeerSpec> = [
            ("plain".to_string(), mk_peer("198.18.0.1", None, None)),
            (
                "here".to_string(),
                mk_peer("198.18.0.2", Some(("auth", None)), None),
            ),
            (
                "there".to_string(),
                mk_peer("198.18.0.3", Some(("auth", Some("net"))), None),
            ),
            (
                "unread".to_string(),
                mk_peer("198.18.0.4", Some(("later", None)), None),
            ),
        ]
        .into();
        let refs = password_refs(&peers, "berth-system");
        assert_eq!(
            refs,
            [
                (
                    "here".to_string(),
                    ("berth-system".to_string(), "auth".to_string())
                ),
                ("there".to_string(), ("net".to_string(), "auth".to_string())),
                (
                    "unread".to_string(),
                    ("berth-system".to_string(), "later".to_string())
                ),
            ]
            .into()
        );
        let read = Passwords {
            read: [
                (
                    ("berth-system".to_string(), "auth".to_string()),
                    Ok("s3cret".to_string()),
                ),
                (
                    ("net".to_string(), "auth".to_string()),
                    Err("does not exist".to_string()),
                ),
            ]
            .into(),
        };
        let (passwords, problems) = read.for_peers(&refs);
        assert_eq!(
            passwords,
            [("here".to_string(), "s3cret".to_string())].into()
        );
        assert_eq!(
            problems["there"],
            "the password Secret net/auth does not exist"
        );
        assert!(problems["unread"].contains("has not been read yet"));
        assert!(!problems.values().any(|p| p.contains("s3cret")));
    }

    #[test]
    fn peer_entries_are_the_peers_that_select_the_node() {
        let peers = [
            ("a".to_string(), mk_peer("198.18.0.1", None, None)),
            ("b".to_string(), mk_peer("198.18.0.2", None, Some("east"))),
            ("c".to_string(), mk_peer("198.18.0.3", None, Some("west"))),
        ];
        let labels: BTreeMap<String, String> = [("zone".to_string(), "east".to_string())].into();
        let skipped = [
            berth_bgp::Skipped {
                kind: "BGPPeer",
                name: "b".into(),
                reason: "BFDProfile fast does not exist".into(),
            },
            berth_bgp::Skipped {
                kind: "BFDProfile",
                name: "a".into(),
                reason: "not a peer".into(),
            },
        ];
        let entries = build_peer_entries(&peers, &labels, &skipped);
        assert_eq!(
            entries,
            [
                PeerEntry {
                    name: "a".into(),
                    address: "198.18.0.1".into(),
                    left_out: None
                },
                PeerEntry {
                    name: "b".into(),
                    address: "198.18.0.2".into(),
                    left_out: Some("BFDProfile fast does not exist".into())
                },
            ]
        );
    }

    #[test]
    fn a_relist_forgets_what_it_did_not_name() {
        let mut kind: Kind<u32> = Kind::default();
        kind.apply("a".into(), 1);
        kind.apply("b".into(), 2);
        assert!(!kind.listed);
        kind.begin();
        kind.apply("b".into(), 3);
        kind.finish();
        assert!(kind.listed);
        assert_eq!(kind.pairs(), [("b".to_string(), 3)]);
        kind.delete("b");
        assert!(kind.pairs().is_empty());
    }
}
