//! Writes to the [`Store`]: create, update (main resource or `/status`), delete with finalizers.
//! Each write bumps the global resourceVersion once and records one watch change.

use super::defaults::fill_defaults;
use super::error::ApiError;
use super::events;
use super::fields::Part;
use super::managed::{track_update, Writer};
use super::resource::{built_ins, ResourceInfo};
use super::store::{meta_str, Obj, Store};
use super::watch::EventType;
use rand::Rng;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The door a write comes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Main,
    Status,
}

/// How `managedFields` are maintained for this write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Managed<'a> {
    /// Record the write as an `Update` by this manager.
    Track(&'a str),
    /// The caller (server-side apply) already computed them.
    Preset,
}

#[derive(Debug, Clone, Copy)]
pub struct WriteCtx<'a> {
    pub now: &'a str,
    pub door: Door,
    pub managed: Managed<'a>,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub grace_period_seconds: Option<i64>,
}

const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let map = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if meta.is_null() {
        *meta = json!({});
    }
    meta.as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

fn check_type(info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    let api_version = info.api_version();
    let map = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    for (field, want) in [
        ("apiVersion", api_version.as_str()),
        ("kind", info.kind.as_str()),
    ] {
        match map.get(field).and_then(Value::as_str) {
            Some(got) if !got.is_empty() && got != want => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({}) does not match the expected API version ({api_version}) or kind ({}) does not match {}",
                    map.get("apiVersion").and_then(Value::as_str).unwrap_or_default(),
                    map.get("kind").and_then(Value::as_str).unwrap_or_default(),
                    info.kind
                )))
            }
            _ => {
                map.insert(field.to_owned(), Value::String(want.to_owned()));
            }
        }
    }
    Ok(())
}

/// Everything but metadata and status: what `metadata.generation` tracks.
fn spec_part(obj: &Value) -> Value {
    let mut out = Map::new();
    if let Some(map) = obj.as_object() {
        for (k, v) in map {
            if !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind") {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

fn without_managed(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    o
}

fn writer<'a>(
    info: &ResourceInfo,
    api_version: &'a str,
    ctx: &WriteCtx<'a>,
    manager: &'a str,
) -> Writer<'a> {
    let (part, subresource) = match (ctx.door, info.status_subresource) {
        (Door::Status, _) => (Part::StatusOnly, Some("status")),
        (Door::Main, true) => (Part::AllButStatus, None),
        (Door::Main, false) => (Part::All, None),
    };
    Writer {
        manager,
        api_version,
        now: ctx.now,
        subresource,
        part,
        schema: info.schema,
    }
}

/// The conditions the apiextensions server sets on a CRD it accepts.
fn crd_status(crd: &Value, now: &str) -> Value {
    let stored: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"].as_bool() == Some(true))
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    json!({
        "acceptedNames": crd["spec"]["names"],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now}
        ],
        "storedVersions": stored
    })
}

fn validate_crd(crd: &Value) -> Result<(), ApiError> {
    let name = meta_str(crd, "name");
    let spec = &crd["spec"];
    let want = format!(
        "{}.{}",
        spec["names"]["plural"].as_str().unwrap_or_default(),
        spec["group"].as_str().unwrap_or_default()
    );
    if name != want {
        return Err(ApiError::invalid(
            "CustomResourceDefinition.apiextensions.k8s.io",
            "apiextensions.k8s.io",
            name,
            "metadata.name",
            &format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if spec["versions"].as_array().is_none_or(Vec::is_empty) {
        return Err(ApiError::invalid(
            "CustomResourceDefinition.apiextensions.k8s.io",
            "apiextensions.k8s.io",
            name,
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        ));
    }
    Ok(())
}

impl Store {
    pub fn create(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        mut obj: Value,
        ctx: &WriteCtx<'_>,
    ) -> Result<Obj, ApiError> {
        check_type(info, &mut obj)?;
        if let Some(core) = core_events_for(info) {
            return self.create(&core, ns, events::to_core(&obj), ctx);
        }
        let meta = meta_mut(&mut obj)?;
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if info.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(body_ns) if !body_ns.is_empty() && body_ns != ns => {
                    return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"))
                }
                _ => {
                    meta.insert("namespace".to_owned(), Value::String(ns.to_owned()));
                }
            }
        } else {
            meta.remove("namespace");
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if name.is_empty() {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    &info.kind,
                    &info.group,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
            name = self.generate_name(info, ns, &prefix);
            meta.insert("name".to_owned(), Value::String(name.clone()));
        }
        if info.namespaced && !self.namespace_exists(ns) {
            return Err(ApiError::not_found("namespaces", "", ns));
        }
        if self.get(info, ns, &name).is_ok() {
            return Err(ApiError::already_exists(&info.plural, &info.group, &name));
        }
        for server_owned in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ] {
            if server_owned != "managedFields" || ctx.managed != Managed::Preset {
                meta.remove(server_owned);
            }
        }
        meta.insert(
            "uid".to_owned(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        meta.insert(
            "creationTimestamp".to_owned(),
            Value::String(ctx.now.to_owned()),
        );
        meta.insert("generation".to_owned(), json!(1));
        if info.is_crd() {
            validate_crd(&obj)?;
        }
        if let Some(map) = obj.as_object_mut() {
            if info.is_namespace() {
                map.insert("status".to_owned(), json!({"phase": "Active"}));
            } else if info.group.is_empty() && info.plural == "pods" {
                map.insert("status".to_owned(), json!({"phase": "Pending"}));
            } else if info.is_crd() {
                let status = crd_status(&Value::Object(map.clone()), ctx.now);
                map.insert("status".to_owned(), status);
            } else if info.status_subresource && !(info.group.is_empty() && info.plural == "nodes")
            {
                map.remove("status");
            }
        }
        fill_defaults(info, &mut obj);
        if let Managed::Track(manager) = ctx.managed {
            let api_version = info.api_version();
            track_update(None, &mut obj, &writer(info, &api_version, ctx, manager));
        }
        let rv = self.next_rv();
        meta_mut(&mut obj)?.insert("resourceVersion".to_owned(), Value::String(rv.to_string()));
        let obj = Arc::new(obj);
        self.put(info, ns, &name, obj.clone());
        self.record(info, ns, EventType::Added, obj.clone(), None);
        if info.is_crd() {
            self.rebuild_catalogue();
        }
        Ok(obj)
    }

    fn generate_name(&self, info: &ResourceInfo, ns: &str, prefix: &str) -> String {
        let mut rng = rand::rng();
        loop {
            let suffix: String = (0..5)
                .map(|_| {
                    char::from(GENERATE_ALPHABET[rng.random_range(0..GENERATE_ALPHABET.len())])
                })
                .collect();
            let name = format!("{prefix}{suffix}");
            if self.get(info, ns, &name).is_err() {
                return name;
            }
        }
    }

    /// Replace an object (PUT), through the main door or `/status`.
    pub fn update(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        mut new: Value,
        ctx: &WriteCtx<'_>,
    ) -> Result<Obj, ApiError> {
        if let Some(core) = core_events_for(info) {
            check_type(info, &mut new)?;
            return self.update(&core, ns, name, events::to_core(&new), ctx);
        }
        let old = match self.get(info, ns, name) {
            Ok(old) => old,
            Err(e) if ctx.door == Door::Main && allow_create_on_update(info) => {
                let _ = e;
                let mut fresh = new;
                if let Some(meta) = fresh.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
                return self.create(info, ns, fresh, ctx);
            }
            Err(e) => return Err(e),
        };
        check_type(info, &mut new)?;
        let meta = meta_mut(&mut new)?;
        let body_name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if info.namespaced {
            if let Some(body_ns) = meta.get("namespace").and_then(Value::as_str) {
                if !body_ns.is_empty() && body_ns != ns {
                    return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
                }
            }
        }
        let requested_rv = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let old_rv = meta_str(&old, "resourceVersion");
        if !requested_rv.is_empty() && requested_rv != old_rv {
            return Err(ApiError::conflict(&info.plural, &info.group, name));
        }
        let mut result = match ctx.door {
            Door::Status => {
                let mut r = (*old).clone();
                if let Some(map) = r.as_object_mut() {
                    match new.get("status") {
                        Some(s) => map.insert("status".to_owned(), s.clone()),
                        None => map.remove("status"),
                    };
                }
                if ctx.managed == Managed::Preset {
                    if let Some(mf) = new["metadata"].get("managedFields") {
                        r["metadata"]["managedFields"] = mf.clone();
                    }
                }
                r
            }
            Door::Main => {
                let mut r = new;
                if let (Some(map), Some(old_map)) = (r.as_object_mut(), old.as_object()) {
                    if info.status_subresource {
                        match old_map.get("status") {
                            Some(s) => map.insert("status".to_owned(), s.clone()),
                            None => map.remove("status"),
                        };
                    }
                }
                let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
                let meta = meta_mut(&mut r)?;
                let mut keep = vec![
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ];
                if ctx.managed != Managed::Preset {
                    keep.push("managedFields");
                }
                for field in keep {
                    match old_meta.get(field) {
                        Some(v) => meta.insert(field.to_owned(), v.clone()),
                        None => meta.remove(field),
                    };
                }
                fill_defaults(info, &mut r);
                if info.is_crd() {
                    validate_crd(&r)?;
                    r["status"] = crd_status(&r, meta_str(&old, "creationTimestamp"));
                }
                r
            }
        };
        meta_mut(&mut result)?.insert(
            "resourceVersion".to_owned(),
            Value::String(old_rv.to_owned()),
        );
        if spec_part(&old) != spec_part(&result) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            meta_mut(&mut result)?.insert("generation".to_owned(), json!(generation));
        }
        if let Managed::Track(manager) = ctx.managed {
            let api_version = info.api_version();
            track_update(
                Some(&old),
                &mut result,
                &writer(info, &api_version, ctx, manager),
            );
        }
        if without_managed(&result) == without_managed(&old) {
            return Ok(old);
        }
        // As the apiserver's `ShouldDeleteDuringUpdate`: an object goes on an update only once
        // its last finalizer is removed and no grace period is running (a terminating pod stays
        // until its kubelet deletes it with grace 0, whatever else writes to it meanwhile).
        let finalizers_done = result["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty)
            && old["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .is_none_or(|grace| grace == 0);
        let rv = self.next_rv();
        meta_mut(&mut result)?.insert("resourceVersion".to_owned(), Value::String(rv.to_string()));
        let result = Arc::new(result);
        if !result["metadata"]["deletionTimestamp"].is_null() && finalizers_done {
            self.take(info, ns, name);
            self.record(info, ns, EventType::Deleted, result.clone(), Some(old));
        } else {
            self.put(info, ns, name, result.clone());
            self.record(info, ns, EventType::Modified, result.clone(), Some(old));
        }
        if info.is_crd() {
            self.rebuild_catalogue();
        }
        Ok(result)
    }

    /// Delete one object. With finalizers it only gains a `deletionTimestamp`; it goes when the last
    /// finalizer is removed by an update.
    pub fn delete(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
        now: &str,
    ) -> Result<Obj, ApiError> {
        let old = self.get(info, ns, name)?;
        if let Some(uid) = opts.uid.as_deref() {
            let have = meta_str(&old, "uid");
            if uid != have {
                return Err(ApiError::conflict_with(&info.plural, &info.group, name, &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}")));
            }
        }
        if let Some(rv) = opts.resource_version.as_deref() {
            let have = meta_str(&old, "resourceVersion");
            if rv != have {
                return Err(ApiError::conflict_with(&info.plural, &info.group, name, &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}")));
            }
        }
        if let Some(grace) = self.termination_grace(info, &old, opts) {
            return self.start_termination(info, ns, name, old, grace, now);
        }
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if !old["metadata"]["deletionTimestamp"].is_null() {
                return Ok(old);
            }
            let mut marked = (*old).clone();
            let rv = self.next_rv();
            let meta = meta_mut(&mut marked)?;
            meta.insert(
                "deletionTimestamp".to_owned(),
                Value::String(now.to_owned()),
            );
            meta.insert("deletionGracePeriodSeconds".to_owned(), json!(0));
            meta.insert("resourceVersion".to_owned(), Value::String(rv.to_string()));
            let marked = Arc::new(marked);
            self.put(info, ns, name, marked.clone());
            self.record(info, ns, EventType::Modified, marked.clone(), Some(old));
            return Ok(marked);
        }
        if info.is_namespace() {
            self.purge(|key, k_ns| k_ns == name && key != "/namespaces");
        }
        if info.is_crd() {
            let key = format!(
                "{}/{}",
                old["spec"]["group"].as_str().unwrap_or_default(),
                old["spec"]["names"]["plural"].as_str().unwrap_or_default()
            );
            self.purge(|k, _| k == key);
        }
        let removed = self.remove_now(info, ns, name, old);
        if info.is_crd() {
            self.rebuild_catalogue();
        }
        Ok(removed)
    }

    /// The grace period of a pod deletion that must wait for its kubelet: only with graceful pod
    /// deletion on, only for pods bound to a node, only when the period is not zero.
    fn termination_grace(
        &self,
        info: &ResourceInfo,
        old: &Value,
        opts: &DeleteOptions,
    ) -> Option<i64> {
        if !(self.graceful_pods && info.group.is_empty() && info.plural == "pods") {
            return None;
        }
        if old["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
            return None;
        }
        let grace = opts
            .grace_period_seconds
            .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        let current = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
        match current {
            // Already terminating: only a shorter period changes anything; zero finishes it.
            Some(c) if grace > 0 && grace >= c => Some(c),
            _ if grace > 0 => Some(grace),
            _ => None,
        }
    }

    /// Mark a pod as terminating: `deletionTimestamp` = now + grace, as the apiserver does, and leave
    /// its removal to whoever plays the kubelet (a delete with grace period 0).
    fn start_termination(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        old: Obj,
        grace: i64,
        now: &str,
    ) -> Result<Obj, ApiError> {
        if old["metadata"]["deletionGracePeriodSeconds"].as_i64() == Some(grace) {
            return Ok(old);
        }
        let deadline = chrono::DateTime::parse_from_rfc3339(now)
            .map(|t| {
                (t + chrono::Duration::seconds(grace))
                    .to_utc()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            })
            .unwrap_or_else(|_| now.to_owned());
        let mut marked = (*old).clone();
        let rv = self.next_rv();
        let meta = meta_mut(&mut marked)?;
        meta.insert("deletionTimestamp".to_owned(), Value::String(deadline));
        meta.insert("deletionGracePeriodSeconds".to_owned(), json!(grace));
        meta.insert("resourceVersion".to_owned(), Value::String(rv.to_string()));
        let marked = Arc::new(marked);
        self.put(info, ns, name, marked.clone());
        self.record(info, ns, EventType::Modified, marked.clone(), Some(old));
        Ok(marked)
    }

    fn remove_now(&mut self, info: &ResourceInfo, ns: &str, name: &str, old: Obj) -> Obj {
        self.take(info, ns, name);
        let rv = self.next_rv();
        let mut gone = (*old).clone();
        gone["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let gone = Arc::new(gone);
        self.record(info, ns, EventType::Deleted, gone.clone(), Some(old));
        gone
    }

    /// Remove, without finalizers, every object whose (storage key, namespace) matches: what the
    /// namespace and CRD cleanup of a real cluster eventually achieves, done at once.
    fn purge(&mut self, doomed: impl Fn(&str, &str) -> bool) {
        let mut victims = Vec::new();
        for (key, table) in &self.tables {
            for ((k_ns, k_name), stored) in table {
                if doomed(key, k_ns) {
                    victims.push((
                        key.clone(),
                        k_ns.clone(),
                        k_name.clone(),
                        stored.obj.clone(),
                    ));
                }
            }
        }
        for (key, ns, name, old) in victims {
            if let Some(t) = self.tables.get_mut(&key) {
                t.remove(&(ns.clone(), name));
            }
            let rv = self.next_rv();
            let mut gone = (*old).clone();
            gone["metadata"]["resourceVersion"] = Value::String(rv.to_string());
            self.record_raw(&key, &ns, EventType::Deleted, Arc::new(gone), Some(old));
        }
    }
}

/// Resources whose PUT creates a missing object, as upstream's `AllowCreateOnUpdate`.
/// The core Events resource that objects written through `info` are stored as, if they are.
fn core_events_for(info: &ResourceInfo) -> Option<ResourceInfo> {
    if !info.stored_as_core_events() {
        return None;
    }
    built_ins()
        .into_iter()
        .find(|r| r.group.is_empty() && r.plural == "events")
}

fn allow_create_on_update(info: &ResourceInfo) -> bool {
    matches!(
        (info.group.as_str(), info.plural.as_str()),
        ("", "endpoints")
            | ("", "events")
            | ("coordination.k8s.io", "leases")
            | ("events.k8s.io", "events")
    )
}
