//! The allocation decision for one Service, as a pure function over the allocators: what to
//! fill into empty spec fields, what the load-balancer ingress should be, and the
//! `berth.dev/Allocated` condition. No I/O; the caller writes the answer.
//!
//! Stages run in the API server's order — ClusterIPs, node ports, LoadBalancer IPs — and
//! the first failure stops the later stages: a Service the API server would have rejected
//! gets nothing new beyond what earlier stages already gave it, and its failure is reported
//! once. Each allocator call is all-or-nothing, so a failed stage changes nothing.

use super::cleanup::{plan_cleanup_finalizer, FinalizerChange};
use std::net::IpAddr;

use berth_api::names::condition::reason;
use berth_core::{IpFamily, IpFamilyPolicy, Labels, PortRange};
use berth_ipam::{
    plan_cluster_ips, ClusterIpAllocator, Error as IpamError, LbIpAllocator, NodePortAllocator,
    NodePortRequest, ServiceKey,
};
use ipnet::IpNet;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::allocation::facts::{LbClass, ServiceFacts, ServiceType, StaleNodePorts};

/// The three allocators, owned by the one task that writes.
#[derive(Debug)]
pub struct Allocators {
    pub cluster: ClusterIpAllocator<ServiceKey>,
    pub ports: NodePortAllocator<ServiceKey>,
    pub lb: LbIpAllocator<ServiceKey>,
}

impl Allocators {
    /// Empty allocators over the service CIDRs and node-port range; `seed` makes the random
    /// picks reproducible.
    pub fn new(cidrs: &[IpNet], range: PortRange, seed: u64) -> Result<Self, IpamError> {
        Ok(Self {
            cluster: ClusterIpAllocator::new(cidrs, SmallRng::seed_from_u64(seed))?,
            ports: NodePortAllocator::new(range, SmallRng::seed_from_u64(seed.wrapping_add(1))),
            lb: LbIpAllocator::new(),
        })
    }

    /// Forgets everything `owner` holds (the Service was deleted).
    pub fn release_all(&mut self, owner: &ServiceKey) -> bool {
        let a = self.cluster.release_owner(owner);
        let b = self.ports.release_owner(owner);
        let c = self.lb.release_owner(owner);
        !(a.is_empty() && b.is_empty() && c.is_empty())
    }
}

/// Values for spec fields that are empty on the Service; berth never changes a set value,
/// except to drop node ports a type change left unused, as the API server does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecFill {
    /// The full `spec.clusterIPs` (the set ones first, unchanged); `spec.clusterIP` is the first.
    pub cluster_ips: Option<Vec<IpAddr>>,
    pub ip_families: Option<Vec<IpFamily>>,
    pub ip_family_policy: Option<IpFamilyPolicy>,
    /// Per `spec.ports` index: a node port for an entry that has none.
    pub node_ports: Vec<Option<u16>>,
    pub health_check_node_port: Option<u16>,
    /// Drop `spec.clusterIP(s)`, `spec.ipFamilies` and `spec.ipFamilyPolicy`: an ExternalName
    /// Service has none.
    pub drop_cluster_ips: bool,
    /// Drop `spec.healthCheckNodePort`: the type no longer uses it.
    pub drop_health_check_node_port: bool,
    /// Drop every `spec.ports[].nodePort`: the type no longer uses them.
    pub drop_node_ports: bool,
}

impl SpecFill {
    pub fn is_empty(&self) -> bool {
        self.cluster_ips.is_none()
            && self.ip_families.is_none()
            && self.ip_family_policy.is_none()
            && self.node_ports.iter().all(Option::is_none)
            && self.health_check_node_port.is_none()
            && !self.drop_cluster_ips
            && !self.drop_health_check_node_port
            && !self.drop_node_ports
    }
}

/// Why allocation failed: a bounded reason (condition, metric label) and the message (the
/// API server's words where it has them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
}

impl Failure {
    fn from_ipam(e: &IpamError) -> Self {
        Self {
            reason: failure_reason(e),
            message: e.to_string(),
        }
    }
}

/// The outcome for one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub fill: SpecFill,
    /// The desired `status.loadBalancer.ingress` addresses; `None` leaves the status alone
    /// (not berth's to write). `Some(empty)` clears it.
    pub ingress: Option<Vec<IpAddr>>,
    /// `None` when berth allocates nothing for the Service (ExternalName).
    pub result: Option<Result<(), Failure>>,
    /// LoadBalancer IPs newly given in this decision, for an `IPAllocated` Event.
    pub new_lb_ips: Vec<IpAddr>,
    /// The Service kept addresses its pools no longer give it (see [`plan_service_keeping`]).
    pub kept: Option<Kept>,
    /// The load-balancer cleanup finalizer to add or remove (see [`super::cleanup`]).
    pub finalizer: Option<FinalizerChange>,
}

/// Why a Service kept LoadBalancer addresses the pools as they are would not give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// An address lies in no IPPool any more.
    PoolGone,
    /// The Service names an IPPool that does not exist.
    PoolNotFound { pool: String },
}

/// The condition reason for an allocator error.
pub fn failure_reason(e: &IpamError) -> &'static str {
    match e {
        IpamError::IpAlreadyAllocated { .. } => reason::IP_ALREADY_ALLOCATED,
        IpamError::PortAlreadyAllocated { .. } | IpamError::HealthCheckPort { .. } => {
            reason::PORT_ALREADY_ALLOCATED
        }
        IpamError::NotAllowedByConfig { .. } => reason::NOT_IN_ANY_POOL,
        IpamError::UnknownPool { .. } => reason::POOL_NOT_FOUND,
        IpamError::PoolNotCompatible { .. } | IpamError::IpNotInPool { .. } => {
            reason::POOL_NOT_ADMITTING
        }
        IpamError::NoAvailableIps { .. } => reason::NO_AVAILABLE_POOL,
        IpamError::IpRangeFull { .. }
        | IpamError::PortRangeFull
        | IpamError::HealthCheckPortRangeFull
        | IpamError::PoolExhausted { .. } => reason::RANGE_FULL,
        IpamError::CannotShare { .. } | IpamError::PortInUse { .. } => reason::SHARING_CONFLICT,
        _ => reason::INVALID_REQUEST,
    }
}

/// Decides and records one Service's allocations. `ns_labels` are its Namespace's labels
/// (for pools restricted by namespace selector). Addresses the pools no longer give the
/// Service are replaced (see [`plan_service_keeping`]).
pub fn plan_service(alloc: &mut Allocators, f: &ServiceFacts, ns_labels: &Labels) -> Allocation {
    plan_service_keeping(alloc, f, ns_labels, Keep::default())
}

/// What a Service may keep of the addresses it holds when the pools as they are would not
/// give them to it (see [`plan_service_keeping`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// A pool change took them away (an address left every pool, or the pools containing it
    /// no longer give it to the Service), and the Service has not changed since.
    pub pool_gone: bool,
    /// The Service names a pool that does not exist.
    pub pool_not_found: bool,
}

/// [`plan_service`], where `keep` lets an l2 Service keep the addresses it holds when the
/// pools as they are would not give them to it — after a pool change, or because the pool it
/// names does not exist: the ingress stays, the result is a failure saying why (`PoolGone`,
/// `PoolNotFound`) and `kept` is set. Whether a Service may keep them (a pool change took
/// them, it has not changed since, its grace has not run out) is the caller's to say.
pub fn plan_service_keeping(
    alloc: &mut Allocators,
    f: &ServiceFacts,
    ns_labels: &Labels,
    keep: Keep,
) -> Allocation {
    let owner = &f.key;
    let mut out = Allocation {
        fill: SpecFill::default(),
        ingress: None,
        result: Some(Ok(())),
        new_lb_ips: Vec::new(),
        kept: None,
        finalizer: plan_cleanup_finalizer(&f.lb_class, f.cleanup, f.has_ingress),
    };
    if !f.problems.is_empty() {
        // What the Service holds stays held: an unreadable edit must not free its addresses
        // for someone else.
        out.result = Some(Err(Failure {
            reason: reason::INVALID_REQUEST,
            message: f.problems.join("; "),
        }));
        return out;
    }
    if f.type_ == ServiceType::ExternalName {
        let had_lb = !alloc.lb.ips_of(owner).is_empty();
        alloc.release_all(owner);
        hold_stale_cluster_ips(alloc, f, &mut out.fill);
        hold_stale_node_ports(alloc, f, &mut out.fill);
        out.ingress = clear_ingress(alloc, f, had_lb);
        out.result = None;
        return out;
    }

    let families = match plan_cluster_stage(alloc, f, &mut out.fill) {
        Ok(families) => families,
        Err(e) => {
            out.result = Some(Err(Failure::from_ipam(&e)));
            return out;
        }
    };
    if let Err(e) = plan_node_port_stage(alloc, f, &mut out.fill) {
        out.result = Some(Err(Failure::from_ipam(&e)));
        return out;
    }

    match f.lb_class {
        LbClass::L2 => {
            let mut view = f.lb_view.clone();
            view.namespace_labels = ns_labels.clone();
            // The families just decided, so a dual-stack Service gets both addresses in
            // one pass, before its spec says so.
            view.families = families;
            let before = alloc.lb.ips_of(owner);
            if before.is_empty() && !f.ingress_ips.is_empty() {
                // Status written by an earlier run that this one has not adopted yet (a
                // Service first seen after startup); a refusal just means a new address.
                let adopted = alloc.lb.adopt(owner, &view, &f.ingress_ips);
                if keep.pool_gone && matches!(adopted, Err(IpamError::NotAllowedByConfig { .. })) {
                    // In no pool: kept below, as if its pool had gone while this ran.
                    let _ = alloc.lb.keep(owner, &view, &f.ingress_ips);
                }
            }
            if let Some(kept) = kept_by(alloc, owner, &view, keep) {
                let held = alloc.lb.ips_of(owner);
                let (reason, message) = match &kept {
                    Kept::PoolGone => (
                        reason::POOL_GONE,
                        format!(
                            "{} is in no IPPool any more; the Service keeps it",
                            ip_texts(&held)
                        ),
                    ),
                    Kept::PoolNotFound { pool } => (
                        reason::POOL_NOT_FOUND,
                        format!(
                            "IPPool {pool:?} not found; the Service keeps {}",
                            ip_texts(&held)
                        ),
                    ),
                };
                out.ingress = Some(held);
                out.result = Some(Err(Failure { reason, message }));
                out.kept = Some(kept);
                return out;
            }
            match alloc.lb.assign(owner, &view) {
                Ok(ips) => {
                    out.new_lb_ips = ips
                        .iter()
                        .filter(|ip| !f.ingress_ips.contains(ip))
                        .copied()
                        .collect();
                    out.ingress = Some(ips);
                }
                Err(e) => {
                    // Not kept (see `plan_service_keeping`): an address no pool contains any
                    // more, or one held while the Service names a pool that does not exist,
                    // is given up rather than kept for lack of a new one.
                    let held = alloc.lb.ips_of(owner);
                    if matches!(e, IpamError::UnknownPool { .. })
                        || held.iter().any(|ip| alloc.lb.pool_of(*ip).is_none())
                    {
                        alloc.lb.release_owner(owner);
                    }
                    out.ingress = Some(alloc.lb.ips_of(owner));
                    out.result = Some(Err(Failure::from_ipam(&e)));
                }
            }
        }
        LbClass::AwsNlb | LbClass::Foreign => {
            alloc.lb.release_owner(owner);
        }
        LbClass::None => {
            let had = !alloc.lb.release_owner(owner).is_empty();
            out.ingress = clear_ingress(alloc, f, had);
        }
    }
    out
}

/// Why the Service keeps what it holds although `assign` would not give it that now, as
/// `keep` allows; `None` when assigning keeps what it holds, or may move it.
fn kept_by(
    alloc: &mut Allocators,
    owner: &ServiceKey,
    view: &berth_ipam::ServiceView,
    keep: Keep,
) -> Option<Kept> {
    if keep == Keep::default() {
        return None;
    }
    let held = alloc.lb.ips_of(owner);
    if held.is_empty() {
        return None;
    }
    match alloc.lb.check(owner, view) {
        Ok(ips) if ips == held => None,
        // The pools changed, not the Service (even when the pool it names is the one gone).
        _ if keep.pool_gone => Some(Kept::PoolGone),
        Err(IpamError::UnknownPool { pool }) if keep.pool_not_found => {
            Some(Kept::PoolNotFound { pool })
        }
        _ => None,
    }
}

/// Whether the pools as they are would still give `f` what it holds (what a decision keeps
/// without keeping anything back). False for a Service with problems or no l2 address.
pub fn pools_give_held(alloc: &mut Allocators, f: &ServiceFacts, ns_labels: &Labels) -> bool {
    let held = alloc.lb.ips_of(&f.key);
    if held.is_empty() || !f.problems.is_empty() || f.lb_class != LbClass::L2 {
        return true;
    }
    let mut view = f.lb_view.clone();
    view.namespace_labels = ns_labels.clone();
    if let Ok(plan) = plan_cluster_ips(&f.cluster_ips, alloc.cluster.families()) {
        view.families = plan.families;
    }
    alloc.lb.check(&f.key, &view).is_ok_and(|ips| ips == held)
}

fn ip_texts(ips: &[IpAddr]) -> String {
    let texts: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    texts.join(", ")
}

/// Clears the ingress of a Service berth no longer serves, when the addresses there were
/// berth's (held until now, from one of its pools, or written under berth's `Allocated`
/// condition); someone else's status stays.
fn clear_ingress(alloc: &Allocators, f: &ServiceFacts, had_lb: bool) -> Option<Vec<IpAddr>> {
    if f.lb_class == LbClass::Foreign || !f.has_ingress {
        return None;
    }
    let ours = had_lb
        || f.allocated_by_berth
        || f.ingress_ips
            .iter()
            .any(|ip| alloc.lb.pool_of(*ip).is_some());
    ours.then(Vec::new)
}

fn plan_cluster_stage(
    alloc: &mut Allocators,
    f: &ServiceFacts,
    fill: &mut SpecFill,
) -> Result<Vec<IpFamily>, IpamError> {
    let plan = plan_cluster_ips(&f.cluster_ips, alloc.cluster.families())?;
    let ips = alloc.cluster.allocate_plan(&f.key, &plan)?;
    if !ips.is_empty() && (ips != f.cluster_ips.cluster_ips || f.cluster_ips_unset) {
        fill.cluster_ips = Some(ips);
    }
    if f.families_unset {
        fill.ip_families = Some(plan.families.clone());
        fill.ip_family_policy = Some(plan.policy);
    }
    Ok(plan.families)
}

fn plan_node_port_stage(
    alloc: &mut Allocators,
    f: &ServiceFacts,
    fill: &mut SpecFill,
) -> Result<(), IpamError> {
    let req = &f.node_ports;
    if req.ports.is_empty() && req.health_check.is_none() {
        alloc.ports.release_owner(&f.key);
        hold_stale_node_ports(alloc, f, fill);
        return Ok(());
    }
    let held = alloc.ports.ports_of(&f.key);
    let got = alloc.ports.assign_service(
        &f.key,
        &with_held_node_ports(req, &held, &f.stale_node_ports),
    )?;
    fill.node_ports = req
        .ports
        .iter()
        .zip(&got.node_ports)
        .map(|(asked, given)| {
            if asked.node_port.is_none() {
                *given
            } else {
                None
            }
        })
        .collect();
    if req.health_check == Some(None) {
        fill.health_check_node_port = got.health_check_node_port;
    }
    hold_stale_node_ports(alloc, f, fill);
    Ok(())
}

/// `req` with the node ports the Service holds and its spec does not name given to its
/// unnamed entries (one per Service port: the others share it) and to an unnamed
/// healthCheckNodePort, before any new one is picked. Held and unnamed, they were given by an
/// earlier decision whose write may have landed though it failed (a timeout): picked anew,
/// they would be freed while the Service may name them. It also keeps a Service's node ports
/// across an edit that leaves them out, as the API server does. Ports the type no longer
/// uses are not reused: they are being dropped.
pub fn with_held_node_ports(
    req: &NodePortRequest,
    held: &[u16],
    stale: &StaleNodePorts,
) -> NodePortRequest {
    let mut out = req.clone();
    let named: Vec<u16> = req
        .ports
        .iter()
        .filter_map(|p| p.node_port)
        .chain(req.health_check.flatten())
        .chain(stale.all())
        .collect();
    let mut spare = held.iter().copied().filter(|p| !named.contains(p));
    if req.allocate_node_ports {
        let mut served: Vec<u16> = req
            .ports
            .iter()
            .filter(|p| p.node_port.is_some())
            .map(|p| p.port)
            .collect();
        for p in out.ports.iter_mut() {
            if p.node_port.is_some() || served.contains(&p.port) {
                continue;
            }
            let Some(port) = spare.next() else {
                break;
            };
            p.node_port = Some(port);
            served.push(p.port);
        }
    }
    if out.health_check == Some(None) {
        if let Some(port) = spare.next() {
            out.health_check = Some(Some(port));
        }
    }
    out
}

/// Keeps the ClusterIPs an ExternalName Service still names, and asks for them to be dropped
/// from the spec, as a real apiserver drops them on the change to ExternalName; freed by the
/// first decision that no longer sees them named. Freed at once, another Service could be
/// given one while this spec still names it, and a change back to ClusterIP would claim it
/// again and be refused for good.
fn hold_stale_cluster_ips(alloc: &mut Allocators, f: &ServiceFacts, fill: &mut SpecFill) {
    if f.stale_cluster_ips.is_empty() {
        return;
    }
    for ip in &f.stale_cluster_ips {
        // Refused: another Service holds it (adopted before this stale claim); the write
        // below drops it from this spec all the same.
        let _ = alloc.cluster.adopt(&f.key, *ip);
    }
    fill.drop_cluster_ips = true;
}

/// Keeps the node ports the spec still names after a type change stopped using them, and
/// asks for them to be dropped from the spec; they are freed by the first decision that no
/// longer sees them named. Freed at once, another Service could be given one while this
/// spec still names it: after a crash the next leader adopts both claims, and a change back
/// to the old type claims it again, so one of the two Services is refused for good.
fn hold_stale_node_ports(alloc: &mut Allocators, f: &ServiceFacts, fill: &mut SpecFill) {
    let stale = &f.stale_node_ports;
    if stale.is_empty() {
        return;
    }
    for port in stale.all() {
        // Refused: another Service holds it (adopted before this stale claim, or out of
        // range); the write below drops it from this spec all the same.
        let _ = alloc.ports.adopt(&f.key, port);
    }
    fill.drop_health_check_node_port = stale.health_check.is_some();
    fill.drop_node_ports = !stale.ports.is_empty();
}

/// Records the values existing Services already hold, oldest first (docs/architecture.md), before
/// anything is assigned. Returns the refused claims, younger Service first in each pair's
/// order of discovery; those Services get their condition when they are reconciled.
///
/// Node ports still named by a Service whose type no longer uses them, and ClusterIPs still
/// named by an ExternalName Service, are held the same way, after every live claim (see
/// `hold_stale_node_ports`, `hold_stale_cluster_ips`).
///
/// Addresses still named by a Service that is no longer a LoadBalancer (its status was not
/// cleared before the last leader stopped) are held too, after every live claim, until the
/// clearing write lands: handed out at once, they would be named by two Services, and a
/// change back to LoadBalancer before the clear would bring the old one back as a claim.
pub fn adopt_all<'a>(
    alloc: &mut Allocators,
    services: impl IntoIterator<Item = (&'a ServiceFacts, &'a Labels)>,
) -> Vec<(ServiceKey, IpamError)> {
    let mut sorted: Vec<(&ServiceFacts, &Labels)> = services.into_iter().collect();
    sorted.sort_by(|a, b| (&a.0.created, &a.0.key).cmp(&(&b.0.created, &b.0.key)));
    let mut refused = Vec::new();
    for &(f, ns_labels) in &sorted {
        if !f.problems.is_empty() || f.type_ == ServiceType::ExternalName {
            continue;
        }
        let owner = &f.key;
        for ip in &f.cluster_ips.cluster_ips {
            if let Err(e) = alloc.cluster.adopt(owner, *ip) {
                refused.push((owner.clone(), e));
            }
        }
        let np = &f.node_ports;
        let hc = np.health_check.flatten();
        for port in np.ports.iter().filter_map(|p| p.node_port).chain(hc) {
            if let Err(e) = alloc.ports.adopt(owner, port) {
                refused.push((owner.clone(), e));
            }
        }
        if f.lb_class == LbClass::L2 && !f.ingress_ips.is_empty() {
            let mut view = f.lb_view.clone();
            view.namespace_labels = ns_labels.clone();
            let adopted = match alloc.lb.adopt(owner, &view, &f.ingress_ips) {
                // In no pool (its pool went away): the Service keeps it, as it would have
                // had this leader seen the pool go.
                Err(IpamError::NotAllowedByConfig { .. }) => {
                    alloc.lb.keep(owner, &view, &f.ingress_ips)
                }
                other => other,
            };
            if let Err(e) = adopted {
                refused.push((owner.clone(), e));
            }
        }
    }
    for (f, _) in &sorted {
        if f.problems.is_empty() {
            for port in f.stale_node_ports.all() {
                // Refused: a live claim holds it, and this stale one is dropped anyway.
                let _ = alloc.ports.adopt(&f.key, port);
            }
            for ip in &f.stale_cluster_ips {
                // Refused: likewise.
                let _ = alloc.cluster.adopt(&f.key, *ip);
            }
        }
    }
    for (f, ns_labels) in &sorted {
        if f.lb_class == LbClass::None && !f.ingress_ips.is_empty() && f.problems.is_empty() {
            let mut view = f.lb_view.clone();
            view.namespace_labels = (*ns_labels).clone();
            // Refused: someone live holds it, and this stale claim is cleared anyway.
            let _ = alloc.lb.adopt(&f.key, &view, &f.ingress_ips);
        }
    }
    refused
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
