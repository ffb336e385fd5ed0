//! Reading an object's fields for its cells, shared by the printers and the Pod printer.

use serde_json::Value;

/// The string at `v`; empty when the field is missing or not a string, as upstream's printers
/// read it.
pub(super) fn str_at(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}
