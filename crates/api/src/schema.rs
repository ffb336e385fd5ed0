//! Hand-tuned parts of the CRD schemas: what schemars cannot derive but a real apiserver needs
//! (CEL rules, list and map types for server-side apply, length bounds that keep CEL costs finite).

use schemars::{json_schema, Schema, SchemaGenerator};
use serde_json::{json, Value};

use berth_core::{
    DNS1123_LABEL_MAX_LEN, DNS1123_LABEL_PATTERN, DNS1123_SUBDOMAIN_MAX_LEN,
    DNS1123_SUBDOMAIN_PATTERN, INTERFACE_NAME_MAX_LEN, INTERFACE_NAME_PATTERN, MAX_ADDRESS_LEN,
};

/// Most entries in `IPPool.spec.addresses`; also bounds the CEL cost estimate of the item rules.
pub const MAX_ADDRESSES: usize = 128;
/// Most entries in `L2Advertisement.spec.interfaces`.
pub const MAX_INTERFACES: usize = 64;
/// Most communities on one BGPAdvertisement.
pub const MAX_COMMUNITIES: usize = 32;
/// `serviceAllocation.priority` bounds: lower numbers are tried first.
pub const MIN_PRIORITY: i32 = 0;
pub const MAX_PRIORITY: i32 = 1000;

const RANGE_FIRST: &str = "self.split('-')[0].trim()";
const RANGE_LAST: &str = "self.split('-')[1].trim()";

/// The CEL rules on each address string, with their messages. The Kubernetes CEL IP/CIDR library
/// (`isIP`, `ip`, `isCIDR`, `cidr`, `family`) parses and classifies addresses but cannot order
/// them, so IPv4 ranges are ordered through their octets and IPv6 order is left to berth's own
/// validation (`IPPoolSpec::validate`).
pub fn address_rules() -> Vec<(String, String)> {
    let is_range =
        format!("(self.split('-').size() == 2 && isIP({RANGE_FIRST}) && isIP({RANGE_LAST}))");
    let ipv4_value = |side: &str| {
        format!(
            "(int({side}.split('.')[0]) * 16777216 + int({side}.split('.')[1]) * 65536 \
             + int({side}.split('.')[2]) * 256 + int({side}.split('.')[3]))"
        )
    };
    vec![
        (
            format!("isCIDR(self) || {is_range}"),
            "must be a CIDR (198.18.0.0/24, fd00::/120) or a range of two addresses \
             (198.18.0.200-198.18.0.250)"
                .to_string(),
        ),
        (
            "!isCIDR(self) || cidr(self).ip() == cidr(self).masked().ip()".to_string(),
            "a CIDR must not have host bits set: write its network address \
             (198.18.0.0/24, not 198.18.0.1/24)"
                .to_string(),
        ),
        (
            format!("!{is_range} || ip({RANGE_FIRST}).family() == ip({RANGE_LAST}).family()"),
            "both ends of a range must be of the same IP family".to_string(),
        ),
        (
            format!(
                "!{is_range} || ip({RANGE_FIRST}).family() != 4 || ip({RANGE_LAST}).family() != 4 \
                 || {} <= {}",
                ipv4_value(RANGE_FIRST),
                ipv4_value(RANGE_LAST)
            ),
            "the first address of a range must not be greater than the last".to_string(),
        ),
    ]
}

fn validations(rules: Vec<(String, String)>) -> Value {
    Value::Array(
        rules
            .into_iter()
            .map(|(rule, message)| json!({ "rule": rule, "message": message }))
            .collect(),
    )
}

pub fn addresses(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_ADDRESSES,
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_ADDRESS_LEN,
            "x-kubernetes-validations": validations(address_rules()),
        },
    })
}

pub fn namespaces(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "maxLength": DNS1123_LABEL_MAX_LEN,
            "pattern": DNS1123_LABEL_PATTERN,
        },
    })
}

pub fn pool_names(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "maxLength": DNS1123_SUBDOMAIN_MAX_LEN,
            "pattern": DNS1123_SUBDOMAIN_PATTERN,
        },
    })
}

pub fn interfaces(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_INTERFACES,
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": INTERFACE_NAME_MAX_LEN,
            "pattern": INTERFACE_NAME_PATTERN,
            "x-kubernetes-validations": [{
                "rule": "self != '.' && self != '..'",
                "message": "an interface name must not be \".\" or \"..\"",
            }],
        },
    })
}

/// A BGP duration: whole seconds, with minutes allowed (`9s`, `1m30s`, `2m`).
pub const SECONDS_PATTERN: &str = "^([0-9]+m)?[0-9]+s$|^[0-9]+m$";
/// A standard (`AS:value`) or large (`large:global:local1:local2`) BGP community.
pub const COMMUNITY_PATTERN: &str =
    "^([0-9]{1,5}:[0-9]{1,5}|large:[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10})$";
/// Longest textual IP address (an IPv6 address with an embedded IPv4 one).
const MAX_IP_LEN: usize = 45;

pub fn ip_address(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": MAX_IP_LEN,
        "x-kubernetes-validations": [{"rule": "isIP(self)", "message": "must be an IPv4 or IPv6 address"}],
    })
}

pub fn optional_ip_address(generator: &mut SchemaGenerator) -> Schema {
    ip_address(generator)
}

pub fn optional_ipv4_address(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": MAX_IP_LEN,
        "x-kubernetes-validations": [{
            "rule": "isIP(self) && ip(self).family() == 4",
            "message": "must be an IPv4 address",
        }],
    })
}

pub fn optional_seconds(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 16,
        "pattern": SECONDS_PATTERN,
    })
}

pub fn name(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": DNS1123_SUBDOMAIN_MAX_LEN,
        "pattern": DNS1123_SUBDOMAIN_PATTERN,
    })
}

pub fn optional_name(generator: &mut SchemaGenerator) -> Schema {
    name(generator)
}

pub fn communities(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_COMMUNITIES,
        "x-kubernetes-list-type": "set",
        "items": {"type": "string", "maxLength": 48, "pattern": COMMUNITY_PATTERN},
    })
}

/// Rules across a BGPPeer's fields. The hold-time rules compare seconds through CEL's own
/// `duration()`, which reads the same `1m30s` forms.
pub fn peer_rules(schema: &mut Schema) {
    let rules = validations(vec![
        (
            "!has(self.ebgpMultiHop) || !self.ebgpMultiHop || self.myASN != self.peerASN".into(),
            "ebgpMultiHop applies to eBGP only: myASN equals peerASN".into(),
        ),
        (
            "!has(self.holdTime) || duration(self.holdTime) == duration('0s') \
             || duration(self.holdTime) >= duration('3s')"
                .into(),
            "holdTime must be 0s or at least 3s".into(),
        ),
        (
            "!has(self.keepaliveTime) || (has(self.holdTime) && duration(self.holdTime) == duration('0s')) \
             || duration(self.keepaliveTime) < (has(self.holdTime) ? duration(self.holdTime) : duration('9s'))"
                .into(),
            "keepaliveTime must be less than holdTime (9s when unset)".into(),
        ),
        (
            "!has(self.connectTime) || (duration(self.connectTime) >= duration('1s') \
             && duration(self.connectTime) <= duration('65535s'))"
                .into(),
            "connectTime must be between 1s and 65535s".into(),
        ),
    ]);
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("x-kubernetes-validations".into(), rules);
    }
}

/// Selectors are replaced whole under server-side apply, as the built-in kinds' selectors are:
/// merging two managers' requirements would silently build a selector neither of them wrote.
pub fn atomic_selector(schema: &mut Schema) {
    let mut value = schema.clone().to_value();
    // An optional selector may come as `anyOf: [selector, null]` rather than `nullable`.
    if let Some(Value::Array(variants)) = value.get_mut("anyOf") {
        variants.iter_mut().for_each(mark_selector);
    }
    mark_selector(&mut value);
    if let Ok(marked) = Schema::try_from(value) {
        *schema = marked;
    }
}

/// A list of selectors (ORed): each one atomic, and the list itself replaced whole.
pub fn atomic_selector_list(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    obj.insert("x-kubernetes-list-type".into(), json!("atomic"));
    if let Some(items) = obj.get_mut("items") {
        mark_selector(items);
    }
}

fn mark_selector(selector: &mut Value) {
    let Some(obj) = selector.as_object_mut() else {
        return;
    };
    if !obj.contains_key("properties") {
        return;
    }
    obj.insert("x-kubernetes-map-type".into(), json!("atomic"));
    let expressions = obj
        .get_mut("properties")
        .and_then(|p| p.get_mut("matchExpressions"));
    if let Some(Value::Object(expressions)) = expressions {
        expressions.insert("x-kubernetes-list-type".into(), json!("atomic"));
        let values = expressions
            .get_mut("items")
            .and_then(|i| i.get_mut("properties"))
            .and_then(|p| p.get_mut("values"));
        if let Some(Value::Object(values)) = values {
            values.insert("x-kubernetes-list-type".into(), json!("atomic"));
        }
    }
}

/// Conditions are a map keyed by `type`, as in every built-in status, so that two writers can
/// each own their own condition under server-side apply.
pub fn conditions_map(schema: &mut Schema) {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("x-kubernetes-list-type".into(), json!("map"));
        obj.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_marking_reaches_nested_lists() {
        let mut schema = Schema::from(
            json!({
                "type": "object",
                "properties": {
                    "matchExpressions": {"type": "array", "items": {"type": "object", "properties": {"values": {"type": "array"}}}},
                    "matchLabels": {"type": "object"}
                }
            })
            .as_object()
            .cloned()
            .unwrap(),
        );
        atomic_selector(&mut schema);
        let v = schema.to_value();
        assert_eq!(v["x-kubernetes-map-type"], "atomic");
        assert_eq!(
            v["properties"]["matchExpressions"]["x-kubernetes-list-type"],
            "atomic"
        );
        assert_eq!(
            v["properties"]["matchExpressions"]["items"]["properties"]["values"]
                ["x-kubernetes-list-type"],
            "atomic"
        );
    }

    #[test]
    fn selector_marking_handles_nullable_any_of() {
        let mut schema = Schema::from(
            json!({"anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]})
                .as_object()
                .cloned()
                .unwrap(),
        );
        atomic_selector(&mut schema);
        let v = schema.to_value();
        assert_eq!(v["anyOf"][0]["x-kubernetes-map-type"], "atomic");
        assert!(v["anyOf"][1].get("x-kubernetes-map-type").is_none());
    }

    #[test]
    fn every_address_rule_has_a_message() {
        for (rule, message) in address_rules() {
            assert!(!rule.is_empty() && !message.is_empty());
        }
    }
}
