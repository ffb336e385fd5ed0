//! The report's I/O loop: Services from the allocation worker's feed, EndpointSlices from a
//! watch of their own (only their sizes are kept), one status patch per change of verdict.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use berth_api::ServicePolicy;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch};
use kube::runtime::watcher::Event;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{build_slice_sizes, judge, plan_report, warning_of, SliceSizes};
use crate::allocation::apply::{now, writer_params, WriteCtx};
use crate::allocation::write::build_status_patch;
use crate::error::ErrorCategory;
use crate::events::EventType;
use crate::service_feed::ServiceFeed;

/// How long a failed status write waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

type Key = (String, String);

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<Key> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

/// One leadership term's report.
pub(crate) struct DatapathReport {
    policy: ServicePolicy,
    services: HashMap<Key, Arc<Service>>,
    slices: HashMap<Key, SliceSizes>,
    /// Slice names by (namespace, Service name).
    by_service: HashMap<Key, BTreeSet<String>>,
    relist_services: Option<HashSet<Key>>,
    relist_slices: Option<HashSet<Key>>,
    services_listed: bool,
    slices_listed: bool,
    dirty: BTreeSet<Key>,
    retry: BTreeSet<Key>,
    retry_at: Option<Instant>,
}

impl DatapathReport {
    pub(crate) fn new(policy: ServicePolicy) -> Self {
        Self {
            policy,
            services: HashMap::new(),
            slices: HashMap::new(),
            by_service: HashMap::new(),
            relist_services: None,
            relist_slices: None,
            services_listed: false,
            slices_listed: false,
            dirty: BTreeSet::new(),
            retry: BTreeSet::new(),
            retry_at: None,
        }
    }

    /// Runs until `token` is cancelled or the Service feed ends (the term ended).
    pub(crate) async fn run(
        mut self,
        ctx: Arc<WriteCtx>,
        mut services: ServiceFeed,
        token: CancellationToken,
    ) {
        let mut slices = watcher(
            Api::<EndpointSlice>::all(ctx.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        loop {
            if self.services_listed && self.slices_listed {
                self.report_dirty(&ctx).await;
            }
            let retry_at = self.retry_at;
            tokio::select! {
                _ = token.cancelled() => return,
                event = services.recv() => match event {
                    Some(event) => self.on_service(event),
                    None => return,
                },
                event = slices.next() => match event {
                    Some(Ok(event)) => self.on_slice(event),
                    Some(Err(e)) => {
                        ctx.metrics.error(ErrorCategory::Watch);
                        tracing::warn!(error = %e, "EndpointSlice watch failed; retrying");
                    }
                    None => return,
                },
                _ = sleep_until(retry_at), if retry_at.is_some() => {
                    self.retry_at = None;
                    self.dirty.append(&mut self.retry);
                }
            }
        }
    }

    fn on_service(&mut self, event: Event<Arc<Service>>) {
        match event {
            Event::Init => self.relist_services = Some(HashSet::new()),
            Event::InitApply(svc) | Event::Apply(svc) => {
                let Some(key) = key_of(&svc.metadata) else {
                    return;
                };
                if let Some(seen) = &mut self.relist_services {
                    seen.insert(key.clone());
                }
                self.dirty.insert(key.clone());
                self.services.insert(key, svc);
            }
            Event::Delete(svc) => {
                if let Some(key) = key_of(&svc.metadata) {
                    self.services.remove(&key);
                    self.dirty.remove(&key);
                    self.retry.remove(&key);
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.relist_services.take() {
                    self.services.retain(|key, _| seen.contains(key));
                    self.dirty.retain(|key| seen.contains(key));
                }
                self.services_listed = true;
            }
        }
    }

    fn on_slice(&mut self, event: Event<EndpointSlice>) {
        match event {
            Event::Init => self.relist_slices = Some(HashSet::new()),
            Event::InitApply(slice) | Event::Apply(slice) => {
                let Some(key) = key_of(&slice.metadata) else {
                    return;
                };
                if let Some(seen) = &mut self.relist_slices {
                    seen.insert(key.clone());
                }
                self.remove_slice(&key);
                if let Some(sizes) = build_slice_sizes(&slice) {
                    let owner = (key.0.clone(), sizes.service.clone());
                    self.by_service
                        .entry(owner.clone())
                        .or_default()
                        .insert(key.1.clone());
                    self.dirty.insert(owner);
                    self.slices.insert(key, sizes);
                }
            }
            Event::Delete(slice) => {
                if let Some(key) = key_of(&slice.metadata) {
                    self.remove_slice(&key);
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.relist_slices.take() {
                    let gone: Vec<Key> = self
                        .slices
                        .keys()
                        .filter(|key| !seen.contains(*key))
                        .cloned()
                        .collect();
                    for key in &gone {
                        self.remove_slice(key);
                    }
                }
                self.slices_listed = true;
            }
        }
    }

    fn remove_slice(&mut self, key: &Key) {
        let Some(old) = self.slices.remove(key) else {
            return;
        };
        let owner = (key.0.clone(), old.service);
        if let Some(names) = self.by_service.get_mut(&owner) {
            names.remove(&key.1);
            if names.is_empty() {
                self.by_service.remove(&owner);
            }
        }
        self.dirty.insert(owner);
    }

    async fn report_dirty(&mut self, ctx: &WriteCtx) {
        while let Some(key) = self.dirty.pop_first() {
            let Some(svc) = self.services.get(&key).cloned() else {
                continue;
            };
            let slices = self
                .by_service
                .get(&key)
                .into_iter()
                .flatten()
                .filter_map(|name| self.slices.get(&(key.0.clone(), name.clone())));
            let Some(verdict) = judge(&svc, slices, &self.policy) else {
                continue;
            };
            let Some((conditions, warn)) = plan_report(&svc, &verdict, now()) else {
                continue;
            };
            let patch = build_status_patch(
                svc.metadata.resource_version.as_deref(),
                None,
                Some(&conditions),
            );
            ctx.metrics.write("status");
            let api: Api<Service> = Api::namespaced(ctx.client.clone(), &key.0);
            match api
                .patch_status(&key.1, &writer_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(namespace = %key.0, name = %key.1, ?verdict, "datapath condition written");
                    if let (true, Some((reason, note))) = (warn, warning_of(&verdict)) {
                        let regarding = Arc::new(svc.object_ref(&()));
                        ctx.event(&regarding, EventType::Warning, reason, note)
                            .await;
                    }
                }
                Err(e) => match ErrorCategory::of_api(&e) {
                    // A newer version (or the deletion) is on its way through the feed.
                    ErrorCategory::NotFound | ErrorCategory::Conflict => {}
                    category => {
                        ctx.metrics.error(category);
                        tracing::warn!(namespace = %key.0, name = %key.1, error = %e, "writing the datapath condition failed; retrying");
                        self.retry.insert(key);
                        self.retry_at
                            .get_or_insert_with(|| Instant::now() + RETRY_AFTER);
                    }
                },
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
