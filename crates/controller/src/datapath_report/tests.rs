//! The report's decisions as rows: Service and slices in, verdict and write out.

use super::*;
use berth_api::ServiceBounds;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn mk_svc(spec: serde_json::Value, conditions: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "tenant", "name": "web", "generation": 3},
        "spec": spec,
        "status": {"conditions": conditions},
    }))
    .unwrap()
}

fn ports(n: usize) -> serde_json::Value {
    json!((0..n)
        .map(|i| json!({"name": format!("p{i}"), "port": 1000 + i, "protocol": "TCP"}))
        .collect::<Vec<_>>())
}

fn mk_slice(service: &str, ports: &[(&str, &str)], endpoints: usize) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"namespace": "tenant", "name": format!("{service}-x"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": ports.iter().map(|(n, p)| json!({"name": n, "protocol": p, "port": 80})).collect::<Vec<_>>(),
        "endpoints": (0..endpoints).map(|i| json!({"addresses": [format!("10.244.0.{}", i + 1)]})).collect::<Vec<_>>(),
    }))
    .unwrap()
}

fn policy() -> ServicePolicy {
    ServicePolicy {
        external_ip_cidrs: vec!["192.0.2.0/24".parse().unwrap()],
        bounds: ServiceBounds {
            max_ports: 2,
            max_endpoints_per_port: 3,
            max_endpoints: 5,
        },
    }
}

fn t(s: i64) -> Time {
    Time(Timestamp::from_second(s).unwrap())
}

#[test]
fn slice_sizes_count_endpoints_per_port_and_skip_what_no_agent_reads() {
    let slice = mk_slice("web", &[("a", "TCP"), ("a", "UDP"), ("a", "TCP")], 2);
    assert_eq!(
        build_slice_sizes(&slice),
        Some(SliceSizes {
            service: "web".into(),
            ports: vec![
                ("a".into(), Protocol::Tcp, 2),
                ("a".into(), Protocol::Udp, 2)
            ],
        })
    );
    let mut fqdn = slice.clone();
    fqdn.address_type = "FQDN".into();
    assert_eq!(build_slice_sizes(&fqdn), None);
    let mut orphan = slice;
    orphan.metadata.labels = None;
    assert_eq!(build_slice_sizes(&orphan), None);
}

#[test]
fn verdict_rows() {
    let sizes = |slices: &[EndpointSlice]| -> Vec<SliceSizes> {
        slices.iter().filter_map(build_slice_sizes).collect()
    };
    let p = policy();
    let rows: Vec<(&str, serde_json::Value, Vec<EndpointSlice>, Option<Verdict>)> = vec![
        ("small and clean", json!({"ports": ports(1)}), vec![mk_slice("web", &[("p0", "TCP")], 3)], Some(Verdict::Accepted)),
        ("headless: no agent programs it", json!({"clusterIP": "None", "ports": ports(9)}), vec![], None),
        ("ExternalName", json!({"type": "ExternalName", "externalName": "x.example"}), vec![], None),
        (
            "too many ports",
            json!({"ports": ports(3)}),
            vec![],
            Some(Verdict::TooLarge("spec.ports: Too many: 3: must have at most 2 items (--max-service-ports of berth agent); no node programs this Service".into())),
        ),
        (
            "a port's endpoints summed over two slices",
            json!({"ports": ports(1)}),
            vec![mk_slice("web", &[("p0", "TCP")], 2), {
                let mut s = mk_slice("web", &[("p0", "TCP")], 2);
                s.metadata.name = Some("web-y".into());
                s
            }],
            Some(Verdict::TooLarge("endpoints of port \"p0\" (TCP): Too many: 4: must have at most 3 items (--max-endpoints-per-service-port of berth agent); no node programs this Service".into())),
        ),
        (
            "a slice port the Service does not have counts for nothing",
            json!({"ports": ports(1)}),
            vec![mk_slice("web", &[("other", "TCP")], 9)],
            Some(Verdict::Accepted),
        ),
        (
            "too large wins over dropped entries",
            json!({"ports": ports(2), "externalIPs": ["198.18.0.2"]}),
            vec![mk_slice("web", &[("p0", "TCP"), ("p1", "TCP")], 3)],
            Some(Verdict::TooLarge("endpoints of all ports together: Too many: 6: must have at most 5 items (--max-service-endpoints of berth agent); no node programs this Service".into())),
        ),
        (
            "entries dropped, named by field and index",
            json!({"type": "LoadBalancer", "ports": ports(1), "externalIPs": ["192.0.2.1", "198.18.0.2"], "loadBalancerSourceRanges": ["010.0.0.0/8"]}),
            vec![],
            Some(Verdict::EntriesDropped(vec![
                "spec.externalIPs[1]: Invalid value: \"198.18.0.2\": not inside the external IP CIDRs this cluster allows (192.0.2.0/24)".into(),
                "spec.loadBalancerSourceRanges[0]: Invalid value: \"010.0.0.0/8\": must be a valid CIDR".into(),
            ])),
        ),
    ];
    for (row, spec, slices, want) in rows {
        let svc = mk_svc(spec, json!([]));
        let sizes = sizes(&slices);
        assert_eq!(judge(&svc, sizes.iter(), &p), want, "{row}");
    }
}

#[test]
fn another_proxys_service_is_not_judged() {
    let mut svc = mk_svc(json!({"ports": ports(9)}), json!([]));
    svc.metadata.labels = Some(
        [(
            "service.kubernetes.io/service-proxy-name".to_string(),
            "other".to_string(),
        )]
        .into(),
    );
    assert_eq!(judge(&svc, std::iter::empty(), &policy()), None);
}

#[test]
fn report_rows() {
    let too_large = Verdict::TooLarge("too large".into());
    let dropped = Verdict::EntriesDropped(vec!["x".into()]);
    let written = |verdict: &Verdict, at: i64| -> serde_json::Value {
        let svc = mk_svc(json!({}), json!([]));
        let (conditions, _) = plan_report(&svc, verdict, t(at)).unwrap();
        serde_json::to_value(conditions).unwrap()
    };
    // A clean Service never reported before: no write at all.
    let clean = mk_svc(json!({}), json!([]));
    assert_eq!(plan_report(&clean, &Verdict::Accepted, t(1)), None);

    // Newly too large: the condition False and a Warning.
    let (conditions, warn) = plan_report(&clean, &too_large, t(1)).unwrap();
    assert!(warn);
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].status, "False");
    assert_eq!(conditions[0].reason, "ServiceTooLarge");
    assert_eq!(conditions[0].message, "too large");
    assert_eq!(conditions[0].observed_generation, Some(3));

    // The same verdict again: nothing to write, no second Warning.
    let reported = mk_svc(json!({}), written(&too_large, 1));
    assert_eq!(plan_report(&reported, &too_large, t(2)), None);

    // Fixed: back to True/Accepted, no Warning, the transition time moves.
    let (conditions, warn) = plan_report(&reported, &Verdict::Accepted, t(3)).unwrap();
    assert!(!warn);
    assert_eq!(
        (conditions[0].status.as_str(), conditions[0].reason.as_str()),
        ("True", "Accepted")
    );
    assert_eq!(conditions[0].last_transition_time, t(3));

    // From too large to entries dropped: a new finding, a new Warning.
    let (conditions, warn) = plan_report(&reported, &dropped, t(4)).unwrap();
    assert!(warn);
    assert_eq!(conditions[0].reason, "EntriesDropped");
    assert!(
        conditions[0].message.ends_with(": x"),
        "{}",
        conditions[0].message
    );

    // Other conditions (the allocation's) are kept as they are.
    let with_other = mk_svc(
        json!({}),
        json!([{"type": "berth.dev/Allocated", "status": "True", "reason": "Allocated",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
    );
    let (conditions, _) = plan_report(&with_other, &dropped, t(5)).unwrap();
    assert_eq!(conditions.len(), 2);
    assert_eq!(conditions[0].type_, "berth.dev/Allocated");
}

#[test]
fn warnings_name_the_reason_and_what_was_left_out() {
    assert_eq!(warning_of(&Verdict::Accepted), None);
    let (reason, note) =
        warning_of(&Verdict::EntriesDropped(vec!["a".into(), "b".into()])).unwrap();
    assert_eq!(reason, "EntriesDropped");
    assert!(note.ends_with(": a; b"), "{note}");
    assert_eq!(
        warning_of(&Verdict::TooLarge("m".into())),
        Some(("ServiceTooLarge", "m".into()))
    );
}
