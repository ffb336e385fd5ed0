//! IPPools: the custom resources read into allocator pools, and the status written back
//! (counts per family, `Valid` and `Overlapping` conditions). Pure.
//!
//! Pool changes: an address that no longer lies in any pool stays with its Service until the
//! Service changes or `--pool-gone-grace` runs out (see `kept`); the counts here are the
//! addresses in use that each pool contains, so a kept address counts in no pool until one
//! contains it again.

use std::collections::BTreeMap;

use berth_api::names::condition::{self as cond, reason};
use berth_api::{set_condition, to_selector, IPPool, IPPoolStatus};
use berth_core::{overlapping_pools, AddressRange};
use berth_ipam::{PoolSpec, PoolStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};

/// The allocator pools for every valid IPPool, with `excluded` (the cluster's own addresses)
/// cut out of each, and the problem of each invalid one.
pub fn build_pool_specs(
    pools: &[IPPool],
    excluded: &[AddressRange],
) -> (Vec<PoolSpec>, BTreeMap<String, String>) {
    let mut specs = Vec::new();
    let mut invalid = BTreeMap::new();
    for pool in pools {
        let name = pool.metadata.name.clone().unwrap_or_default();
        match to_pool_spec(&name, pool, excluded) {
            Ok(spec) => specs.push(spec),
            Err(problem) => {
                invalid.insert(name, problem);
            }
        }
    }
    (specs, invalid)
}

fn to_pool_spec(name: &str, pool: &IPPool, excluded: &[AddressRange]) -> Result<PoolSpec, String> {
    pool.spec.validate().map_err(|e| e.to_string())?;
    let alloc = pool.spec.service_allocation.clone().unwrap_or_default();
    // The CRD holds at most one selector of each kind; the allocator takes a list.
    let selectors = |s: Option<&LabelSelector>| -> Result<Vec<_>, String> {
        s.map(to_selector)
            .transpose()
            .map(|s| s.into_iter().collect())
            .map_err(|e| e.to_string())
    };
    let spec = PoolSpec {
        name: name.to_string(),
        addresses: pool.spec.addresses.clone(),
        auto_assign: pool.spec.auto_assign,
        avoid_buggy_ips: pool.spec.avoid_buggy_ips,
        priority: alloc.priority,
        namespaces: alloc.namespaces,
        namespace_selectors: selectors(alloc.namespace_selector.as_ref())?,
        service_selectors: selectors(alloc.service_selector.as_ref())?,
        excluded: excluded.to_vec(),
    };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(spec)
}

/// For each pool, the names of the pools it overlaps.
pub fn pool_overlaps(pools: &[IPPool]) -> BTreeMap<String, Vec<String>> {
    let names: Vec<String> = pools
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    overlapping_pools(
        names
            .iter()
            .map(String::as_str)
            .zip(pools.iter().map(|p| p.spec.addresses.as_slice())),
    )
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect()
}

/// The status a pool should have. `counts` is `None` for an invalid pool (it serves nothing);
/// existing conditions keep their transition time unless their status changes.
pub fn build_pool_status(
    pool: &IPPool,
    counts: Option<PoolStatus>,
    problem: Option<&str>,
    overlaps: &[String],
    collision: Option<&str>,
    now: Time,
) -> IPPoolStatus {
    let counts = counts.unwrap_or_default();
    let clamp = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    let mut status = IPPoolStatus::from_counts(
        u32::try_from(counts.assigned_ipv4).unwrap_or(u32::MAX),
        clamp(counts.available_ipv4),
        clamp(counts.assigned_ipv6),
        counts.available_ipv6,
    );
    let old = pool.status.as_ref();
    status.conditions = old.map(|s| s.conditions.clone()).unwrap_or_default();
    let generation = pool.metadata.generation;
    let mk = |type_: &str, ok: bool, reason: &str, message: String| Condition {
        type_: type_.to_string(),
        status: if ok { cond::TRUE } else { cond::FALSE }.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    };
    let valid = match problem {
        None => mk(cond::VALID, true, reason::VALID_SPEC, String::new()),
        Some(p) => mk(cond::VALID, false, reason::INVALID_SPEC, p.to_string()),
    };
    set_condition(&mut status.conditions, valid);
    let overlap = if overlaps.is_empty() {
        mk(cond::OVERLAPPING, false, reason::NO_OVERLAP, String::new())
    } else {
        mk(
            cond::OVERLAPPING,
            true,
            reason::OVERLAPS_POOL,
            format!("addresses overlap IPPool {}", overlaps.join(", ")),
        )
    };
    set_condition(&mut status.conditions, overlap);
    let cluster = match collision {
        None => mk(
            cond::OVERLAPS_CLUSTER,
            false,
            reason::NO_CLUSTER_ADDRESSES,
            String::new(),
        ),
        Some(m) => mk(
            cond::OVERLAPS_CLUSTER,
            true,
            reason::CLUSTER_ADDRESSES,
            m.to_string(),
        ),
    };
    set_condition(&mut status.conditions, cluster);
    status
}

/// The note of the Warning Event a pool gets when `new` says that it collides with the
/// cluster's addresses and `old` did not say so (or named others).
pub fn collision_event(old: Option<&IPPoolStatus>, new: &IPPoolStatus) -> Option<String> {
    let find = |s: &IPPoolStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == cond::OVERLAPS_CLUSTER && c.status == cond::TRUE)
            .map(|c| c.message.clone())
    };
    let now = find(new)?;
    (old.and_then(find).as_ref() != Some(&now)).then_some(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn mk_pool(name: &str, spec: serde_json::Value) -> IPPool {
        serde_json::from_value(json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": name, "generation": 1}, "spec": spec}))
        .unwrap()
    }

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn valid_and_invalid_pools() {
        let pools = vec![
            mk_pool(
                "a",
                json!({"addresses": ["198.18.0.200-198.18.0.250"],
                "serviceAllocation": {"priority": 5, "namespaces": ["x"],
                    "serviceSelector": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}}}),
            ),
            mk_pool("b", json!({"addresses": ["not-an-address"]})),
        ];
        let (specs, invalid) = build_pool_specs(&pools, &[]);
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].priority, Some(5));
        assert_eq!(specs[0].service_selectors.len(), 1);
        assert!(invalid["b"].contains("not-an-address"), "{invalid:?}");
    }

    #[test]
    fn a_cidr_with_host_bits_set_makes_the_pool_invalid() {
        let pools = vec![
            mk_pool("a", json!({"addresses": ["198.18.0.1/24"]})),
            mk_pool("b", json!({"addresses": ["198.18.1.0/24"]})),
        ];
        let (specs, invalid) = build_pool_specs(&pools, &[]);
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].name, "b");
        assert!(
            invalid["a"].contains("did you mean 198.18.0.0/24?"),
            "{invalid:?}"
        );
    }

    #[test]
    fn status_counts_and_conditions_keep_transition_times() {
        let pools = vec![
            mk_pool("a", json!({"addresses": ["198.18.0.0/24"]})),
            mk_pool("b", json!({"addresses": ["198.18.0.128/25"]})),
            mk_pool("c", json!({"addresses": ["fd00::/64"]})),
        ];
        let overlaps = pool_overlaps(&pools);
        assert_eq!(overlaps["a"], vec!["b".to_string()]);
        assert!(!overlaps.contains_key("c"));
        let counts = PoolStatus {
            assigned_ipv4: 2,
            available_ipv4: 254,
            assigned_ipv6: 0,
            available_ipv6: 1 << 64,
        };
        let s = build_pool_status(&pools[0], Some(counts), None, &overlaps["a"], None, at(10));
        assert_eq!((s.assigned_ipv4, s.available_ipv4), (2, 254));
        assert_eq!(s.available_ipv6, "18446744073709551616");
        let overlap = s
            .conditions
            .iter()
            .find(|c| c.type_ == cond::OVERLAPPING)
            .unwrap();
        assert_eq!(overlap.status, cond::TRUE);
        assert_eq!(overlap.message, "addresses overlap IPPool b");
        let mut again = pools[0].clone();
        again.status = Some(s);
        let s2 = build_pool_status(&again, Some(counts), None, &overlaps["a"], None, at(20));
        assert_eq!(s2.conditions[0].last_transition_time, at(10));
        let s3 = build_pool_status(&again, Some(counts), Some("bad"), &[], None, at(30));
        let valid = s3
            .conditions
            .iter()
            .find(|c| c.type_ == cond::VALID)
            .unwrap();
        assert_eq!(
            (valid.status.as_str(), valid.last_transition_time.clone()),
            (cond::FALSE, at(30))
        );
    }
}
