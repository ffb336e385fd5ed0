//! The churn: Services over a fixed set of names are created, changed (type, ports, traffic
//! policy, requested node ports) and deleted. Each name has one writer, which behaves like a
//! well-behaved client on a real cluster: it writes with the resourceVersion it read, keeps the
//! node ports and healthCheckNodePort the new spec still needs (the API server does that), and
//! drops the ones it no longer needs. Every write bumps the `STEP` annotation, so a watcher can
//! tell the churn's changes from the controller's.
//!
//! Address plan: service CIDRs 10.96.0.0/16 and fd00:96::/112 (static band 10.96.0.0-255 for
//! requested ClusterIPs), node ports 30000-39999 (static band 30000-30127 for requested ones),
//! pools: `auto` 198.18.0.0-198.18.7.255 and fd00:198::-fd00:198::fff, `requested`
//! 198.18.16.0-198.18.23.255 (no auto-assign; names ending in 7 ask for 198.18.16.0 + index),
//! `named` 198.18.24.0-198.18.31.255 (no auto-assign; names ending in 3 name it).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

pub const STEP: &str = "test.berth.dev/step";
pub const SERVICE_CIDRS: &str = "10.96.0.0/16,fd00:96::/112";
pub const NODE_PORT_RANGE: &str = "30000-39999";
pub const SHARING_KEY: &str = "berth.dev/sharing-key";

/// The pools: (name, addresses, autoAssign).
pub fn pools() -> Vec<(&'static str, Vec<&'static str>, bool)> {
    vec![
        (
            "auto",
            vec!["198.18.0.0-198.18.7.255", "fd00:198::-fd00:198::fff"],
            true,
        ),
        ("requested", vec!["198.18.16.0-198.18.23.255"], false),
        ("named", vec!["198.18.24.0-198.18.31.255"], false),
    ]
}

pub fn name_of(i: usize) -> String {
    format!("svc-{i}")
}

pub fn index_of(name: &str) -> Option<usize> {
    name.strip_prefix("svc-")?.parse().ok()
}

/// What a name asks for, fixed for its whole life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// `RequireDualStack` (true) or `PreferDualStack` (false).
    pub dual_stack: Option<bool>,
    pub cluster_ip: Option<Ipv4Addr>,
    pub node_port: Option<i32>,
    pub lb_ip: Option<Ipv4Addr>,
    pub named_pool: bool,
    /// Shares its LoadBalancer IP with the other sharing names (disjoint ports, Cluster policy).
    pub sharing: bool,
}

pub fn profile(i: usize) -> Profile {
    let dual_stack = match i % 6 {
        5 => Some(true),
        4 => Some(false),
        _ => None,
    };
    let single = dual_stack.is_none();
    let offset = |base: Ipv4Addr| Ipv4Addr::from(u32::from(base) + i as u32);
    Profile {
        dual_stack,
        cluster_ip: (single && i < 200 && i % 4 == 2).then(|| offset(Ipv4Addr::new(10, 96, 0, 10))),
        node_port: (i < 120 && i % 4 == 1).then_some(30000 + i as i32),
        lb_ip: (single && i % 10 == 7).then(|| offset(Ipv4Addr::new(198, 18, 16, 0))),
        named_pool: single && i % 10 == 3,
        sharing: single && i % 50 == 21,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    ClusterIp,
    NodePort,
    LbCluster,
    LbLocal,
}

impl Shape {
    fn random(rng: &mut SmallRng, p: &Profile) -> Self {
        // Sharing needs the Cluster policy on every Service that shares.
        let n = if p.sharing { 3 } else { 4 };
        [
            Self::ClusterIp,
            Self::NodePort,
            Self::LbCluster,
            Self::LbLocal,
        ][rng.random_range(0..n)]
    }

    fn type_name(self) -> &'static str {
        match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LbCluster | Self::LbLocal => "LoadBalancer",
        }
    }

    fn node_ported(self) -> bool {
        self != Self::ClusterIp
    }

    fn policy(self) -> Value {
        match self {
            Self::ClusterIp => Value::Null,
            Self::LbLocal => json!("Local"),
            Self::NodePort | Self::LbCluster => json!("Cluster"),
        }
    }
}

/// The ports of one variant: (name, port, protocol, asks for the name's requested node port).
fn port_set(i: usize, p: &Profile, variant: u32) -> Vec<(&'static str, i32, &'static str, bool)> {
    if p.sharing {
        let port = 9000 + i as i32;
        return match variant % 2 {
            0 => vec![("tcp", port, "TCP", true)],
            _ => vec![("tcp", port, "TCP", true), ("udp", port, "UDP", true)],
        };
    }
    match variant % 3 {
        0 => vec![("http", 80, "TCP", true)],
        // The same requested node port for TCP and UDP of one Service.
        1 => vec![
            ("http", 80, "TCP", false),
            ("dns-udp", 53, "UDP", true),
            ("dns-tcp", 53, "TCP", true),
        ],
        _ => vec![("https", 443, "TCP", false), ("http", 80, "TCP", true)],
    }
}

/// `spec.ports`: node ports the Service already holds for the same port and protocol are
/// kept; otherwise the name's requested node port where it asks for one.
fn ports(i: usize, shape: Shape, variant: u32, current: Option<&Service>) -> Value {
    let p = profile(i);
    let held: Vec<(i32, String, i32)> = current
        .and_then(|s| s.spec.as_ref())
        .filter(|s| matches!(s.type_.as_deref(), Some("NodePort" | "LoadBalancer")))
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|sp| {
            let proto = sp.protocol.unwrap_or_else(|| "TCP".into());
            sp.node_port.map(|n| (sp.port, proto, n))
        })
        .collect();
    let set = port_set(i, &p, variant);
    let kept = |port: i32, proto: &str| {
        held.iter()
            .find(|(hp, hproto, _)| *hp == port && hproto == proto)
            .map(|(_, _, n)| *n)
    };
    // A kept port may already hold the requested number (from an earlier variant); asking
    // for it again on another port number would be a duplicate.
    let requested = p.node_port.filter(|n| {
        !set.iter()
            .any(|(_, port, proto, _)| kept(*port, proto) == Some(*n))
    });
    let list: Vec<Value> = set
        .iter()
        .map(|&(name, port, proto, asks)| {
            let node_port = if shape.node_ported() {
                kept(port, proto).or(requested.filter(|_| asks))
            } else {
                None
            };
            let mut v = json!({"name": name, "port": port, "protocol": proto});
            if let Some(n) = node_port {
                v["nodePort"] = json!(n);
            }
            v
        })
        .collect();
    Value::Array(list)
}

pub fn mk_service(i: usize, shape: Shape, variant: u32, step: u64) -> Service {
    let p = profile(i);
    let mut annotations = serde_json::Map::new();
    annotations.insert(STEP.into(), json!(step.to_string()));
    if let Some(ip) = p.lb_ip {
        annotations.insert("berth.dev/load-balancer-ips".into(), json!(ip.to_string()));
    }
    if p.named_pool {
        annotations.insert("berth.dev/ip-pool".into(), json!("named"));
    }
    if p.sharing {
        annotations.insert(SHARING_KEY.into(), json!("shared"));
    }
    let mut spec = json!({
        "type": shape.type_name(),
        "selector": {"app": name_of(i)},
        "ports": ports(i, shape, variant, None),
    });
    if shape.node_ported() {
        spec["externalTrafficPolicy"] = shape.policy();
    }
    match p.dual_stack {
        Some(true) => spec["ipFamilyPolicy"] = json!("RequireDualStack"),
        Some(false) => spec["ipFamilyPolicy"] = json!("PreferDualStack"),
        None => {}
    }
    if let Some(ip) = p.cluster_ip {
        spec["clusterIP"] = json!(ip.to_string());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name_of(i), "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

/// The merge patch that turns `current` into `shape`/`variant`, guarded by its resourceVersion.
pub fn change_patch(i: usize, current: &Service, shape: Shape, variant: u32, step: u64) -> Value {
    let spec = current.spec.clone().unwrap_or_default();
    let was_local_lb = spec.type_.as_deref() == Some("LoadBalancer")
        && spec.external_traffic_policy.as_deref() == Some("Local");
    let mut new_spec = json!({
        "type": shape.type_name(),
        "ports": ports(i, shape, variant, Some(current)),
        "externalTrafficPolicy": shape.policy(),
    });
    // Kept while still needed (the API server keeps it too), cleared otherwise.
    if !(shape == Shape::LbLocal && was_local_lb) {
        new_spec["healthCheckNodePort"] = Value::Null;
    }
    json!({
        "metadata": {
            "resourceVersion": current.metadata.resource_version,
            "annotations": {STEP: step.to_string()},
        },
        "spec": new_spec,
    })
}

#[derive(Debug, Default)]
pub struct ChurnStats {
    pub created: AtomicU64,
    pub changed: AtomicU64,
    pub deleted: AtomicU64,
    /// Writes refused (stale resourceVersion, injected faults); the churn just moves on.
    pub refused: AtomicU64,
}

impl ChurnStats {
    pub fn line(&self) -> String {
        format!(
            "created={} changed={} deleted={} refused={}",
            self.created.load(Ordering::Relaxed),
            self.changed.load(Ordering::Relaxed),
            self.deleted.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed)
        )
    }
}

/// One writer over `names` until `stop`: every name is created once first (in random order),
/// then random names are changed (3 in 4) or deleted, and deleted ones created again.
pub async fn churn(
    api: Api<Service>,
    mut names: Vec<usize>,
    seed: u64,
    stop: Arc<AtomicBool>,
    stats: Arc<ChurnStats>,
    pause: Duration,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut present: HashMap<usize, bool> = HashMap::new();
    let mut steps: HashMap<usize, u64> = HashMap::new();
    for k in (1..names.len()).rev() {
        names.swap(k, rng.random_range(0..=k));
    }
    let mut fill = names.clone().into_iter();
    while !stop.load(Ordering::Relaxed) {
        let i = match fill.next() {
            Some(i) => i,
            None => names[rng.random_range(0..names.len())],
        };
        let step = {
            let s = steps.entry(i).or_insert(0);
            *s += 1;
            *s
        };
        let p = profile(i);
        let is_present = present.get(&i).copied().unwrap_or(false);
        if !is_present {
            let svc = mk_service(i, Shape::random(&mut rng, &p), rng.random(), step);
            match api.create(&PostParams::default(), &svc).await {
                Ok(_) => {
                    stats.created.fetch_add(1, Ordering::Relaxed);
                    present.insert(i, true);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    present.insert(i, true);
                }
                Err(_) => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else if rng.random_range(0..4) < 3 {
            match api.get_opt(&name_of(i)).await {
                Ok(Some(current)) => {
                    let shape = Shape::random(&mut rng, &p);
                    let patch = change_patch(i, &current, shape, rng.random(), step);
                    match api
                        .patch(&name_of(i), &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => {
                            stats.changed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Ok(None) => {
                    present.insert(i, false);
                }
                Err(_) => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else {
            match api.delete(&name_of(i), &DeleteParams::default()).await {
                Ok(_) => {
                    stats.deleted.fetch_add(1, Ordering::Relaxed);
                    present.insert(i, false);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    present.insert(i, false);
                }
                Err(_) => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        tokio::time::sleep(pause).await;
    }
}
