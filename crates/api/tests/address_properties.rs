//! Agreement between the CEL rules and berth's parser on random IPv4 ranges (ordered or
//! inverted), which exercises the octet arithmetic the CEL ordering rule relies on. The
//! parser's own properties are proven in berth-core.

// Helpers outside #[test] functions unwrap too; a panic is a test failure here.
#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;

use berth_api::crds;
use berth_core::parse_address;
use kube::core::cel::{compile_schema, CompiledSchema, Validator};
use proptest::prelude::*;
use serde_json::json;

fn ippool_schema() -> CompiledSchema {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "IPPool")
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
    compile_schema(&schema)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn cel_orders_ipv4_ranges_like_berth(a in any::<u32>(), b in any::<u32>(), near in any::<bool>(), delta in -300i64..300) {
        // Half the cases differ in the last octets only, where ordering mistakes would hide.
        let b = if near { (i64::from(a) + delta).clamp(0, i64::from(u32::MAX)) as u32 } else { b };
        let address = format!("{}-{}", Ipv4Addr::from(a), Ipv4Addr::from(b));
        let object = json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "IPPool",
            "metadata": {"name": "p"},
            "spec": {"addresses": [address]},
        });
        let by_cel = Validator::new().validate_compiled(&ippool_schema(), &object, None).is_ok();
        prop_assert_eq!(by_cel, parse_address(&address).is_ok(), "{}", address);
    }
}
