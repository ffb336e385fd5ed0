//! Names and tags of the AWS resources berth makes for a Service.
//!
//! Ownership is read from tags, never from names; names only have to be valid, stable and
//! distinct. A name is `berth-<namespace:7>-<name:7>-<hash:10>`, at most 32 characters (the
//! ELBv2 limit). The hash covers every input that AWS cannot change in place (the scheme of a
//! load balancer; the protocol, port and target type of a target group), so a change to one of
//! them yields a new name and the resource is replaced rather than renamed.

use sha2::{Digest, Sha256};

/// The longest name ELBv2 accepts for a load balancer or a target group.
pub const NAME_MAX_LEN: usize = 32;
const PREFIX: &str = "berth";
const PART_LEN: usize = 7;
const HASH_LEN: usize = 10;

/// `berth-<ns>-<name>-<hash>` where the hash covers `inputs`, each one length-prefixed so
/// that no two different input lists hash alike (`ns-a` + `b-c` is not `ns-a-b` + `c`).
pub fn build_name(namespace: &str, name: &str, inputs: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for input in inputs {
        hasher.update((input.len() as u64).to_be_bytes());
        hasher.update(input.as_bytes());
    }
    let digest = hasher.finalize();
    let hash = data_encoding::HEXLOWER.encode(&digest);
    format!(
        "{PREFIX}-{}-{}-{}",
        part(namespace),
        part(name),
        &hash[..HASH_LEN]
    )
}

/// The first characters of a Kubernetes name that ELBv2 allows (alphanumerics and `-`), with
/// no trailing hyphen so that the name never has three hyphens in a row.
fn part(value: &str) -> String {
    let kept: String = value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(PART_LEN)
        .collect();
    kept.trim_end_matches('-').to_string()
}

/// What is wrong with a load-balancer or target-group name ELBv2 would refuse, or `None`.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".to_string());
    }
    if name.len() > NAME_MAX_LEN {
        return Some(format!(
            "must be at most {NAME_MAX_LEN} characters, not {}",
            name.len()
        ));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Some("must contain only alphanumeric characters and hyphens".to_string());
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Some("must not begin or end with a hyphen".to_string());
    }
    if name.starts_with("internal-") {
        return Some("must not begin with \"internal-\"".to_string());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_elbv2_and_keep_a_readable_prefix() {
        let long = "a-very-long-namespace-name-indeed";
        let name = build_name(long, "web-frontend-service", &["c", "uid"]);
        assert!(name.len() <= NAME_MAX_LEN, "{name}");
        assert!(name.starts_with("berth-a-very-web-fro-"), "{name}");
        assert_eq!(name_problem(&name), None);
        let short = build_name("ns", "a", &["c", "uid"]);
        assert!(short.starts_with("berth-ns-a-"), "{short}");
        assert_eq!(name_problem(&short), None);
    }

    #[test]
    fn a_truncated_part_never_ends_in_a_hyphen() {
        let name = build_name("abcdef-xyz", "web", &["u"]);
        assert!(name.starts_with("berth-abcdef-web-"), "{name}");
    }

    #[test]
    fn split_points_do_not_collide() {
        let a = build_name("ns-a", "b-c", &["cluster", "ns-a", "b-c"]);
        let b = build_name("ns-a-b", "c", &["cluster", "ns-a-b", "c"]);
        assert_ne!(a, b);
        let c = build_name("x", "y", &["ab", "c"]);
        let d = build_name("x", "y", &["a", "bc"]);
        assert_ne!(c, d);
    }

    #[test]
    fn elbv2_name_rules() {
        assert!(name_problem("").is_some());
        assert!(name_problem(&"a".repeat(33)).is_some());
        assert!(name_problem("a_b").is_some());
        assert!(name_problem("-ab").is_some());
        assert!(name_problem("ab-").is_some());
        assert!(name_problem("internal-ab").is_some());
        assert_eq!(name_problem(&"a".repeat(32)), None);
    }
}
