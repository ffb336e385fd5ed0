//! Table responses (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), which is how
//! `kubectl get` asks: the server chooses the columns and formats the cells, kubectl only lays
//! them out. Built-in kinds print with upstream's printers ([`printers`]), custom resources with
//! their CRD's `additionalPrinterColumns`, anything else with upstream's default NAME / CREATED AT.
//! Everything here is pure: the HTTP layer passes the objects and the time.

pub mod age;
mod pod;
pub mod printers;
mod text;

use crate::columns::{Column, PrinterColumn};
use crate::error::ApiError;
use crate::resource::{view, ResourceInfo, Schema};
use crate::store::Obj;
use chrono::{DateTime, Utc};
use jsonpath_rust::JsonPath;
use printers::Printer;
use serde_json::{json, Map, Value};

/// What the rows carry besides their cells (`includeObject`; kubectl's default is Metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// The representation a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    Json,
    Table {
        /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`.
        api_version: &'static str,
        include: IncludeObject,
    },
    /// Only the metadata of each object (`as=PartialObjectMetadata` and `...List`), what kube-rs's
    /// `list_metadata` and `watch_metadata` ask for.
    Metadata {
        /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`.
        api_version: &'static str,
    },
}

const ACCEPTED: &str = "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io";

/// The first media range of `Accept` that the lab can answer, in the client's order. None
/// acceptable (protobuf only, say) is 406, as upstream.
pub fn negotiate(accept: Option<&str>, include_object: Option<&str>) -> Result<Wanted, ApiError> {
    // Read only for Tables, as upstream reads it only into its table options.
    let include = || match include_object.unwrap_or_default() {
        "" | "Metadata" => Ok(IncludeObject::Metadata),
        "None" => Ok(IncludeObject::None),
        "Object" => Ok(IncludeObject::Object),
        other => Err(ApiError::bad_request(format!(
            "includeObject: unsupported value {other:?}: must be one of None, Metadata, Object"
        ))),
    };
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Wanted::Json);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let mut params = Map::new();
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                params.insert(k.trim().to_owned(), json!(v.trim().trim_matches('"')));
            }
        }
        let json_media = matches!(media.as_str(), "application/json" | "application/*" | "*/*");
        if !json_media {
            continue;
        }
        let Some(target) = params.get("as").and_then(Value::as_str) else {
            return Ok(Wanted::Json);
        };
        if params.get("g").and_then(Value::as_str) != Some("meta.k8s.io") {
            continue;
        }
        let api_version = match params.get("v").and_then(Value::as_str) {
            Some("v1") => "meta.k8s.io/v1",
            Some("v1beta1") => "meta.k8s.io/v1beta1",
            _ => continue,
        };
        match target {
            "Table" => {
                return Ok(Wanted::Table {
                    api_version,
                    include: include()?,
                })
            }
            "PartialObjectMetadata" | "PartialObjectMetadataList" => {
                return Ok(Wanted::Metadata { api_version })
            }
            _ => continue,
        }
    }
    Err(ApiError::not_acceptable(ACCEPTED))
}

/// How objects of one resource print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    BuiltIn(Printer),
    /// A custom resource: Name, then its CRD's columns (Age when it declares none).
    Custom(Vec<PrinterColumn>),
    /// Upstream's default table convertor: Name and Created At.
    Default,
}

impl Layout {
    pub fn of(info: &ResourceInfo) -> Self {
        if info.schema == Schema::Custom {
            if info.printer_columns.is_empty() {
                return Self::Custom(vec![PrinterColumn {
                    column: Column::new("Age", "date", 0, printers::CREATED),
                    json_path: ".metadata.creationTimestamp".to_owned(),
                }]);
            }
            return Self::Custom(info.printer_columns.clone());
        }
        Printer::of(&info.group, &info.plural).map_or(Self::Default, Self::BuiltIn)
    }

    pub fn columns(&self) -> Vec<Column> {
        match self {
            Self::BuiltIn(p) => p.columns(),
            Self::Custom(cols) => std::iter::once(Column::name())
                .chain(cols.iter().map(|c| c.column.clone()))
                .collect(),
            Self::Default => vec![
                Column::name(),
                Column::new("Created At", "date", 0, printers::CREATED),
            ],
        }
    }

    /// The cells of one object: `stored` is the object as kept (core shape for Events), `shown`
    /// as the requested version shows it.
    pub fn cells(&self, stored: &Value, shown: &Value, now: DateTime<Utc>) -> Vec<Value> {
        match self {
            Self::BuiltIn(p) => p.cells(stored, now),
            Self::Custom(cols) => std::iter::once(json!(shown["metadata"]["name"]))
                .chain(cols.iter().map(|c| custom_cell(c, shown, now)))
                .collect(),
            Self::Default => vec![
                json!(shown["metadata"]["name"]),
                json!(shown["metadata"]["creationTimestamp"]),
            ],
        }
    }

    /// One row: its cells, the conditions upstream adds, and the object as `include` asks.
    pub fn row(
        &self,
        stored: &Value,
        shown: &Value,
        now: DateTime<Utc>,
        table_api_version: &str,
        include: IncludeObject,
    ) -> Value {
        let mut row = json!({"cells": self.cells(stored, shown, now)});
        if self == &Self::BuiltIn(Printer::Pod) {
            if let Some(conditions) = pod::pod_row_conditions(stored) {
                row["conditions"] = conditions;
            }
        }
        match include {
            IncludeObject::None => {}
            IncludeObject::Metadata => row["object"] = partial_metadata(shown, table_api_version),
            IncludeObject::Object => row["object"] = shown.clone(),
        }
        row
    }
}

/// An object reduced to its metadata, as `PartialObjectMetadata` of `api_version` (meta.k8s.io).
pub fn partial_metadata(obj: &Value, api_version: &str) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": obj["metadata"]})
}

/// A `PartialObjectMetadataList`; `metadata` is the list's.
pub fn partial_metadata_list(items: Vec<Value>, api_version: &str, metadata: Value) -> Value {
    json!({"kind": "PartialObjectMetadataList", "apiVersion": api_version, "metadata": metadata,
        "items": items})
}

/// A Table of `rows`; `metadata` is the list's (resourceVersion, continue, remainingItemCount).
pub fn table(api_version: &str, columns: &[Column], rows: Vec<Value>, metadata: Value) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": metadata,
        "columnDefinitions": columns.iter().map(Column::to_json).collect::<Vec<_>>(),
        "rows": rows,
    })
}

/// A Table of stored objects, each row shown as its resource's version shows it, ages as of `now`.
pub fn build_table(
    info: &ResourceInfo,
    items: &[&Obj],
    metadata: Value,
    api_version: &str,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    let layout = Layout::of(info);
    let shown_as = info.api_version();
    let rows = items
        .iter()
        .map(|obj| layout.row(obj, &view(obj, &shown_as), now, api_version, include))
        .collect();
    table(api_version, &layout.columns(), rows, metadata)
}

/// kubectl's JSONPath (`.spec.x`, `{.spec.x}`) as a JSONPath query (`$.spec.x`).
fn query_path(k8s: &str) -> String {
    let inner = k8s.trim();
    let inner = inner
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or(inner);
    match inner.strip_prefix('$') {
        Some(_) => inner.to_owned(),
        None if inner.starts_with('.') || inner.starts_with('[') => format!("${inner}"),
        None => format!("$.{inner}"),
    }
}

/// A custom column's cell, as the apiextensions table convertor makes it: the first result of the
/// JSONPath, typed by the column (strings print as kubectl's JSONPath prints: maps and lists as
/// compact JSON), null where there is no result.
fn custom_cell(col: &PrinterColumn, obj: &Value, now: DateTime<Utc>) -> Value {
    let Ok(results) = obj.query(&query_path(&col.json_path)) else {
        return Value::Null;
    };
    let Some(value) = results.into_iter().next().filter(|v| !v.is_null()) else {
        return Value::Null;
    };
    match col.column.type_.as_str() {
        "string" => match value {
            Value::String(s) => json!(s),
            Value::Number(n) => json!(n.to_string()),
            Value::Bool(b) => json!(b.to_string()),
            other => json!(other.to_string()),
        },
        "integer" => value
            .as_i64()
            .or_else(|| value.as_f64().map(|f| f as i64))
            .map_or(Value::Null, |i| json!(i)),
        "number" => value.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => value.as_bool().map_or(Value::Null, |b| json!(b)),
        "date" => match value.as_str() {
            Some(s) if DateTime::parse_from_rfc3339(s).is_ok() => json!(age::since(Some(s), now)),
            Some(_) => json!("<invalid>"),
            None => Value::Null,
        },
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests;
