//! `/scale` on Deployments and ReplicaSets: get, update and patch a Scale, written through as
//! an update of the object's `spec.replicas` (see [`crate::scale`]).

use super::{json_response, write_as_manager, App};
use crate::error::ApiError;
use crate::patch::{build_patched, PatchType};
use crate::resource::{view, ResourceInfo, Schema};
use crate::scale::{to_scale, wanted_replicas, with_replicas};
use crate::store::meta_str;
use crate::write::Door;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::collections::HashMap;

/// One request on `/scale`: the object it addresses and the request itself.
pub(super) struct ScaleRequest<'a> {
    pub info: &'a ResourceInfo,
    pub ns: &'a str,
    pub name: &'a str,
    pub method: Method,
    pub query: &'a HashMap<String, String>,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
}

pub(super) fn handle(app: &App, req: ScaleRequest<'_>) -> Result<Response, ApiError> {
    let ScaleRequest {
        info,
        ns,
        name,
        method,
        query,
        headers,
        body,
    } = req;
    let patch = match method {
        Method::GET => {
            let obj = app.store().get(info, ns, name)?;
            return Ok(json_response(StatusCode::OK, &to_scale(&obj)));
        }
        Method::PUT => None,
        Method::PATCH => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = PatchType::from_content_type(content_type)?;
            if kind == PatchType::Apply {
                return Err(ApiError::unsupported_media_type(content_type));
            }
            Some(kind)
        }
        m => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            )))
        }
    };
    let written = write_as_manager(app, query, headers, Door::Main, |s, ctx| {
        let current = s.get(info, ns, name)?;
        let current = view(&current, &info.api_version()).into_owned();
        let scale = match patch {
            Some(kind) => build_patched(&to_scale(&current), kind, body, Schema::BuiltIn)?,
            None => {
                let scale: Value = serde_json::from_slice(body).map_err(|e| {
                    ApiError::bad_request(format!(
                        "the body of the request could not be decoded: {e}"
                    ))
                })?;
                // An update names the version it read, as every update does.
                if let Some(rv) = scale["metadata"]["resourceVersion"]
                    .as_str()
                    .filter(|rv| !rv.is_empty())
                {
                    if rv != meta_str(&current, "resourceVersion") {
                        return Err(ApiError::conflict(&info.plural, &info.group, name));
                    }
                }
                scale
            }
        };
        let replicas = wanted_replicas(&scale, &info.kind, name)?;
        let mut updated = with_replicas(&current, replicas);
        // The write is of the object as read: no stale-version conflict of its own.
        if let Some(meta) = updated["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        s.update(info, ns, name, updated, ctx)
    })?;
    Ok(json_response(StatusCode::OK, &to_scale(&written)))
}
