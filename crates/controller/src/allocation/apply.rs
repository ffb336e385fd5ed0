//! Sending one Service's writes (see `write`): the spec, then the provider, then the status,
//! with the Events in between.

use std::net::IpAddr;
use std::sync::Arc;

use berth_api::names::{condition as cond, event as ev};
use berth_ipam::ServiceKey;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde_json::Value;
use tokio::sync::watch;

use super::write::{build_status_patch, JobOutcome, Write, WriteJob, WrittenSpec};
use crate::error::ErrorCategory;
use crate::events::{EventRecorder, EventType};
use crate::load_balancer::{LbRequest, Provider};
use crate::metrics::Metrics;
use crate::written::{send_write, WrittenMeta};

/// Shared by every job.
pub struct WriteCtx {
    pub client: kube::Client,
    pub events: EventRecorder,
    pub provider: Arc<dyn Provider>,
    pub metrics: Metrics,
    pub leading: watch::Receiver<bool>,
}

impl WriteCtx {
    fn leading(&self) -> bool {
        *self.leading.borrow()
    }

    pub(crate) async fn event(
        &self,
        regarding: &Arc<ObjectReference>,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        if self.leading() {
            self.events.record(regarding, type_, reason, note).await;
        }
    }
}

fn outcome_of(e: &kube::Error, write: Write) -> JobOutcome {
    match ErrorCategory::of_api(e) {
        ErrorCategory::NotFound => JobOutcome::Gone,
        // Only a 409 says for sure that nothing was written: after a timeout or a lost
        // connection the write may have landed, and what it names stays held.
        ErrorCategory::Conflict => JobOutcome::Rejected { write },
        category => JobOutcome::Retry { category },
    }
}

/// Sends one job: spec first (so the status never names an address the spec lost), then the
/// status with the provider's ingress. Events are queued in between and sent by the event
/// writer, so they never hold up the next Service.
pub async fn run_job(
    ctx: Arc<WriteCtx>,
    job: WriteJob,
) -> (ServiceKey, JobOutcome, Option<WrittenSpec>) {
    let mut spec = None;
    let outcome = run_job_inner(&ctx, &job, &mut spec).await;
    let spec = spec.map(|svc| WrittenSpec {
        base_version: job.svc.metadata.resource_version.clone(),
        svc,
    });
    (job.key, outcome, spec)
}

async fn run_job_inner(
    ctx: &WriteCtx,
    job: &WriteJob,
    spec: &mut Option<Arc<Service>>,
) -> JobOutcome {
    let mut written = Vec::new();
    let mut generation = job.svc.metadata.generation;
    // The version the status write must find: the one decided from, or the spec write's.
    let mut version = job.svc.metadata.resource_version.clone();
    let mut regarding = job.svc.object_ref(&());
    if let Some(patch) = &job.spec_patch {
        let svc = match write_spec(ctx, job, patch).await {
            Ok(svc) => svc,
            Err(outcome) => return outcome,
        };
        generation = svc.metadata.generation;
        version = svc.metadata.resource_version.clone();
        regarding.resource_version = version.clone();
        written.extend(version.clone());
        *spec = Some(Arc::new(svc));
    }
    let regarding = Arc::new(regarding);
    if let Some((reason, message)) = &job.failure {
        ctx.event(&regarding, EventType::Warning, reason, message.clone())
            .await;
    }

    let (ingress, lb_failed) = match call_provider(ctx, job, &regarding).await {
        Some(Ok(ingress)) => (Some(ingress), false),
        Some(Err(message)) => {
            ctx.event(
                &regarding,
                EventType::Warning,
                ev::SYNC_LOAD_BALANCER_FAILED,
                message,
            )
            .await;
            (None, true)
        }
        None => (None, false),
    };

    if ingress.is_some() || job.conditions.is_some() {
        match write_status(ctx, job, generation, version.as_deref(), ingress.as_deref()).await {
            Ok(status_version) => written.extend(status_version),
            Err(outcome) => return outcome,
        }
    }
    if ingress.is_some() {
        record_provided(ctx, job, &regarding).await;
    }
    if lb_failed {
        return JobOutcome::Retry {
            category: ErrorCategory::Provider,
        };
    }
    JobOutcome::Done { written }
}

/// Writes the spec patch; the Service as written, or the job's outcome when it failed.
async fn write_spec(ctx: &WriteCtx, job: &WriteJob, patch: &Value) -> Result<Service, JobOutcome> {
    if !ctx.leading() {
        return Err(JobOutcome::NotLeading);
    }
    ctx.metrics.write("spec");
    // The whole object is read back (once per Service that gets values), so that a retry
    // can be decided from it; status writes read back only their metadata.
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &job.key.namespace);
    api.patch(&job.key.name, &writer_params(), &Patch::Merge(patch))
        .await
        .map_err(|e| outcome_of(&e, Write::Spec))
}

/// Asks the provider to delete or ensure the load balancer, with the Event saying so. The
/// provider's answer, or the message of the Warning Event when it failed: deleting and
/// ensuring fail the same way. `None`: the job has nothing for the provider.
async fn call_provider(
    ctx: &WriteCtx,
    job: &WriteJob,
    regarding: &Arc<ObjectReference>,
) -> Option<Result<Vec<LoadBalancerIngress>, String>> {
    match &job.ingress {
        Some(ips) if ips.is_empty() => {
            ctx.event(
                regarding,
                EventType::Normal,
                ev::DELETING_LOAD_BALANCER,
                "Deleting load balancer".into(),
            )
            .await;
            Some(
                ctx.provider
                    .delete(&job.key)
                    .await
                    .map(|()| Vec::new())
                    .map_err(|e| format!("Error deleting load balancer: {e}")),
            )
        }
        Some(ips) => {
            ctx.event(
                regarding,
                EventType::Normal,
                ev::ENSURING_LOAD_BALANCER,
                "Ensuring load balancer".into(),
            )
            .await;
            let req = LbRequest {
                service: &job.key,
                addresses: ips,
                nodes: &job.nodes,
            };
            Some(
                ctx.provider
                    .ensure(req)
                    .await
                    .map_err(|e| format!("Error syncing load balancer: {e}")),
            )
        }
        None => None,
    }
}

/// Writes the status (ingress and conditions) at `version`; the version written, or the
/// job's outcome when it failed.
async fn write_status(
    ctx: &WriteCtx,
    job: &WriteJob,
    generation: Option<i64>,
    version: Option<&str>,
    ingress: Option<&[LoadBalancerIngress]>,
) -> Result<Option<String>, JobOutcome> {
    if !ctx.leading() {
        return Err(JobOutcome::NotLeading);
    }
    // The spec write moved the generation; the condition speaks for the new one.
    let conditions = job.conditions.clone().map(|mut cs| {
        for c in cs.iter_mut().filter(|c| c.type_ == cond::ALLOCATED) {
            c.observed_generation = generation;
        }
        cs
    });
    let patch = build_status_patch(version, ingress, conditions.as_deref());
    ctx.metrics.write("status");
    match send_patch(&ctx.client, &job.key, Some("status"), &patch).await {
        Ok(meta) => Ok(meta.resource_version),
        Err(e) => Err(outcome_of(&e, Write::Status)),
    }
}

/// The Events once the provider's answer is in the status: deleted, or the addresses
/// assigned and the load balancer ensured.
async fn record_provided(ctx: &WriteCtx, job: &WriteJob, regarding: &Arc<ObjectReference>) {
    match &job.ingress {
        Some(ips) if ips.is_empty() => {
            ctx.event(
                regarding,
                EventType::Normal,
                ev::DELETED_LOAD_BALANCER,
                "Deleted load balancer".into(),
            )
            .await;
        }
        Some(ips) => {
            if !job.new_lb_ips.is_empty() {
                ctx.event(
                    regarding,
                    EventType::Normal,
                    ev::IP_ALLOCATED,
                    format!("Assigned IP [{}]", ip_list(&job.new_lb_ips)),
                )
                .await;
            }
            ctx.event(
                regarding,
                EventType::Normal,
                ev::ENSURED_LOAD_BALANCER,
                format!("Ensured load balancer with [{}]", ip_list(ips)),
            )
            .await;
        }
        None => {}
    }
}

/// Addresses as the load-balancer Events spell them: `10.0.0.1, fd00::1`.
fn ip_list(ips: &[IpAddr]) -> String {
    let texts: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    texts.join(", ")
}

/// A merge patch of the Service (or of its `subresource`) with berth's field manager.
async fn send_patch(
    client: &kube::Client,
    key: &ServiceKey,
    subresource: Option<&str>,
    patch: &Value,
) -> Result<WrittenMeta, kube::Error> {
    let request = kube::core::Request::new(Service::url_path(&(), Some(&key.namespace)));
    let patch = Patch::Merge(patch);
    let req = match subresource {
        Some(sub) => request.patch_subresource(sub, &key.name, &writer_params(), &patch),
        None => request.patch(&key.name, &writer_params(), &patch),
    }
    .map_err(kube::Error::BuildRequest)?;
    let verb = if subresource.is_some() {
        "patch_status"
    } else {
        "patch"
    };
    send_write(client, req, verb).await
}

/// Every write carries berth's field manager, so ownership of the fields it fills is visible.
pub fn writer_params() -> PatchParams {
    PatchParams {
        field_manager: Some(berth_api::names::field_manager::CONTROLLER.to_string()),
        ..PatchParams::default()
    }
}

/// `now` as a condition time.
pub fn now() -> Time {
    Time(Timestamp::now())
}
