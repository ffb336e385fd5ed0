//! Every manifest under examples/ that is one of berth's kinds parses into the Rust types,
//! validates (in Rust and against the CRD's CEL rules), and serializes back to the same JSON,
//! up to defaults the example leaves out.

// Helpers outside #[test] functions unwrap too; a panic is a test failure here.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use berth_api::names::{annotation, class, API_VERSION, KIND_IP_POOL, KIND_L2_ADVERTISEMENT};
use berth_api::{crds, ip_pool, IPPool, L2Advertisement};
use k8s_openapi::api::core::v1::Service;
use kube::core::cel::Validator;
use serde::Deserialize;
use serde_json::Value;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// (file name, document) for every YAML document under examples/.
fn documents() -> Vec<(String, Value)> {
    documents_in(examples_dir())
}

/// (file name, document) for every YAML document in `dir` (not its subdirectories).
fn documents_in(dir: PathBuf) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc).unwrap();
            if !value.is_null() {
                docs.push((name.clone(), value));
            }
        }
    }
    docs
}

/// Every field of `written` appears in `round_tripped` with the same value; fields the example
/// omitted may appear only as the listed defaults.
fn assert_round_trip(
    file: &str,
    written: &Value,
    round_tripped: &Value,
    defaults: &[(&str, Value)],
) {
    let mut expected = written.clone();
    for (field, default) in defaults {
        let spec = expected["spec"].as_object_mut().unwrap();
        spec.entry(field.to_string()).or_insert(default.clone());
    }
    assert_eq!(
        &expected, round_tripped,
        "{file}: round trip changed the object"
    );
}

fn cel_check(kind: &str, file: &str, object: &Value) {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    let schema = serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap();
    if let Err(errors) = Validator::new().validate(&schema, object, None) {
        panic!("{file}: CEL rejects the example: {errors:?}");
    }
}

#[test]
fn examples_of_our_kinds_round_trip_and_validate() {
    let mut seen = (0, 0);
    for (file, doc) in documents() {
        if doc["apiVersion"] != API_VERSION {
            continue;
        }
        match doc["kind"].as_str().unwrap() {
            KIND_IP_POOL => {
                let pool: IPPool = serde_json::from_value(doc.clone()).unwrap();
                if let Err(errors) = pool.spec.validate() {
                    panic!("{file}: {errors}");
                }
                let back = serde_json::to_value(&pool).unwrap();
                assert_round_trip(
                    &file,
                    &doc,
                    &back,
                    &[
                        ("autoAssign", Value::Bool(true)),
                        ("avoidBuggyIPs", Value::Bool(false)),
                    ],
                );
                cel_check(KIND_IP_POOL, &file, &doc);
                seen.0 += 1;
            }
            KIND_L2_ADVERTISEMENT => {
                let adv: L2Advertisement = serde_json::from_value(doc.clone()).unwrap();
                if let Err(errors) = adv.spec.validate() {
                    panic!("{file}: {errors}");
                }
                let back = serde_json::to_value(&adv).unwrap();
                assert_round_trip(&file, &doc, &back, &[]);
                cel_check(KIND_L2_ADVERTISEMENT, &file, &doc);
                seen.1 += 1;
            }
            other => panic!("{file}: unknown berth kind {other}"),
        }
    }
    assert!(
        seen.0 >= 2,
        "expected the default and the IPv6 pool examples, saw {}",
        seen.0
    );
    assert!(seen.1 >= 1, "expected an L2Advertisement example");
}

/// examples/bgp (applied by `berth lab up --bgp` only): every object parses, validates in Rust
/// and against its CRD's CEL rules; the pool lies outside the lab LAN (its addresses are routed
/// through the lab's router) and is never assigned unasked; the advertisement names it.
#[test]
fn bgp_examples_validate_and_their_pool_lies_outside_the_lan() {
    use berth_api::names::{KIND_BFD_PROFILE, KIND_BGP_ADVERTISEMENT, KIND_BGP_PEER};
    use berth_api::{BFDProfile, BGPAdvertisement, BGPPeer};
    let mut kinds = Vec::new();
    let mut pools = Vec::new();
    let mut advertised = Vec::new();
    for (file, doc) in documents_in(examples_dir().join("bgp")) {
        if doc["apiVersion"] != API_VERSION {
            continue;
        }
        let kind = doc["kind"].as_str().unwrap().to_string();
        let verdict = match kind.as_str() {
            KIND_IP_POOL => {
                let pool: IPPool = serde_json::from_value(doc.clone()).unwrap();
                pools.push(pool.clone());
                pool.spec.validate()
            }
            KIND_BGP_PEER => serde_json::from_value::<BGPPeer>(doc.clone())
                .unwrap()
                .spec
                .validate(),
            KIND_BGP_ADVERTISEMENT => {
                let adv: BGPAdvertisement = serde_json::from_value(doc.clone()).unwrap();
                advertised.extend(adv.spec.ip_pools.clone());
                adv.spec.validate()
            }
            KIND_BFD_PROFILE => serde_json::from_value::<BFDProfile>(doc.clone())
                .unwrap()
                .spec
                .validate(),
            other => panic!("{file}: unexpected kind {other}"),
        };
        if let Err(errors) = verdict {
            panic!("{file}: {errors}");
        }
        cel_check(&kind, &file, &doc);
        kinds.push(kind);
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "BFDProfile",
            "BGPAdvertisement",
            "BGPPeer",
            "BGPPeer",
            "IPPool"
        ]
    );
    let [pool] = pools.as_slice() else {
        panic!("one BGP pool expected: {pools:?}");
    };
    assert!(!pool.spec.auto_assign, "the BGP pool assigns itself");
    assert_eq!(advertised, [pool.metadata.name.clone().unwrap()]);
    let lan: ipnet::IpNet = "198.18.0.0/24".parse().unwrap();
    let lan6: ipnet::IpNet = "fd00:198:18::/64".parse().unwrap();
    for range in pool.spec.ranges().unwrap() {
        let text = range.to_string();
        for end in text.split('-') {
            let ip: std::net::IpAddr = end.parse().unwrap();
            assert!(
                !lan.contains(&ip) && !lan6.contains(&ip),
                "{text} lies on the lab LAN"
            );
        }
    }
}

#[test]
fn default_pool_is_the_lab_pool() {
    let (_, doc) = documents()
        .into_iter()
        .find(|(file, doc)| file == "ippool.yaml" && doc["kind"] == KIND_IP_POOL)
        .unwrap();
    let pool: IPPool = serde_json::from_value(doc).unwrap();
    assert_eq!(pool.metadata.name.as_deref(), Some("default"));
    let ranges = pool.spec.ranges().unwrap();
    assert_eq!(ranges.len(), 2);
    assert_eq!(ranges[0].to_string(), "198.18.0.200-198.18.0.250");
    assert_eq!(ranges[0].len(), 51);
    // The IPv6 LAN's own numbers: fd00:198:18::200 to ::250 (hex), above the nodes and client.
    assert_eq!(ranges[1].to_string(), "fd00:198:18::200-fd00:198:18::250");
    assert_eq!(ranges[1].len(), 0x51);
}

#[test]
fn no_example_pool_holds_a_lab_node_or_client_address() {
    // The lab's LAN hosts (docs/lab.md): control plane .2, nodes .11 up to .26 (16 nodes at
    // most), the client .100; in IPv6 the same numbers as hex digits.
    let mut hosts: Vec<std::net::IpAddr> = Vec::new();
    for n in std::iter::once(2u16)
        .chain(11..=26)
        .chain(std::iter::once(100))
    {
        hosts.push(format!("198.18.0.{n}").parse().unwrap());
        hosts.push(format!("fd00:198:18::{n}").parse().unwrap());
    }
    let pools: Vec<IPPool> = documents()
        .into_iter()
        .filter(|(_, doc)| doc["kind"] == KIND_IP_POOL)
        .map(|(_, doc)| serde_json::from_value(doc).unwrap())
        .collect();
    assert!(pools.len() >= 2);
    for pool in pools {
        for range in pool.spec.ranges().unwrap() {
            for host in &hosts {
                assert!(!range.contains(*host), "{range} holds {host}");
            }
        }
    }
}

#[test]
fn dual_stack_service_example_asks_for_both_families_where_the_cluster_has_them() {
    let (_, doc) = documents()
        .into_iter()
        .find(|(file, _)| file == "service-dual-stack.yaml")
        .unwrap();
    let service: Service = serde_json::from_value(doc).unwrap();
    let spec = service.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(spec.load_balancer_class.as_deref(), Some(class::L2));
    assert_eq!(spec.ip_family_policy.as_deref(), Some("PreferDualStack"));
    // No ipFamilies: the cluster's own order, so the example works on every lab family.
    assert_eq!(spec.ip_families, None);
}

#[test]
fn l2_service_example_is_served_by_berth() {
    let (_, doc) = documents()
        .into_iter()
        .find(|(file, _)| file == "service-l2.yaml")
        .unwrap();
    let service: Service = serde_json::from_value(doc).unwrap();
    let spec = service.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(spec.load_balancer_class.as_deref(), Some(class::L2));
    assert_eq!(
        spec.selector.unwrap().get("app").map(String::as_str),
        Some("echo")
    );
    let annotations = service.metadata.annotations.unwrap_or_default();
    let pool = ip_pool(&annotations).unwrap();
    assert_eq!((pool.key, pool.value), (annotation::IP_POOL, "default"));
}
