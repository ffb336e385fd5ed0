//! Histories of the allocation state machine, without an API server: each row is a sequence
//! of operations — objects created and changed, leaders started (a restart is a new state
//! machine listing the objects as the API server holds them), writes decided, held back, let
//! land or refused — and what the objects and the allocators must show at each point.
//!
//! The API server is a map of objects with resourceVersions: a write carries the version it
//! was decided from and is refused (409) when the object moved on, as a merge patch with a
//! resourceVersion is. Writes are sent as `run_job` sends them: spec, then the provider, then
//! status. After every row, no two Services may name one value.
//!
//! Address plan: service CIDR 10.96.0.0/16, node ports 30000-32767, pools in 198.18.0.0/24.

mod api;
mod lifecycle;
mod rows_adoption;
mod rows_cleanup;
mod rows_crash_windows;
mod rows_late_writes;
mod rows_pools;
mod rows_refusals;
mod rows_service_cidrs;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_ipam::ServiceKey;
use k8s_openapi::api::networking::v1::{ServiceCIDR, ServiceCIDRSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

use super::fresh::Holding;
use super::state::{AllocationState, Observed};
use super::write::WriteJob;
use crate::config::ControllerConfig;
use crate::metrics::Metrics;
use api::{Api, Logged};

/// One step of a history.
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// `--service-cidr` of the leaders started from now on (10.96.0.0/16 unless set).
    ServiceCidrFlag(&'static str),
    /// The cluster serves ServiceCIDRs: creates or replaces one with these CIDRs, being
    /// deleted when the flag says so (leaders see it when they watch).
    ServiceCidr(&'static str, &'static [&'static str], bool),
    /// Removes a ServiceCIDR object.
    DeleteServiceCidr(&'static str),
    /// Creates the pool, or replaces its addresses.
    Pool(&'static str, &'static [&'static str]),
    /// Creates or replaces a pool from its whole spec.
    PoolSpec(&'static str, Value),
    DeletePool(&'static str),
    /// Creates or relabels a namespace.
    Namespace(&'static str, Value),
    /// Creates a Service in `default` from its whole object (`spec`, and `status` when set).
    Create(&'static str, Value),
    /// A merge patch of the Service (someone else's write: a user's, or a killed leader's).
    Patch(&'static str, Value),
    /// A merge patch of the Service's status (likewise).
    PatchStatus(&'static str, Value),
    /// A delete: with finalizers (berth's cleanup finalizer on a served LoadBalancer) the
    /// Service only gains a `deletionTimestamp`.
    Delete(&'static str),
    /// The Service goes at once, as a delete does once no finalizer is left.
    Remove(&'static str),
    /// Deleted and created again from `Value`; the watch shows only the new object.
    Recreate(&'static str, Value),
    /// The next leader decides with at most this many writes in flight.
    MaxInFlight(usize),
    /// A new leader (the first, or after a crash) lists the objects and adopts.
    Start,
    /// The leader's watch delivers every change so far.
    Watch,
    /// Only the leader's IPPool watch delivers its changes so far (the watches of different
    /// kinds are separate streams: a pool event can overtake a Service's).
    WatchPools,
    /// The next leader's `--pool-gone-grace`, in seconds (`None`: never).
    Grace(Option<u64>),
    /// This many seconds pass: retries and graces come due, nothing else happens.
    Wait(u64),
    /// The periodic resync comes due.
    Resync,
    /// The leader decides its next write, which must be the named Service's, and holds it.
    Decide(&'static str),
    /// The leader has nothing to write now.
    DecideNothing,
    /// The held write of the named Service is sent, and its outcome reported.
    Send(&'static str),
    /// The held write of the named Service is lost with its leader: never sent.
    Drop(&'static str),
    /// Writes are sent and retries come due until nothing is left to do (five minutes at most);
    /// graces run out only with `Wait`.
    Settle,
    /// The earliest retry comes due, and nothing else happens.
    Due,
    /// The leader's watch breaks and lists the Services again: it sees them as they are now,
    /// without the events in between.
    Relist,
    /// The next write the API server gets fails like this.
    Fail(Fault),
    /// Whether the provider's deletes fail.
    ProviderDeleteFails(bool),
    Expect(Want),
}

/// A failure of one write.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    /// The write goes through (to let a later write fail).
    Pass,
    /// 409 as if the object had moved on; it did not.
    Conflict,
    /// 500: retried with backoff.
    Server,
    /// Leadership was lost before the write was sent.
    NotLeading,
}

/// What must hold at a point of a history.
#[derive(Debug, Clone)]
pub(super) enum Want {
    /// The addresses the Service's status names.
    Ingress(&'static str, &'static [&'static str]),
    /// `spec.clusterIP`, `None` when unset.
    ClusterIp(&'static str, Option<&'static str>),
    /// `spec.clusterIP` is set, and differs from this one.
    ClusterIpOtherThan(&'static str, &'static str),
    /// `spec.ports[].nodePort`.
    NodePorts(&'static str, &'static [Option<i32>]),
    /// Every `spec.ports[].nodePort` is set.
    NodePortsSet(&'static str),
    /// `spec.healthCheckNodePort`.
    HealthCheck(&'static str, Option<i32>),
    /// `spec.healthCheckNodePort` is set, and differs from this one.
    HealthCheckOtherThan(&'static str, i32),
    /// The `berth.dev/Allocated` condition's status ("True", "False"), "" when absent.
    Allocated(&'static str, &'static str),
    /// Its message contains this.
    Message(&'static str, &'static str),
    /// Its reason.
    Reason(&'static str, &'static str),
    /// Its message is cut to at most this many bytes, and says so.
    MessageBounded(&'static str, usize),
    /// The conflicts counted so far by the current leader.
    Conflicts(u64),
    /// The LoadBalancer addresses the allocators hold for the Service.
    HoldsLb(&'static str, &'static [&'static str]),
    /// The ClusterIPs the allocators hold for the Service.
    HoldsClusterIps(&'static str, &'static [&'static str]),
    /// `spec.clusterIP` lies in this CIDR.
    ClusterIpIn(&'static str, &'static str),
    /// Whether the allocators hold this node port for the Service.
    HoldsPort(&'static str, u16, bool),
    /// The allocators hold for the Service exactly the values its object names.
    Exact(&'static str),
    /// Whether the state machine keeps an entry for the Service beyond its holdings.
    Entry(&'static str, bool),
    /// Writes the API server took (spec and status), since the last leader started.
    Writes(usize),
    /// The reason of the last Warning Event the Service's writes carried, and a text its
    /// message contains.
    Warning(&'static str, &'static str, &'static str),
    /// The pools' assigned counts equal the addresses the Services' statuses name in them.
    CountsTrue,
    /// Addresses held in no pool (the `kept_addresses` metric's count).
    KeptAddresses(usize),
    /// Whether the Service is to be decided.
    Marked(&'static str, bool),
    /// The Service's finalizers.
    Finalizers(&'static str, &'static [&'static str]),
    /// Whether the Service object exists.
    Exists(&'static str, bool),
}

/// A Service object with this spec.
pub(super) fn svc(spec: Value) -> Value {
    json!({ "spec": spec })
}

/// A LoadBalancer Service on port 80, with nothing set.
pub(super) fn lb() -> Value {
    svc(json!({"type": "LoadBalancer", "ports": [{"port": 80}]}))
}

/// The same with `externalTrafficPolicy: Local`.
pub(super) fn local_lb() -> Value {
    svc(json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}))
}

/// A LoadBalancer Service whose spec is complete: its first write is the status write.
pub(super) fn complete_lb(ip: &str, port: u16) -> Value {
    svc(
        json!({"type": "LoadBalancer", "clusterIP": ip, "clusterIPs": [ip],
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
        "ports": [{"port": 80, "nodePort": port}]}),
    )
}

/// A status naming one LoadBalancer address, as a leader writes it.
pub(super) fn ingress(ip: &str) -> Value {
    json!({"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}})
}

/// A history and its name.
pub(super) struct Row {
    pub(super) name: &'static str,
    pub(super) ops: Vec<Op>,
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default".to_string(), name.to_string())
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// The time every changed condition carries.
fn condition_time() -> Time {
    Time(Timestamp::from_second(1_700_000_000).expect("a valid time"))
}

/// A leader: the state machine, the writes it holds back, its clock.
struct Leader {
    state: AllocationState,
    metrics: Metrics,
    held: BTreeMap<String, WriteJob>,
    /// How far into the API server's log the leader's watch has read: the Service and
    /// Namespace watches, and the IPPool watch.
    seen: usize,
    seen_pools: usize,
    clock: Instant,
    started_at: Instant,
}

impl Leader {
    /// The wall-clock time of `clock` (conditions, graces).
    fn wall(&self) -> Time {
        let elapsed = self.clock.duration_since(self.started_at);
        let base = condition_time().0;
        Time(
            base.checked_add(k8s_openapi::jiff::SignedDuration::try_from(elapsed).expect("short"))
                .expect("a valid time"),
        )
    }
}

struct Run {
    row: &'static str,
    api: Api,
    leader: Option<Leader>,
    max_in_flight: usize,
    grace: Option<u64>,
    /// Writes taken since the last leader started.
    writes: usize,
    flag: &'static str,
    /// The ServiceCIDR objects, where the cluster serves the kind.
    service_cidrs: Option<BTreeMap<String, ServiceCIDR>>,
}

fn mk_service_cidr(name: &str, cidrs: &[&str], deleting: bool) -> ServiceCIDR {
    ServiceCIDR {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            deletion_timestamp: deleting.then(condition_time),
            ..Default::default()
        },
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
        }),
        status: None,
    }
}

impl Run {
    fn leader(&mut self) -> &mut Leader {
        let row = self.row;
        self.leader
            .as_mut()
            .unwrap_or_else(|| panic!("{row}: no leader started"))
    }

    fn start(&mut self) {
        let mut cfg = ControllerConfig::new(vec![self.flag.parse().expect("a CIDR")]);
        cfg.max_in_flight = self.max_in_flight;
        cfg.pool_gone_grace = self.grace.map(Duration::from_secs);
        let metrics = Metrics::new(&mut Registry::default());
        let mut state = AllocationState::new(&cfg, metrics.clone()).expect("allocators");
        let (services, pools, namespaces) = self.api.list();
        if let Some(objects) = &self.service_cidrs {
            state.watch_service_cidrs();
            state.observe(Observed::ServiceCidr(Event::Init));
            for o in objects.values() {
                state.observe(Observed::ServiceCidr(Event::InitApply(o.clone())));
            }
            state.observe(Observed::ServiceCidr(Event::InitDone));
        }
        state.observe(Observed::Node(Event::Init));
        state.observe(Observed::Node(Event::InitDone));
        state.observe(Observed::Namespace(Event::Init));
        for ns in namespaces {
            state.observe(Observed::Namespace(Event::InitApply(ns)));
        }
        state.observe(Observed::Namespace(Event::InitDone));
        state.observe(Observed::Pool(Event::Init));
        for p in pools {
            state.observe(Observed::Pool(Event::InitApply(p)));
        }
        state.observe(Observed::Pool(Event::InitDone));
        state.observe(Observed::Service(Event::Init));
        for s in services {
            state.observe(Observed::Service(Event::InitApply(Arc::new(s))));
        }
        state.observe(Observed::Service(Event::InitDone));
        assert!(state.started(), "{}: started once all is listed", self.row);
        self.writes = 0;
        let now = Instant::now();
        self.leader = Some(Leader {
            state,
            metrics,
            held: BTreeMap::new(),
            seen: self.api.log.len(),
            seen_pools: self.api.log.len(),
            clock: now,
            started_at: now,
        });
    }

    fn watch(&mut self) {
        let Some(leader) = self.leader.as_mut() else {
            return;
        };
        for (i, logged) in self.api.log.iter().enumerate().skip(leader.seen) {
            let observed = match logged.clone() {
                Logged::Service(e) => Observed::Service(e),
                Logged::Pool(_) if i < leader.seen_pools => continue,
                Logged::Pool(e) => Observed::Pool(e),
                Logged::Namespace(e) => Observed::Namespace(e),
            };
            leader.state.observe(observed);
        }
        leader.seen = self.api.log.len();
        leader.seen_pools = self.api.log.len();
    }

    fn watch_pools(&mut self) {
        let Some(leader) = self.leader.as_mut() else {
            return;
        };
        for logged in &self.api.log[leader.seen_pools..] {
            if let Logged::Pool(e) = logged.clone() {
                leader.state.observe(Observed::Pool(e));
            }
        }
        leader.seen_pools = self.api.log.len();
    }

    /// Moves the leader's clock to `at` and brings what is due by then.
    fn advance(&mut self, at: Instant) {
        let leader = self.leader();
        leader.clock = leader.clock.max(at);
        let now = leader.clock;
        leader.state.due(now);
        let wall = leader.wall();
        leader.state.deadlines_due(&wall);
    }

    fn send(&mut self, job: WriteJob) {
        let (outcome, written, writes) = self.api.run_job(&job);
        self.writes += writes;
        let leader = self.leader();
        leader.clock += Duration::from_millis(1);
        let now = leader.clock;
        leader.state.done(job.key, outcome, written, now);
    }

    fn settle(&mut self) {
        let row = self.row;
        // Long enough for a provider retry at its longest backoff.
        let until = self.leader().clock + Duration::from_secs(301);
        for _ in 0..1000 {
            self.watch();
            let leader = self.leader();
            let wall = leader.wall();
            if let Some(job) = leader.state.decide(&wall) {
                self.send(job);
                continue;
            }
            match self.leader().state.next_retry() {
                Some(at) if at <= until => self.advance(at),
                _ => return,
            }
        }
        panic!("{row}: never settled");
    }

    fn step(&mut self, op: Op) {
        let row = self.row;
        match op {
            Op::ServiceCidrFlag(flag) => self.flag = flag,
            Op::ServiceCidr(name, cidrs, deleting) => {
                let object = mk_service_cidr(name, cidrs, deleting);
                self.service_cidrs
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name.to_string(), object.clone());
                if let Some(leader) = self.leader.as_mut() {
                    leader
                        .state
                        .observe(Observed::ServiceCidr(Event::Apply(object)));
                }
            }
            Op::DeleteServiceCidr(name) => {
                let removed = self.service_cidrs.as_mut().and_then(|m| m.remove(name));
                let removed = removed.unwrap_or_else(|| panic!("{row}: no ServiceCIDR {name}"));
                if let Some(leader) = self.leader.as_mut() {
                    leader
                        .state
                        .observe(Observed::ServiceCidr(Event::Delete(removed)));
                }
            }
            Op::Pool(name, addresses) => self
                .api
                .put_pool(name, serde_json::json!({ "addresses": addresses })),
            Op::PoolSpec(name, spec) => self.api.put_pool(name, spec),
            Op::DeletePool(name) => self.api.delete_pool(name),
            Op::Namespace(name, labels) => self.api.put_namespace(name, labels),
            Op::Create(name, object) => self.api.create(name, object),
            Op::Patch(name, patch) => self.api.patch(name, &patch, false),
            Op::PatchStatus(name, patch) => self.api.patch(name, &patch, true),
            Op::Delete(name) => self.api.delete(name),
            Op::Remove(name) => self.api.remove(name),
            Op::Recreate(name, object) => self.api.recreate(name, object),
            Op::MaxInFlight(n) => self.max_in_flight = n,
            Op::Start => self.start(),
            Op::Watch => self.watch(),
            Op::WatchPools => self.watch_pools(),
            Op::Grace(secs) => self.grace = secs,
            Op::Resync => self.leader().state.resync(),
            Op::Wait(secs) => {
                let at = self.leader().clock + Duration::from_secs(secs);
                self.advance(at);
            }
            Op::Decide(name) => {
                let leader = self.leader();
                let wall = leader.wall();
                let job = leader.state.decide(&wall);
                let job = job.unwrap_or_else(|| panic!("{row}: nothing decided, {name} expected"));
                assert_eq!(job.key, key(name), "{row}: decided the wrong Service");
                leader.held.insert(name.to_string(), job);
            }
            Op::DecideNothing => {
                let leader = self.leader();
                let wall = leader.wall();
                let job = leader.state.decide(&wall);
                assert!(job.is_none(), "{row}: decided {:?}", job.map(|j| j.key));
            }
            Op::Send(name) => {
                let job = self.leader().held.remove(name);
                let job = job.unwrap_or_else(|| panic!("{row}: no write of {name} held"));
                self.send(job);
            }
            Op::Drop(name) => {
                self.leader().held.remove(name);
            }
            Op::Settle => self.settle(),
            Op::Due => {
                let leader = self.leader();
                let at = leader.state.next_retry();
                let at = at.unwrap_or_else(|| panic!("{row}: no retry pending"));
                leader.clock = leader.clock.max(at);
                leader.state.due(at);
            }
            Op::Relist => {
                let (services, _, _) = self.api.list();
                let seen = self.api.log.len();
                let leader = self.leader();
                leader.state.observe(Observed::Service(Event::Init));
                for s in services {
                    leader
                        .state
                        .observe(Observed::Service(Event::InitApply(Arc::new(s))));
                }
                leader.state.observe(Observed::Service(Event::InitDone));
                leader.seen = seen;
            }
            Op::Fail(fault) => self.api.faults.push_back(fault),
            Op::ProviderDeleteFails(fails) => self.api.provider_delete_fails = fails,
            Op::Expect(want) => self.check(&want),
        }
    }

    fn check(&mut self, want: &Want) {
        let row = self.row;
        let ctx = format!("{row}: {want:?}");
        match *want {
            Want::Ingress(name, ips) => assert_eq!(self.api.ingress(name), ips, "{ctx}"),
            Want::Finalizers(name, want) => {
                assert_eq!(self.api.finalizers(name), want, "{ctx}")
            }
            Want::Exists(name, want) => assert_eq!(self.api.exists(name), want, "{ctx}"),
            Want::ClusterIp(name, ip) => {
                assert_eq!(self.api.cluster_ip(name).as_deref(), ip, "{ctx}")
            }
            Want::ClusterIpOtherThan(name, other) => {
                let got = self.api.cluster_ip(name);
                assert!(
                    got.is_some() && got.as_deref() != Some(other),
                    "{ctx}: {got:?}"
                );
            }
            Want::NodePorts(name, ports) => assert_eq!(self.api.node_ports(name), ports, "{ctx}"),
            Want::NodePortsSet(name) => {
                let ports = self.api.node_ports(name);
                assert!(
                    !ports.is_empty() && ports.iter().all(Option::is_some),
                    "{ctx}: {ports:?}"
                );
            }
            Want::HealthCheck(name, port) => {
                assert_eq!(self.api.health_check(name), port, "{ctx}")
            }
            Want::HealthCheckOtherThan(name, other) => {
                let got = self.api.health_check(name);
                assert!(got.is_some() && got != Some(other), "{ctx}: {got:?}");
            }
            Want::Allocated(name, status) => {
                let got = self.api.allocated(name).map(|c| c.0);
                assert_eq!(
                    got.as_deref().unwrap_or(""),
                    status,
                    "{ctx}: {:?}",
                    self.api.allocated(name)
                );
            }
            Want::Message(name, text) => {
                let got = self.api.allocated(name).map(|c| c.1).unwrap_or_default();
                assert!(got.contains(text), "{ctx}: {got}");
            }
            Want::MessageBounded(name, max) => {
                let got = self.api.allocated(name).map(|c| c.1).unwrap_or_default();
                assert!(
                    got.len() <= max && got.ends_with("..."),
                    "{ctx}: {} bytes",
                    got.len()
                );
            }
            Want::Reason(name, reason) => {
                assert_eq!(self.api.allocated_reason(name), reason, "{ctx}");
            }
            Want::Conflicts(n) => assert_eq!(self.leader().metrics.conflicts.get(), n, "{ctx}"),
            Want::HoldsLb(name, ips) => {
                let want: Vec<IpAddr> = ips.iter().map(|s| ip(s)).collect();
                assert_eq!(
                    self.leader().state.alloc.lb.ips_of(&key(name)),
                    want,
                    "{ctx}"
                );
            }
            Want::ClusterIpIn(name, cidr) => {
                let got = self.api.cluster_ip(name);
                let net: ipnet::IpNet = cidr.parse().expect("a CIDR");
                assert!(
                    got.as_deref().is_some_and(|g| net.contains(&ip(g))),
                    "{ctx}: {got:?} not in {cidr}"
                );
            }
            Want::HoldsClusterIps(name, ips) => {
                let want: Vec<IpAddr> = ips.iter().map(|s| ip(s)).collect();
                assert_eq!(
                    self.leader().state.alloc.cluster.ips_of(&key(name)),
                    want,
                    "{ctx}"
                );
            }
            Want::HoldsPort(name, port, held) => {
                let owner = self.leader().state.alloc.ports.owner_of(port).cloned();
                assert_eq!(owner == Some(key(name)), held, "{ctx}: held by {owner:?}");
            }
            Want::Entry(name, present) => {
                let got = self.leader().state.has_entry(&key(name));
                assert_eq!(got, present, "{ctx}");
            }
            Want::Exact(name) => {
                let named = self.api.named(name);
                let mut held = Holding::of(&self.leader().state.alloc, &key(name));
                held.lb_ips.sort_unstable();
                assert_eq!(held, named, "{ctx}");
            }
            Want::Writes(n) => assert_eq!(self.writes, n, "{ctx}"),
            Want::Warning(name, reason, text) => {
                let got = self.api.warnings.get(name).cloned().unwrap_or_default();
                assert!(got.0 == reason && got.1.contains(text), "{ctx}: {got:?}");
            }
            Want::CountsTrue => {
                let truth = self.api.named_per_pool();
                let leader = self.leader();
                for (pool, named) in truth {
                    let counted = leader
                        .state
                        .alloc
                        .lb
                        .pool_status(&pool)
                        .map(|c| c.assigned_ipv4);
                    assert_eq!(counted, Some(named), "{ctx}: pool {pool}");
                }
            }
            Want::Marked(name, marked) => {
                let got = self.leader().state.queue.is_marked(&key(name));
                assert_eq!(got, marked, "{ctx}");
            }
            Want::KeptAddresses(n) => {
                assert_eq!(self.leader().state.count_kept(), n, "{ctx}")
            }
        }
    }
}

/// Runs one history; a failure names the row and the step.
pub(super) fn run(row: Row) {
    let mut run = Run {
        row: row.name,
        api: Api::default(),
        leader: None,
        max_in_flight: 64,
        grace: None,
        writes: 0,
        flag: "10.96.0.0/16",
        service_cidrs: None,
    };
    for op in row.ops {
        run.step(op);
    }
    run.api.assert_no_value_named_twice(row.name);
}
