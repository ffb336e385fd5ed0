//! The `aws-nlb` class: a controller of its own beside the allocation loop, run in the same
//! leadership term. It owns `status.loadBalancer` of the Services it serves (the allocation loop
//! gives them ClusterIPs and node ports but no address) and the finalizer
//! `berth.dev/load-balancer`, which is on the Service before the first AWS call and comes off
//! only once `berth-aws` has confirmed that nothing of the Service is left. A Service deleted
//! while the controller was down still carries the finalizer, so the first list after start
//! cleans it up; the periodic sweep removes anything tagged with this cluster whose Service is
//! gone (for Services that lost the finalizer some other way) and re-reads Services whose
//! resources vanished.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_api::names::{
    annotation as ann, class, condition as cond, event as ev, field_manager, finalizer as fin,
    label,
};
use berth_api::set_condition;
use berth_aws::elbv2::Elbv2;
use berth_aws::{IpTargets, NlbProvider, NodeFacts, PortFacts, ServiceFacts};
use berth_core::{Protocol, TrafficPolicy};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::events::{EventRecorder, EventType};

/// What `berth controller` is told about AWS (`--cluster-name`, `--aws-*` flags).
#[derive(Debug, Clone)]
pub struct AwsSettings {
    pub cluster_name: String,
    /// Subnet IDs for Services that name none.
    pub subnets: Vec<String>,
    /// For tests against a local server; AWS's own endpoint otherwise.
    pub endpoint_url: Option<String>,
    pub sweep_interval: Duration,
    /// A converged Service is read from AWS again after this long.
    pub verify_after: Duration,
}

/// Settings of the AWS loop.
#[derive(Debug, Clone)]
pub struct AwsLoopConfig {
    pub default_class: Option<&'static str>,
    /// How often everything tagged with this cluster is listed to remove leaks and find drift.
    pub sweep_interval: Duration,
}

/// Why one Service's reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum AwsLoopError {
    #[error(transparent)]
    Provider(#[from] berth_aws::Error),
    #[error("{action}: {source}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("finalizer: {0}")]
    Finalizer(String),
}

struct Ctx<C> {
    client: kube::Client,
    provider: Arc<NlbProvider<C>>,
    config: AwsLoopConfig,
    nodes: Store<Node>,
    /// For `nlb-target-type: ip`: the pods' addresses come from the Service's EndpointSlices.
    slices: Store<EndpointSlice>,
    events: EventRecorder,
    /// Consecutive failures per Service, for the 5 s to 5 min backoff.
    failures: Mutex<BTreeMap<String, u32>>,
}

/// Whether berth's AWS provider serves the Service.
pub fn is_served(svc: &Service, default_class: Option<&'static str>) -> bool {
    let Some(spec) = &svc.spec else { return false };
    spec.type_.as_deref() == Some("LoadBalancer")
        && class::served_class(spec.load_balancer_class.as_deref(), default_class)
            == Some(class::AWS_NLB)
}

/// The Service as the provider needs it.
pub fn build_service_facts(svc: &Service) -> ServiceFacts {
    let spec = svc.spec.clone().unwrap_or_default();
    let ports = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| PortFacts {
            name: p.name,
            port: u16::try_from(p.port).unwrap_or_default(),
            protocol: Protocol::from_spec(p.protocol.as_deref()).unwrap_or(Protocol::Tcp),
            node_port: p.node_port.and_then(|n| u16::try_from(n).ok()),
        })
        .collect();
    ServiceFacts {
        namespace: svc.namespace().unwrap_or_default(),
        name: svc.name_any(),
        uid: svc.uid().unwrap_or_default(),
        ports,
        annotations: svc.annotations().clone(),
        external_traffic_policy: TrafficPolicy::from_spec(spec.external_traffic_policy.as_deref()),
        health_check_node_port: spec
            .health_check_node_port
            .and_then(|n| u16::try_from(n).ok()),
    }
}

/// Whether a slice was written by an endpoints controller (Kubernetes' or berth's). Anyone
/// who may create an EndpointSlice could otherwise label one with the Service's name and
/// have the NLB send its traffic to any address.
pub fn is_managed_slice(slice: &EndpointSlice) -> bool {
    matches!(
        slice
            .labels()
            .get(label::ENDPOINTSLICE_MANAGED_BY)
            .map(String::as_str),
        Some(label::ENDPOINTSLICE_MANAGED_BY_KUBERNETES | label::ENDPOINTSLICE_MANAGED_BY_BERTH)
    )
}

/// `ip` targets: the ready addresses of the Service's EndpointSlices, per Service port, with the
/// port each pod listens on (a slice port matches the Service port of the same name).
pub fn build_ip_targets(svc: &Service, slices: &[Arc<EndpointSlice>]) -> IpTargets {
    let namespace = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let ports: Vec<(String, u16)> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p.name.clone().unwrap_or_default(),
                u16::try_from(p.port).ok()?,
            ))
        })
        .collect();
    let mut targets = IpTargets::new();
    for slice in slices {
        if slice.namespace().as_deref() != Some(namespace.as_str())
            || slice.labels().get(label::ENDPOINTSLICE_SERVICE_NAME) != Some(&name)
            || !is_managed_slice(slice)
        {
            continue;
        }
        for sp in slice.ports.iter().flatten() {
            let sp_name = sp.name.clone().unwrap_or_default();
            let Some(pod_port) = sp.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let Some((_, service_port)) = ports.iter().find(|(n, _)| *n == sp_name) else {
                continue;
            };
            let entry = targets.entry(*service_port).or_default();
            for ep in &slice.endpoints {
                // As kube-proxy: an endpoint without conditions counts as ready.
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for address in &ep.addresses {
                    if let Ok(ip) = address.parse() {
                        entry.insert((ip, pod_port));
                    }
                }
            }
        }
    }
    targets
}

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Nodes that may be targets: Ready, not excluded by label, not being deleted, and not
/// about to be deleted by the cluster autoscaler (as kube-proxy's health check fails such a
/// node, KEP-3836): its targets are deregistered while it still serves, so connections
/// drain for the target group's `deregistration_delay.timeout_seconds`.
pub fn build_node_facts(nodes: &[Arc<Node>]) -> Vec<NodeFacts> {
    let mut out: Vec<NodeFacts> = nodes
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter(|n| {
            !n.labels()
                .contains_key(label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS)
        })
        .filter(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
        })
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|n| NodeFacts {
            name: n.name_any(),
            provider_id: n.spec.as_ref().and_then(|s| s.provider_id.clone()),
            labels: n.labels().clone(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Longest condition message: an error can quote annotation values, which are the user's.
const MESSAGE_MAX: usize = 1024;

/// The `berth.dev/LoadBalancerReady` condition's reason for an outcome.
pub fn reason_of(error: &berth_aws::Error) -> &'static str {
    match error {
        berth_aws::Error::Model(berth_aws::ModelError::Quota { .. }) => {
            cond::reason::QUOTA_EXCEEDED
        }
        berth_aws::Error::Model(_) | berth_aws::Error::NameTaken { .. } => {
            cond::reason::INVALID_CONFIGURATION
        }
        _ => cond::reason::PROVISIONING_FAILED,
    }
}

/// The Service's conditions with `berth.dev/LoadBalancerReady` set from the outcome (`Ok`:
/// provisioned; `Err`: the reason and message), or `None` when that changes nothing.
pub fn build_ready_condition(
    svc: &Service,
    outcome: Result<(), (&'static str, String)>,
    now: Time,
) -> Option<Vec<Condition>> {
    let (status, reason, mut message) = match outcome {
        Ok(()) => (cond::TRUE, cond::reason::PROVISIONED, String::new()),
        Err((reason, message)) => (cond::FALSE, reason, message),
    };
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    let mut conditions = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let changed = set_condition(
        &mut conditions,
        Condition {
            type_: cond::LOAD_BALANCER_READY.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: svc.metadata.generation,
            last_transition_time: now,
        },
    );
    changed.then_some(conditions)
}

/// Writes the conditions, guarded by `resource_version` so the allocation loop's own
/// condition, written meanwhile, is never overwritten (a conflict retries the reconcile).
async fn write_conditions(
    api: &Api<Service>,
    name: &str,
    resource_version: Option<String>,
    conditions: Vec<Condition>,
) -> Result<(), AwsLoopError> {
    let patch = json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"conditions": conditions},
    });
    api.patch_status(name, &params(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| AwsLoopError::Kube {
            action: "writing the LoadBalancerReady condition",
            source,
        })
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(field_manager::CONTROLLER.to_string()),
        ..PatchParams::default()
    }
}

fn key(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

async fn record<C>(
    ctx: &Ctx<C>,
    svc: &Service,
    type_: EventType,
    reason: &'static str,
    note: String,
) {
    ctx.events
        .record(&Arc::new(svc.object_ref(&())), type_, reason, note)
        .await;
}

async fn apply<C: Elbv2 + 'static>(
    svc: Arc<Service>,
    ctx: &Ctx<C>,
) -> Result<Action, AwsLoopError> {
    let facts = build_service_facts(&svc);
    let nodes = build_node_facts(&ctx.nodes.state());
    let known = svc.annotations().get(ann::AWS_LOAD_BALANCER_ARN).cloned();
    let ip_targets = build_ip_targets(&svc, &ctx.slices.state());
    let ensured = match ctx
        .provider
        .ensure(&facts, &nodes, &ip_targets, known.as_deref())
        .await
    {
        Ok(e) => e,
        Err(e) => {
            record(
                ctx,
                &svc,
                EventType::Warning,
                ev::SYNC_LOAD_BALANCER_FAILED,
                format!("Error syncing load balancer: {e}"),
            )
            .await;
            if let Some(conditions) =
                build_ready_condition(&svc, Err((reason_of(&e), e.to_string())), now())
            {
                let api: Api<Service> =
                    Api::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default());
                let rv = svc.resource_version();
                if let Err(w) = write_conditions(&api, &svc.name_any(), rv, conditions).await {
                    tracing::warn!(service = %key(&svc), error = %w, "could not record the failure on the Service");
                }
            }
            return Err(e.into());
        }
    };
    let api: Api<Service> =
        Api::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default());
    let mut resource_version = svc.resource_version();
    let has_status = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| {
            i.iter()
                .any(|x| x.hostname.as_deref() == Some(ensured.hostname.as_str()))
        });
    if ensured.changes > 0 || !has_status {
        record(
            ctx,
            &svc,
            EventType::Normal,
            ev::ENSURING_LOAD_BALANCER,
            "Ensuring load balancer".into(),
        )
        .await;
    }
    if known.as_deref() != Some(ensured.load_balancer_arn.as_str()) {
        let patch = json!({"metadata": {"annotations": {ann::AWS_LOAD_BALANCER_ARN: ensured.load_balancer_arn}}});
        let written = api
            .patch(&svc.name_any(), &params(), &Patch::Merge(&patch))
            .await
            .map_err(|source| AwsLoopError::Kube {
                action: "remembering the load balancer's ARN",
                source,
            })?;
        resource_version = written.resource_version();
    }
    if !has_status {
        let patch =
            json!({"status": {"loadBalancer": {"ingress": [{"hostname": ensured.hostname}]}}});
        let written = api
            .patch_status(&svc.name_any(), &params(), &Patch::Merge(&patch))
            .await
            .map_err(|source| AwsLoopError::Kube {
                action: "writing the load balancer's hostname",
                source,
            })?;
        resource_version = written.resource_version();
    }
    if let Some(conditions) = build_ready_condition(&svc, Ok(()), now()) {
        write_conditions(&api, &svc.name_any(), resource_version, conditions).await?;
    }
    if let (Some(subnets), true) = (&ensured.discovered_subnets, ensured.changes > 0) {
        // Said whenever the load balancer changed: which subnets its tags chose and why.
        record(
            ctx,
            &svc,
            EventType::Normal,
            ev::SUBNETS_DISCOVERED,
            subnets.clone(),
        )
        .await;
    }
    if ensured.changes > 0 || !has_status {
        record(
            ctx,
            &svc,
            EventType::Normal,
            ev::ENSURED_LOAD_BALANCER,
            format!("Ensured load balancer {}", ensured.hostname),
        )
        .await;
    }
    if !ensured.skipped_nodes.is_empty() && ensured.changes > 0 {
        let note = format!(
            "Nodes without an EC2 instance in spec.providerID are not targets: {}",
            ensured.skipped_nodes.join(", ")
        );
        record(
            ctx,
            &svc,
            EventType::Warning,
            ev::SYNC_LOAD_BALANCER_FAILED,
            note,
        )
        .await;
    }
    ctx.failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&key(&svc));
    Ok(Action::await_change())
}

async fn cleanup<C: Elbv2 + 'static>(
    svc: Arc<Service>,
    ctx: &Ctx<C>,
) -> Result<Action, AwsLoopError> {
    record(
        ctx,
        &svc,
        EventType::Normal,
        ev::DELETING_LOAD_BALANCER,
        "Deleting load balancer".into(),
    )
    .await;
    let facts = build_service_facts(&svc);
    let known = svc.annotations().get(ann::AWS_LOAD_BALANCER_ARN).cloned();
    if let Err(e) = ctx.provider.delete(&facts, known.as_deref()).await {
        record(
            ctx,
            &svc,
            EventType::Warning,
            ev::SYNC_LOAD_BALANCER_FAILED,
            format!("Error deleting load balancer: {e}"),
        )
        .await;
        return Err(e.into());
    }
    record(
        ctx,
        &svc,
        EventType::Normal,
        ev::DELETED_LOAD_BALANCER,
        "Deleted load balancer".into(),
    )
    .await;
    Ok(Action::await_change())
}

/// A Service that stopped being served (type or class changed): clean up, clear what berth
/// wrote, then let go of it.
async fn release<C: Elbv2 + 'static>(
    svc: Arc<Service>,
    ctx: &Ctx<C>,
) -> Result<Action, AwsLoopError> {
    cleanup(svc.clone(), ctx).await?;
    let api: Api<Service> =
        Api::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default());
    let name = svc.name_any();
    if svc.annotations().contains_key(ann::AWS_LOAD_BALANCER_ARN) {
        let patch = json!({"metadata": {"annotations": {ann::AWS_LOAD_BALANCER_ARN: null}}});
        api.patch(&name, &params(), &Patch::Merge(&patch))
            .await
            .map_err(|source| AwsLoopError::Kube {
                action: "forgetting the load balancer's ARN",
                source,
            })?;
    }
    let hostnames = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| i.iter().any(|x| x.hostname.is_some()));
    if hostnames {
        let patch = json!({"status": {"loadBalancer": {"ingress": null}}});
        api.patch_status(&name, &params(), &Patch::Merge(&patch))
            .await
            .map_err(|source| AwsLoopError::Kube {
                action: "clearing the load balancer's hostname",
                source,
            })?;
    }
    let finalizers: Vec<String> = svc
        .finalizers()
        .iter()
        .filter(|f| *f != fin::LOAD_BALANCER)
        .cloned()
        .collect();
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": svc.resource_version()}});
    api.patch(&name, &params(), &Patch::Merge(&patch))
        .await
        .map_err(|source| AwsLoopError::Kube {
            action: "removing the finalizer",
            source,
        })?;
    Ok(Action::await_change())
}

async fn reconcile<C: Elbv2 + 'static>(
    svc: Arc<Service>,
    ctx: Arc<Ctx<C>>,
) -> Result<Action, AwsLoopError> {
    let served = is_served(&svc, ctx.config.default_class);
    let has_finalizer = svc.finalizers().iter().any(|f| f == fin::LOAD_BALANCER);
    if !served && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !served && svc.meta().deletion_timestamp.is_none() {
        let _timer = ctx.provider.metrics().reconcile_timer("release");
        return release(svc, &ctx).await;
    }
    let action = if svc.meta().deletion_timestamp.is_some() {
        "cleanup"
    } else {
        "apply"
    };
    let _timer = ctx.provider.metrics().reconcile_timer(action);
    let api: Api<Service> =
        Api::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default());
    // Adds the finalizer before `apply` (so before any AWS call) and removes it after
    // `cleanup` succeeded.
    finalizer(&api, fin::LOAD_BALANCER, svc, |event| async {
        match event {
            Finalizer::Apply(svc) => apply(svc, &ctx).await,
            Finalizer::Cleanup(svc) => cleanup(svc, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => AwsLoopError::Finalizer(other.to_string()),
    })
}

/// 5 s, doubling per consecutive failure, at most 5 min (the cloud-controller's backoff).
pub fn retry_after(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.min(6));
    Duration::from_secs(secs.min(300))
}

fn error_policy<C>(svc: Arc<Service>, error: &AwsLoopError, ctx: Arc<Ctx<C>>) -> Action {
    let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures.entry(key(&svc)).or_default();
    let delay = retry_after(*n);
    *n = n.saturating_add(1);
    tracing::warn!(service = %key(&svc), %error, retry_in = ?delay, "aws load balancer reconcile failed");
    Action::requeue(delay)
}

/// Runs the `aws-nlb` controller until `token` is cancelled (the end of the leadership term).
pub async fn run_aws_loop<C: Elbv2 + 'static>(
    client: kube::Client,
    provider: Arc<NlbProvider<C>>,
    config: AwsLoopConfig,
    events: EventRecorder,
    token: CancellationToken,
) {
    let services: Api<Service> = Api::all(client.clone());
    let (nodes, writer) = reflector::store();
    let node_changes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects()
        .filter_map(|n| async move { n.ok().map(|_| ()) });
    // Drift found by the sweep re-reconciles everything: unchanged Services are answered from
    // the provider's memory, and the drifted ones (forgotten by the sweep) read AWS again.
    let (slices, slice_writer) = reflector::store();
    let slice_changes = watcher(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(slice_writer)
    .touched_objects();
    let (drift_tx, drift_rx) = tokio::sync::mpsc::channel::<()>(1);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        provider: provider.clone(),
        config: config.clone(),
        nodes,
        slices,
        events,
        failures: Mutex::new(BTreeMap::new()),
    });
    let sweeper = sweep_loop(services.clone(), provider, config, drift_tx, token.clone());
    let controller = Controller::new(services, watcher::Config::default())
        .watches_stream(slice_changes, |slice: EndpointSlice| {
            let service = slice
                .labels()
                .get(label::ENDPOINTSLICE_SERVICE_NAME)?
                .clone();
            Some(ObjectRef::new(&service).within(&slice.namespace()?))
        })
        .reconcile_all_on(futures::stream::select(
            node_changes,
            tokio_stream_from(drift_rx),
        ))
        .graceful_shutdown_on(token.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    // At the end of the term, reconciles in flight get a short grace and are then dropped: an
    // AWS call that retries against an unreachable endpoint must not hold up a shutdown or a
    // hand-over, and an abandoned reconcile is safe (the next one looks up before it creates).
    let bounded = async {
        tokio::pin!(controller);
        tokio::select! {
            () = &mut controller => {}
            () = async {
                token.cancelled().await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => tracing::warn!("aws reconciles still running at shutdown were abandoned"),
        }
    };
    tokio::join!(bounded, sweeper);
}

/// How long reconciles in flight may finish after the term ends.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn sweep_loop<C: Elbv2 + 'static>(
    services: Api<Service>,
    provider: Arc<NlbProvider<C>>,
    config: AwsLoopConfig,
    drift: tokio::sync::mpsc::Sender<()>,
    token: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.sweep_interval);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        // AWS first, then the Services: a Service created between the two reads is in the
        // live set, so the load balancer it just got is not taken for a leak.
        let listing = tokio::select! {
            listing = provider.list_for_sweep() => listing,
            () = token.cancelled() => return,
        };
        let listing = match listing {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing AWS resources for the sweep failed");
                continue;
            }
        };
        let list = match services.list(&Default::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing Services for the aws sweep failed");
                continue;
            }
        };
        // A Service being deleted still owns its resources: its finalizer cleans them up.
        let live: BTreeSet<String> = list
            .items
            .iter()
            .filter(|s| {
                is_served(s, config.default_class)
                    || s.finalizers().iter().any(|f| f == fin::LOAD_BALANCER)
            })
            .map(key)
            .collect();
        let swept = tokio::select! {
            swept = provider.sweep_listed(listing, &live) => swept,
            () = token.cancelled() => return,
        };
        match swept {
            Ok(swept) => {
                if !swept.load_balancers.is_empty() || !swept.target_groups.is_empty() {
                    tracing::info!(
                        load_balancers = swept.load_balancers.len(),
                        target_groups = swept.target_groups.len(),
                        "aws sweep removed resources of Services that are gone"
                    );
                }
                if !swept.drifted.is_empty() {
                    tracing::info!(services = ?swept.drifted, "aws resources vanished; reading those Services again");
                    let _ = drift.try_send(());
                }
            }
            Err(e) => tracing::warn!(error = %e, "aws sweep failed"),
        }
    }
}

/// Starts the `aws-nlb` controller for one leadership term.
pub type AwsRunner = Arc<
    dyn Fn(
            kube::Client,
            EventRecorder,
            CancellationToken,
        ) -> futures::future::BoxFuture<'static, ()>
        + Send
        + Sync,
>;

/// The runner for a provider over any ELBv2 client (the SDK in production, the in-memory fake
/// in tests).
pub fn aws_runner<C: Elbv2 + 'static>(
    provider: Arc<NlbProvider<C>>,
    config: AwsLoopConfig,
) -> AwsRunner {
    Arc::new(move |client, events, token| {
        Box::pin(run_aws_loop(
            client,
            provider.clone(),
            config.clone(),
            events,
            token,
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn ip_targets_are_the_ready_addresses_of_the_services_slices() {
        let svc: Arc<Service> = from(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}
        }));
        let slice_by = |manager: Option<&str>,
                        ns: &str,
                        service: &str,
                        ready: Option<bool>,
                        ip: &str|
         -> Arc<EndpointSlice> {
            let mut labels = json!({"kubernetes.io/service-name": service});
            if let Some(manager) = manager {
                labels["endpointslice.kubernetes.io/managed-by"] = json!(manager);
            }
            from(json!({
                "metadata": {"name": format!("{service}-{ip}"), "namespace": ns,
                             "labels": labels},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}, {"name": "dns", "port": 5353}, {"name": "other", "port": 9}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}]
            }))
        };
        let slice = |ns: &str, service: &str, ready: Option<bool>, ip: &str| {
            slice_by(
                Some("endpointslice-controller.k8s.io"),
                ns,
                service,
                ready,
                ip,
            )
        };
        let slices = vec![
            slice("shop", "web", Some(true), "10.244.1.5"),
            slice_by(
                Some("endpointslice-controller.berth.dev"),
                "shop",
                "web",
                None,
                "10.244.2.7",
            ),
            slice("shop", "web", Some(false), "10.244.3.9"),
            slice("other", "web", Some(true), "10.244.4.1"),
            slice("shop", "api", Some(true), "10.244.5.1"),
            // Labelled with the Service's name by someone who is no endpoints controller.
            slice_by(None, "shop", "web", Some(true), "192.0.2.66"),
            slice_by(
                Some("someone-else"),
                "shop",
                "web",
                Some(true),
                "192.0.2.67",
            ),
        ];
        let targets = build_ip_targets(&svc, &slices);
        let http: Vec<String> = targets[&80]
            .iter()
            .map(|(ip, p)| format!("{ip}:{p}"))
            .collect();
        assert_eq!(http, ["10.244.1.5:8080", "10.244.2.7:8080"]);
        assert_eq!(targets[&53].len(), 2);
        assert!(targets[&53].iter().all(|(_, p)| *p == 5353));
        assert_eq!(targets.len(), 2);
    }

    #[test]
    fn nodes_about_to_be_deleted_or_excluded_are_no_targets() {
        let node =
            |name: &str, labels: serde_json::Value, taints: serde_json::Value| -> Arc<Node> {
                from(json!({
                    "metadata": {"name": name, "labels": labels},
                    "spec": {"providerID": format!("aws:///us-east-1a/i-{name}"), "taints": taints},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}
                }))
            };
        let nodes = vec![
            node("a", json!({"pool": "edge"}), json!([])),
            node(
                "b",
                json!({}),
                json!([{"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}]),
            ),
            node(
                "c",
                json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""}),
                json!([]),
            ),
            node(
                "d",
                json!({}),
                json!([{"key": "other", "effect": "NoSchedule"}]),
            ),
        ];
        let facts = build_node_facts(&nodes);
        let names: Vec<&str> = facts.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "d"]);
        assert_eq!(
            facts[0].labels.get("pool").map(String::as_str),
            Some("edge")
        );
    }

    #[test]
    fn the_ready_condition_names_the_quota_and_changes_only_on_news() {
        let at =
            |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + s).unwrap());
        let mut svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "wide", "namespace": "shop", "generation": 3},
            "status": {"conditions": [{"type": "berth.dev/Allocated", "status": "True",
                "reason": "Allocated", "message": "", "lastTransitionTime": "2023-11-14T22:13:20Z"}]}
        }))
        .unwrap();
        let quota = berth_aws::Error::Model(berth_aws::ModelError::Quota {
            quota: "Listeners per Network Load Balancer",
            limit: 50,
            needed: 60,
            hint: "",
        });
        assert_eq!(reason_of(&quota), "QuotaExceeded");
        let failed =
            build_ready_condition(&svc, Err((reason_of(&quota), quota.to_string())), at(0))
                .expect("a new condition");
        assert_eq!(failed.len(), 2, "the allocation loop's condition is kept");
        let ready = &failed[1];
        assert_eq!(
            (
                ready.type_.as_str(),
                ready.status.as_str(),
                ready.reason.as_str()
            ),
            ("berth.dev/LoadBalancerReady", "False", "QuotaExceeded")
        );
        assert!(ready
            .message
            .contains("Listeners per Network Load Balancer"));
        assert_eq!(ready.observed_generation, Some(3));
        svc.status.as_mut().unwrap().conditions = Some(failed.clone());
        // The same failure again writes nothing.
        assert_eq!(
            build_ready_condition(&svc, Err((reason_of(&quota), quota.to_string())), at(5)),
            None
        );
        // Success moves the transition time; a message is bounded.
        let ok = build_ready_condition(&svc, Ok(()), at(9)).unwrap();
        assert_eq!(
            (ok[1].status.as_str(), ok[1].last_transition_time.clone()),
            ("True", at(9))
        );
        let long =
            build_ready_condition(&svc, Err(("ProvisioningFailed", "é".repeat(2000))), at(9))
                .unwrap();
        assert!(long[1].message.len() <= MESSAGE_MAX + 3);
    }

    #[test]
    fn retries_back_off_from_five_seconds_to_five_minutes() {
        assert_eq!(retry_after(0), Duration::from_secs(5));
        assert_eq!(retry_after(1), Duration::from_secs(10));
        assert_eq!(retry_after(5), Duration::from_secs(160));
        assert_eq!(retry_after(6), Duration::from_secs(300));
        assert_eq!(retry_after(40), Duration::from_secs(300));
    }
}
