//! What must hold: during the run, a live Service never loses or changes a value it was given
//! (unless the churn's own change made it unnecessary); at the end, nothing has two owners,
//! every Service holds what its spec needs, and the pool counts equal what live Services hold.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use berth_api::IPPool;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

use super::churn::{index_of, profile, SHARING_KEY, STEP};

/// The parts of a Service the allocation invariants speak about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub name: String,
    pub step: Option<u64>,
    pub type_: String,
    pub local: bool,
    pub cluster_ips: Vec<String>,
    /// (port, protocol, nodePort)
    pub ports: Vec<(i32, String, Option<i32>)>,
    pub health_check: Option<i32>,
    pub ingress: Vec<String>,
    /// Deleted, and kept only by a finalizer (berth's `load-balancer-cleanup`, as upstream's
    /// service controller): its load balancer is being taken down.
    pub terminating: bool,
}

impl Snapshot {
    pub fn of(s: &Service) -> Self {
        let spec = s.spec.clone().unwrap_or_default();
        let mut cluster_ips = spec.cluster_ips.clone().unwrap_or_default();
        if cluster_ips.is_empty() {
            cluster_ips.extend(spec.cluster_ip.clone().filter(|ip| !ip.is_empty()));
        }
        Self {
            name: s.metadata.name.clone().unwrap_or_default(),
            step: s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(STEP))
                .and_then(|v| v.parse().ok()),
            type_: spec.type_.clone().unwrap_or_else(|| "ClusterIP".into()),
            local: spec.external_traffic_policy.as_deref() == Some("Local"),
            cluster_ips,
            ports: spec
                .ports
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    (
                        p.port,
                        p.protocol.unwrap_or_else(|| "TCP".into()),
                        p.node_port,
                    )
                })
                .collect(),
            health_check: spec.health_check_node_port,
            ingress: s
                .status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.clone())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|i| i.ip)
                .collect(),
            terminating: s.metadata.deletion_timestamp.is_some(),
        }
    }

    fn is_lb(&self) -> bool {
        self.type_ == "LoadBalancer"
    }

    fn node_ported(&self) -> bool {
        matches!(self.type_.as_str(), "NodePort" | "LoadBalancer")
    }

    fn node_port_of(&self, port: i32, proto: &str) -> Option<Option<i32>> {
        self.ports
            .iter()
            .find(|(p, pr, _)| *p == port && pr == proto)
            .map(|(_, _, n)| *n)
    }
}

/// Checks one observed version of a Service against the previous one seen (same UID). Between
/// them, the controller may only have added values; the churn (whose writes bump `step`) may
/// have made some unnecessary, but never changes one that is still needed.
pub fn compare(prev: &Snapshot, next: &Snapshot) -> Result<(), String> {
    let who = &next.name;
    if !next.cluster_ips.starts_with(&prev.cluster_ips) {
        return Err(format!(
            "{who}: clusterIPs changed {:?} -> {:?}",
            prev.cluster_ips, next.cluster_ips
        ));
    }
    let churn_steps = match (prev.step, next.step) {
        (Some(a), Some(b)) => b.checked_sub(a),
        _ => None,
    };
    match churn_steps {
        Some(0) => {
            for (i, (port, proto, np)) in prev.ports.iter().enumerate() {
                if np.is_some() && next.ports.get(i) != Some(&(*port, proto.clone(), *np)) {
                    return Err(format!(
                        "{who}: node port of {port}/{proto} changed {np:?} -> {:?}",
                        next.ports.get(i)
                    ));
                }
            }
            if prev.health_check.is_some() && next.health_check != prev.health_check {
                return Err(format!(
                    "{who}: healthCheckNodePort changed {:?} -> {:?}",
                    prev.health_check, next.health_check
                ));
            }
        }
        Some(1) => {
            if prev.node_ported() && next.node_ported() {
                for (port, proto, np) in &prev.ports {
                    let Some(held) = np else { continue };
                    if let Some(now) = next.node_port_of(*port, proto) {
                        if now != Some(*held) {
                            return Err(format!(
                                "{who}: node port of {port}/{proto} changed {held} -> {now:?} across a change that kept the port"
                            ));
                        }
                    }
                }
            }
            let local_lb = |s: &Snapshot| s.is_lb() && s.local;
            if local_lb(prev)
                && local_lb(next)
                && prev.health_check.is_some()
                && next.health_check != prev.health_check
            {
                return Err(format!(
                    "{who}: healthCheckNodePort changed {:?} -> {:?} while still LoadBalancer/Local",
                    prev.health_check, next.health_check
                ));
            }
        }
        // Several churn changes in between (a relisted watch): only the ClusterIPs are fixed.
        _ => return Ok(()),
    }
    // A deleted Service's address is released at once (DESIGN: release on delete), while the
    // cleanup finalizer keeps the object until its load balancer is gone.
    if prev.is_lb()
        && next.is_lb()
        && !next.terminating
        && !prev.ingress.is_empty()
        && next.ingress != prev.ingress
    {
        return Err(format!(
            "{who}: LoadBalancer ingress changed {:?} -> {:?}",
            prev.ingress, next.ingress
        ));
    }
    Ok(())
}

/// Watches every Service and records each broken rule of [`compare`].
#[derive(Debug, Default)]
pub struct Tracker {
    by_uid: HashMap<String, Snapshot>,
    pub versions: u64,
    pub violations: Vec<String>,
}

impl Tracker {
    pub fn observe(&mut self, s: &Service) {
        let Some(uid) = s.metadata.uid.clone() else {
            return;
        };
        self.versions += 1;
        let next = Snapshot::of(s);
        if let Some(prev) = self.by_uid.get(&uid) {
            if let Err(e) = compare(prev, &next) {
                self.violations.push(e);
            }
        }
        self.by_uid.insert(uid, next);
    }

    pub fn forget(&mut self, s: &Service) {
        if let Some(uid) = &s.metadata.uid {
            self.by_uid.remove(uid);
        }
    }
}

/// Runs the watch until `stop`; watch errors (injected faults) just restart it.
pub async fn track(client: Client, tracker: Arc<Mutex<Tracker>>, stop: Arc<AtomicBool>) {
    let stream = watcher(Api::<Service>::all(client), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while !stop.load(Ordering::Relaxed) {
        let next = tokio::time::timeout(std::time::Duration::from_millis(200), stream.next()).await;
        let Ok(Some(event)) = next else { continue };
        let Ok(event) = event else { continue };
        let mut t = tracker.lock().unwrap();
        match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) => t.observe(&s),
            watcher::Event::Delete(s) => t.forget(&s),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }
}

/// What the final state holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Holdings {
    pub services: usize,
    pub cluster_ips: usize,
    pub node_ports: usize,
    pub lb_ips: usize,
    pub shared_lb_ips: usize,
}

/// Whether `ip` lies in one of the pool's `a-b` ranges (the only form the churn's pools use).
fn in_pool(pool: &IPPool, ip: IpAddr) -> bool {
    pool.spec.addresses.iter().any(|a| {
        a.split_once('-')
            .and_then(|(lo, hi)| Some((lo.parse::<IpAddr>().ok()?, hi.parse::<IpAddr>().ok()?)))
            .is_some_and(|(lo, hi)| lo <= ip && ip <= hi)
    })
}

/// IPv4 addresses in the pool's `a-b` ranges.
fn v4_size(pool: &IPPool) -> i64 {
    pool.spec
        .addresses
        .iter()
        .filter_map(|a| {
            let (lo, hi) = a.split_once('-')?;
            let lo: std::net::Ipv4Addr = lo.parse().ok()?;
            let hi: std::net::Ipv4Addr = hi.parse().ok()?;
            Some(i64::from(u32::from(hi)) - i64::from(u32::from(lo)) + 1)
        })
        .sum()
}

/// Every rule of the final state, as one error naming the first broken one.
pub fn check_final(services: &[Service], pools: &[IPPool]) -> Result<Holdings, String> {
    let mut h = Holdings {
        services: services.len(),
        ..Holdings::default()
    };
    let mut cluster_owner: BTreeMap<&str, &str> = BTreeMap::new();
    let mut port_owner: BTreeMap<i32, &str> = BTreeMap::new();
    let mut lb_owners: BTreeMap<String, Vec<&Service>> = BTreeMap::new();
    let snaps: Vec<Snapshot> = services.iter().map(Snapshot::of).collect();
    for (svc, s) in services.iter().zip(&snaps) {
        let who = s.name.as_str();
        let p = index_of(who).map(profile);
        let cond = svc
            .status
            .as_ref()
            .and_then(|st| st.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "berth.dev/Allocated"));
        if cond.map(|c| c.status.as_str()) != Some("True") {
            return Err(format!("{who}: Allocated condition is {cond:?}"));
        }
        let want_ips = match p.as_ref().and_then(|p| p.dual_stack) {
            Some(_) => 2,
            None => 1,
        };
        if s.cluster_ips.len() != want_ips {
            return Err(format!("{who}: clusterIPs {:?}", s.cluster_ips));
        }
        if let Some(want) = p.as_ref().and_then(|p| p.cluster_ip) {
            if s.cluster_ips[0] != want.to_string() {
                return Err(format!(
                    "{who}: asked for {want}, holds {:?}",
                    s.cluster_ips
                ));
            }
        }
        for ip in &s.cluster_ips {
            if let Some(other) = cluster_owner.insert(ip, who) {
                return Err(format!("ClusterIP {ip} held by {other} and {who}"));
            }
        }
        h.cluster_ips += s.cluster_ips.len();
        if s.node_ported() {
            let mut mine: BTreeMap<i32, BTreeSet<&str>> = BTreeMap::new();
            for (port, proto, np) in &s.ports {
                let np = np.ok_or(format!("{who}: {port}/{proto} has no node port"))?;
                if !mine.entry(np).or_default().insert(proto) {
                    return Err(format!("{who}: node port {np} twice for {proto}"));
                }
            }
            if s.is_lb() && s.local {
                let hc = s.health_check.ok_or(format!(
                    "{who}: LoadBalancer/Local without healthCheckNodePort"
                ))?;
                if mine.insert(hc, BTreeSet::new()).is_some() {
                    return Err(format!(
                        "{who}: healthCheckNodePort {hc} is also a node port"
                    ));
                }
            }
            for np in mine.keys() {
                if let Some(other) = port_owner.insert(*np, who) {
                    return Err(format!("node port {np} held by {other} and {who}"));
                }
            }
        }
        if s.is_lb() {
            if s.ingress.len() != want_ips {
                return Err(format!("{who}: ingress {:?}", s.ingress));
            }
            if let Some(want) = p.as_ref().and_then(|p| p.lb_ip) {
                if s.ingress != [want.to_string()] {
                    return Err(format!("{who}: asked for {want}, ingress {:?}", s.ingress));
                }
            }
            for ip in &s.ingress {
                lb_owners.entry(ip.clone()).or_default().push(svc);
            }
        } else if !s.ingress.is_empty() {
            return Err(format!(
                "{who} is {} but has ingress {:?}",
                s.type_, s.ingress
            ));
        }
    }
    h.node_ports = port_owner.len();
    for (ip, owners) in &lb_owners {
        if owners.len() > 1 {
            check_sharing(ip, owners)?;
            h.shared_lb_ips += 1;
        }
    }
    h.lb_ips = lb_owners.len();
    for pool in pools {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let held: Vec<IpAddr> = lb_owners
            .keys()
            .filter_map(|ip| ip.parse().ok())
            .filter(|ip| in_pool(pool, *ip))
            .collect();
        let v4 = held.iter().filter(|ip| ip.is_ipv4()).count() as i64;
        let v6 = held.len() as i64 - v4;
        let status = pool
            .status
            .clone()
            .ok_or(format!("pool {name}: no status"))?;
        if (status.assigned_ipv4, status.assigned_ipv6) != (v4, v6) {
            return Err(format!(
                "pool {name}: status says {}+{} assigned, live Services hold {v4}+{v6}",
                status.assigned_ipv4, status.assigned_ipv6
            ));
        }
        if status.available_ipv4 != v4_size(pool) - v4 {
            return Err(format!(
                "pool {name}: status says {} IPv4 available, expected {}",
                status.available_ipv4,
                v4_size(pool) - v4
            ));
        }
    }
    Ok(h)
}

/// Several Services on one LoadBalancer IP: the same sharing key, Cluster policy, and ports that
/// do not overlap per protocol.
fn check_sharing(ip: &str, owners: &[&Service]) -> Result<(), String> {
    let mut ports: BTreeSet<(i32, String)> = BTreeSet::new();
    for svc in owners {
        let s = Snapshot::of(svc);
        let key = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SHARING_KEY));
        if key.map(String::as_str) != Some("shared") || s.local {
            return Err(format!(
                "LoadBalancer IP {ip} held by {} Services, {} may not share it",
                owners.len(),
                s.name
            ));
        }
        for (port, proto, _) in &s.ports {
            if !ports.insert((*port, proto.clone())) {
                return Err(format!("LoadBalancer IP {ip}: {port}/{proto} used twice"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn mk_svc(name: &str, step: u64, spec: Value, ingress: &[&str]) -> Service {
        let ingress: Vec<Value> = ingress.iter().map(|ip| json!({"ip": ip})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": name, "annotations": {STEP: step.to_string()}},
            "spec": spec,
            "status": {
                "loadBalancer": {"ingress": ingress},
                "conditions": [{"type": "berth.dev/Allocated", "status": "True", "reason": "Allocated",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            },
        }))
        .unwrap()
    }

    fn lb(np: i32) -> Value {
        json!({"type": "LoadBalancer", "clusterIPs": ["10.96.1.1"],
            "ports": [{"port": 80, "protocol": "TCP", "nodePort": np}]})
    }

    fn snap(step: u64, spec: Value, ingress: &[&str]) -> Snapshot {
        Snapshot::of(&mk_svc("svc-1", step, spec, ingress))
    }

    #[test]
    fn the_controller_alone_may_only_add() {
        let before = snap(1, lb(30001), &["198.18.0.1"]);
        assert!(compare(&before, &snap(1, lb(30001), &["198.18.0.1"])).is_ok());
        assert!(compare(&before, &snap(1, lb(30002), &["198.18.0.1"])).is_err());
        assert!(compare(&before, &snap(1, lb(30001), &["198.18.0.2"])).is_err());
        assert!(compare(&before, &snap(1, lb(30001), &[])).is_err());
        let mut moved = lb(30001);
        moved["clusterIPs"] = json!(["10.96.1.2"]);
        assert!(compare(&before, &snap(1, moved, &["198.18.0.1"])).is_err());
        let mut dual = lb(30001);
        dual["clusterIPs"] = json!(["10.96.1.1", "fd00:96::1"]);
        assert!(compare(&before, &snap(1, dual, &["198.18.0.1"])).is_ok());
    }

    #[test]
    fn a_deleted_service_held_by_its_cleanup_finalizer_may_lose_its_address() {
        let before = snap(1, lb(30001), &["198.18.0.1"]);
        let mut deleting = serde_json::to_value(mk_svc("svc-1", 1, lb(30001), &[])).unwrap();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-28T10:00:00Z");
        let deleting = Snapshot::of(&serde_json::from_value(deleting).unwrap());
        assert!(deleting.terminating);
        assert!(compare(&before, &deleting).is_ok());
        // Its ClusterIP is still fixed.
        let mut moved = serde_json::to_value(mk_svc("svc-1", 1, lb(30001), &[])).unwrap();
        moved["metadata"]["deletionTimestamp"] = json!("2026-11-28T10:00:00Z");
        moved["spec"]["clusterIPs"] = json!(["10.96.1.2"]);
        assert!(compare(
            &before,
            &Snapshot::of(&serde_json::from_value(moved).unwrap())
        )
        .is_err());
    }

    #[test]
    fn one_churn_change_may_drop_only_what_it_made_unnecessary() {
        let before = snap(1, lb(30001), &["198.18.0.1"]);
        let cluster_ip = json!({"type": "ClusterIP", "clusterIPs": ["10.96.1.1"],
            "ports": [{"port": 80, "protocol": "TCP"}]});
        assert!(compare(&before, &snap(2, cluster_ip, &[])).is_ok());
        let node_port = json!({"type": "NodePort", "clusterIPs": ["10.96.1.1"],
            "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30001}]});
        assert!(compare(&before, &snap(2, node_port.clone(), &[])).is_ok());
        let mut renumbered = node_port;
        renumbered["ports"][0]["nodePort"] = json!(30002);
        assert!(compare(&before, &snap(2, renumbered.clone(), &[])).is_err());
        // Several churn changes in between: only the ClusterIPs are fixed.
        assert!(compare(&before, &snap(4, renumbered, &[])).is_ok());
        assert!(compare(&before, &snap(2, lb(30001), &["198.18.0.9"])).is_err());
    }

    #[test]
    fn final_state_rules() {
        let svc = |name: &str, cip: &str, np: i32, ip: &str| {
            let mut spec = lb(np);
            spec["clusterIPs"] = json!([cip]);
            mk_svc(name, 1, spec, &[ip])
        };
        let a = svc("svc-1200", "10.96.1.1", 30001, "198.18.0.1");
        let b = svc("svc-1201", "10.96.1.2", 30002, "198.18.0.2");
        let h = check_final(&[a.clone(), b], &[]).unwrap();
        assert_eq!((h.cluster_ips, h.node_ports, h.lb_ips), (2, 2, 2));
        let same_port = svc("svc-1201", "10.96.1.2", 30001, "198.18.0.2");
        assert!(check_final(&[a.clone(), same_port], &[]).is_err());
        let same_ip = svc("svc-1201", "10.96.1.2", 30002, "198.18.0.1");
        assert!(check_final(&[a.clone(), same_ip], &[]).is_err());
        // TCP and UDP of one Service may share a node port.
        let mut both = lb(30003);
        both["ports"] = json!([{"port": 53, "protocol": "UDP", "nodePort": 30003},
            {"port": 53, "protocol": "TCP", "nodePort": 30003}]);
        both["clusterIPs"] = json!(["10.96.1.3"]);
        let c = mk_svc("svc-1202", 1, both, &["198.18.0.3"]);
        assert!(check_final(&[a, c], &[]).is_ok());
    }
}
