//! Names: DNS-1123 labels and subdomains (namespaces, object and Node names), label keys and
//! values, and Linux interface names. Each check returns `None` when the name is valid, else the
//! apiserver's reason.

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
    if let Some(problem) = length_problem(name, DNS1123_LABEL_MAX_LEN) {
        return Some(problem);
    }
    is_label_shaped(name).not_then(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
         and must start and end with an alphanumeric character",
    )
}

/// `None` when `name` is a DNS-1123 subdomain, else why not.
pub fn dns1123_subdomain_problem(name: &str) -> Option<String> {
    if let Some(problem) = length_problem(name, DNS1123_SUBDOMAIN_MAX_LEN) {
        return Some(problem);
    }
    name.split('.').all(is_label_shaped).not_then(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' \
         or '.', and must start and end with an alphanumeric character",
    )
}

/// `None` when the kernel would accept `name` as a network interface name, else why not.
pub fn interface_name_problem(name: &str) -> Option<String> {
    if let Some(problem) = length_problem(name, INTERFACE_NAME_MAX_LEN) {
        return Some(problem);
    }
    if name == "." || name == ".." {
        return Some("must not be \".\" or \"..\"".into());
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    ok.not_then("must be printable ASCII without '/', ':' or spaces")
}

/// Emptiness and length come before the characters, so an over-long name gets one reason.
fn length_problem(name: &str, max_len: usize) -> Option<String> {
    if name.is_empty() {
        Some("must not be empty".into())
    } else if name.len() > max_len {
        Some(format!("must be no more than {max_len} characters"))
    } else {
        None
    }
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
    fn node_names_are_subdomains() {
        for ok in ["node-1", "ip-10-0-0-1.ec2.internal", "a"] {
            assert_eq!(dns1123_subdomain_problem(ok), None, "{ok}");
        }
        for bad in ["", "Node", "node_1", "-node", "node-", "a..b"] {
            assert!(dns1123_subdomain_problem(bad).is_some(), "{bad}");
        }
    }
}
