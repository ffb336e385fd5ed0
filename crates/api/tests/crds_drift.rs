//! The committed CRD manifests must be exactly what the Rust types generate.

// Helpers outside #[test] functions unwrap too; a panic is a test failure here.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds/berth.dev.yaml")
}

#[test]
fn committed_crds_match_the_rust_types() {
    let generated = berth_api::crds_yaml().unwrap();
    let committed = std::fs::read_to_string(committed_path()).unwrap_or_default();
    if committed != generated {
        // Leave the fresh output next to the test binaries so the difference can be inspected.
        let fresh = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("berth.dev.yaml");
        std::fs::write(&fresh, &generated).unwrap();
        panic!(
            "crds/berth.dev.yaml is out of date with the Rust types: run `make crds` \
             (fresh output written to {})",
            fresh.display()
        );
    }
}

#[test]
fn crds_yaml_is_deterministic_and_multi_document() {
    let first = berth_api::crds_yaml().unwrap();
    assert_eq!(first, berth_api::crds_yaml().unwrap());
    assert!(first.starts_with("---\n"));
    assert_eq!(
        first.matches("\n---\n").count() + 1,
        berth_api::crds().len()
    );
    let names: Vec<String> = first
        .split("---\n")
        .filter(|d| !d.is_empty())
        .map(|d| {
            let v: serde_yaml::Value = serde_yaml::from_str(d).unwrap();
            v["metadata"]["name"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "ippools.berth.dev",
            "l2advertisements.berth.dev",
            "bgppeers.berth.dev",
            "bgpadvertisements.berth.dev",
            "bfdprofiles.berth.dev",
            "servicel2statuses.berth.dev",
            "bgpsessionstates.berth.dev",
        ]
    );
}

#[test]
fn every_crd_is_named_by_the_vocabulary() {
    // The kinds and the category other crates and the chart name come from `berth_api::names`;
    // the derive attributes cannot use those constants, so they are held equal here.
    use berth_api::names::{
        API_VERSION, CATEGORY, KIND_BFD_PROFILE, KIND_BGP_ADVERTISEMENT, KIND_BGP_PEER,
        KIND_BGP_SESSION_STATE, KIND_IP_POOL, KIND_L2_ADVERTISEMENT, KIND_SERVICE_L2_STATUS,
    };
    let mut kinds: Vec<String> = Vec::new();
    for crd in berth_api::crds() {
        let names = &crd.spec.names;
        kinds.push(names.kind.clone());
        assert_eq!(
            names.categories.as_deref(),
            Some(&[CATEGORY.to_string()][..]),
            "{}: `kubectl get {CATEGORY}` lists it",
            names.kind
        );
        let (group, version) = API_VERSION.split_once('/').unwrap();
        assert_eq!(crd.spec.group, group, "{}", names.kind);
        assert!(
            crd.spec.versions.iter().any(|v| v.name == version),
            "{}",
            names.kind
        );
    }
    kinds.sort();
    let mut vocabulary = vec![
        KIND_BFD_PROFILE,
        KIND_BGP_ADVERTISEMENT,
        KIND_BGP_PEER,
        KIND_BGP_SESSION_STATE,
        KIND_IP_POOL,
        KIND_L2_ADVERTISEMENT,
        KIND_SERVICE_L2_STATUS,
    ];
    vocabulary.sort();
    assert_eq!(kinds, vocabulary);
}
