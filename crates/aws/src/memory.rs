//! An in-memory ELBv2 that enforces the rules AWS enforces and moto does not (unique load
//! balancer and target group names, one listener per port, a target group used by one load
//! balancer, targets keyed by ID and port, unknown instances refused, at most 20 ARNs per
//! DescribeTags), counts every call, and fails calls on request: what berth's reconcile is
//! tested against before it meets moto.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use crate::elbv2::{
    ApiError, ApiErrorKind, ApiResult, Elbv2, LbQuery, Page, TgQuery, NAMES_PER_CALL, TAGS_PER_CALL,
};
use crate::model::{
    HealthCheck, ListenerSpec, ListenerTls, LoadBalancerSpec, Target, TargetGroupSpec, TgProtocol,
};
use crate::observed::{Listener, LoadBalancer, Tags, TargetGroup};

#[derive(Debug, Default)]
struct State {
    subnets: BTreeMap<String, String>,
    instances: BTreeSet<String>,
    lbs: BTreeMap<String, LoadBalancer>,
    tgs: BTreeMap<String, TargetGroup>,
    listeners: BTreeMap<String, Listener>,
    targets: BTreeMap<String, BTreeSet<Target>>,
    tags: BTreeMap<String, Tags>,
    lb_attributes: BTreeMap<String, BTreeMap<String, String>>,
    tg_attributes: BTreeMap<String, BTreeMap<String, String>>,
    next_id: u64,
    calls: BTreeMap<&'static str, u64>,
    /// Mutating calls still allowed before every call fails (a crash mid-reconcile).
    mutations_left: Option<u64>,
    page_size: usize,
    /// Every page says there is another, under the same marker (a broken server).
    repeat_markers: bool,
}

/// The fake. Cloning is not offered: share it behind an `Arc`.
#[derive(Debug)]
pub struct MemoryElbv2 {
    state: Mutex<State>,
}

impl Default for MemoryElbv2 {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything the fake holds, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub load_balancers: Vec<LoadBalancer>,
    pub target_groups: Vec<TargetGroup>,
    pub listeners: Vec<Listener>,
    pub targets: BTreeMap<String, BTreeSet<Target>>,
    pub tags: BTreeMap<String, Tags>,
}

fn err(op: &'static str, kind: ApiErrorKind, code: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(op, kind, code, message)
}

/// What AWS answers for an ARN it does not know (`LoadBalancerNotFound`, ...).
fn not_found(op: &'static str, code: &str) -> ApiError {
    err(op, ApiErrorKind::NotFound, code, "not found")
}

const MUTATING: [&str; 15] = [
    "CreateLoadBalancer",
    "CreateTargetGroup",
    "CreateListener",
    "SetSubnets",
    "ModifyLoadBalancerAttributes",
    "ModifyTargetGroup",
    "ModifyTargetGroupAttributes",
    "ModifyListener",
    "RegisterTargets",
    "DeregisterTargets",
    "DeleteListener",
    "DeleteLoadBalancer",
    "DeleteTargetGroup",
    "AddTags",
    "RemoveTags",
];

/// Every operation berth calls.
pub const ALL_OPERATIONS: [&str; 22] = [
    "DescribeLoadBalancers",
    "DescribeTargetGroups",
    "DescribeTags",
    "DescribeListeners",
    "DescribeTargetHealth",
    "DescribeLoadBalancerAttributes",
    "DescribeTargetGroupAttributes",
    "CreateLoadBalancer",
    "CreateTargetGroup",
    "CreateListener",
    "SetSubnets",
    "ModifyLoadBalancerAttributes",
    "ModifyTargetGroup",
    "ModifyTargetGroupAttributes",
    "ModifyListener",
    "RegisterTargets",
    "DeregisterTargets",
    "DeleteListener",
    "DeleteLoadBalancer",
    "DeleteTargetGroup",
    "AddTags",
    "RemoveTags",
];

/// Whether an ELBv2 operation changes anything.
pub fn is_mutating(operation: &str) -> bool {
    MUTATING.contains(&operation)
}

impl MemoryElbv2 {
    pub fn new() -> Self {
        MemoryElbv2 {
            state: Mutex::new(State {
                page_size: 400,
                ..State::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock leaves consistent data: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A subnet the fake knows, in a VPC.
    pub fn add_subnet(&self, subnet: &str, vpc: &str) {
        self.lock()
            .subnets
            .insert(subnet.to_string(), vpc.to_string());
    }

    /// An EC2 instance that may be registered as a target.
    pub fn add_instance(&self, id: &str) {
        self.lock().instances.insert(id.to_string());
    }

    /// Page size of the unfiltered Describe calls.
    pub fn set_page_size(&self, size: usize) {
        self.lock().page_size = size.max(1);
    }

    /// Every paged answer names the same next marker, for ever, as a broken endpoint might.
    pub fn repeat_markers(&self, on: bool) {
        self.lock().repeat_markers = on;
    }

    /// After `n` more mutating calls, every call fails as if the process had died.
    pub fn fail_after_mutations(&self, n: Option<u64>) {
        self.lock().mutations_left = n;
    }

    /// Calls made so far, by operation.
    pub fn calls(&self) -> BTreeMap<&'static str, u64> {
        self.lock().calls.clone()
    }

    pub fn reset_calls(&self) {
        self.lock().calls.clear();
    }

    pub fn snapshot(&self) -> Snapshot {
        let s = self.lock();
        Snapshot {
            load_balancers: s.lbs.values().cloned().collect(),
            target_groups: s.tgs.values().cloned().collect(),
            listeners: s.listeners.values().cloned().collect(),
            targets: s.targets.clone(),
            tags: s.tags.clone(),
        }
    }

    fn call(&self, op: &'static str) -> ApiResult<MutexGuard<'_, State>> {
        let mut s = self.lock();
        *s.calls.entry(op).or_default() += 1;
        if let Some(left) = s.mutations_left {
            if left == 0 {
                return Err(err(
                    op,
                    ApiErrorKind::Transient,
                    "Crashed",
                    "the fake stopped answering",
                ));
            }
            if is_mutating(op) {
                s.mutations_left = Some(left - 1);
            }
        }
        Ok(s)
    }
}

impl State {
    fn arn(&mut self, kind: &str, name: &str) -> String {
        self.next_id += 1;
        format!(
            "arn:aws:elasticloadbalancing:us-east-1:000000000000:{kind}/{name}/{:016x}",
            self.next_id
        )
    }

    fn page<T: Clone>(&self, all: Vec<T>, marker: Option<String>) -> Page<T> {
        let start: usize = marker.and_then(|m| m.parse().ok()).unwrap_or(0);
        let end = (start + self.page_size).min(all.len());
        let next_marker = if self.repeat_markers {
            Some("1".to_string())
        } else {
            (end < all.len()).then(|| end.to_string())
        };
        Page {
            items: all.get(start..end).map(<[T]>::to_vec).unwrap_or_default(),
            next_marker,
            skipped: 0,
        }
    }

    fn lb_of_listener_tg(&self, tg: &str) -> Vec<String> {
        self.listeners
            .values()
            .filter(|l| l.target_group_arn.as_deref() == Some(tg))
            .map(|l| l.load_balancer_arn.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    fn tg_view(&self, tg: &TargetGroup) -> TargetGroup {
        TargetGroup {
            load_balancer_arns: self.lb_of_listener_tg(&tg.arn),
            ..tg.clone()
        }
    }
}

fn too_many(op: &'static str, n: usize, max: usize) -> ApiResult<()> {
    if n > max {
        return Err(err(
            op,
            ApiErrorKind::Invalid,
            "ValidationError",
            format!("at most {max} items, got {n}"),
        ));
    }
    Ok(())
}

impl Elbv2 for MemoryElbv2 {
    async fn describe_load_balancers(&self, query: LbQuery) -> ApiResult<Page<LoadBalancer>> {
        const OP: &str = "DescribeLoadBalancers";
        let s = self.call(OP)?;
        match query {
            LbQuery::All { marker } => Ok(s.page(s.lbs.values().cloned().collect(), marker)),
            LbQuery::Arns(arns) => {
                too_many(OP, arns.len(), NAMES_PER_CALL)?;
                let items = arns
                    .iter()
                    .map(|a| {
                        s.lbs.get(a).cloned().ok_or_else(|| {
                            err(
                                OP,
                                ApiErrorKind::NotFound,
                                "LoadBalancerNotFound",
                                format!("{a} not found"),
                            )
                        })
                    })
                    .collect::<ApiResult<Vec<_>>>()?;
                Ok(Page {
                    items,
                    next_marker: None,
                    skipped: 0,
                })
            }
            LbQuery::Names(names) => {
                too_many(OP, names.len(), NAMES_PER_CALL)?;
                let mut items = Vec::new();
                for n in &names {
                    let found: Vec<_> =
                        s.lbs.values().filter(|lb| &lb.name == n).cloned().collect();
                    if found.is_empty() {
                        return Err(err(
                            OP,
                            ApiErrorKind::NotFound,
                            "LoadBalancerNotFound",
                            format!("{n} not found"),
                        ));
                    }
                    items.extend(found);
                }
                Ok(Page {
                    items,
                    next_marker: None,
                    skipped: 0,
                })
            }
        }
    }

    async fn describe_target_groups(&self, query: TgQuery) -> ApiResult<Page<TargetGroup>> {
        const OP: &str = "DescribeTargetGroups";
        let s = self.call(OP)?;
        let all: Vec<TargetGroup> = s.tgs.values().map(|t| s.tg_view(t)).collect();
        match query {
            TgQuery::All { marker } => Ok(s.page(all, marker)),
            TgQuery::LoadBalancer(lb) => {
                if !s.lbs.contains_key(&lb) {
                    return Err(err(
                        OP,
                        ApiErrorKind::NotFound,
                        "LoadBalancerNotFound",
                        format!("{lb} not found"),
                    ));
                }
                let items = all
                    .into_iter()
                    .filter(|t| t.load_balancer_arns.contains(&lb))
                    .collect();
                Ok(Page {
                    items,
                    next_marker: None,
                    skipped: 0,
                })
            }
            TgQuery::Names(names) => {
                too_many(OP, names.len(), NAMES_PER_CALL)?;
                let mut items = Vec::new();
                for n in &names {
                    match all.iter().find(|t| &t.name == n) {
                        Some(t) => items.push(t.clone()),
                        None => {
                            return Err(err(
                                OP,
                                ApiErrorKind::NotFound,
                                "TargetGroupNotFound",
                                format!("{n} not found"),
                            ))
                        }
                    }
                }
                Ok(Page {
                    items,
                    next_marker: None,
                    skipped: 0,
                })
            }
        }
    }

    async fn describe_tags(&self, arns: Vec<String>) -> ApiResult<BTreeMap<String, Tags>> {
        const OP: &str = "DescribeTags";
        let s = self.call(OP)?;
        too_many(OP, arns.len(), TAGS_PER_CALL)?;
        arns.into_iter()
            .map(|a| {
                if !(s.lbs.contains_key(&a)
                    || s.tgs.contains_key(&a)
                    || s.listeners.contains_key(&a))
                {
                    return Err(err(
                        OP,
                        ApiErrorKind::NotFound,
                        "LoadBalancerNotFound",
                        format!("{a} not found"),
                    ));
                }
                let tags = s.tags.get(&a).cloned().unwrap_or_default();
                Ok((a, tags))
            })
            .collect()
    }

    async fn describe_listeners(&self, load_balancer_arn: String) -> ApiResult<Vec<Listener>> {
        const OP: &str = "DescribeListeners";
        let s = self.call(OP)?;
        if !s.lbs.contains_key(&load_balancer_arn) {
            return Err(not_found(OP, "LoadBalancerNotFound"));
        }
        Ok(s.listeners
            .values()
            .filter(|l| l.load_balancer_arn == load_balancer_arn)
            .cloned()
            .collect())
    }

    async fn describe_target_health(
        &self,
        target_group_arn: String,
    ) -> ApiResult<BTreeSet<Target>> {
        const OP: &str = "DescribeTargetHealth";
        let s = self.call(OP)?;
        if !s.tgs.contains_key(&target_group_arn) {
            return Err(not_found(OP, "TargetGroupNotFound"));
        }
        Ok(s.targets
            .get(&target_group_arn)
            .cloned()
            .unwrap_or_default())
    }

    async fn describe_load_balancer_attributes(
        &self,
        arn: String,
    ) -> ApiResult<BTreeMap<String, String>> {
        const OP: &str = "DescribeLoadBalancerAttributes";
        let s = self.call(OP)?;
        if !s.lbs.contains_key(&arn) {
            return Err(not_found(OP, "LoadBalancerNotFound"));
        }
        Ok(s.lb_attributes.get(&arn).cloned().unwrap_or_default())
    }

    async fn describe_target_group_attributes(
        &self,
        arn: String,
    ) -> ApiResult<BTreeMap<String, String>> {
        const OP: &str = "DescribeTargetGroupAttributes";
        let s = self.call(OP)?;
        if !s.tgs.contains_key(&arn) {
            return Err(not_found(OP, "TargetGroupNotFound"));
        }
        Ok(s.tg_attributes.get(&arn).cloned().unwrap_or_default())
    }

    async fn create_load_balancer(&self, spec: LoadBalancerSpec) -> ApiResult<LoadBalancer> {
        const OP: &str = "CreateLoadBalancer";
        let mut s = self.call(OP)?;
        if s.lbs.values().any(|lb| lb.name == spec.name) {
            return Err(err(
                OP,
                ApiErrorKind::Duplicate,
                "DuplicateLoadBalancerName",
                format!("{} exists", spec.name),
            ));
        }
        let mut vpcs = BTreeSet::new();
        for subnet in &spec.subnets {
            match s.subnets.get(subnet) {
                Some(vpc) => vpcs.insert(vpc.clone()),
                None => {
                    return Err(err(
                        OP,
                        ApiErrorKind::Invalid,
                        "InvalidSubnet",
                        format!("{subnet} not found"),
                    ))
                }
            };
        }
        if vpcs.len() != 1 {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "InvalidConfigurationRequest",
                "subnets must be in one VPC",
            ));
        }
        let arn = s.arn("loadbalancer/net", &spec.name);
        let lb = LoadBalancer {
            dns_name: format!("{}-{:x}.elb.us-east-1.amazonaws.com", spec.name, s.next_id),
            arn: arn.clone(),
            name: spec.name,
            scheme: spec.scheme,
            subnets: spec.subnets,
            vpc_id: vpcs.into_iter().next(),
        };
        s.tags.insert(arn.clone(), spec.tags);
        s.lbs.insert(arn, lb.clone());
        Ok(lb)
    }

    async fn create_target_group(
        &self,
        spec: TargetGroupSpec,
        vpc_id: Option<String>,
    ) -> ApiResult<TargetGroup> {
        const OP: &str = "CreateTargetGroup";
        let mut s = self.call(OP)?;
        if s.tgs.values().any(|t| t.name == spec.name) {
            return Err(err(
                OP,
                ApiErrorKind::Duplicate,
                "DuplicateTargetGroupName",
                format!("{} exists", spec.name),
            ));
        }
        if vpc_id.is_none() {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "ValidationError",
                "a VPC ID is required",
            ));
        }
        let arn = s.arn("targetgroup", &spec.name);
        let tg = TargetGroup {
            arn: arn.clone(),
            name: spec.name,
            protocol: spec.protocol,
            port: spec.port,
            target_type: spec.target_type,
            health_check: spec.health_check,
            load_balancer_arns: Vec::new(),
        };
        s.tags.insert(arn.clone(), spec.tags);
        s.tgs.insert(arn, tg.clone());
        Ok(tg)
    }

    async fn create_listener(
        &self,
        load_balancer_arn: String,
        spec: ListenerSpec,
        target_group_arn: String,
        tags: Tags,
    ) -> ApiResult<Listener> {
        const OP: &str = "CreateListener";
        let mut s = self.call(OP)?;
        if !s.lbs.contains_key(&load_balancer_arn) {
            return Err(not_found(OP, "LoadBalancerNotFound"));
        }
        let Some(tg) = s.tgs.get(&target_group_arn).cloned() else {
            return Err(not_found(OP, "TargetGroupNotFound"));
        };
        if tg.protocol != spec.protocol {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "IncompatibleProtocols",
                "listener and target group protocols differ",
            ));
        }
        if s.lb_of_listener_tg(&target_group_arn)
            .iter()
            .any(|lb| lb != &load_balancer_arn)
        {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "TargetGroupAssociationLimit",
                "the target group is used by another load balancer",
            ));
        }
        if s.listeners
            .values()
            .any(|l| l.load_balancer_arn == load_balancer_arn && l.port == spec.port)
        {
            return Err(err(
                OP,
                ApiErrorKind::Duplicate,
                "DuplicateListener",
                format!("port {} is taken", spec.port),
            ));
        }
        let arn = s.arn("listener/net", &spec.port.to_string());
        let listener = Listener {
            arn: arn.clone(),
            load_balancer_arn,
            port: spec.port,
            protocol: Some(spec.protocol),
            target_group_arn: Some(target_group_arn),
            tls: spec.tls,
        };
        s.tags.insert(arn.clone(), tags);
        s.listeners.insert(arn, listener.clone());
        Ok(listener)
    }

    async fn set_subnets(&self, arn: String, subnets: BTreeSet<String>) -> ApiResult<()> {
        const OP: &str = "SetSubnets";
        let mut s = self.call(OP)?;
        if let Some(bad) = subnets.iter().find(|n| !s.subnets.contains_key(*n)) {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "InvalidSubnet",
                format!("{bad} not found"),
            ));
        }
        let lb = s
            .lbs
            .get_mut(&arn)
            .ok_or_else(|| not_found(OP, "LoadBalancerNotFound"))?;
        lb.subnets = subnets;
        Ok(())
    }

    async fn modify_load_balancer_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> ApiResult<()> {
        const OP: &str = "ModifyLoadBalancerAttributes";
        let mut s = self.call(OP)?;
        if !s.lbs.contains_key(&arn) {
            return Err(not_found(OP, "LoadBalancerNotFound"));
        }
        s.lb_attributes.entry(arn).or_default().extend(attributes);
        Ok(())
    }

    async fn modify_target_group(&self, arn: String, health_check: HealthCheck) -> ApiResult<()> {
        const OP: &str = "ModifyTargetGroup";
        let mut s = self.call(OP)?;
        let tg = s
            .tgs
            .get_mut(&arn)
            .ok_or_else(|| not_found(OP, "TargetGroupNotFound"))?;
        tg.health_check = health_check;
        Ok(())
    }

    async fn modify_target_group_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> ApiResult<()> {
        const OP: &str = "ModifyTargetGroupAttributes";
        let mut s = self.call(OP)?;
        if !s.tgs.contains_key(&arn) {
            return Err(not_found(OP, "TargetGroupNotFound"));
        }
        s.tg_attributes.entry(arn).or_default().extend(attributes);
        Ok(())
    }

    async fn modify_listener(
        &self,
        arn: String,
        protocol: Option<TgProtocol>,
        tls: Option<ListenerTls>,
        target_group_arn: String,
    ) -> ApiResult<()> {
        const OP: &str = "ModifyListener";
        let mut s = self.call(OP)?;
        let Some(tg) = s.tgs.get(&target_group_arn).cloned() else {
            return Err(not_found(OP, "TargetGroupNotFound"));
        };
        let Some(current) = s.listeners.get(&arn).cloned() else {
            return Err(not_found(OP, "ListenerNotFound"));
        };
        let protocol = protocol.or(current.protocol);
        if protocol != Some(tg.protocol) {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "IncompatibleProtocols",
                "listener and target group protocols differ",
            ));
        }
        let Some(lb) = s.listeners.get(&arn).map(|l| l.load_balancer_arn.clone()) else {
            return Err(not_found(OP, "ListenerNotFound"));
        };
        if s.lb_of_listener_tg(&target_group_arn)
            .iter()
            .any(|other| other != &lb)
        {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "TargetGroupAssociationLimit",
                "the target group is used by another load balancer",
            ));
        }
        if let Some(l) = s.listeners.get_mut(&arn) {
            l.protocol = protocol;
            l.tls = tls;
            l.target_group_arn = Some(target_group_arn);
        }
        Ok(())
    }

    async fn register_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> ApiResult<()> {
        const OP: &str = "RegisterTargets";
        let mut s = self.call(OP)?;
        let Some(tg) = s.tgs.get(&target_group_arn).cloned() else {
            return Err(not_found(OP, "TargetGroupNotFound"));
        };
        if tg.target_type == crate::model::TargetType::Instance {
            if let Some(bad) = targets.iter().find(|t| !s.instances.contains(&t.id)) {
                return Err(err(
                    OP,
                    ApiErrorKind::Invalid,
                    "InvalidTarget",
                    format!("{} is not a running instance", bad.id),
                ));
            }
        }
        s.targets
            .entry(target_group_arn)
            .or_default()
            .extend(targets);
        Ok(())
    }

    async fn deregister_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> ApiResult<()> {
        const OP: &str = "DeregisterTargets";
        let mut s = self.call(OP)?;
        let registered = s.targets.entry(target_group_arn).or_default();
        if let Some(bad) = targets.iter().find(|t| !registered.contains(*t)) {
            return Err(err(
                OP,
                ApiErrorKind::Invalid,
                "InvalidTarget",
                format!("{}:{} is not registered", bad.id, bad.port),
            ));
        }
        for t in &targets {
            registered.remove(t);
        }
        Ok(())
    }

    async fn delete_listener(&self, arn: String) -> ApiResult<()> {
        const OP: &str = "DeleteListener";
        let mut s = self.call(OP)?;
        s.listeners.remove(&arn);
        s.tags.remove(&arn);
        Ok(())
    }

    async fn delete_load_balancer(&self, arn: String) -> ApiResult<()> {
        const OP: &str = "DeleteLoadBalancer";
        let mut s = self.call(OP)?;
        // As AWS: deleting what does not exist succeeds; the listeners go with it.
        s.lbs.remove(&arn);
        s.tags.remove(&arn);
        s.lb_attributes.remove(&arn);
        let gone: Vec<String> = s
            .listeners
            .values()
            .filter(|l| l.load_balancer_arn == arn)
            .map(|l| l.arn.clone())
            .collect();
        for l in gone {
            s.listeners.remove(&l);
            s.tags.remove(&l);
        }
        Ok(())
    }

    async fn delete_target_group(&self, arn: String) -> ApiResult<()> {
        const OP: &str = "DeleteTargetGroup";
        let mut s = self.call(OP)?;
        if !s.lb_of_listener_tg(&arn).is_empty() {
            return Err(err(
                OP,
                ApiErrorKind::InUse,
                "ResourceInUse",
                "a listener uses the target group",
            ));
        }
        s.tgs.remove(&arn);
        s.tags.remove(&arn);
        s.targets.remove(&arn);
        s.tg_attributes.remove(&arn);
        Ok(())
    }

    async fn add_tags(&self, arn: String, tags: Tags) -> ApiResult<()> {
        const OP: &str = "AddTags";
        let mut s = self.call(OP)?;
        if !(s.lbs.contains_key(&arn) || s.tgs.contains_key(&arn) || s.listeners.contains_key(&arn))
        {
            return Err(not_found(OP, "LoadBalancerNotFound"));
        }
        s.tags.entry(arn).or_default().extend(tags);
        Ok(())
    }

    async fn remove_tags(&self, arn: String, keys: Vec<String>) -> ApiResult<()> {
        const OP: &str = "RemoveTags";
        let mut s = self.call(OP)?;
        if let Some(t) = s.tags.get_mut(&arn) {
            for k in &keys {
                t.remove(k);
            }
        }
        Ok(())
    }
}
