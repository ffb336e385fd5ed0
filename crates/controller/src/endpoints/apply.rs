//! The I/O edge: writes a planned sync to the API server and tells the cache what to expect back.

use std::sync::Mutex;
use std::time::Instant;

use berth_api::names::field_manager;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams};
use kube::core::Request;
use kube::{Client, Resource};
use tracing::{debug, info};

use super::cache::Cache;
use super::key::ObjectKey;
use super::metrics::Metrics;
use super::sync::{EndpointsWrite, Writes};
use super::tracker::Target;
use crate::error::{status_code, Error};
use crate::written::{send_write, WrittenMeta};

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
        source: Box::new(source),
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

    /// Slice creates and updates go out together with the Endpoints write (they are read by
    /// different consumers, and neither removes anything); slice deletes only after both landed,
    /// so a consumer of slices never sees fewer endpoints than there are while a change is half
    /// applied. Stops at the first failure: what is left is planned again on the retry, from
    /// fresher state.
    pub(crate) async fn apply(&self, key: &ObjectKey, writes: Writes) -> Result<(), Error> {
        let (upserted, endpoints) = futures::join!(self.upsert_slices(key, &writes), async {
            match &writes.endpoints {
                Some(write) => self.apply_endpoints(key, write).await,
                None => Ok(()),
            }
        });
        upserted.and(endpoints)?;
        for name in &writes.slices.delete {
            let built = slice_request(&key.namespace)
                .delete(name, &DeleteParams::default())
                .map_err(kube::Error::BuildRequest);
            match send(self.client, built, "delete").await {
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
            endpoints = ?writes.endpoints.as_ref().map(EndpointsWrite::verb),
            "synced endpoints"
        );
        Ok(())
    }

    async fn upsert_slices(&self, key: &ObjectKey, writes: &Writes) -> Result<(), Error> {
        let request = slice_request(&key.namespace);
        let creates = writes.slices.create.iter().map(|s| ("create", s));
        let updates = writes.slices.update.iter().map(|s| ("update", s));
        for (verb, slice) in creates.chain(updates) {
            // A new slice has only a generateName: its Service names it in errors.
            let planned = slice.metadata.name.as_deref();
            let replace = (verb == "update").then(|| planned.unwrap_or_default());
            let written = send(self.client, upsert(&request, replace, slice), verb)
                .await
                .map_err(write_error(
                    verb,
                    "EndpointSlice",
                    key,
                    planned.unwrap_or(&key.name),
                ))?;
            let name = written.name.as_deref().or(planned).unwrap_or_default();
            self.expect(
                key,
                Target::Slice(name.to_owned()),
                written.resource_version.as_deref(),
                false,
            );
            self.metrics.slice_change(verb);
            debug!(slice = %name, endpoints = slice.endpoints.len(), "{verb}d EndpointSlice");
        }
        Ok(())
    }

    async fn apply_endpoints(&self, key: &ObjectKey, write: &EndpointsWrite) -> Result<(), Error> {
        let request = Request::new(Endpoints::url_path(&(), Some(&key.namespace)));
        let verb = write.verb();
        let built = match write {
            EndpointsWrite::Create(endpoints) => upsert(&request, None, endpoints),
            EndpointsWrite::Replace(endpoints) => upsert(&request, Some(&key.name), endpoints),
            EndpointsWrite::Delete => request
                .delete(&key.name, &DeleteParams::default())
                .map_err(kube::Error::BuildRequest),
        };
        let deleted = matches!(write, EndpointsWrite::Delete);
        match send(self.client, built, verb).await {
            Ok(written) => {
                let rv = written.resource_version.as_deref().filter(|_| !deleted);
                self.expect(key, Target::Endpoints, rv, deleted);
                self.metrics.endpoints_change(verb);
            }
            // Already gone: the watch tells the cache, nothing to wait for.
            Err(e) if deleted && status_code(&e) == Some(404) => {}
            Err(e) => return Err(write_error(verb, "Endpoints", key, &key.name)(e)),
        }
        Ok(())
    }
}

/// A create (no `replace` name) or a replace of `object`, as a request with berth's field
/// manager.
fn upsert<K: serde::Serialize>(
    request: &Request,
    replace: Option<&str>,
    object: &K,
) -> Result<http::Request<Vec<u8>>, kube::Error> {
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let pp = post_params();
    match replace {
        Some(name) => request.replace(name, &pp, body),
        None => request.create(&pp, body),
    }
    .map_err(kube::Error::BuildRequest)
}

/// Sends a write built for `verb` (berth's word: create, update or delete).
async fn send(
    client: &Client,
    built: Result<http::Request<Vec<u8>>, kube::Error>,
    verb: &'static str,
) -> Result<WrittenMeta, kube::Error> {
    // The client's name for an update is a replace.
    let kube_verb = if verb == "update" { "replace" } else { verb };
    send_write(client, built?, kube_verb).await
}

fn slice_request(namespace: &str) -> Request {
    Request::new(EndpointSlice::url_path(&(), Some(namespace)))
}
