//! The pool lifecycle as a property: random short sequences of IPPool creates, deletes,
//! re-creates, narrowings and widenings, and of Service creates, changes and deletes, with
//! the watches of Services and IPPools delivering at different times, decisions, writes and
//! restarts in between, run against the state machine and the API server of the histories.
//!
//! After every step: no value is named by two Services and no address has two holders; no
//! live Service's address changes unless the Service changed (or, with a grace, the grace ran
//! out; five minutes pass now and then, so a pool not found's grace runs out too). Once settled: every LoadBalancer Service with room in a pool that admits it has an
//! address, the allocators hold exactly what each Service names, and the pools' counts are
//! the addresses the Services name in them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::api::Api;
use super::{key, Op, Run, Want};

const POOLS: [&str; 2] = ["p", "q"];
/// Ranges a pool is created, re-created, narrowed or widened to.
const RANGES: [&[&str]; 5] = [
    &["198.18.0.10-198.18.0.12"],
    &["198.18.0.10-198.18.0.11"],
    &["198.18.0.11-198.18.0.13"],
    &["198.18.0.10-198.18.0.14"],
    &["198.18.0.13-198.18.0.14"],
];
const SERVICES: [&str; 4] = ["s0", "s1", "s2", "s3"];
const REQUESTED: &str = "198.18.0.11";

/// What a Service asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// Any admitting pool.
    Any,
    /// The named pool.
    Pool(usize),
    /// [`REQUESTED`].
    Address,
    /// Not a LoadBalancer.
    ClusterIp,
}

impl Ask {
    fn annotations(self) -> Value {
        let (pool, ips) = match self {
            Ask::Pool(p) => (json!(POOLS[p]), Value::Null),
            Ask::Address => (Value::Null, json!(REQUESTED)),
            Ask::Any | Ask::ClusterIp => (Value::Null, Value::Null),
        };
        json!({"berth.dev/ip-pool": pool, "berth.dev/load-balancer-ips": ips})
    }

    fn type_(self) -> &'static str {
        if self == Ask::ClusterIp {
            "ClusterIP"
        } else {
            "LoadBalancer"
        }
    }

    fn object(self) -> Value {
        let mut annotations = self.annotations();
        if let Some(map) = annotations.as_object_mut() {
            map.retain(|_, v| !v.is_null());
        }
        json!({"metadata": {"annotations": annotations},
            "spec": {"type": self.type_(), "ports": [{"port": 80}]}})
    }

    fn patch(self) -> Value {
        json!({"metadata": {"annotations": self.annotations()},
            "spec": {"type": self.type_()}})
    }
}

#[derive(Debug, Clone)]
enum Step {
    PutPool(usize, usize),
    /// Deleted and created again (as `kubectl replace --force` and GitOps tools do), with
    /// the IPPool watch delivering each and decisions in between.
    Recreate(usize, usize, usize, usize),
    DeletePool(usize),
    Create(usize, Ask),
    Change(usize, Ask),
    Delete(usize),
    WatchPools,
    Watch,
    /// The next decision's write, sent at once.
    DecideSend,
    Settle,
    Restart,
    /// Five minutes pass: a pool not found's grace runs out.
    Wait,
}

fn ask() -> impl Strategy<Value = Ask> {
    prop_oneof![
        4 => Just(Ask::Any),
        2 => (0..POOLS.len()).prop_map(Ask::Pool),
        1 => Just(Ask::Address),
        1 => Just(Ask::ClusterIp),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..POOLS.len(), 0..RANGES.len()).prop_map(|(p, r)| Step::PutPool(p, r)),
        2 => (0..POOLS.len()).prop_map(Step::DeletePool),
        3 => (0..POOLS.len(), 0..RANGES.len(), 0..3usize, 0..3usize)
            .prop_map(|(p, r, a, b)| Step::Recreate(p, r, a, b)),
        3 => (0..SERVICES.len(), ask()).prop_map(|(s, a)| Step::Create(s, a)),
        2 => (0..SERVICES.len(), ask()).prop_map(|(s, a)| Step::Change(s, a)),
        1 => (0..SERVICES.len()).prop_map(Step::Delete),
        2 => Just(Step::WatchPools),
        2 => Just(Step::Watch),
        3 => Just(Step::DecideSend),
        2 => Just(Step::Settle),
        1 => Just(Step::Restart),
        1 => Just(Step::Wait),
    ]
}

struct Lifecycle {
    run: Run,
    /// What each Service asks for now.
    asks: BTreeMap<&'static str, Ask>,
    /// The address each live Service's status named after the last step, and whether it
    /// changed since.
    seen: BTreeMap<&'static str, (Vec<String>, bool)>,
    log: Vec<String>,
}

impl Lifecycle {
    fn api(&self) -> &Api {
        &self.run.api
    }

    fn apply(&mut self, step: &Step) {
        self.log.push(format!("{step:?}"));
        let op = match *step {
            Step::PutPool(p, r) => Op::Pool(POOLS[p], RANGES[r]),
            Step::Recreate(p, r, before, after) if self.api().has_pool(POOLS[p]) => {
                self.run.step(Op::DeletePool(POOLS[p]));
                self.run.step(Op::WatchPools);
                self.check_step();
                for _ in 0..before {
                    self.decide_send();
                }
                self.run.step(Op::Pool(POOLS[p], RANGES[r]));
                self.run.step(Op::WatchPools);
                self.check_step();
                for _ in 0..after {
                    self.decide_send();
                }
                return;
            }
            Step::DeletePool(p) if self.api().has_pool(POOLS[p]) => Op::DeletePool(POOLS[p]),
            Step::Create(s, a) if !self.api().has_service(SERVICES[s]) => {
                self.asks.insert(SERVICES[s], a);
                Op::Create(SERVICES[s], a.object())
            }
            Step::Change(s, a) if self.api().has_service(SERVICES[s]) => {
                self.asks.insert(SERVICES[s], a);
                if let Some(seen) = self.seen.get_mut(SERVICES[s]) {
                    seen.1 = true;
                }
                Op::Patch(SERVICES[s], a.patch())
            }
            Step::Delete(s) if self.api().has_service(SERVICES[s]) => {
                self.asks.remove(SERVICES[s]);
                self.seen.remove(SERVICES[s]);
                Op::Remove(SERVICES[s])
            }
            Step::WatchPools => Op::WatchPools,
            Step::Watch => Op::Watch,
            Step::DecideSend => return self.decide_send(),
            Step::Settle => Op::Settle,
            Step::Restart => Op::Start,
            Step::Wait => Op::Wait(300),
            _ => return,
        };
        self.run.step(op);
        self.check_step();
    }

    fn decide_send(&mut self) {
        let leader = self.run.leader();
        let wall = leader.wall();
        if let Some(job) = leader.state.decide(&wall) {
            self.run.send(job);
        }
        self.check_step();
    }

    fn fail(&self, what: String) -> ! {
        panic!("{what}\nsteps:\n  {}", self.log.join("\n  "));
    }

    /// No value named twice, no address held twice, no live address moved unasked.
    fn check_step(&mut self) {
        let api = &self.run.api;
        let named = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            api.assert_no_value_named_twice("lifecycle")
        }));
        if let Err(e) = named {
            let text = e
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "named twice".into());
            self.fail(text);
        }
        if let Some(leader) = self.run.leader.as_ref() {
            for n in 10..=14u8 {
                let ip: IpAddr = format!("198.18.0.{n}").parse().expect("an address");
                let holders = leader.state.alloc.lb.holders_of(ip);
                if holders.len() > 1 {
                    self.fail(format!("{ip} held by {holders:?}"));
                }
            }
        }
        let grace = self.run.grace.is_some();
        for name in SERVICES {
            if !self.api().has_service(name) {
                continue;
            }
            let now = self.api().ingress(name);
            if let Some((before, changed)) = self.seen.get(name) {
                if !before.is_empty() && *before != now && !changed && !grace {
                    self.fail(format!(
                        "{name}'s address moved from {before:?} to {now:?} unasked"
                    ));
                }
            }
            let changed = self.seen.get(name).is_some_and(|s| s.1 && s.0 == now);
            self.seen.insert(name, (now, changed));
        }
    }

    /// Once settled: every LoadBalancer Service with room has an address; holdings and
    /// counts are what the objects say.
    fn check_settled(&mut self) {
        self.run.step(Op::Settle);
        self.check_step();
        let api = self.api();
        let ranges = api.pool_ranges();
        let mut named: BTreeSet<IpAddr> = BTreeSet::new();
        for name in api.service_names() {
            named.extend(
                api.ingress(&name)
                    .iter()
                    .filter_map(|s| s.parse::<IpAddr>().ok()),
            );
        }
        let free_in = |pool: &str| -> bool {
            ranges.get(pool).is_some_and(|rs| {
                rs.iter().any(|r| {
                    (0..r.len())
                        .filter_map(|i| r.nth(i))
                        .any(|ip| !named.contains(&ip))
                })
            })
        };
        for (name, ask) in self.asks.clone() {
            if !self.api().ingress(name).is_empty() {
                continue;
            }
            let room = match ask {
                Ask::Any => POOLS.iter().any(|p| free_in(p)),
                Ask::Pool(p) => free_in(POOLS[p]),
                Ask::Address => {
                    let ip: IpAddr = REQUESTED.parse().expect("an address");
                    !named.contains(&ip) && ranges.values().flatten().any(|r| r.contains(ip))
                }
                Ask::ClusterIp => false,
            };
            if room {
                self.fail(format!(
                    "{name} ({ask:?}) has no address though a pool has room"
                ));
            }
        }
        if self.run.leader.is_some() {
            for name in self.api().service_names() {
                let svc = self.api().service(&name);
                let held =
                    super::super::fresh::Holding::of(&self.run.leader().state.alloc, &key(&name));
                let mut lb = held.lb_ips.clone();
                lb.sort_unstable();
                if lb != self.api().named(&name).lb_ips {
                    self.fail(format!(
                        "{name} holds {lb:?} but names {:?} ({:?})",
                        self.api().named(&name).lb_ips,
                        svc.status
                    ));
                }
            }
            let counts = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run.check(&Want::CountsTrue)
            }));
            if counts.is_err() {
                self.fail("the pools' counts differ from the addresses named".into());
            }
        }
    }
}

fn run_lifecycle(grace: Option<u64>, steps: &[Step]) {
    let mut l = Lifecycle {
        run: Run {
            row: "lifecycle",
            api: Api::default(),
            leader: None,
            max_in_flight: 64,
            grace,
            writes: 0,
            flag: "10.96.0.0/16",
            service_cidrs: None,
        },
        asks: BTreeMap::new(),
        seen: BTreeMap::new(),
        log: Vec::new(),
    };
    l.run.step(Op::Pool("p", RANGES[0]));
    l.run.step(Op::Start);
    for s in steps {
        l.apply(s);
    }
    l.check_settled();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn pool_lifecycle_keeps_every_live_address_and_strands_no_service(
        grace in prop_oneof![Just(None), Just(Some(0u64))],
        steps in proptest::collection::vec(step(), 1..14),
    ) {
        run_lifecycle(grace, &steps);
    }
}

/// Found by the property: a Service turned ClusterIP, its pool deleted before the controller
/// cleared its status, then a restart.
#[test]
fn a_service_turned_cluster_ip_whose_pool_went_before_a_restart_is_cleared() {
    run_lifecycle(
        None,
        &[
            Step::Create(1, Ask::Any),
            Step::Settle,
            Step::Change(1, Ask::ClusterIp),
            Step::DeletePool(0),
            Step::Restart,
        ],
    );
}

/// Found by the property: a Service turned ClusterIP before the controller saw it, its pool
/// re-created (with no grace) while it still named its address, and another Service then
/// given that address.
#[test]
fn an_address_still_named_by_a_service_turned_cluster_ip_is_not_given_to_another() {
    run_lifecycle(
        Some(0),
        &[
            Step::Create(0, Ask::Any),
            Step::Wait,
            Step::Create(3, Ask::Pool(0)),
            Step::Settle,
            Step::Settle,
            Step::Change(3, Ask::ClusterIp),
            Step::Recreate(0, 2, 1, 2),
        ],
    );
}
