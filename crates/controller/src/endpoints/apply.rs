//! The I/O edge: writes a planned sync to the API server and tells the cache what to expect back.

use std::sync::Mutex;
use std::time::Instant;

use berth_api::names::field_manager;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use tracing::{debug, info};

use super::cache::{Cache, ObjectKey};
use super::error::{status_code, Error};
use super::metrics::Metrics;
use super::sync::{EndpointsWrite, Writes};
use super::tracker::Target;

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(field_manager::CONTROLLER.to_owned()),
        ..PostParams::default()
    }
}

fn write_error(
    verb: &'static str,
    kind: &'static str,
    key: &ObjectKey,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    let namespace = key.namespace.clone();
    let name = name.to_owned();
    move |source| Error::Write {
        verb,
        kind,
        namespace,
        name,
        source,
    }
}

/// Applies the writes of one Service in a safe order and records each one in the cache.
pub(crate) struct Applier<'a> {
    pub(crate) client: &'a Client,
    pub(crate) cache: &'a Mutex<Cache>,
    pub(crate) metrics: &'a Metrics,
}

impl Applier<'_> {
    fn expect(&self, key: &ObjectKey, target: Target, rv: Option<&str>, deleted: bool) {
        let mut cache = match self.cache.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        cache.expect(key, target, rv, deleted, Instant::now());
    }

    /// Stops at the first failure: what is left is planned again on the retry, from fresher state.
    pub(crate) async fn apply(&self, key: &ObjectKey, writes: Writes) -> Result<(), Error> {
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &key.namespace);
        let pp = post_params();
        for slice in &writes.slices.create {
            let created = slices.create(&pp, slice).await.map_err(write_error(
                "create",
                "EndpointSlice",
                key,
                &key.name,
            ))?;
            let name = created.metadata.name.clone().unwrap_or_default();
            self.expect(
                key,
                Target::Slice(name.clone()),
                created.metadata.resource_version.as_deref(),
                false,
            );
            self.metrics.slice_change("create");
            debug!(slice = %name, endpoints = slice.endpoints.len(), "created EndpointSlice");
        }
        for slice in &writes.slices.update {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let replaced = slices
                .replace(&name, &pp, slice)
                .await
                .map_err(write_error("update", "EndpointSlice", key, &name))?;
            self.expect(
                key,
                Target::Slice(name.clone()),
                replaced.metadata.resource_version.as_deref(),
                false,
            );
            self.metrics.slice_change("update");
            debug!(slice = %name, endpoints = slice.endpoints.len(), "updated EndpointSlice");
        }
        if let Some(write) = &writes.endpoints {
            self.apply_endpoints(key, write).await?;
        }
        for name in &writes.slices.delete {
            match slices.delete(name, &DeleteParams::default()).await {
                Ok(_) => self.expect(key, Target::Slice(name.clone()), None, true),
                // Already gone: the watch tells the cache, nothing to wait for.
                Err(e) if status_code(&e) == Some(404) => {}
                Err(e) => return Err(write_error("delete", "EndpointSlice", key, name)(e)),
            }
            self.metrics.slice_change("delete");
            debug!(slice = %name, "deleted EndpointSlice");
        }
        let (created, updated, deleted) = (
            writes.slices.create.len(),
            writes.slices.update.len(),
            writes.slices.delete.len(),
        );
        info!(
            slices_created = created,
            slices_updated = updated,
            slices_deleted = deleted,
            endpoints = ?writes.endpoints.as_ref().map(|w| match w {
                EndpointsWrite::Create(_) => "create",
                EndpointsWrite::Replace(_) => "update",
                EndpointsWrite::Delete => "delete",
            }),
            "synced endpoints"
        );
        Ok(())
    }

    async fn apply_endpoints(&self, key: &ObjectKey, write: &EndpointsWrite) -> Result<(), Error> {
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &key.namespace);
        let pp = post_params();
        match write {
            EndpointsWrite::Create(endpoints) => {
                let created = api.create(&pp, endpoints).await.map_err(write_error(
                    "create",
                    "Endpoints",
                    key,
                    &key.name,
                ))?;
                let rv = created.metadata.resource_version.as_deref();
                self.expect(key, Target::Endpoints, rv, false);
                self.metrics.endpoints_change("create");
            }
            EndpointsWrite::Replace(endpoints) => {
                let replaced = api
                    .replace(&key.name, &pp, endpoints)
                    .await
                    .map_err(write_error("update", "Endpoints", key, &key.name))?;
                let rv = replaced.metadata.resource_version.as_deref();
                self.expect(key, Target::Endpoints, rv, false);
                self.metrics.endpoints_change("update");
            }
            EndpointsWrite::Delete => match api.delete(&key.name, &DeleteParams::default()).await {
                Ok(_) => {
                    self.expect(key, Target::Endpoints, None, true);
                    self.metrics.endpoints_change("delete");
                }
                Err(e) if status_code(&e) == Some(404) => {}
                Err(e) => return Err(write_error("delete", "Endpoints", key, &key.name)(e)),
            },
        }
        Ok(())
    }
}
