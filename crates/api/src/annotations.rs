//! Reading a Service's requests from its annotations. berth's own keys win over MetalLB's
//! current ones, which win over MetalLB's legacy ones, so a Service migrated from MetalLB keeps
//! working and a berth annotation added later takes over.

use std::collections::BTreeMap;
use std::net::IpAddr;

use berth_core::IpFamily;

use crate::names::annotation;
use crate::Error;

/// An annotation value, with the key it was read from (for messages that name what to fix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnnotationValue<'a> {
    pub key: &'static str,
    pub value: &'a str,
}

/// Where requested LoadBalancer IPs came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestSource {
    Annotation(&'static str),
    /// The deprecated `spec.loadBalancerIP` field.
    SpecLoadBalancerIP,
}

/// LoadBalancer IPs a Service asks for: one or two, at most one per family, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedIps {
    pub source: RequestSource,
    pub ips: Vec<IpAddr>,
}

/// The first key of `keys` present with a non-blank value. A blank value counts as absent, so
/// an emptied berth annotation does not hide a MetalLB one.
fn first_present<'a>(
    annotations: &'a BTreeMap<String, String>,
    keys: [&'static str; 3],
) -> Option<AnnotationValue<'a>> {
    keys.into_iter().find_map(|key| {
        annotations
            .get(key)
            .map(|value| value.trim())
            .filter(|value| !value.is_empty())
            .map(|value| AnnotationValue { key, value })
    })
}

/// The pool a Service names, from `berth.dev/ip-pool`, `metallb.io/address-pool` or
/// `metallb.universe.tf/address-pool`.
pub fn ip_pool(annotations: &BTreeMap<String, String>) -> Option<AnnotationValue<'_>> {
    first_present(annotations, annotation::IP_POOL_PRECEDENCE)
}

/// The sharing key, from `berth.dev/sharing-key`, `metallb.io/allow-shared-ip` or
/// `metallb.universe.tf/allow-shared-ip`.
pub fn sharing_key(annotations: &BTreeMap<String, String>) -> Option<AnnotationValue<'_>> {
    first_present(annotations, annotation::SHARING_KEY_PRECEDENCE)
}

/// The namespaces `berth.dev/sharing-cross-namespace` names (comma separated, blanks dropped;
/// `*` for any), in order; empty without the annotation.
pub fn sharing_namespaces(annotations: &BTreeMap<String, String>) -> Vec<String> {
    annotations
        .get(annotation::SHARING_CROSS_NAMESPACE)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Requested IPs from `berth.dev/load-balancer-ips`, `metallb.io/loadBalancerIPs` or
/// `metallb.universe.tf/loadBalancerIPs` (comma separated). Only the winning annotation is
/// parsed: a broken lower-precedence one that is overridden does not matter.
pub fn requested_ips(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<RequestedIps>, Error> {
    let Some(found) = first_present(annotations, annotation::LOAD_BALANCER_IPS_PRECEDENCE) else {
        return Ok(None);
    };
    let invalid = |reason: String| Error::InvalidAnnotation {
        key: found.key,
        value: found.value.to_string(),
        reason,
    };
    let ips = parse_ip_list(found.value).map_err(invalid)?;
    Ok(Some(RequestedIps {
        source: RequestSource::Annotation(found.key),
        ips,
    }))
}

/// Requested IPs from the annotations, else from `spec.loadBalancerIP` (deprecated upstream, so
/// the annotations take precedence).
pub fn requested_ips_with_spec(
    annotations: &BTreeMap<String, String>,
    load_balancer_ip: Option<&str>,
) -> Result<Option<RequestedIps>, Error> {
    if let Some(requested) = requested_ips(annotations)? {
        return Ok(Some(requested));
    }
    let Some(value) = load_balancer_ip.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let ip = parse_one(value).map_err(|reason| Error::InvalidLoadBalancerIp {
        value: value.to_string(),
        reason,
    })?;
    Ok(Some(RequestedIps {
        source: RequestSource::SpecLoadBalancerIP,
        ips: vec![ip],
    }))
}

fn parse_ip_list(value: &str) -> Result<Vec<IpAddr>, String> {
    let mut ips: Vec<IpAddr> = Vec::new();
    for item in value.split(',') {
        let ip = parse_one(item.trim())?;
        if let Some(other) = ips.iter().find(|o| IpFamily::of(**o) == IpFamily::of(ip)) {
            return Err(if *other == ip {
                format!("{ip} is listed twice")
            } else {
                format!(
                    "{other} and {ip} are both {}: at most one address per family",
                    IpFamily::of(ip)
                )
            });
        }
        ips.push(ip);
    }
    Ok(ips)
}

fn parse_one(item: &str) -> Result<IpAddr, String> {
    if item.is_empty() {
        return Err("empty address in list".into());
    }
    let ip: IpAddr = item
        .parse()
        .map_err(|_| format!("{item:?} is not an IP address"))?;
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Err(format!(
            "{item:?} is an IPv4-mapped IPv6 address; write the IPv4 address"
        )),
        _ => Ok(ip),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::annotation::*;

    fn mk_annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn pool_precedence() {
        let all = [
            (METALLB_LEGACY_ADDRESS_POOL, "legacy"),
            (METALLB_ADDRESS_POOL, "metallb"),
            (IP_POOL, "berth"),
        ];
        assert_eq!(
            ip_pool(&mk_annotations(&all)),
            Some(AnnotationValue {
                key: IP_POOL,
                value: "berth"
            })
        );
        assert_eq!(
            ip_pool(&mk_annotations(&all[..2])),
            Some(AnnotationValue {
                key: METALLB_ADDRESS_POOL,
                value: "metallb"
            })
        );
        assert_eq!(
            ip_pool(&mk_annotations(&all[..1])),
            Some(AnnotationValue {
                key: METALLB_LEGACY_ADDRESS_POOL,
                value: "legacy"
            })
        );
        assert_eq!(ip_pool(&mk_annotations(&[])), None);
        assert_eq!(ip_pool(&mk_annotations(&[("berth.dev/other", "x")])), None);
    }

    #[test]
    fn blank_values_fall_through() {
        let a = mk_annotations(&[(IP_POOL, "  "), (METALLB_ADDRESS_POOL, " blue ")]);
        assert_eq!(
            ip_pool(&a),
            Some(AnnotationValue {
                key: METALLB_ADDRESS_POOL,
                value: "blue"
            })
        );
        assert_eq!(ip_pool(&mk_annotations(&[(IP_POOL, "")])), None);
    }

    #[test]
    fn sharing_namespaces_are_a_comma_separated_list() {
        assert!(sharing_namespaces(&mk_annotations(&[])).is_empty());
        assert_eq!(
            sharing_namespaces(&mk_annotations(&[(
                SHARING_CROSS_NAMESPACE,
                " tenant-a, ,tenant-b ,"
            )])),
            ["tenant-a", "tenant-b"]
        );
        assert_eq!(
            sharing_namespaces(&mk_annotations(&[(SHARING_CROSS_NAMESPACE, "*")])),
            ["*"]
        );
    }

    #[test]
    fn sharing_key_precedence() {
        let all = [
            (METALLB_LEGACY_ALLOW_SHARED_IP, "legacy"),
            (METALLB_ALLOW_SHARED_IP, "metallb"),
            (SHARING_KEY, "berth"),
        ];
        assert_eq!(
            sharing_key(&mk_annotations(&all)).map(|v| v.value),
            Some("berth")
        );
        assert_eq!(
            sharing_key(&mk_annotations(&all[..2])).map(|v| v.value),
            Some("metallb")
        );
        assert_eq!(
            sharing_key(&mk_annotations(&all[..1])).map(|v| v.value),
            Some("legacy")
        );
        assert_eq!(sharing_key(&mk_annotations(&[(IP_POOL, "x")])), None);
    }

    #[test]
    fn requested_ips_precedence() {
        let all = [
            (METALLB_LEGACY_LOAD_BALANCER_IPS, "198.18.0.203"),
            (METALLB_LOAD_BALANCER_IPS, "198.18.0.202"),
            (LOAD_BALANCER_IPS, "198.18.0.201"),
        ];
        let want = |key, addr| {
            Some(RequestedIps {
                source: RequestSource::Annotation(key),
                ips: vec![ip(addr)],
            })
        };
        assert_eq!(
            requested_ips(&mk_annotations(&all)).unwrap(),
            want(LOAD_BALANCER_IPS, "198.18.0.201")
        );
        assert_eq!(
            requested_ips(&mk_annotations(&all[..2])).unwrap(),
            want(METALLB_LOAD_BALANCER_IPS, "198.18.0.202")
        );
        assert_eq!(
            requested_ips(&mk_annotations(&all[..1])).unwrap(),
            want(METALLB_LEGACY_LOAD_BALANCER_IPS, "198.18.0.203")
        );
        assert_eq!(requested_ips(&mk_annotations(&[])).unwrap(), None);
    }

    #[test]
    fn overridden_broken_annotation_is_ignored() {
        let a = mk_annotations(&[
            (LOAD_BALANCER_IPS, "198.18.0.201"),
            (METALLB_LOAD_BALANCER_IPS, "garbage"),
        ]);
        assert_eq!(
            requested_ips(&a).unwrap().unwrap().ips,
            [ip("198.18.0.201")]
        );
    }

    #[test]
    fn dual_stack_request() {
        let a = mk_annotations(&[(LOAD_BALANCER_IPS, "fd00::10, 198.18.0.201")]);
        assert_eq!(
            requested_ips(&a).unwrap().unwrap().ips,
            [ip("fd00::10"), ip("198.18.0.201")]
        );
    }

    #[test]
    fn bad_requests_name_the_annotation() {
        for (value, reason) in [
            (
                "198.18.0.1,198.18.0.2",
                "198.18.0.1 and 198.18.0.2 are both IPv4: at most one address per family",
            ),
            ("fd00::1,fd00::1", "fd00::1 is listed twice"),
            ("198.18.0.1,", "empty address in list"),
            ("198.18.0.300", "\"198.18.0.300\" is not an IP address"),
            ("198.18.0.0/24", "\"198.18.0.0/24\" is not an IP address"),
            (
                "::ffff:198.18.0.1",
                "\"::ffff:198.18.0.1\" is an IPv4-mapped IPv6 address; write the IPv4 address",
            ),
        ] {
            let err =
                requested_ips(&mk_annotations(&[(METALLB_LOAD_BALANCER_IPS, value)])).unwrap_err();
            match &err {
                Error::InvalidAnnotation {
                    key,
                    value: v,
                    reason: r,
                } => {
                    assert_eq!(*key, METALLB_LOAD_BALANCER_IPS);
                    assert_eq!(v, value);
                    assert_eq!(r, reason);
                }
                other => panic!("{other:?}"),
            }
            assert!(err
                .to_string()
                .starts_with("annotation metallb.io/loadBalancerIPs: invalid value"));
        }
    }

    #[test]
    fn spec_load_balancer_ip_comes_last() {
        let spec_only =
            requested_ips_with_spec(&mk_annotations(&[]), Some("198.18.0.210")).unwrap();
        assert_eq!(
            spec_only,
            Some(RequestedIps {
                source: RequestSource::SpecLoadBalancerIP,
                ips: vec![ip("198.18.0.210")]
            })
        );
        let both = requested_ips_with_spec(
            &mk_annotations(&[(METALLB_LEGACY_LOAD_BALANCER_IPS, "198.18.0.220")]),
            Some("198.18.0.210"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            both.source,
            RequestSource::Annotation(METALLB_LEGACY_LOAD_BALANCER_IPS)
        );
        assert_eq!(
            requested_ips_with_spec(&mk_annotations(&[]), Some("")).unwrap(),
            None
        );
        assert_eq!(
            requested_ips_with_spec(&mk_annotations(&[]), None).unwrap(),
            None
        );
        let err = requested_ips_with_spec(&mk_annotations(&[]), Some("nope")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.loadBalancerIP: invalid value \"nope\": \"nope\" is not an IP address"
        );
    }
}
