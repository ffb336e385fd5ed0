//! Field errors in the apiserver's own words (`spec.addresses[0]: Invalid value: "x": reason`),
//! and the name and selector checks shared by both kinds.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path from the object root, e.g. `spec.addresses[2]`.
    pub path: String,
    /// The offending value as the user wrote it, when there is one to show.
    pub value: Option<String>,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => write!(
                f,
                "{}: Invalid value: {value:?}: {}",
                self.path, self.reason
            ),
            None => write!(f, "{}: Invalid value: {}", self.path, self.reason),
        }
    }
}

/// Every problem found in one object, in field order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, FieldError> {
        self.0.iter()
    }

    pub(crate) fn push(
        &mut self,
        path: impl Into<String>,
        value: Option<&str>,
        reason: impl Into<String>,
    ) {
        self.0.push(FieldError {
            path: path.into(),
            value: value.map(str::to_string),
            reason: reason.into(),
        });
    }

    pub(crate) fn into_result(self) -> Result<(), FieldErrors> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Same layout as the apiserver's aggregated errors: one problem, or a bracketed list.
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                f.write_str("[")?;
                for (i, e) in many.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl std::error::Error for FieldErrors {}

impl<'a> IntoIterator for &'a FieldErrors {
    type Item = &'a FieldError;
    type IntoIter = std::slice::Iter<'a, FieldError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Pattern of a DNS-1123 label (namespace names); the same text goes into the CRD schema.
pub const DNS1123_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
pub const DNS1123_LABEL_MAX_LEN: usize = 63;
/// Pattern of a DNS-1123 subdomain (object names such as IPPool names).
pub const DNS1123_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
pub const DNS1123_SUBDOMAIN_MAX_LEN: usize = 253;
/// Linux interface names: IFNAMSIZ (16) minus the terminating NUL.
pub const INTERFACE_NAME_MAX_LEN: usize = 15;
/// Printable ASCII without `/`, `:` and space, which the kernel refuses in interface names.
pub const INTERFACE_NAME_PATTERN: &str = "^[!-.0-9;-~]+$";

/// `None` when `name` is a DNS-1123 label, else why not.
pub fn dns1123_label_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    if name.len() > DNS1123_LABEL_MAX_LEN {
        return Some(format!(
            "must be no more than {DNS1123_LABEL_MAX_LEN} characters"
        ));
    }
    is_label_shaped(name).not_then(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
         and must start and end with an alphanumeric character",
    )
}

/// `None` when `name` is a DNS-1123 subdomain, else why not.
pub fn dns1123_subdomain_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    if name.len() > DNS1123_SUBDOMAIN_MAX_LEN {
        return Some(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX_LEN} characters"
        ));
    }
    name.split('.').all(is_label_shaped).not_then(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' \
         or '.', and must start and end with an alphanumeric character",
    )
}

/// `None` when the kernel would accept `name` as a network interface name, else why not.
pub fn interface_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    if name.len() > INTERFACE_NAME_MAX_LEN {
        return Some(format!(
            "must be no more than {INTERFACE_NAME_MAX_LEN} characters"
        ));
    }
    if name == "." || name == ".." {
        return Some("must not be \".\" or \"..\"".into());
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    ok.not_then("must be printable ASCII without '/', ':' or spaces")
}

fn is_label_shaped(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

trait NotThen {
    fn not_then(self, reason: &str) -> Option<String>;
}

impl NotThen for bool {
    fn not_then(self, reason: &str) -> Option<String> {
        (!self).then(|| reason.to_string())
    }
}

/// Checks a label selector as the apiserver does for built-in kinds: operators, values per
/// operator, and label key/value syntax. The controller matches with the selector afterwards,
/// so a selector that passes here cannot fail at matching time.
pub fn validate_label_selector(selector: &LabelSelector, path: &str, errors: &mut FieldErrors) {
    if let Some(labels) = &selector.match_labels {
        for (key, value) in labels {
            let at = format!("{path}.matchLabels");
            if let Some(problem) = label_key_problem(key) {
                errors.push(&at, Some(key), problem);
            }
            if let Some(problem) = label_value_problem(value) {
                errors.push(format!("{at}[{key}]"), Some(value), problem);
            }
        }
    }
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        validate_requirement(req, &format!("{path}.matchExpressions[{i}]"), errors);
    }
}

fn validate_requirement(req: &LabelSelectorRequirement, path: &str, errors: &mut FieldErrors) {
    if let Some(problem) = label_key_problem(&req.key) {
        errors.push(format!("{path}.key"), Some(&req.key), problem);
    }
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" | "NotIn" => {
            if values.is_empty() {
                errors.push(
                    format!("{path}.values"),
                    None,
                    "must be specified when `operator` is 'In' or 'NotIn'",
                );
            }
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                errors.push(
                    format!("{path}.values"),
                    None,
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                );
            }
        }
        other => errors.push(
            format!("{path}.operator"),
            Some(other),
            "not a valid selector operator (In, NotIn, Exists, DoesNotExist)",
        ),
    }
    for (i, value) in values.iter().enumerate() {
        if let Some(problem) = label_value_problem(value) {
            errors.push(format!("{path}.values[{i}]"), Some(value), problem);
        }
    }
}

/// `None` when `key` is a valid label key (`[prefix/]name`), else why not.
pub fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if let Some(problem) = dns1123_subdomain_problem(prefix) {
            return Some(format!("prefix part {problem}"));
        }
    }
    if name.is_empty() {
        return Some("name part must not be empty".into());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    qualified_name_shaped(name).not_then(
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
         end with an alphanumeric character",
    )
}

/// `None` when `value` is a valid label value (possibly empty), else why not.
pub fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    if value.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    qualified_name_shaped(value).not_then(
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' \
         or '.', and must start and end with an alphanumeric character",
    )
}

fn qualified_name_shaped(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn check(selector: &LabelSelector) -> Vec<String> {
        let mut errors = FieldErrors::default();
        validate_label_selector(selector, "spec.sel", &mut errors);
        errors.iter().map(|e| e.path.clone()).collect()
    }

    #[test]
    fn labels() {
        for ok in ["a", "default", "kube-system", "a1", "1a", &"a".repeat(63)] {
            assert_eq!(dns1123_label_problem(ok), None, "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(dns1123_label_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        for ok in ["default", "pool.example.com", "a-b.c"] {
            assert_eq!(dns1123_subdomain_problem(ok), None, "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "Pool", "a_b", &"a".repeat(254)] {
            assert!(dns1123_subdomain_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn interface_names() {
        for ok in [
            "eth0",
            "enp0s31f6",
            "br-lan",
            "bond0.100",
            "wg0",
            "lo",
            "a",
            "veth_1234567890",
        ] {
            assert_eq!(interface_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "eth 0",
            "eth/0",
            "eth0:1",
            "ethé",
            "veth_12345678901",
            "\teth",
        ] {
            assert!(interface_name_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn interface_pattern_matches_the_rust_rule_on_every_ascii_byte() {
        // The schema pattern is a character class; check it against the Rust predicate byte by byte.
        for b in 0u8..=127 {
            let s = (b as char).to_string();
            let by_rust = interface_name_problem(&s).is_none() || s == ".";
            let in_class =
                (b'!'..=b'.').contains(&b) || b.is_ascii_digit() || (b';'..=b'~').contains(&b);
            assert_eq!(by_rust, in_class, "byte {b:#x}");
        }
        assert_eq!(INTERFACE_NAME_PATTERN, "^[!-.0-9;-~]+$");
    }

    #[test]
    fn label_keys_and_values() {
        for ok in ["app", "app.kubernetes.io/name", "berth.dev/pool", "A_b-c.d"] {
            assert_eq!(label_key_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "/app",
            "Berth.dev/app",
            "app/",
            "-app",
            "a/b/c",
            &"a".repeat(64),
        ] {
            assert!(label_key_problem(bad).is_some(), "{bad}");
        }
        for ok in ["", "echo", "v1.2_3-x"] {
            assert_eq!(label_value_problem(ok), None, "{ok}");
        }
        for bad in ["-x", "x-", "a b", &"a".repeat(64)] {
            assert!(label_value_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn selectors() {
        let good = LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "echo".into())])),
            match_expressions: Some(vec![
                req("tier", "In", &["web"]),
                req("gpu", "DoesNotExist", &[]),
            ]),
        };
        assert!(check(&good).is_empty());
        assert!(check(&LabelSelector::default()).is_empty());

        let bad = LabelSelector {
            match_labels: Some(BTreeMap::from([("bad key".into(), "-v".into())])),
            match_expressions: Some(vec![
                req("tier", "In", &[]),
                req("gpu", "Exists", &["yes"]),
                req("zone", "Near", &["a"]),
                req("ok", "NotIn", &["bad value"]),
            ]),
        };
        assert_eq!(
            check(&bad),
            [
                "spec.sel.matchLabels",
                "spec.sel.matchLabels[bad key]",
                "spec.sel.matchExpressions[0].values",
                "spec.sel.matchExpressions[1].values",
                "spec.sel.matchExpressions[2].operator",
                "spec.sel.matchExpressions[3].values[0]",
            ]
        );
    }

    #[test]
    fn errors_render_like_the_apiserver() {
        let mut errors = FieldErrors::default();
        errors.push("spec.addresses[0]", Some("x"), "bad");
        assert_eq!(
            errors.to_string(),
            "spec.addresses[0]: Invalid value: \"x\": bad"
        );
        errors.push(
            "spec.serviceAllocation.priority",
            None,
            "must be at most 1000",
        );
        assert_eq!(
            errors.to_string(),
            "[spec.addresses[0]: Invalid value: \"x\": bad, spec.serviceAllocation.priority: Invalid value: must be at most 1000]"
        );
        assert_eq!(errors.len(), 2);
        assert!(errors.clone().into_result().is_err());
        assert!(FieldErrors::default().into_result().is_ok());
    }
}
