//! The desired model from Services: names, annotations, ports, health checks, targets.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use berth_api::names::{annotation as ann, aws_tag};
use berth_aws::model::{HcPort, HcProtocol, Scheme, TargetType, TgProtocol};
use berth_aws::{build_stack, instance_id, IpTargets, ModelError, NodeFacts};
use berth_core::{Protocol, TrafficPolicy};
use common::*;

#[test]
fn one_port_gives_one_target_group_and_listener_at_the_node_port() {
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let stack = build_stack(&svc, &mk_nodes(3), &IpTargets::new(), &mk_config()).unwrap();
    assert_eq!(stack.service, "web/front");
    assert_eq!(stack.load_balancer.scheme, Scheme::Internal);
    assert_eq!(stack.load_balancer.subnets.len(), 2);
    assert_eq!(
        stack
            .load_balancer
            .tags
            .get(aws_tag::CLUSTER)
            .map(String::as_str),
        Some(CLUSTER)
    );
    assert_eq!(
        stack
            .load_balancer
            .tags
            .get(aws_tag::RESOURCE)
            .map(String::as_str),
        Some("LoadBalancer")
    );
    let tg = &stack.target_groups["80/TCP"];
    assert_eq!(
        (tg.protocol, tg.port, tg.target_type),
        (TgProtocol::Tcp, 30080, TargetType::Instance)
    );
    assert_eq!(tg.health_check.protocol, HcProtocol::Tcp);
    assert_eq!(tg.health_check.port, HcPort::TrafficPort);
    assert_eq!(tg.health_check.path, None);
    assert_eq!(tg.targets.len(), 3);
    assert!(tg.targets.iter().all(|t| t.port == 30080));
    assert_eq!(stack.listeners[&80].target_group, "80/TCP");
    assert!(stack.load_balancer.name.len() <= 32);
}

#[test]
fn local_policy_checks_health_over_http_on_the_health_check_node_port() {
    let mut svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    svc.external_traffic_policy = TrafficPolicy::Local;
    assert_eq!(
        build_stack(&svc, &[], &IpTargets::new(), &mk_config()),
        Err(ModelError::NoHealthCheckNodePort)
    );
    svc.health_check_node_port = Some(32000);
    let stack = build_stack(&svc, &[], &IpTargets::new(), &mk_config()).unwrap();
    let hc = &stack.target_groups["80/TCP"].health_check;
    assert_eq!(
        (hc.protocol, hc.port, hc.path.as_deref()),
        (HcProtocol::Http, HcPort::Port(32000), Some("/healthz"))
    );
    assert_eq!(hc.matcher.as_deref(), Some("200-399"));
}

#[test]
fn health_check_annotations_override() {
    let mut svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    for (k, v) in [
        (ann::AWS_HEALTHCHECK_PROTOCOL, "http"),
        (ann::AWS_HEALTHCHECK_PORT, "8080"),
        (ann::AWS_HEALTHCHECK_PATH, "/ready"),
        (ann::AWS_HEALTHCHECK_INTERVAL, "30"),
        (ann::AWS_HEALTHCHECK_TIMEOUT, "5"),
        (ann::AWS_HEALTHCHECK_HEALTHY_THRESHOLD, "2"),
        (ann::AWS_HEALTHCHECK_UNHEALTHY_THRESHOLD, "4"),
        (ann::AWS_HEALTHCHECK_SUCCESS_CODES, "200"),
    ] {
        svc.annotations.insert(k.to_string(), v.to_string());
    }
    let stack = build_stack(&svc, &[], &IpTargets::new(), &mk_config()).unwrap();
    let hc = &stack.target_groups["80/TCP"].health_check;
    assert_eq!(hc.protocol, HcProtocol::Http);
    assert_eq!(hc.port, HcPort::Port(8080));
    assert_eq!(hc.path.as_deref(), Some("/ready"));
    assert_eq!(
        (
            hc.interval_seconds,
            hc.timeout_seconds,
            hc.healthy_threshold,
            hc.unhealthy_threshold
        ),
        (30, 5, 2, 4)
    );
    assert_eq!(hc.matcher.as_deref(), Some("200"));
}

#[test]
fn bad_annotations_name_the_annotation() {
    let cases = [
        (ann::AWS_LOAD_BALANCER_SCHEME, "public"),
        (ann::AWS_HEALTHCHECK_PORT, "eighty"),
        (ann::AWS_HEALTHCHECK_INTERVAL, "1"),
        (ann::AWS_HEALTHCHECK_PATH, "healthz"),
        (ann::AWS_NLB_TARGET_TYPE, "lambda"),
        (ann::AWS_LOAD_BALANCER_NAME, "has_underscore"),
        (
            ann::AWS_LOAD_BALANCER_NAME,
            "a-name-that-is-far-too-long-for-elbv2",
        ),
        (ann::AWS_ADDITIONAL_RESOURCE_TAGS, "berth.dev/cluster=other"),
        (ann::AWS_ADDITIONAL_RESOURCE_TAGS, "novalue"),
        (ann::AWS_LOAD_BALANCER_ATTRIBUTES, "a=1,a=2"),
        (ann::AWS_LOAD_BALANCER_SUBNETS, "my-subnet-name"),
    ];
    for (key, value) in cases {
        let mut svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
        svc.annotations.insert(key.to_string(), value.to_string());
        let err = build_stack(&svc, &[], &IpTargets::new(), &mk_config()).unwrap_err();
        assert!(
            matches!(&err, ModelError::Annotation { annotation, .. } if *annotation == key),
            "{key}={value}: {err}"
        );
        assert!(err.to_string().contains(key), "{err}");
    }
}

#[test]
fn tcp_and_udp_on_one_port_share_a_tcp_udp_listener() {
    let svc = mk_service(
        "dns",
        "coredns",
        vec![
            mk_port(53, Protocol::Udp, 30053),
            mk_port(53, Protocol::Tcp, 30053),
            mk_port(9153, Protocol::Tcp, 30153),
        ],
    );
    let stack = build_stack(&svc, &mk_nodes(1), &IpTargets::new(), &mk_config()).unwrap();
    let keys: Vec<&str> = stack.target_groups.keys().map(String::as_str).collect();
    assert_eq!(keys, ["53/TCP_UDP", "9153/TCP"]);
    assert_eq!(stack.listeners[&53].protocol, TgProtocol::TcpUdp);
    let split = mk_service(
        "dns",
        "coredns",
        vec![
            mk_port(53, Protocol::Udp, 30053),
            mk_port(53, Protocol::Tcp, 30054),
        ],
    );
    let err = build_stack(&split, &[], &IpTargets::new(), &mk_config()).unwrap_err();
    assert!(matches!(err, ModelError::Port { index: 1, .. }), "{err}");
    let sctp = mk_service("x", "y", vec![mk_port(9, Protocol::Sctp, 30009)]);
    assert!(matches!(
        build_stack(&sctp, &[], &IpTargets::new(), &mk_config()),
        Err(ModelError::Port { index: 0, .. })
    ));
}

#[test]
fn instance_targets_come_from_provider_ids_and_others_are_reported() {
    let mut nodes = mk_nodes(2);
    nodes.push(NodeFacts {
        name: "bare".into(),
        provider_id: Some("kind://docker/kind/kind-worker".into()),
        labels: Default::default(),
    });
    nodes.push(NodeFacts {
        name: "none".into(),
        provider_id: None,
        labels: Default::default(),
    });
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let stack = build_stack(&svc, &nodes, &IpTargets::new(), &mk_config()).unwrap();
    assert_eq!(stack.target_groups["80/TCP"].targets.len(), 2);
    assert_eq!(
        stack.skipped_nodes,
        vec!["bare".to_string(), "none".to_string()]
    );
    assert_eq!(
        instance_id("aws:///us-east-1a/i-0123456789abcdef0"),
        Some("i-0123456789abcdef0")
    );
    assert_eq!(
        instance_id("aws:///us-east-1a/i-01234567"),
        Some("i-01234567")
    );
    assert_eq!(instance_id("aws:///us-east-1a/i-xyz"), None);
    assert_eq!(instance_id("gce://p/z/i-0123456789abcdef0"), None);
}

#[test]
fn ip_targets_are_pod_addresses() {
    let mut svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    svc.annotations
        .insert(ann::AWS_NLB_TARGET_TYPE.into(), "ip".into());
    let mut ips = IpTargets::new();
    ips.insert(
        80,
        BTreeSet::from([
            ("10.0.1.5".parse().unwrap(), 8080),
            ("10.0.2.7".parse().unwrap(), 8080),
        ]),
    );
    let stack = build_stack(&svc, &mk_nodes(3), &ips, &mk_config()).unwrap();
    let tg = &stack.target_groups["80/TCP"];
    assert_eq!((tg.target_type, tg.port), (TargetType::Ip, 8080));
    let ids: Vec<&str> = tg.targets.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["10.0.1.5", "10.0.2.7"]);
}

#[test]
fn names_change_with_what_aws_cannot_change_in_place() {
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let a = build_stack(&svc, &[], &IpTargets::new(), &mk_config()).unwrap();
    let mut facing = svc.clone();
    facing.annotations.insert(
        ann::AWS_LOAD_BALANCER_SCHEME.into(),
        "internet-facing".into(),
    );
    let b = build_stack(&facing, &[], &IpTargets::new(), &mk_config()).unwrap();
    assert_ne!(a.load_balancer.name, b.load_balancer.name);
    assert_eq!(
        a.target_groups["80/TCP"].name,
        b.target_groups["80/TCP"].name
    );
    let moved = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30081)]);
    let c = build_stack(&moved, &[], &IpTargets::new(), &mk_config()).unwrap();
    assert_ne!(
        a.target_groups["80/TCP"].name,
        c.target_groups["80/TCP"].name
    );
    assert_eq!(a.load_balancer.name, c.load_balancer.name);
    let mut named = svc.clone();
    named
        .annotations
        .insert(ann::AWS_LOAD_BALANCER_NAME.into(), "my-nlb".into());
    assert_eq!(
        build_stack(&named, &[], &IpTargets::new(), &mk_config())
            .unwrap()
            .load_balancer
            .name,
        "my-nlb"
    );
}

#[test]
fn no_subnets_and_missing_node_ports_are_clear_errors() {
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let mut config = mk_config();
    config.default_subnets.clear();
    assert_eq!(
        build_stack(&svc, &[], &IpTargets::new(), &config),
        Err(ModelError::NoSubnets)
    );
    let mut no_np = svc.clone();
    no_np.ports[0].node_port = None;
    assert!(matches!(
        build_stack(&no_np, &[], &IpTargets::new(), &mk_config()),
        Err(ModelError::Port { index: 0, .. })
    ));
    let none = mk_service("web", "front", vec![]);
    assert_eq!(
        build_stack(&none, &[], &IpTargets::new(), &mk_config()),
        Err(ModelError::NoPorts)
    );
}

fn mk_labelled(i: usize, zone: &str, labels: &[(&str, &str)]) -> NodeFacts {
    NodeFacts {
        name: format!("node-{i}"),
        provider_id: Some(format!("aws:///{zone}/{}", instance(i))),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn target_node_labels_choose_the_instance_targets() {
    let nodes = vec![
        mk_labelled(0, "us-east-1a", &[("pool", "edge"), ("tier", "web")]),
        mk_labelled(1, "us-east-1a", &[("pool", "edge")]),
        mk_labelled(2, "us-east-1b", &[("pool", "batch"), ("tier", "web")]),
        mk_labelled(3, "us-east-1b", &[]),
    ];
    let mut svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let targets = |svc: &berth_aws::ServiceFacts| -> Vec<String> {
        let stack = build_stack(svc, &nodes, &IpTargets::new(), &mk_config()).unwrap();
        stack.target_groups["80/TCP"]
            .targets
            .iter()
            .map(|t| t.id.clone())
            .collect()
    };
    // Without the annotation every eligible node is a target.
    assert_eq!(targets(&svc).len(), 4);
    // Every label listed must match, value included.
    for (value, want) in [
        ("pool=edge", vec![0, 1]),
        ("pool=edge, tier=web", vec![0]),
        ("tier=web", vec![0, 2]),
        ("pool=gpu", vec![]),
    ] {
        svc.annotations
            .insert(ann::AWS_TARGET_NODE_LABELS.into(), value.into());
        let want: Vec<String> = want.into_iter().map(instance).collect();
        assert_eq!(targets(&svc), want, "{value}");
    }
    svc.annotations
        .insert(ann::AWS_TARGET_NODE_LABELS.into(), "pool".into());
    assert!(matches!(
        build_stack(&svc, &nodes, &IpTargets::new(), &mk_config()),
        Err(ModelError::Annotation { annotation, .. }) if annotation == ann::AWS_TARGET_NODE_LABELS
    ));
}

#[test]
fn a_service_that_cannot_fit_the_quotas_is_refused_whole() {
    // 51 ports: one listener more than a Network Load Balancer may have.
    let ports: Vec<_> = (0..51)
        .map(|i| mk_port(1000 + i, Protocol::Tcp, 30000 + i))
        .collect();
    let svc = mk_service("web", "wide", ports.clone());
    let err = build_stack(&svc, &mk_nodes(1), &IpTargets::new(), &mk_config()).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Quota {
                quota: "Listeners per Network Load Balancer",
                limit: 50,
                needed: 51,
                ..
            }
        ),
        "{err}"
    );
    assert!(err
        .to_string()
        .contains("Listeners per Network Load Balancer"));
    let fits = mk_service("web", "wide", ports[..50].to_vec());
    assert!(build_stack(&fits, &mk_nodes(1), &IpTargets::new(), &mk_config()).is_ok());

    // Registrations per zone: each node counts once per target group.
    let mut config = mk_config();
    config.quotas.targets_per_zone = 5;
    let two_ports = mk_service(
        "web",
        "front",
        vec![
            mk_port(80, Protocol::Tcp, 30080),
            mk_port(443, Protocol::Tcp, 30443),
        ],
    );
    let zoned = |a: usize, b: usize| -> Vec<NodeFacts> {
        (0..a)
            .map(|i| mk_labelled(i, "us-east-1a", &[]))
            .chain((a..a + b).map(|i| mk_labelled(i, "us-east-1b", &[])))
            .collect()
    };
    // 2 ports x 2 nodes per zone = 4 registrations per zone: fits.
    assert!(build_stack(&two_ports, &zoned(2, 2), &IpTargets::new(), &config).is_ok());
    // 2 ports x 3 nodes in one zone = 6.
    let err = build_stack(&two_ports, &zoned(3, 1), &IpTargets::new(), &config).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Quota {
                limit: 5,
                needed: 6,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(ann::AWS_TARGET_NODE_LABELS),
        "the refusal says how to fit: {err}"
    );
    // Targets per target group.
    config.quotas.targets_per_zone = 500;
    config.quotas.targets_per_target_group = 3;
    let err = build_stack(&two_ports, &zoned(2, 2), &IpTargets::new(), &config).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Quota {
                quota: "Targets per target group per Region",
                needed: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn proxy_protocol_star_turns_v2_on_for_every_target_group() {
    let mut svc = mk_service(
        "web",
        "front",
        vec![
            mk_port(80, Protocol::Tcp, 30080),
            mk_port(443, Protocol::Tcp, 30443),
        ],
    );
    svc.annotations.insert(
        ann::AWS_TARGET_GROUP_ATTRIBUTES.into(),
        "proxy_protocol_v2.enabled=false,deregistration_delay.timeout_seconds=30".into(),
    );
    svc.annotations
        .insert(ann::AWS_PROXY_PROTOCOL.into(), "*".into());
    let stack = build_stack(&svc, &mk_nodes(1), &IpTargets::new(), &mk_config()).unwrap();
    for tg in stack.target_groups.values() {
        assert_eq!(
            tg.attributes
                .get("proxy_protocol_v2.enabled")
                .map(String::as_str),
            Some("true"),
            "the annotation wins over the attribute"
        );
        assert_eq!(
            tg.attributes
                .get("deregistration_delay.timeout_seconds")
                .map(String::as_str),
            Some("30")
        );
    }
    svc.annotations
        .insert(ann::AWS_PROXY_PROTOCOL.into(), "80".into());
    assert!(matches!(
        build_stack(&svc, &mk_nodes(1), &IpTargets::new(), &mk_config()),
        Err(ModelError::Annotation { annotation, .. }) if annotation == ann::AWS_PROXY_PROTOCOL
    ));
}

#[test]
fn tls_listeners_only_on_tcp_ports_with_one_certificate() {
    let cert = "arn:aws:acm:us-east-1:123456789012:certificate/abc";
    let mut dns = mk_port(53, Protocol::Udp, 30053);
    dns.name = Some("dns".into());
    let mut svc = mk_service(
        "web",
        "front",
        vec![mk_port(443, Protocol::Tcp, 30443), dns],
    );
    svc.annotations
        .insert(ann::AWS_SSL_CERT.into(), cert.into());
    // Every port by default: the UDP one cannot be TLS.
    let refused = |svc: &berth_aws::ServiceFacts, key: &str| {
        matches!(
            build_stack(svc, &mk_nodes(1), &IpTargets::new(), &mk_config()),
            Err(ModelError::Annotation { annotation, .. }) if annotation == key
        )
    };
    assert!(refused(&svc, ann::AWS_SSL_CERT));
    svc.annotations
        .insert(ann::AWS_SSL_PORTS.into(), "dns".into());
    assert!(refused(&svc, ann::AWS_SSL_PORTS));
    svc.annotations
        .insert(ann::AWS_SSL_PORTS.into(), "443".into());
    let stack = build_stack(&svc, &mk_nodes(1), &IpTargets::new(), &mk_config()).unwrap();
    let tls = stack.listeners[&443].tls.clone().unwrap();
    assert_eq!(
        (tls.certificate.as_str(), tls.policy.as_str()),
        (cert, "ELBSecurityPolicy-2016-08")
    );
    assert_eq!(stack.listeners[&53].tls, None);
    // The target group stays TCP behind a TLS listener.
    assert_eq!(stack.target_groups["443/TCP"].protocol, TgProtocol::Tcp);
    svc.annotations
        .insert(ann::AWS_SSL_CERT.into(), format!("{cert},{cert}2"));
    assert!(refused(&svc, ann::AWS_SSL_CERT));
}
