//! The verbs on resource paths: get, list, watch, create, update, patch, delete, deletecollection.

use super::route::ResourcePath;
use super::watch::{serve_watch, WatchParams};
use super::{bytes_response, json_response, now, write_as_manager, App};
use crate::error::ApiError;
use crate::fields::Part;
use crate::managed::{self, Writer};
use crate::patch::{build_patched, PatchType};
use crate::protobuf;
use crate::resource::{view, ResourceInfo};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{meta_str, ListQuery, Obj, Stored};
use crate::table::{self, IncludeObject, Wanted};
use crate::write::{DeleteOptions, Door, Managed, WriteCtx};
use axum::body::Bytes;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The object as the requested version shows it (see [`view`]).
fn as_version<'a>(obj: &'a Obj, api_version: &str) -> std::borrow::Cow<'a, Value> {
    view(obj, api_version)
}

fn object_response(code: StatusCode, obj: &Obj, info: &ResourceInfo) -> Response {
    json_response(code, &as_version(obj, &info.api_version()))
}

/// A Table of stored objects, as `wanted` asks (see [`table`]).
fn table_response(
    info: &ResourceInfo,
    items: &[&Obj],
    metadata: Value,
    api_version: &str,
    include: IncludeObject,
) -> Response {
    json_response(
        StatusCode::OK,
        &table::build_table(
            info,
            items,
            metadata,
            api_version,
            include,
            chrono::Utc::now(),
        ),
    )
}

fn list_meta(rv: u64, cont: Option<&str>, remaining: Option<u64>) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    meta
}

fn list_response(
    info: &ResourceInfo,
    items: &[Stored],
    rv: u64,
    cont: Option<&str>,
    remaining: Option<u64>,
) -> Response {
    let meta = list_meta(rv, cont, remaining);
    let api_version = info.api_version();
    let head = json!({"kind": info.list_kind(), "apiVersion": api_version, "metadata": meta});
    // Concatenated from each object's stored text: a 100k-pod list is neither built as one more
    // JSON tree nor serialized again.
    let mut out = Vec::with_capacity(items.iter().map(|s| s.json.len() + 1).sum::<usize>() + 256);
    let head_text = head.to_string();
    out.extend_from_slice(&head_text.as_bytes()[..head_text.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.json_as(&api_version).as_bytes());
    }
    out.extend_from_slice(b"]}");
    bytes_response(StatusCode::OK, out)
}

fn flag(query: &HashMap<String, String>, key: &str) -> bool {
    query.get(key).is_some_and(|v| v == "true" || v == "1")
}

fn list_query(query: &HashMap<String, String>, info: &ResourceInfo) -> Result<ListQuery, ApiError> {
    Ok(ListQuery {
        labels: LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?,
        fields: FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str), info)?,
        limit: match query.get("limit") {
            Some(l) if !l.is_empty() => Some(
                l.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
            ),
            _ => None,
        },
        continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
    })
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
    })
}

pub async fn handle(
    app: Arc<App>,
    method: Method,
    path: ResourcePath,
    query: HashMap<String, String>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let info = resource_of(&app, &path)?;
    if let (Some("scale"), Some(name), true) = (
        path.subresource.as_deref(),
        path.name.as_deref(),
        info.scale_subresource,
    ) {
        let ns = path.namespace.as_deref().unwrap_or_default();
        let req = super::scale::ScaleRequest {
            info: &info,
            ns,
            name,
            method,
            query: &query,
            headers,
            body: &body,
        };
        return super::scale::handle(&app, req);
    }
    let door = door_of(&path, &info)?;
    let ns = path.namespace.clone().unwrap_or_default();
    let wanted = table::negotiate(
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()),
        query.get("includeObject").map(String::as_str),
    )?;
    let body = json_body(&method, headers, body)?;
    let mutating = matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if mutating {
        if let Some(err) = app.fault_state().mutation_error() {
            return Err(err);
        }
    }
    if info.namespaced && path.namespace.is_none() && (path.name.is_some() || method != Method::GET)
    {
        return Err(ApiError::page_not_found(&format!(
            "{} needs a namespace",
            info.plural
        )));
    }
    match (method, path.name.as_deref()) {
        (Method::GET, Some(name)) => get(&app, &info, &ns, name, wanted),
        (Method::GET, None) => {
            let q = list_query(&query, &info)?;
            if flag(&query, "watch") {
                let params = WatchParams::from_query(&query)?;
                return Ok(serve_watch(app, info, path.namespace, q, params, wanted));
            }
            list(&app, &info, path.namespace.as_deref(), &q, &query, wanted)
        }
        (Method::POST, None) => {
            let obj = parse_body(&body)?;
            let created = write_as_manager(&app, &query, headers, Door::Main, |s, ctx| {
                s.create(&info, &ns, obj, ctx)
            })?;
            Ok(object_response(StatusCode::CREATED, &created, &info))
        }
        (Method::PUT, Some(name)) => {
            let obj = parse_body(&body)?;
            let updated = write_as_manager(&app, &query, headers, door, |s, ctx| {
                s.update(&info, &ns, name, obj, ctx)
            })?;
            Ok(object_response(StatusCode::OK, &updated, &info))
        }
        (Method::PATCH, Some(name)) => {
            let target = Target {
                info: &info,
                ns: &ns,
                name,
                door,
            };
            patch(&app, target, &query, headers, &body)
        }
        (Method::DELETE, Some(name)) => {
            let opts = delete_options(&body, &query)?;
            let t = now();
            let deleted = app.write(|s| s.delete(&info, &ns, name, &opts, &t))?;
            Ok(object_response(StatusCode::OK, &deleted, &info))
        }
        (Method::DELETE, None) => {
            let q = list_query(&query, &info)?;
            let opts = delete_options(&body, &query)?;
            delete_collection(&app, &info, path.namespace.as_deref(), q, &opts)
        }
        (m, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}

/// The resource a path names, if the catalogue has it and the path's namespace fits it.
fn resource_of(app: &App, path: &ResourcePath) -> Result<ResourceInfo, ApiError> {
    let info = app
        .store()
        .catalogue()
        .find(&path.group, &path.version, &path.plural)
        .cloned()
        .ok_or_else(|| {
            ApiError::page_not_found(&format!("{} {}/{}", path.plural, path.group, path.version))
        })?;
    if !info.namespaced && path.namespace.is_some() {
        return Err(ApiError::page_not_found(&format!(
            "{} is not namespaced",
            info.plural
        )));
    }
    Ok(info)
}

/// The main door, or `/status` where the resource has it; any other subresource is not found.
fn door_of(path: &ResourcePath, info: &ResourceInfo) -> Result<Door, ApiError> {
    match path.subresource.as_deref() {
        None => Ok(Door::Main),
        Some("status") if info.status_subresource => Ok(Door::Status),
        Some(sub) => Err(ApiError::page_not_found(&format!("{}/{sub}", info.plural))),
    }
}

/// The request body as the JSON every path reads: protobuf decoded once, JSON and YAML as sent,
/// any other content type refused for a create or update.
fn json_body(method: &Method, headers: &HeaderMap, body: Bytes) -> Result<Bytes, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if matches!(*method, Method::POST | Method::PUT | Method::DELETE)
        && content_type.starts_with(protobuf::PROTOBUF)
        && !body.is_empty()
    {
        Ok(Bytes::from(protobuf::decode(&body)?.to_string()))
    } else if matches!(*method, Method::POST | Method::PUT)
        && !content_type.starts_with("application/json")
        && !content_type.starts_with("application/yaml")
    {
        Err(ApiError::unsupported_body(content_type))
    } else {
        Ok(body)
    }
}

/// One object, as JSON, a one-row Table or its metadata.
fn get(
    app: &App,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    wanted: Wanted,
) -> Result<Response, ApiError> {
    let obj = app.store().get(info, ns, name)?;
    match wanted {
        Wanted::Json => Ok(object_response(StatusCode::OK, &obj, info)),
        Wanted::Table {
            api_version,
            include,
        } => {
            let meta = json!({"resourceVersion": meta_str(&obj, "resourceVersion")});
            Ok(table_response(info, &[&obj], meta, api_version, include))
        }
        Wanted::Metadata { api_version } => Ok(json_response(
            StatusCode::OK,
            &table::partial_metadata(&obj, api_version),
        )),
    }
}

/// The object a write names, and the door it comes through.
struct Target<'a> {
    info: &'a ResourceInfo,
    ns: &'a str,
    name: &'a str,
    door: Door,
}

/// A patch of the kind its content type names; server-side apply goes its own way.
fn patch(
    app: &App,
    target: Target<'_>,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let Target {
        info,
        ns,
        name,
        door,
    } = target;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kind = PatchType::from_content_type(content_type)?;
    if kind == PatchType::Apply {
        return server_side_apply(app, info, ns, name, door, query, body);
    }
    let patched = write_as_manager(app, query, headers, door, |s, ctx| {
        let current = s.get(info, ns, name)?;
        let current = view(&current, &info.api_version());
        let new = build_patched(&current, kind, body, info.schema)?;
        s.update(info, ns, name, new, ctx)
    })?;
    Ok(object_response(StatusCode::OK, &patched, info))
}

/// Every object the query selects deleted in one write, answered as the list of them.
fn delete_collection(
    app: &App,
    info: &ResourceInfo,
    namespace: Option<&str>,
    q: ListQuery,
    opts: &DeleteOptions,
) -> Result<Response, ApiError> {
    let t = now();
    let deleted = app.write(|s| -> Result<Vec<Obj>, ApiError> {
        let page = s.list(
            info,
            namespace,
            &ListQuery {
                limit: None,
                continue_token: None,
                ..q
            },
        )?;
        let mut out = Vec::new();
        for stored in page.items {
            let (o_ns, o_name) = (
                meta_str(&stored.obj, "namespace").to_owned(),
                meta_str(&stored.obj, "name").to_owned(),
            );
            out.push(s.delete(info, &o_ns, &o_name, opts, &t)?);
        }
        Ok(out)
    })?;
    let rv = app.store().resource_version();
    let deleted: Vec<Stored> = deleted.into_iter().map(Stored::new).collect();
    Ok(list_response(info, &deleted, rv, None, None))
}

fn list(
    app: &App,
    info: &ResourceInfo,
    ns: Option<&str>,
    q: &ListQuery,
    query: &HashMap<String, String>,
    wanted: Wanted,
) -> Result<Response, ApiError> {
    let page = {
        let store = app.store();
        let exact = query
            .get("resourceVersionMatch")
            .is_some_and(|m| m == "Exact");
        if let (true, Some(rv)) = (exact, query.get("resourceVersion")) {
            let rv: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?;
            if rv != store.resource_version() {
                return Err(ApiError::gone(format!(
                    "too old resource version: {rv} ({})",
                    store.resource_version()
                )));
            }
        }
        store.list(info, ns, q)?
    };
    let meta = || {
        list_meta(
            page.resource_version,
            page.continue_token.as_deref(),
            page.remaining,
        )
    };
    match wanted {
        Wanted::Json => {}
        Wanted::Table {
            api_version,
            include,
        } => {
            let objs: Vec<&Obj> = page.items.iter().map(|s| &s.obj).collect();
            return Ok(table_response(info, &objs, meta(), api_version, include));
        }
        Wanted::Metadata { api_version } => {
            let items = page
                .items
                .iter()
                .map(|s| table::partial_metadata(&s.obj, api_version))
                .collect();
            let list = table::partial_metadata_list(items, api_version, meta());
            return Ok(json_response(StatusCode::OK, &list));
        }
    }
    Ok(list_response(
        info,
        &page.items,
        page.resource_version,
        page.continue_token.as_deref(),
        page.remaining,
    ))
}

fn delete_options(body: &[u8], query: &HashMap<String, String>) -> Result<DeleteOptions, ApiError> {
    let v = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        parse_body(body)?
    };
    let pre = &v["preconditions"];
    Ok(DeleteOptions {
        uid: pre["uid"].as_str().map(str::to_owned),
        resource_version: pre["resourceVersion"].as_str().map(str::to_owned),
        grace_period_seconds: v["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok())),
    })
}

fn server_side_apply(
    app: &App,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    door: Door,
    query: &HashMap<String, String>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let manager = query
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager must be set for apply requests",
            )
        })?
        .clone();
    let force = flag(query, "force");
    let applied: Value = serde_yaml::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    let body_name = applied["metadata"]["name"].as_str().unwrap_or_default();
    // An applied configuration may leave the name to the URL, as upstream allows.
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let api_version = info.api_version();
    for (field, want) in [
        ("apiVersion", api_version.as_str()),
        ("kind", info.kind.as_str()),
    ] {
        if applied[field].as_str() != Some(want) {
            return Err(ApiError::bad_request(format!(
                "{field} must be {want:?} in an applied configuration"
            )));
        }
    }
    let t = now();
    let (part, subresource) = match (door, info.status_subresource) {
        (Door::Status, _) => (Part::StatusOnly, Some("status")),
        (Door::Main, true) => (Part::AllButStatus, None),
        (Door::Main, false) => (Part::All, None),
    };
    let writer = Writer {
        manager: &manager,
        api_version: &api_version,
        now: &t,
        subresource,
        part,
        schema: info.schema,
    };
    let ctx = WriteCtx {
        now: &t,
        door,
        managed: Managed::Preset,
    };
    let (created, obj) = app.write(|s| -> Result<(bool, Obj), ApiError> {
        let current = match s.get(info, ns, name) {
            Ok(c) => Some(c),
            Err(e) if e.code == 404 && door == Door::Main => None,
            Err(e) => return Err(e),
        };
        if let (Some(cur), Some(rv)) = (&current, applied["metadata"]["resourceVersion"].as_str()) {
            if rv != meta_str(cur, "resourceVersion") {
                return Err(ApiError::conflict(&info.plural, &info.group, name));
            }
        }
        let base = current
            .as_deref()
            .map(|c| view(c, &api_version).into_owned())
            .unwrap_or_else(|| {
                let mut meta = json!({"name": name});
                if info.namespaced {
                    meta["namespace"] = json!(ns);
                }
                json!({"apiVersion": api_version, "kind": info.kind, "metadata": meta})
            });
        let merged = managed::apply(&base, &applied, &writer, force)
            .map_err(|c| ApiError::apply_conflicts(&info.plural, &info.group, name, &c.0))?;
        match current {
            Some(_) => Ok((false, s.update(info, ns, name, merged, &ctx)?)),
            None => Ok((true, s.create(info, ns, merged, &ctx)?)),
        }
    })?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(object_response(code, &obj, info))
}
