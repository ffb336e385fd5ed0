//! The CEL rules in the generated CRDs, evaluated client-side with the Kubernetes CEL libraries,
//! must agree with berth's own validation: an address the apiserver accepts is one the
//! controller accepts, and the other way round, except where CEL cannot look (IPv6 order).

// Helpers outside #[test] functions unwrap too; a panic is a test failure here.
#![allow(clippy::unwrap_used)]

use berth_api::crds;
use berth_core::{parse_address, AddressError, AddressProblem};
use kube::core::cel::{check_rule_scope, compile_schema, ScopeContext, Validator};
use serde_json::{json, Value};

fn schema_of(kind: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

fn pool(addresses: &[&str]) -> Value {
    json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": "p"},
        "spec": {"addresses": addresses},
    })
}

/// The messages of the rules that reject `address`, empty when CEL accepts it.
fn cel_messages(address: &str) -> Vec<String> {
    match Validator::new().validate(&schema_of("IPPool"), &pool(&[address]), None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

const ACCEPTED: &[&str] = &[
    "198.18.0.0/24",
    "198.18.0.7/32",
    "0.0.0.0/0",
    "198.18.0.200-198.18.0.250",
    "198.18.0.200 - 198.18.0.250",
    "10.0.0.1-10.0.0.1",
    "10.0.0.255-10.0.1.0",
    "9.255.255.255-10.0.0.0",
    "fd00::/120",
    "2001:db8::/64",
    "::/0",
    "fd00::10-fd00::1:0",
];

const REJECTED: &[&str] = &[
    "",
    "nonsense",
    "198.18.0.1",
    "198.18.0.256/24",
    "198.18.0.1/24",
    "198.18.0.0/33",
    "fd00::1/64",
    "fd00::/129",
    "198.18.0.250-198.18.0.200",
    "10.0.1.0-10.0.0.255",
    "10.0.0.0-9.255.255.255",
    "10.0.0.1-fd00::1",
    "fd00::1-10.0.0.1",
    "10.0.0.1-10.0.0.2-10.0.0.3",
    "-10.0.0.1",
    "::ffff:10.0.0.1-::ffff:10.0.0.9",
];

#[test]
fn rules_compile() {
    for kind in ["IPPool", "L2Advertisement"] {
        let compiled = compile_schema(&schema_of(kind));
        assert!(
            !compiled.has_errors(),
            "{kind}: {:?}",
            compiled.compilation_errors()
        );
    }
}

#[test]
fn rules_use_only_crd_variables() {
    for (rule, _) in berth_api::address_rules() {
        let warnings = check_rule_scope(&rule, ScopeContext::CrdValidation);
        assert!(warnings.is_empty(), "{rule}: {warnings:?}");
    }
    // An admission-policy variable is flagged, so the check above has teeth.
    assert!(!check_rule_scope("object.spec == self", ScopeContext::CrdValidation).is_empty());
}

#[test]
fn cel_accepts_what_berth_accepts() {
    for address in ACCEPTED {
        assert!(parse_address(address).is_ok(), "berth rejects {address:?}");
        assert_eq!(
            cel_messages(address),
            Vec::<String>::new(),
            "CEL rejects {address:?}"
        );
    }
}

#[test]
fn cel_rejects_what_berth_rejects() {
    for address in REJECTED {
        assert!(parse_address(address).is_err(), "berth accepts {address:?}");
        if address.is_empty() {
            // minLength, not CEL, turns the empty string away on an apiserver.
            continue;
        }
        assert!(!cel_messages(address).is_empty(), "CEL accepts {address:?}");
    }
}

#[test]
fn cel_messages_match_the_problem() {
    for (address, fragment) in [
        ("nonsense", "must be a CIDR"),
        ("198.18.0.1/24", "host bits"),
        ("10.0.0.1-fd00::1", "same IP family"),
        ("198.18.0.250-198.18.0.200", "greater than the last"),
    ] {
        let messages = cel_messages(address);
        assert_eq!(messages.len(), 1, "{address}: {messages:?}");
        assert!(messages[0].contains(fragment), "{address}: {messages:?}");
    }
}

#[test]
fn leading_zero_octets_are_rejected_by_berth() {
    // The apiserver's CEL library parses with Go's netip, which refuses leading zeros; the
    // client-side evaluator used here is looser, so this case is asserted on berth's side only.
    for address in ["010.0.0.0/8", "10.0.0.01-10.0.0.9"] {
        assert!(parse_address(address).is_err(), "berth accepts {address:?}");
    }
}

#[test]
fn inverted_ipv6_ranges_are_left_to_berth() {
    // CEL's IP library cannot order IPv6 addresses, so only the controller catches this one.
    let address = "fd00::2-fd00::1";
    assert!(cel_messages(address).is_empty());
    match parse_address(address) {
        Err(AddressError { problem, .. }) => assert_eq!(problem, AddressProblem::Inverted),
        other => panic!("{other:?}"),
    }
}

#[test]
fn interface_names_dot_and_dot_dot_are_rejected() {
    let schema = schema_of("L2Advertisement");
    let adv = |name: &str| {
        json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "L2Advertisement",
            "metadata": {"name": "a"},
            "spec": {"interfaces": [name]},
        })
    };
    for name in [".", ".."] {
        assert!(
            Validator::new()
                .validate(&schema, &adv(name), None)
                .is_err(),
            "{name}"
        );
    }
    for name in ["eth0", "bond0.100", "..x"] {
        assert!(
            Validator::new().validate(&schema, &adv(name), None).is_ok(),
            "{name}"
        );
    }
}
