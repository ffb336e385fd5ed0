//! The reconcile: find what the Service has by its tags (starting from the ARN remembered on
//! the Service), diff against the model, apply only the difference. Look-ups come before every
//! create, so a crash between two calls never leaves a duplicate: the next reconcile finds what
//! the last one made by its deterministic name and adopts it.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_api::names::aws_tag;

use crate::elbv2::{ApiError, ApiErrorKind, Elbv2, LbQuery, Page, TgQuery, TAGS_PER_CALL};
use crate::metrics::{AwsMetrics, SWEPT_LOAD_BALANCER, SWEPT_TARGET_GROUP};
use crate::model::{
    build_stack, load_balancer_names, IpTargets, ModelError, NodeFacts, ProviderConfig, Scheme,
    ServiceFacts, Stack,
};
use crate::observed::{
    LoadBalancer, Observed, ObservedLoadBalancer, ObservedTargetGroup, Tags, TargetGroup,
};
use crate::plan::{plan_delete, plan_stack, LbRef, Step, TgRef};
use crate::subnets::{choose_subnets, SubnetChoice, SubnetSource};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("{kind} {name} exists but is not berth's for this Service (tags {tags:?}): it is left alone; choose another name")]
    NameTaken {
        kind: &'static str,
        name: String,
        tags: Tags,
    },
    #[error("{0} resources of the Service still exist after deleting them; will check again")]
    NotYetGone(usize),
    #[error("a step refers to {0}, which this reconcile did not create")]
    Unresolved(String),
    #[error("{operation}: {reason}: the listing is given up")]
    Paging {
        operation: &'static str,
        reason: String,
    },
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: &'static str, after: Duration },
    #[error(transparent)]
    Subnets(#[from] crate::subnets::DiscoveryError),
}

impl Error {
    /// A Service that cannot be modelled stays wrong until it changes; the rest may heal.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Model(_) | Error::NameTaken { .. } => false,
            Error::Api(e) => e.kind != ApiErrorKind::Invalid,
            Error::NotYetGone(_)
            | Error::Unresolved(_)
            | Error::Paging { .. }
            | Error::Timeout { .. }
            // Someone may tag a subnet: tried again with backoff.
            | Error::Subnets(_) => true,
        }
    }
}

/// The outcome of an ensure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ensured {
    /// The NLB's DNS name, for `status.loadBalancer.ingress[].hostname`.
    pub hostname: String,
    pub load_balancer_arn: String,
    /// Nodes without an EC2 instance in `spec.providerID`.
    pub skipped_nodes: Vec<String>,
    /// Mutating calls made (0 when nothing had to change).
    pub changes: usize,
    /// Which subnets discovery chose and why, when the Service's subnets came from their tags.
    pub discovered_subnets: Option<String>,
}

/// What a sweep removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    pub load_balancers: Vec<String>,
    pub target_groups: Vec<String>,
    /// Live Services one of whose resources vanished: their next ensure reads AWS again.
    pub drifted: Vec<String>,
}

#[derive(Debug, Clone)]
struct Converged {
    fingerprint: u64,
    at: Instant,
    lb_arn: String,
    hostname: String,
    tg_arns: BTreeSet<String>,
    skipped_nodes: Vec<String>,
}

/// How long the sweep may take to list the account. A region at its quotas (3,000 target
/// groups, a few hundred load balancers) is a few dozen pages and about 200 DescribeTags at 50
/// calls a second.
pub const LISTING_TIMEOUT: Duration = Duration::from_secs(120);

/// The NLB provider over any ELBv2 client.
#[derive(Debug)]
pub struct NlbProvider<C> {
    client: C,
    config: ProviderConfig,
    /// A Service whose model has not changed since it converged is not read again until this
    /// much time has passed (or a sweep saw one of its resources vanish).
    verify_after: Duration,
    /// Target groups in the region (every owner's) as the last listing counted them, kept
    /// up to date with what berth creates and deletes since: a Service whose new target
    /// groups would pass the regional quota is refused before it creates any.
    region_target_groups: Mutex<Option<usize>>,
    converged: Mutex<HashMap<String, Converged>>,
    /// Services with an ensure under way: the sweep leaves their target groups alone, since a
    /// new one has no listener until the ensure reaches it.
    in_flight: Mutex<BTreeSet<String>>,
    /// When `delete` last confirmed that a Service has nothing left: a sweep whose listing
    /// began before that saw resources that are gone since, which are no leak.
    deleted: Mutex<HashMap<String, Instant>>,
    /// What the sweep removed (the SDK client counts the calls into the same metrics).
    metrics: Arc<AwsMetrics>,
    /// Where subnets are discovered for Services that name none (no annotation, no
    /// `--aws-subnets`); `None`: such a Service is refused.
    subnet_source: Option<Arc<dyn SubnetSource>>,
    /// The last choice per scheme, reused for `verify_after`: a steady state makes no call.
    subnet_choices: Mutex<HashMap<Scheme, (Instant, SubnetChoice)>>,
}

/// What a sweep found tagged in the account, listed before the Services are read: everything
/// listed was made before that read, so the Service of a load balancer made meanwhile is in
/// the live set, and its new load balancer is never taken for a leak.
#[derive(Debug, Clone)]
pub struct SweepListing {
    load_balancers: Vec<LoadBalancer>,
    target_groups: Vec<TargetGroup>,
    tags: BTreeMap<String, Tags>,
    /// When the listing began: only Services that converged before can miss something in it.
    started: Instant,
}

/// Marks a Service in flight for as long as it lives.
struct InFlight<'a> {
    set: &'a Mutex<BTreeSet<String>>,
    key: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

fn fingerprint(stack: &Stack) -> u64 {
    let mut h = DefaultHasher::new();
    stack.hash(&mut h);
    h.finish()
}

fn ours(tags: &Tags, config: &ProviderConfig, service: Option<&str>) -> bool {
    tags.get(aws_tag::CLUSTER) == Some(&config.cluster_name)
        && service.is_none_or(|s| tags.get(aws_tag::SERVICE).map(String::as_str) == Some(s))
}

/// Most pages one listing reads: at 400 items a page, far more load balancers and target
/// groups than a region's quotas allow, so a longer listing is a server that never ends.
pub const MAX_PAGES: usize = 100;

/// Every page of a marker-paged Describe. A marker that comes back twice, or more than
/// [`MAX_PAGES`] pages, ends the listing with an error instead of looping forever.
/// Returns the items and how many were skipped as someone else's.
async fn all_pages<T, F, Fut>(
    operation: &'static str,
    mut fetch: F,
) -> Result<(Vec<T>, usize), Error>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T>, ApiError>>,
{
    let mut items = Vec::new();
    let mut skipped = 0;
    let mut seen = BTreeSet::new();
    let mut marker = None;
    for _ in 0..MAX_PAGES {
        let page = fetch(marker.take()).await?;
        items.extend(page.items);
        skipped += page.skipped;
        match page.next_marker {
            None => return Ok((items, skipped)),
            Some(m) if !seen.insert(m.clone()) => {
                return Err(Error::Paging {
                    operation,
                    reason: format!("the marker {m:?} came back twice"),
                })
            }
            Some(m) => marker = Some(m),
        }
    }
    Err(Error::Paging {
        operation,
        reason: format!("more than {MAX_PAGES} pages"),
    })
}

/// `NotFound` is an answer, not a failure, for a look-up.
fn found<T: Default>(result: Result<T, ApiError>) -> Result<T, ApiError> {
    match result {
        Err(e) if e.is_not_found() => Ok(T::default()),
        other => other,
    }
}

impl<C: Elbv2> NlbProvider<C> {
    pub fn new(client: C, config: ProviderConfig, verify_after: Duration) -> Self {
        NlbProvider {
            client,
            config,
            verify_after,
            region_target_groups: Mutex::new(None),
            converged: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(BTreeSet::new()),
            deleted: Mutex::new(HashMap::new()),
            metrics: Arc::new(AwsMetrics::default()),
            subnet_source: None,
            subnet_choices: Mutex::new(HashMap::new()),
        }
    }

    /// Discovers subnets by their tags through `source` for Services that name none.
    pub fn with_subnet_source(mut self, source: Arc<dyn SubnetSource>) -> Self {
        self.subnet_source = Some(source);
        self
    }

    /// The discovered subnets for `svc`, or `None` when it names its own (annotation) or the
    /// controller's `--aws-subnets` applies, or no source is configured.
    async fn discover_subnets(&self, svc: &ServiceFacts) -> Result<Option<SubnetChoice>, Error> {
        let Some(source) = &self.subnet_source else {
            return Ok(None);
        };
        if svc
            .annotations
            .contains_key(berth_api::names::annotation::AWS_LOAD_BALANCER_SUBNETS)
            || !self.config.default_subnets.is_empty()
        {
            return Ok(None);
        }
        let scheme = crate::model::scheme_of(svc)?;
        let choices = || {
            self.subnet_choices
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        };
        if let Some((at, choice)) = choices().get(&scheme) {
            if at.elapsed() < self.verify_after {
                return Ok(Some(choice.clone()));
            }
        }
        let subnets = source
            .describe_subnets(crate::subnets::role_tag(scheme))
            .await?;
        let choice = choose_subnets(&subnets, &self.config.cluster_name, scheme)?;
        choices().insert(scheme, (Instant::now(), choice.clone()));
        Ok(Some(choice))
    }

    /// Counts what the sweep removes into `metrics` (the binary's registered ones).
    pub fn with_metrics(mut self, metrics: Arc<AwsMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &AwsMetrics {
        &self.metrics
    }

    pub fn client(&self) -> &C {
        &self.client
    }

    pub fn into_client(self) -> C {
        self.client
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Converged>> {
        self.converged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets what is known of a Service, so its next ensure reads AWS.
    pub fn forget(&self, service: &str) {
        self.cache().remove(service);
    }

    /// Makes the Service's NLB match its model. `known_arn` is the ARN remembered on the
    /// Service, if any.
    pub async fn ensure(
        &self,
        svc: &ServiceFacts,
        nodes: &[NodeFacts],
        ip_targets: &IpTargets,
        known_arn: Option<&str>,
    ) -> Result<Ensured, Error> {
        let discovered = self.discover_subnets(svc).await?;
        let with_discovered;
        let config = match &discovered {
            Some(choice) => {
                with_discovered = ProviderConfig {
                    default_subnets: choice.ids(),
                    ..self.config.clone()
                };
                &with_discovered
            }
            None => &self.config,
        };
        let discovered_subnets = discovered.map(|c| c.to_string());
        let stack = build_stack(svc, nodes, ip_targets, config)?;
        let key = stack.service.clone();
        let _in_flight = self.start(&key);
        let print = fingerprint(&stack);
        if let Some(c) = self.cache().get(&key) {
            if c.fingerprint == print && c.at.elapsed() < self.verify_after {
                return Ok(Ensured {
                    hostname: c.hostname.clone(),
                    load_balancer_arn: c.lb_arn.clone(),
                    skipped_nodes: c.skipped_nodes.clone(),
                    changes: 0,
                    discovered_subnets,
                });
            }
        }
        self.forget(&key);
        let tg_names: Vec<String> = stack
            .target_groups
            .values()
            .map(|t| t.name.clone())
            .collect();
        let observed = self
            .fetch(
                svc,
                known_arn,
                &tg_names,
                !stack.load_balancer.attributes.is_empty(),
                stack
                    .target_groups
                    .values()
                    .any(|t| !t.attributes.is_empty()),
            )
            .await?;
        self.refuse_taken_names(&stack, &observed.foreign)?;
        let steps = plan_stack(&stack, &observed.ours);
        self.check_region_quota(&steps)?;
        let changes = steps.len();
        let applied = self
            .apply(steps, &observed.ours, stack.load_balancer.tags.clone())
            .await?;
        let lb = applied
            .load_balancer
            .ok_or_else(|| Error::Unresolved("the load balancer".to_string()))?;
        let tg_arns = stack
            .target_groups
            .keys()
            .filter_map(|r| applied.target_groups.get(r).cloned())
            .collect();
        self.cache().insert(
            key,
            Converged {
                fingerprint: print,
                at: Instant::now(),
                lb_arn: lb.arn.clone(),
                hostname: lb.dns_name.to_lowercase(),
                tg_arns,
                skipped_nodes: stack.skipped_nodes.clone(),
            },
        );
        Ok(Ensured {
            hostname: lb.dns_name.to_lowercase(),
            load_balancer_arn: lb.arn,
            skipped_nodes: stack.skipped_nodes,
            changes,
            discovered_subnets,
        })
    }

    fn start(&self, key: &str) -> InFlight<'_> {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string());
        InFlight {
            set: &self.in_flight,
            key: key.to_string(),
        }
    }

    /// Removes everything the Service has in AWS and confirms that nothing is left. Works
    /// from the Service's last known state, even if its annotations no longer model.
    pub async fn delete(
        &self,
        svc: &ServiceFacts,
        known_arn: Option<&str>,
    ) -> Result<usize, Error> {
        let key = svc.key();
        let _in_flight = self.start(&key);
        self.forget(&key);
        let tg_names: Vec<String> = build_stack(svc, &[], &IpTargets::new(), &self.config)
            .map(|s| s.target_groups.values().map(|t| t.name.clone()).collect())
            .unwrap_or_default();
        let observed = self.fetch(svc, known_arn, &tg_names, false, false).await?;
        let steps = plan_delete(&observed.ours);
        let removed = steps.len();
        self.apply(steps, &observed.ours, Tags::new()).await?;
        let left = self.fetch(svc, None, &tg_names, false, false).await?;
        let count = left.ours.load_balancers.len() + left.ours.target_groups.len();
        if count > 0 {
            return Err(Error::NotYetGone(count));
        }
        self.deleted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Instant::now());
        Ok(removed)
    }

    fn region_count(&self) -> std::sync::MutexGuard<'_, Option<usize>> {
        self.region_target_groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses a plan whose new target groups would pass the regional quota, when a listing
    /// has counted the region (before the first one, AWS's own refusal is the guard).
    fn check_region_quota(&self, steps: &[Step]) -> Result<(), Error> {
        let creates = steps
            .iter()
            .filter(|s| matches!(s, Step::CreateTargetGroup(_)))
            .count();
        let limit = self.config.quotas.target_groups_per_region;
        match *self.region_count() {
            Some(in_use) if creates > 0 && in_use + creates > limit => {
                Err(Error::Model(ModelError::Quota {
                    quota: "Target groups per Region",
                    limit,
                    needed: in_use + creates,
                    hint: "; counted over every owner's target groups in the region as last listed: free some, or ask AWS for a higher quota",
                }))
            }
            _ => Ok(()),
        }
    }

    fn refuse_taken_names(&self, stack: &Stack, foreign: &Foreign) -> Result<(), Error> {
        if let Some(tags) = foreign.load_balancers.get(&stack.load_balancer.name) {
            return Err(Error::NameTaken {
                kind: "load balancer",
                name: stack.load_balancer.name.clone(),
                tags: tags.clone(),
            });
        }
        for tg in stack.target_groups.values() {
            if let Some(tags) = foreign.target_groups.get(&tg.name) {
                return Err(Error::NameTaken {
                    kind: "target group",
                    name: tg.name.clone(),
                    tags: tags.clone(),
                });
            }
        }
        Ok(())
    }

    async fn tags_of(&self, arns: Vec<String>) -> Result<BTreeMap<String, Tags>, Error> {
        let mut all = BTreeMap::new();
        for chunk in arns.chunks(TAGS_PER_CALL) {
            all.extend(found(self.client.describe_tags(chunk.to_vec()).await)?);
        }
        Ok(all)
    }

    async fn fetch(
        &self,
        svc: &ServiceFacts,
        known_arn: Option<&str>,
        tg_names: &[String],
        lb_attributes: bool,
        tg_attributes: bool,
    ) -> Result<Fetched, Error> {
        let key = svc.key();
        // The load balancer: by its remembered ARN, else by every name it may have. One name
        // per call, since AWS fails the whole call when one name is unknown.
        let mut lbs: Vec<LoadBalancer> = match known_arn {
            Some(arn) => found(
                self.client
                    .describe_load_balancers(LbQuery::Arns(vec![arn.to_string()]))
                    .await
                    .map(|p| p.items),
            )?,
            None => Vec::new(),
        };
        if lbs.is_empty() {
            for name in load_balancer_names(&self.config, svc) {
                lbs.extend(found(
                    self.client
                        .describe_load_balancers(LbQuery::Names(vec![name]))
                        .await
                        .map(|p| p.items),
                )?);
            }
        }
        let mut fetched = Fetched::default();
        let lb_tags = self
            .tags_of(lbs.iter().map(|l| l.arn.clone()).collect())
            .await?;
        let mut tgs: BTreeMap<String, TargetGroup> = BTreeMap::new();
        for lb in lbs {
            let tags = lb_tags.get(&lb.arn).cloned().unwrap_or_default();
            if !ours(&tags, &self.config, Some(&key)) {
                fetched.foreign.load_balancers.insert(lb.name.clone(), tags);
                continue;
            }
            let listeners = found(self.client.describe_listeners(lb.arn.clone()).await)?;
            let attributes = if lb_attributes {
                Some(found(
                    self.client
                        .describe_load_balancer_attributes(lb.arn.clone())
                        .await,
                )?)
            } else {
                None
            };
            for tg in found(
                self.client
                    .describe_target_groups(TgQuery::LoadBalancer(lb.arn.clone()))
                    .await
                    .map(|p| p.items),
            )? {
                tgs.insert(tg.arn.clone(), tg);
            }
            fetched.ours.load_balancers.push(ObservedLoadBalancer {
                lb,
                tags,
                attributes,
                listeners,
            });
        }
        // Target groups made before a crash left them without a listener are found by name.
        for name in tg_names {
            if tgs.values().any(|t| &t.name == name) {
                continue;
            }
            for tg in found(
                self.client
                    .describe_target_groups(TgQuery::Names(vec![name.clone()]))
                    .await
                    .map(|p| p.items),
            )? {
                tgs.insert(tg.arn.clone(), tg);
            }
        }
        let tg_tags = self.tags_of(tgs.keys().cloned().collect()).await?;
        for (arn, tg) in tgs {
            let tags = tg_tags.get(&arn).cloned().unwrap_or_default();
            if !ours(&tags, &self.config, Some(&key)) {
                fetched.foreign.target_groups.insert(tg.name.clone(), tags);
                continue;
            }
            let targets = found(self.client.describe_target_health(arn.clone()).await)?;
            let attributes = if tg_attributes {
                Some(found(
                    self.client
                        .describe_target_group_attributes(arn.clone())
                        .await,
                )?)
            } else {
                None
            };
            fetched.ours.target_groups.push(ObservedTargetGroup {
                tg,
                tags,
                attributes,
                targets,
            });
        }
        Ok(fetched)
    }

    async fn apply(
        &self,
        steps: Vec<Step>,
        observed: &Observed,
        listener_tags: Tags,
    ) -> Result<Applied, Error> {
        let mut applied = Applied {
            listener_tags,
            ..Applied::default()
        };
        let mut vpc = None;
        let mut deleted = BTreeSet::new();
        for step in &steps {
            if let Step::DeleteLoadBalancer { arn, .. } | Step::DeleteTargetGroup { arn } = step {
                deleted.insert(arn.clone());
            }
        }
        // The target groups that stay, by resource; created ones are added as they are made.
        for o in observed
            .target_groups
            .iter()
            .filter(|o| !deleted.contains(&o.tg.arn))
        {
            if let Some(resource) = o.tags.get(aws_tag::RESOURCE) {
                applied
                    .target_groups
                    .insert(resource.clone(), o.tg.arn.clone());
            }
        }
        // The load balancer that stays, if one does.
        if let Some(o) = observed
            .load_balancers
            .iter()
            .find(|o| !deleted.contains(&o.lb.arn))
        {
            vpc = o.lb.vpc_id.clone();
            applied.load_balancer = Some(o.lb.clone());
        }
        for step in steps {
            let lb_arn = |r: &LbRef, applied: &Applied| match r {
                LbRef::Arn(a) => Ok(a.clone()),
                LbRef::Planned => applied
                    .load_balancer
                    .as_ref()
                    .map(|l| l.arn.clone())
                    .ok_or_else(|| Error::Unresolved("the new load balancer".to_string())),
            };
            let tg_arn = |r: &TgRef, applied: &Applied| match r {
                TgRef::Arn(a) => Ok(a.clone()),
                TgRef::Planned(res) => applied
                    .target_groups
                    .get(res)
                    .cloned()
                    .ok_or_else(|| Error::Unresolved(format!("target group {res}"))),
            };
            match step {
                Step::DeleteLoadBalancer { arn, why } => {
                    tracing::info!(%arn, why, "deleting load balancer");
                    found(self.client.delete_load_balancer(arn).await)?;
                }
                Step::CreateLoadBalancer(spec) => {
                    let lb = self.client.create_load_balancer(spec).await?;
                    vpc = lb.vpc_id.clone();
                    applied.load_balancer = Some(lb);
                }
                Step::CreateTargetGroup(spec) => {
                    let resource = spec.resource.clone();
                    let tg = self.client.create_target_group(spec, vpc.clone()).await?;
                    if let Some(n) = self.region_count().as_mut() {
                        *n += 1;
                    }
                    applied.target_groups.insert(resource, tg.arn);
                }
                Step::SetSubnets { arn, subnets } => self.client.set_subnets(arn, subnets).await?,
                Step::ModifyLoadBalancerAttributes { lb, attributes } => {
                    let arn = lb_arn(&lb, &applied)?;
                    self.client
                        .modify_load_balancer_attributes(arn, attributes)
                        .await?
                }
                Step::ModifyTargetGroup { arn, health_check } => {
                    self.client.modify_target_group(arn, health_check).await?
                }
                Step::ModifyTargetGroupAttributes { tg, attributes } => {
                    let arn = tg_arn(&tg, &applied)?;
                    self.client
                        .modify_target_group_attributes(arn, attributes)
                        .await?
                }
                Step::RegisterTargets { tg, targets } => {
                    let arn = tg_arn(&tg, &applied)?;
                    self.client.register_targets(arn, targets).await?
                }
                Step::DeregisterTargets { arn, targets } => {
                    found(self.client.deregister_targets(arn, targets).await)?
                }
                Step::CreateListener {
                    lb,
                    spec,
                    target_group,
                } => {
                    let lb = lb_arn(&lb, &applied)?;
                    let tg = tg_arn(&target_group, &applied)?;
                    let tags = applied.listener_tags.clone();
                    self.client.create_listener(lb, spec, tg, tags).await?;
                }
                Step::ModifyListener {
                    arn,
                    protocol,
                    tls,
                    target_group,
                } => {
                    let tg = tg_arn(&target_group, &applied)?;
                    self.client.modify_listener(arn, protocol, tls, tg).await?
                }
                Step::DeleteListener { arn } => found(self.client.delete_listener(arn).await)?,
                Step::DeleteTargetGroup { arn } => {
                    found(self.client.delete_target_group(arn).await)?;
                    if let Some(n) = self.region_count().as_mut() {
                        *n = n.saturating_sub(1);
                    }
                }
                Step::AddTags { arn, tags } => self.client.add_tags(arn, tags).await?,
                Step::RemoveTags { arn, keys } => self.client.remove_tags(arn, keys).await?,
            }
        }
        Ok(applied)
    }

    /// Removes resources tagged with this cluster whose Service is not in `live`, and tells
    /// which live Services lost a resource behind berth's back. Reads are paged lists plus one
    /// DescribeTags per 20 resources. A caller that reads `live` from the API should list
    /// first ([`Self::list_for_sweep`], then [`Self::sweep_listed`]).
    pub async fn sweep(&self, live: &BTreeSet<String>) -> Result<Swept, Error> {
        let listing = self.list_for_sweep().await?;
        self.sweep_listed(listing, live).await
    }

    /// Lists every load balancer and target group of the account with their tags, within
    /// [`LISTING_TIMEOUT`]: a server that stops answering cannot stall the sweep.
    pub async fn list_for_sweep(&self) -> Result<SweepListing, Error> {
        match tokio::time::timeout(LISTING_TIMEOUT, self.list_all()).await {
            Ok(listing) => listing,
            Err(_) => Err(Error::Timeout {
                what: "listing the account for the sweep",
                after: LISTING_TIMEOUT,
            }),
        }
    }

    async fn list_all(&self) -> Result<SweepListing, Error> {
        let started = Instant::now();
        let (lbs, _) = all_pages("DescribeLoadBalancers", |marker| {
            self.client.describe_load_balancers(LbQuery::All { marker })
        })
        .await?;
        let (tgs, foreign_tgs) = all_pages("DescribeTargetGroups", |marker| {
            self.client.describe_target_groups(TgQuery::All { marker })
        })
        .await?;
        let tags = self
            .tags_of(
                lbs.iter()
                    .map(|l| l.arn.clone())
                    .chain(tgs.iter().map(|t| t.arn.clone()))
                    .collect(),
            )
            .await?;
        let owned = |arn: &String| tags.get(arn).is_some_and(|t| ours(t, &self.config, None));
        let region_tgs = tgs.len() + foreign_tgs;
        self.metrics.listed(
            lbs.iter().filter(|l| owned(&l.arn)).count(),
            tgs.iter().filter(|t| owned(&t.arn)).count(),
            region_tgs,
        );
        *self
            .region_target_groups
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(region_tgs);
        Ok(SweepListing {
            load_balancers: lbs,
            target_groups: tgs,
            tags,
            started,
        })
    }

    /// The sweep over a listing made before `live` was read.
    pub async fn sweep_listed(
        &self,
        listing: SweepListing,
        live: &BTreeSet<String>,
    ) -> Result<Swept, Error> {
        let SweepListing {
            load_balancers: lbs,
            target_groups: tgs,
            tags,
            started,
        } = listing;
        let mut swept = Swept::default();
        // Services deleted since the listing began: what the listing shows of them is gone.
        let deleted_since: BTreeSet<String> = {
            let mut deleted = self.deleted.lock().unwrap_or_else(|e| e.into_inner());
            deleted.retain(|_, at| *at >= started);
            deleted.keys().cloned().collect()
        };
        let service_of = |arn: &str| -> Option<String> {
            let t = tags.get(arn)?;
            ours(t, &self.config, None)
                .then(|| t.get(aws_tag::SERVICE).cloned())
                .flatten()
                .filter(|s| !deleted_since.contains(s))
        };
        let existing: BTreeSet<&str> = lbs
            .iter()
            .map(|l| l.arn.as_str())
            .chain(tgs.iter().map(|t| t.arn.as_str()))
            .collect();
        {
            let mut cache = self.cache();
            let gone: Vec<String> = cache
                .iter()
                .filter(|(_, c)| c.at < started)
                .filter(|(_, c)| {
                    !existing.contains(c.lb_arn.as_str())
                        || c.tg_arns.iter().any(|a| !existing.contains(a.as_str()))
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in gone {
                cache.remove(&k);
                swept.drifted.push(k);
            }
        }
        for lb in &lbs {
            if let Some(service) = service_of(&lb.arn) {
                if !live.contains(&service) {
                    tracing::info!(arn = %lb.arn, %service, "sweeping a load balancer whose Service is gone");
                    found(self.client.delete_load_balancer(lb.arn.clone()).await)?;
                    self.metrics.swept(SWEPT_LOAD_BALANCER, 1);
                    swept.load_balancers.push(lb.arn.clone());
                }
            }
        }
        let in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let wanted: BTreeSet<String> = self
            .cache()
            .values()
            .flat_map(|c| c.tg_arns.iter().cloned())
            .collect();
        for tg in &tgs {
            if let Some(service) = service_of(&tg.arn) {
                // A target group of a live Service that no listener uses and no converged
                // model wants: left over from a port that went away while its load balancer
                // was gone (deleted behind berth's back, or replaced).
                let orphan = live.contains(&service)
                    && tg.load_balancer_arns.is_empty()
                    && !in_flight.contains(&service)
                    && !wanted.contains(&tg.arn);
                if !live.contains(&service) || orphan {
                    tracing::info!(arn = %tg.arn, %service, orphan, "sweeping a target group");
                    found(self.client.delete_target_group(tg.arn.clone()).await)?;
                    if let Some(n) = self.region_count().as_mut() {
                        *n = n.saturating_sub(1);
                    }
                    self.metrics.swept(SWEPT_TARGET_GROUP, 1);
                    swept.target_groups.push(tg.arn.clone());
                }
            }
        }
        Ok(swept)
    }
}

#[derive(Debug, Default)]
struct Foreign {
    /// By name: load balancers and target groups with a name berth wants, not tagged as this
    /// Service's.
    load_balancers: BTreeMap<String, Tags>,
    target_groups: BTreeMap<String, Tags>,
}

#[derive(Debug, Default)]
struct Fetched {
    ours: Observed,
    foreign: Foreign,
}

#[derive(Debug, Default)]
struct Applied {
    load_balancer: Option<LoadBalancer>,
    target_groups: BTreeMap<String, String>,
    listener_tags: Tags,
}
