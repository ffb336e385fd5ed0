//! The allocation state machine: everything the single writer knows and decides, with no
//! client, no runtime and no clock of its own. The loop around it (`worker`) feeds it watch
//! events (`observe`), asks it for the next write (`decide`), hands it the write's outcome
//! (`done`) and tells it the time; everything it returns is plain data.
//!
//! Per Service it keeps at most one [`ServiceState`] (waiting for a value, dropping values),
//! and two rooms keep their own data behind private fields: `held` (what the Service holds
//! beyond what its object names: addresses until their clearing write lands, what the write in
//! flight would newly name, what refused writes would have named) and `kept` (addresses the
//! pools no longer give it, with their grace). A release removes all of it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use berth_api::names::condition::reason;
use berth_api::IPPool;
use berth_core::Labels;
use berth_ipam::{PoolSpec, ServiceKey};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::watcher;

use super::cache::Cache;
use super::cluster_addresses::{build_cluster_addresses, excluded_ranges, ClusterAddress};
use super::facts::{read_service, LbClass, ServiceFacts};
use super::fresh::{compute_fresh, Holding};
use super::held::ledger::Held;
use super::kept::keepers::{event_reason, Keepers};
use super::plan::{adopt_all, plan_service_keeping, Allocators, Keep};
use super::pools::build_pool_specs;
use super::queue::Queue;
use super::service_cidrs::{all_service_cidrs, service_ranges};
use super::write::{
    build_conditions, build_spec_patch, ingress_differs, JobOutcome, WriteJob, WrittenSpec,
};
use crate::config::ControllerConfig;
use crate::error::ErrorCategory;
use crate::load_balancer::eligible_nodes;
use crate::metrics::{Metrics, ReconcileTimer};
use crate::Error;

/// One watch event of a kind the state machine follows.
// Not boxed: an event is moved once, from the watch into `observe`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Observed {
    Service(watcher::Event<Arc<Service>>),
    Pool(watcher::Event<IPPool>),
    Namespace(watcher::Event<Namespace>),
    Node(watcher::Event<Node>),
    ServiceCidr(watcher::Event<ServiceCIDR>),
}

/// What the state machine keeps of one Service besides its cached object, the values the
/// allocators hold for it, what it holds beyond what its object names (`held`) and what it keeps
/// that the pools no longer give it (`kept`). Absent (the default) for most Services.
#[derive(Debug, Default)]
pub(crate) struct ServiceState {
    /// Its last decision failed for want of a value: it is decided again whenever a value is
    /// let go.
    pub(crate) waiting: bool,
    /// Its spec write drops values its type no longer uses (node ports, an ExternalName
    /// Service's ClusterIPs), or its status write clears an address its cleanup finalizer
    /// waits for: decided again once it lands, which frees them or removes the finalizer (the
    /// write's echo alone would not be decided).
    pub(crate) dropping: bool,
}

impl ServiceState {
    fn is_idle(&self) -> bool {
        let Self { waiting, dropping } = self;
        !waiting && !dropping
    }
}

/// The single writer's state: the allocators, the objects they are decided from, the queue,
/// and one [`ServiceState`] per Service that needs one.
pub(crate) struct AllocationState {
    default_class: Option<&'static str>,
    max_in_flight: usize,
    pub(super) metrics: Metrics,
    pub(super) alloc: Allocators,
    pub(super) services: HashMap<ServiceKey, Arc<Service>>,
    pub(super) svc_buffer: Option<HashMap<ServiceKey, Arc<Service>>>,
    pub(super) svc_synced: bool,
    pub(super) pools: Cache<IPPool>,
    pub(super) pool_problems: BTreeMap<String, String>,
    pub(super) namespaces: Cache<Namespace>,
    pub(super) nodes: Cache<Node>,
    pub(super) started: bool,
    pub(super) queue: Queue,
    pub(super) states: HashMap<ServiceKey, ServiceState>,
    /// Services whose writes are in flight.
    in_flight: usize,
    /// The pool statuses may differ from the counts: the loop is to compute them soon.
    pool_status_wanted: bool,
    pub(super) pools_in_flight: HashSet<String>,
    /// Deleted Services whose provider state is to be cleaned up.
    cleanups: Vec<ServiceKey>,
    /// What Services hold beyond what their objects name (`held`).
    pub(super) held: Held,
    /// The Services keeping addresses the pools no longer give them (`kept`).
    pub(super) keepers: Keepers,
    /// The pools installed last, to name the pool an address was in once it is gone.
    pool_specs: Vec<PoolSpec>,
    /// `--service-cidr` and `--reserved-addresses`, part of the cluster's own addresses (with
    /// every ServiceCIDR object's).
    service_cidrs: Vec<ipnet::IpNet>,
    /// The cluster's ServiceCIDR objects, where it serves the kind (`None`: `--service-cidr`
    /// alone).
    pub(super) service_cidr_objects: Option<Cache<ServiceCIDR>>,
    reserved: Vec<berth_core::AddressRange>,
    /// The cluster's own addresses as the Nodes show them now: cut out of every pool.
    pub(super) cluster: Vec<ClusterAddress>,
}

impl AllocationState {
    pub(crate) fn new(cfg: &ControllerConfig, metrics: Metrics) -> Result<Self, Error> {
        let alloc = Allocators::new(&cfg.service_cidrs, cfg.node_port_range, cfg.seed)?;
        Ok(Self {
            default_class: cfg.default_class,
            max_in_flight: cfg.max_in_flight,
            metrics,
            alloc,
            services: HashMap::new(),
            svc_buffer: None,
            svc_synced: false,
            pools: Cache::default(),
            pool_problems: BTreeMap::new(),
            namespaces: Cache::default(),
            nodes: Cache::default(),
            started: false,
            queue: Queue::default(),
            states: HashMap::new(),
            in_flight: 0,
            pool_status_wanted: false,
            pools_in_flight: HashSet::new(),
            cleanups: Vec::new(),
            held: Held::default(),
            keepers: Keepers::new(cfg.pool_gone_grace),
            pool_specs: Vec::new(),
            service_cidrs: cfg.service_cidrs.clone(),
            service_cidr_objects: None,
            reserved: cfg.reserved_addresses.clone(),
            cluster: Vec::new(),
        })
    }

    /// Whether every existing value has been adopted, so that new ones may be assigned.
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// The Service's entry, made when missing; [`Self::tidy`] removes it once idle again.
    pub(super) fn state_mut(&mut self, key: &ServiceKey) -> &mut ServiceState {
        self.states.entry(key.clone()).or_default()
    }

    /// Whether the state machine keeps anything for the Service beyond its holdings.
    #[cfg(test)]
    pub(super) fn has_entry(&self, key: &ServiceKey) -> bool {
        self.states.contains_key(key) || self.held.holds(key) || self.keepers.keeps(key)
    }

    pub(super) fn tidy(&mut self, key: &ServiceKey) {
        if self.states.get(key).is_some_and(ServiceState::is_idle) {
            self.states.remove(key);
        }
    }

    /// The Service read with this controller's default class.
    pub(crate) fn read(&self, svc: &Service) -> ServiceFacts {
        read_service(svc, self.default_class)
    }

    pub(super) fn schedule_pool_status(&mut self) {
        self.pool_status_wanted = true;
    }

    /// True once after something changed the pool counts (or a pool status write failed).
    pub(crate) fn take_pool_status_wanted(&mut self) -> bool {
        std::mem::take(&mut self.pool_status_wanted)
    }

    /// The deleted Services whose provider state is to be cleaned up.
    pub(crate) fn take_cleanups(&mut self) -> Vec<ServiceKey> {
        std::mem::take(&mut self.cleanups)
    }

    pub(super) fn push_cleanup(&mut self, key: ServiceKey) {
        self.cleanups.push(key);
    }

    /// When the earliest retry is due.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.queue.next_retry()
    }

    /// Marks the Services whose retry is due at `now`.
    pub(crate) fn due(&mut self, now: Instant) {
        self.queue.due(now);
    }

    /// Follows the cluster's ServiceCIDR objects (call before the first event, where the
    /// cluster serves the kind): adoption then waits for them to be listed too.
    pub(crate) fn watch_service_cidrs(&mut self) {
        self.service_cidr_objects = Some(Cache::default());
    }

    /// Serves the ServiceCIDRs as they are now (`--service-cidr` where none are followed).
    fn install_service_ranges(&mut self) {
        let Some(objects) = &self.service_cidr_objects else {
            return;
        };
        let ranges = service_ranges(objects.objects.values(), &self.service_cidrs);
        if ranges == self.alloc.cluster.ranges() {
            return;
        }
        tracing::info!(?ranges, "Service CIDRs changed");
        for e in self.alloc.cluster.set_ranges(&ranges) {
            self.metrics.error(ErrorCategory::Config);
            tracing::warn!(error = %e, "ServiceCIDR range left out");
        }
    }

    /// A ServiceCIDR changed: the allocator serves the new ranges, pools lose what they now
    /// overlap, and Services waiting for room decide again.
    pub(super) fn service_cidrs_changed(&mut self) {
        self.install_service_ranges();
        if self.refresh_cluster_addresses() {
            self.pools_changed();
        }
        self.resync();
    }

    /// Adopts every existing value oldest first, once all kinds are listed.
    pub(super) fn maybe_start(&mut self) {
        if self.started
            || !(self.svc_synced
                && self.pools.synced
                && self.namespaces.synced
                && self.nodes.synced)
            || matches!(&self.service_cidr_objects, Some(c) if !c.synced)
        {
            return;
        }
        self.install_service_ranges();
        self.refresh_cluster_addresses();
        self.install_pools();
        let labels: HashMap<String, Labels> = self.namespace_labels();
        let empty = Labels::new();
        let facts: Vec<_> = self.services.values().map(|s| self.read(s)).collect();
        let refused = adopt_all(
            &mut self.alloc,
            facts
                .iter()
                .map(|f| (f, labels.get(&f.key.namespace).unwrap_or(&empty))),
        );
        for (key, e) in &refused {
            self.metrics.conflicts.inc();
            tracing::warn!(service = %key, error = %e, "conflicting value on an existing Service; the older Service keeps it");
        }
        self.started = true;
        // What the Services name that the pools no longer give them (a pool deleted while no
        // leader ran) is kept, as it would have been had this leader seen the pool go.
        let current = self.pool_specs.clone();
        self.note_pool_change(&current);
        tracing::info!(
            services = self.services.len(),
            pools = self.pools.objects.len(),
            conflicts = refused.len(),
            "adopted existing allocations"
        );
        let mut keys: Vec<ServiceKey> = self.services.keys().cloned().collect();
        keys.sort();
        for k in keys {
            self.queue.mark(k);
        }
        self.schedule_pool_status();
    }

    fn namespace_labels(&self) -> HashMap<String, Labels> {
        self.namespaces
            .objects
            .iter()
            .map(|(n, ns)| (n.clone(), ns.metadata.labels.clone().unwrap_or_default()))
            .collect()
    }

    /// The labels of one namespace (none while it is unknown).
    pub(super) fn labels_of_namespace(&self, namespace: &str) -> Labels {
        self.namespaces
            .objects
            .get(namespace)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    /// Recomputes the cluster's own addresses from the Nodes; true when they changed.
    pub(super) fn refresh_cluster_addresses(&mut self) -> bool {
        let objects = self
            .service_cidr_objects
            .iter()
            .flat_map(|c| c.objects.values());
        let cidrs = all_service_cidrs(objects, &self.service_cidrs);
        let cluster = build_cluster_addresses(self.nodes.objects.values(), &cidrs, &self.reserved);
        let changed = cluster != self.cluster;
        self.cluster = cluster;
        changed
    }

    fn install_pools(&mut self) {
        let pools: Vec<IPPool> = self.pools.objects.values().cloned().collect();
        let (specs, problems) = build_pool_specs(&pools, &excluded_ranges(&self.cluster));
        self.pool_problems = problems;
        match self.alloc.lb.set_pools(specs.clone()) {
            Ok(orphans) => {
                for o in &orphans {
                    tracing::debug!(service = %o.owner, ip = %o.ip, "address left every pool");
                }
                let previous = std::mem::replace(&mut self.pool_specs, specs);
                if self.started {
                    self.note_pool_change(&previous);
                }
            }
            Err(e) => {
                self.metrics.error(ErrorCategory::Config);
                tracing::warn!(error = %e, "IPPools not installed; keeping the previous ones");
            }
        }
    }

    pub(super) fn pools_changed(&mut self) {
        self.install_pools();
        self.mark_lb_services();
        self.schedule_pool_status();
    }

    /// LoadBalancer Services, and Services still showing an ingress, decide again.
    pub(super) fn mark_lb_services(&mut self) {
        let keys: Vec<ServiceKey> = self
            .services
            .iter()
            .filter(|(_, s)| {
                s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) == Some("LoadBalancer")
                    || s.status
                        .as_ref()
                        .and_then(|st| st.load_balancer.as_ref())
                        .is_some_and(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.queue.mark(k);
        }
    }

    /// Every Service that lacks an address it should have — waiting for space, or a
    /// LoadBalancer Service holding no address — is decided again (the periodic resync).
    pub(crate) fn resync(&mut self) {
        if !self.started {
            return;
        }
        let mut keys: Vec<ServiceKey> = self
            .services
            .iter()
            .filter(|(k, s)| {
                self.states.get(*k).is_some_and(|st| st.waiting)
                    || (s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) == Some("LoadBalancer")
                        && self.alloc.lb.ips_of(k).is_empty())
            })
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        for k in keys {
            self.queue.mark(k);
        }
    }

    /// The next write, decided from the dirty Services while there is room for one; `now` is
    /// the time a changed condition carries.
    pub(crate) fn decide(&mut self, now: &Time) -> Option<WriteJob> {
        if !self.started {
            return None;
        }
        while self.in_flight < self.max_in_flight {
            let key = self.queue.pop()?;
            if let Some(job) = self.decide_one(key, now) {
                return Some(job);
            }
        }
        None
    }

    fn decide_one(&mut self, key: ServiceKey, now: &Time) -> Option<WriteJob> {
        let svc = self.services.get(&key).cloned()?;
        let span = tracing::info_span!("reconcile", namespace = %key.namespace, name = %key.name);
        let _enter = span.enter();
        let metrics = self.metrics.clone();
        let timer = ReconcileTimer::start(&metrics, "service");
        let facts = self.read(&svc);
        let labels = self.labels_of_namespace(&key.namespace);
        let carried = self.settle_refused(&key, &svc, &facts);
        let before = Holding::of(&self.alloc, &key);
        let keep = self.may_keep(&key, &facts, now);
        let mut out = plan_service_keeping(&mut self.alloc, &facts, &labels, keep);
        if !self.note_kept(&key, &svc, &facts, &mut out, now) {
            // Its grace ran out as it started: decided as if it did not keep (keeping changed
            // nothing in the allocators, so deciding again is the same decision without it).
            out = plan_service_keeping(&mut self.alloc, &facts, &labels, Keep::default());
        }
        if self.alloc.lb.ips_of(&key) != before.lb_ips {
            self.schedule_pool_status();
        }
        let failure = match &out.result {
            Some(Err(f)) => {
                self.metrics
                    .allocations
                    .get_or_create(&vec![("result", "failed")])
                    .inc();
                if f.reason == reason::IP_ALREADY_ALLOCATED
                    || f.reason == reason::PORT_ALREADY_ALLOCATED
                {
                    self.metrics.conflicts.inc();
                }
                // A Service keeping its address waits only for a change or its grace.
                if out.kept.is_none() {
                    self.state_mut(&key).waiting = true;
                } else {
                    self.stop_waiting(&key);
                }
                Some((event_reason(&out), f.message.clone()))
            }
            Some(Ok(())) => {
                self.metrics
                    .allocations
                    .get_or_create(&vec![("result", "ok")])
                    .inc();
                self.stop_waiting(&key);
                None
            }
            None => {
                self.stop_waiting(&key);
                None
            }
        };
        if before.any_released(&self.alloc, &key) {
            self.wake_waiting(Some(&key));
        }
        // A class berth does not serve gets no status from berth, conditions included.
        let conditions = if facts.lb_class == LbClass::Foreign {
            None
        } else {
            build_conditions(&svc, &out, now.clone())
        };
        let ingress = out.ingress.clone().filter(|ips| ingress_differs(&svc, ips));
        self.withhold_until_cleared(&key, &facts, &labels, &before.lb_ips, ingress.as_ref());
        let nodes = if ingress.is_some() && facts.lb_class != LbClass::None {
            eligible_nodes(&self.nodes.objects)
        } else {
            Vec::new()
        };
        let finalizer_waits = facts.cleanup.has_cleanup
            && out.finalizer.is_none()
            && ingress.as_ref().is_some_and(Vec::is_empty);
        if out.fill.drop_node_ports
            || out.fill.drop_health_check_node_port
            || out.fill.drop_cluster_ips
            || finalizer_waits
        {
            self.state_mut(&key).dropping = true;
        }
        let job = WriteJob {
            key: key.clone(),
            spec_patch: build_spec_patch(&svc, &out.fill, out.finalizer),
            // A failure is announced once, when the condition says so for the first time.
            failure: failure.filter(|_| conditions.is_some()),
            conditions,
            ingress,
            nodes,
            new_lb_ips: out.new_lb_ips.clone(),
            svc,
        };
        drop(timer);
        if job.is_empty() {
            tracing::debug!("nothing to write");
            self.queue.settled(&key);
            self.hold_refused(&key, job.svc.metadata.resource_version.clone(), carried);
            self.tidy(&key);
            return None;
        }
        tracing::info!(
            spec = job.spec_patch.is_some(),
            status = job.conditions.is_some() || job.ingress.is_some(),
            "writing allocation"
        );
        let mut fresh = compute_fresh(&before, &facts, &out.fill, job.ingress.as_deref());
        fresh.merge(carried);
        self.hold_in_flight(&key, job.svc.metadata.resource_version.clone(), fresh);
        self.tidy(&key);
        self.queue.started(key);
        self.in_flight += 1;
        Some(job)
    }

    fn stop_waiting(&mut self, key: &ServiceKey) {
        if let Some(s) = self.states.get_mut(key) {
            s.waiting = false;
        }
    }

    /// A Service's write job ended at `now` with `outcome`; `written` is the Service as its
    /// spec write returned it, when that write landed.
    pub(crate) fn done(
        &mut self,
        key: ServiceKey,
        outcome: JobOutcome,
        written: Option<WrittenSpec>,
        now: Instant,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        // The version a status write carried when the spec write before it landed.
        let spec_version = written
            .as_ref()
            .and_then(|w| w.svc.metadata.resource_version.clone());
        if let Some(w) = written {
            self.remember_written(&key, w);
        }
        let landed = matches!(outcome, JobOutcome::Done { .. });
        if landed {
            self.release_cleared(&key);
        }
        let refused = match &outcome {
            JobOutcome::Rejected { write } => Some(*write),
            _ => None,
        };
        self.end_in_flight(&key, refused, spec_version);
        if let Some(category) = self.queue.finished(&key, outcome, now) {
            self.metrics.error(category);
        }
        // Any other outcome decides again by itself.
        let dropped = self
            .states
            .get_mut(&key)
            .is_some_and(|s| std::mem::take(&mut s.dropping));
        if dropped && landed {
            self.queue.mark(key.clone());
        }
        self.tidy(&key);
    }
}
