//! Protobuf bodies built with the same types Go's clients encode, decoded to the JSON the store
//! keeps.

use super::*;
use k8s_pb::api::{
    coordination::v1 as coordination, discovery::v1 as discovery, events::v1 as events,
};
use k8s_pb::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            kind: Some(kind.to_owned()),
            api_version: Some(api_version.to_owned()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = MAGIC.to_vec();
    out.extend(unknown.encode_to_vec());
    out
}

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

/// What `kubectl create service loadbalancer web --tcp=80:8080` sends: gogo writes every value
/// field, zero or not, so empty strings and zero numbers arrive and must vanish again.
fn mk_generated_service() -> core::Service {
    core::Service {
        metadata: Some(ObjectMeta {
            name: s("web"),
            generate_name: s(""),
            namespace: s(""),
            resource_version: s(""),
            generation: Some(0),
            creation_timestamp: Some(Time {
                seconds: Some(-62_135_596_800),
                nanos: Some(0),
            }),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            ..Default::default()
        }),
        spec: Some(core::ServiceSpec {
            ports: vec![core::ServicePort {
                name: s("80-8080"),
                protocol: s("TCP"),
                app_protocol: None,
                port: Some(80),
                target_port: Some(IntOrString {
                    r#type: Some(0),
                    int_val: Some(8080),
                    str_val: s(""),
                }),
                node_port: Some(0),
            }],
            selector: [("app".to_owned(), "web".to_owned())].into(),
            cluster_ip: s(""),
            r#type: s("LoadBalancer"),
            session_affinity: s(""),
            external_traffic_policy: s(""),
            health_check_node_port: Some(0),
            publish_not_ready_addresses: Some(false),
            allocate_load_balancer_node_ports: Some(false),
            ..Default::default()
        }),
        status: Some(core::ServiceStatus {
            load_balancer: Some(core::LoadBalancerStatus { ingress: vec![] }),
            conditions: vec![],
        }),
    }
}

#[test]
fn a_generated_service_decodes_to_its_json() {
    let body = envelope("v1", "Service", mk_generated_service().encode_to_vec());
    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                "selector": {"app": "web"},
                "type": "LoadBalancer",
                // A pointer field keeps its false.
                "allocateLoadBalancerNodePorts": false
            }
        })
    );
}

#[test]
fn every_service_field_reaches_json() {
    let svc = core::Service {
        metadata: Some(ObjectMeta {
            name: s("web"),
            namespace: s("team"),
            annotations: [("a".to_owned(), "1".to_owned())].into(),
            finalizers: vec!["berth.dev/load-balancer".to_owned()],
            creation_timestamp: Some(Time {
                seconds: Some(1_767_225_600),
                nanos: Some(0),
            }),
            owner_references: vec![meta::OwnerReference {
                api_version: s("v1"),
                kind: s("Pod"),
                name: s("p"),
                uid: s("u"),
                controller: Some(true),
                block_owner_deletion: None,
            }],
            ..Default::default()
        }),
        spec: Some(core::ServiceSpec {
            ports: vec![core::ServicePort {
                name: s("http"),
                protocol: s("UDP"),
                app_protocol: s("h2c"),
                port: Some(53),
                target_port: Some(IntOrString {
                    r#type: Some(1),
                    int_val: Some(0),
                    str_val: s("dns"),
                }),
                node_port: Some(30053),
            }],
            selector: BTreeMap::new(),
            cluster_ip: s("10.96.0.10"),
            cluster_ips: vec!["10.96.0.10".to_owned()],
            r#type: s("NodePort"),
            external_ips: vec!["198.18.0.9".to_owned()],
            session_affinity: s("ClientIP"),
            load_balancer_ip: s("198.18.0.200"),
            load_balancer_source_ranges: vec!["198.18.0.0/24".to_owned()],
            external_name: s("x.example"),
            external_traffic_policy: s("Local"),
            health_check_node_port: Some(31000),
            publish_not_ready_addresses: Some(true),
            session_affinity_config: Some(core::SessionAffinityConfig {
                client_ip: Some(core::ClientIpConfig {
                    timeout_seconds: Some(60),
                }),
            }),
            ip_families: vec!["IPv4".to_owned()],
            ip_family_policy: s("SingleStack"),
            allocate_load_balancer_node_ports: Some(true),
            load_balancer_class: s("berth.dev/l2"),
            internal_traffic_policy: s("Cluster"),
            traffic_distribution: s("PreferClose"),
        }),
        status: Some(core::ServiceStatus {
            load_balancer: Some(core::LoadBalancerStatus {
                ingress: vec![core::LoadBalancerIngress {
                    ip: s("198.18.0.200"),
                    hostname: s(""),
                    ip_mode: s("VIP"),
                    ports: vec![core::PortStatus {
                        port: Some(53),
                        protocol: s("UDP"),
                        error: None,
                    }],
                }],
            }),
            conditions: vec![meta::Condition {
                r#type: s("berth.dev/Allocated"),
                status: s("True"),
                observed_generation: Some(2),
                last_transition_time: Some(Time {
                    seconds: Some(1_767_225_600),
                    nanos: Some(0),
                }),
                reason: s("Allocated"),
                message: s(""),
            }],
        }),
    };
    let got = decode(&envelope("v1", "Service", svc.encode_to_vec())).unwrap();
    assert_eq!(
        got,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "team", "annotations": {"a": "1"},
                "finalizers": ["berth.dev/load-balancer"], "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": true}]},
            "spec": {
                "ports": [{"name": "http", "protocol": "UDP", "appProtocol": "h2c", "port": 53,
                    "targetPort": "dns", "nodePort": 30053}],
                "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "type": "NodePort",
                "externalIPs": ["198.18.0.9"], "sessionAffinity": "ClientIP",
                "loadBalancerIP": "198.18.0.200", "loadBalancerSourceRanges": ["198.18.0.0/24"],
                "externalName": "x.example", "externalTrafficPolicy": "Local",
                "healthCheckNodePort": 31000, "publishNotReadyAddresses": true,
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "allocateLoadBalancerNodePorts": true, "loadBalancerClass": "berth.dev/l2",
                "internalTrafficPolicy": "Cluster", "trafficDistribution": "PreferClose"
            },
            "status": {
                "loadBalancer": {"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP",
                    "ports": [{"port": 53, "protocol": "UDP"}]}]},
                "conditions": [{"type": "berth.dev/Allocated", "status": "True", "observedGeneration": 2,
                    "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "Allocated", "message": ""}]
            }
        })
    );
}

#[test]
fn config_maps_and_namespaces() {
    let cm = core::ConfigMap {
        metadata: Some(ObjectMeta {
            name: s("settings"),
            ..Default::default()
        }),
        immutable: Some(false),
        data: [("a".to_owned(), "1".to_owned())].into(),
        binary_data: [("b".to_owned(), vec![0u8, 255])].into(),
    };
    assert_eq!(
        decode(&envelope("v1", "ConfigMap", cm.encode_to_vec())).unwrap(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
            "immutable": false, "data": {"a": "1"}, "binaryData": {"b": "AP8="}})
    );
    let ns = core::Namespace {
        metadata: Some(ObjectMeta {
            name: s("team"),
            ..Default::default()
        }),
        spec: Some(core::NamespaceSpec {
            finalizers: vec!["kubernetes".to_owned()],
        }),
        status: Some(core::NamespaceStatus {
            phase: s(""),
            conditions: vec![],
        }),
    };
    assert_eq!(
        decode(&envelope("v1", "Namespace", ns.encode_to_vec())).unwrap(),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"},
            "spec": {"finalizers": ["kubernetes"]}})
    );
}

#[test]
fn bodies_that_cannot_be_decoded_are_refused_clearly() {
    // (body, status code, words in the message)
    let replica_set = envelope("apps/v1", "ReplicaSet", vec![]);
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{\"kind\": \"Service\"}".to_vec(), 400, "k8s envelope"),
        (b"k8s\x00\xff\xff\xff".to_vec(), 400, "could not be decoded"),
        (
            envelope("v1", "Service", vec![0x0a, 0xff]),
            400,
            "could not be decoded",
        ),
        (replica_set, 415, "\"ReplicaSet\""),
        (envelope("v1", "Pod", vec![]), 415, "application/json"),
    ];
    for (body, code, words) in cases {
        let err = decode(&body).unwrap_err();
        assert_eq!(err.code, code, "{}", err.message);
        assert!(err.message.contains(words), "{}", err.message);
    }
}

#[test]
fn times_are_rfc3339_and_go_zero_is_absent() {
    let t = |seconds, nanos| {
        time(Some(Time {
            seconds: Some(seconds),
            nanos: Some(nanos),
        }))
    };
    assert_eq!(t(1_767_225_600, 0).as_deref(), Some("2026-01-01T00:00:00Z"));
    assert_eq!(t(-62_135_596_800, 0), None);
    assert_eq!(t(0, 0), None);
    assert_eq!(time(None), None);
}

fn micro(seconds: i64, nanos: i32) -> Option<meta::MicroTime> {
    Some(meta::MicroTime {
        seconds: Some(seconds),
        nanos: Some(nanos),
    })
}

fn named(name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: s(name),
        ..Default::default()
    })
}

#[test]
fn leases_as_go_leader_election_writes_them() {
    let lease = coordination::Lease {
        metadata: named("berth-controller"),
        spec: Some(coordination::LeaseSpec {
            holder_identity: s("controller-0"),
            lease_duration_seconds: Some(15),
            acquire_time: micro(1_767_225_600, 123_456_000),
            renew_time: micro(1_767_225_601, 0),
            lease_transitions: Some(0),
            strategy: None,
            preferred_holder: None,
        }),
    };
    let body = envelope("coordination.k8s.io/v1", "Lease", lease.encode_to_vec());
    assert_eq!(
        decode(&body).unwrap(),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "berth-controller"},
            "spec": {"holderIdentity": "controller-0", "leaseDurationSeconds": 15,
                "acquireTime": "2026-01-01T00:00:00.123456Z", "renewTime": "2026-01-01T00:00:01.000000Z",
                "leaseTransitions": 0}})
    );
}

#[test]
fn endpoints_and_slices() {
    let target = || {
        Some(core::ObjectReference {
            kind: s("Pod"),
            name: s("web-1"),
            namespace: s("default"),
            uid: s(""),
            ..Default::default()
        })
    };
    let ep = core::Endpoints {
        metadata: named("web"),
        subsets: vec![core::EndpointSubset {
            addresses: vec![core::EndpointAddress {
                ip: s("10.244.1.5"),
                hostname: s(""),
                node_name: s("n1"),
                target_ref: target(),
            }],
            not_ready_addresses: vec![],
            ports: vec![core::EndpointPort {
                name: s("http"),
                port: Some(8080),
                protocol: s("TCP"),
                app_protocol: None,
            }],
        }],
    };
    assert_eq!(
        decode(&envelope("v1", "Endpoints", ep.encode_to_vec())).unwrap(),
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web"},
            "subsets": [{"addresses": [{"ip": "10.244.1.5", "nodeName": "n1",
                    "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "default"}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]})
    );
    let slice = discovery::EndpointSlice {
        metadata: named("web-abc"),
        address_type: s("IPv4"),
        endpoints: vec![
            discovery::Endpoint {
                addresses: vec!["10.244.1.5".to_owned()],
                conditions: Some(discovery::EndpointConditions {
                    ready: Some(false),
                    serving: Some(true),
                    terminating: Some(true),
                }),
                hostname: None,
                target_ref: target(),
                deprecated_topology: BTreeMap::new(),
                node_name: s("n1"),
                zone: s("a"),
                hints: Some(discovery::EndpointHints {
                    for_zones: vec![discovery::ForZone { name: s("a") }],
                    for_nodes: vec![],
                }),
            },
            discovery::Endpoint {
                addresses: vec!["10.244.2.5".to_owned()],
                ..Default::default()
            },
        ],
        ports: vec![discovery::EndpointPort {
            name: s(""),
            protocol: s("TCP"),
            port: Some(8080),
            app_protocol: None,
        }],
    };
    assert_eq!(
        decode(&envelope(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            slice.encode_to_vec()
        ))
        .unwrap(),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc"}, "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.5"],
                    "conditions": {"ready": false, "serving": true, "terminating": true},
                    "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "default"},
                    "nodeName": "n1", "zone": "a", "hints": {"forZones": [{"name": "a"}]}},
                {"addresses": ["10.244.2.5"], "conditions": {}}
            ],
            "ports": [{"name": "", "protocol": "TCP", "port": 8080}]})
    );
}

#[test]
fn events_of_both_groups() {
    let old = core::Event {
        metadata: named("web.1"),
        involved_object: Some(core::ObjectReference {
            kind: s("Service"),
            name: s("web"),
            ..Default::default()
        }),
        reason: s("Ensured"),
        message: s("done"),
        source: Some(core::EventSource {
            component: s("ccm"),
            host: s(""),
        }),
        first_timestamp: Some(Time {
            seconds: Some(1_767_225_600),
            nanos: Some(0),
        }),
        last_timestamp: None,
        count: Some(1),
        r#type: s("Normal"),
        event_time: micro(-62_135_596_800, 0),
        series: None,
        action: s(""),
        related: None,
        reporting_component: s(""),
        reporting_instance: s(""),
    };
    assert_eq!(
        decode(&envelope("v1", "Event", old.encode_to_vec())).unwrap(),
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1"},
            "involvedObject": {"kind": "Service", "name": "web"}, "reason": "Ensured",
            "message": "done", "source": {"component": "ccm"},
            "firstTimestamp": "2026-01-01T00:00:00Z", "count": 1, "type": "Normal",
            "reportingComponent": "", "reportingInstance": ""})
    );
    let new = events::Event {
        metadata: named("web.2"),
        event_time: micro(1_767_225_600, 5_000),
        series: Some(events::EventSeries {
            count: Some(2),
            last_observed_time: micro(1_767_225_660, 0),
        }),
        reporting_controller: s("berth.dev/controller"),
        reporting_instance: s("controller-0"),
        action: s("Allocate"),
        reason: s("IPAllocated"),
        regarding: Some(core::ObjectReference {
            kind: s("Service"),
            name: s("web"),
            ..Default::default()
        }),
        related: None,
        note: s("assigned"),
        r#type: s("Normal"),
        deprecated_source: None,
        deprecated_first_timestamp: None,
        deprecated_last_timestamp: None,
        deprecated_count: Some(0),
    };
    assert_eq!(
        decode(&envelope("events.k8s.io/v1", "Event", new.encode_to_vec())).unwrap(),
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "web.2"},
            "eventTime": "2026-01-01T00:00:00.000005Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
            "reportingController": "berth.dev/controller", "reportingInstance": "controller-0",
            "action": "Allocate", "reason": "IPAllocated",
            "regarding": {"kind": "Service", "name": "web"}, "note": "assigned", "type": "Normal",
            "deprecatedSource": {}})
    );
}

#[test]
fn nodes_as_a_kubelet_reports_them() {
    use k8s_pb::apimachinery::pkg::api::resource::Quantity;
    let q = |s: &str| Quantity {
        string: Some(s.to_owned()),
    };
    let node = core::Node {
        metadata: named("n1"),
        spec: Some(core::NodeSpec {
            pod_cidr: s("10.244.1.0/24"),
            pod_cid_rs: vec!["10.244.1.0/24".to_owned()],
            provider_id: s("aws:///eu-west-1a/i-0123"),
            unschedulable: Some(false),
            taints: vec![core::Taint {
                key: s("node.kubernetes.io/not-ready"),
                value: s(""),
                effect: s("NoSchedule"),
                time_added: None,
            }],
            config_source: None,
            external_id: s(""),
        }),
        status: Some(core::NodeStatus {
            capacity: [("cpu".to_owned(), q("4")), ("memory".to_owned(), q("8Gi"))].into(),
            allocatable: [("pods".to_owned(), q("110"))].into(),
            phase: s(""),
            conditions: vec![core::NodeCondition {
                r#type: s("Ready"),
                status: s("True"),
                last_heartbeat_time: Some(Time {
                    seconds: Some(1_767_225_600),
                    nanos: Some(0),
                }),
                last_transition_time: None,
                reason: s("KubeletReady"),
                message: s(""),
            }],
            addresses: vec![core::NodeAddress {
                r#type: s("InternalIP"),
                address: s("198.18.0.11"),
            }],
            daemon_endpoints: Some(core::NodeDaemonEndpoints {
                kubelet_endpoint: Some(core::DaemonEndpoint { port: Some(10250) }),
            }),
            node_info: Some(core::NodeSystemInfo {
                kubelet_version: s("v1.34.0"),
                operating_system: s("linux"),
                swap: Some(core::NodeSwapStatus { capacity: Some(0) }),
                ..Default::default()
            }),
            images: vec![core::ContainerImage {
                names: vec!["echo:1".to_owned()],
                size_bytes: Some(1024),
            }],
            volumes_in_use: vec![],
            volumes_attached: vec![],
            config: None,
            runtime_handlers: vec![core::NodeRuntimeHandler {
                name: s(""),
                features: Some(core::NodeRuntimeHandlerFeatures {
                    recursive_read_only_mounts: Some(true),
                    user_namespaces: Some(false),
                }),
            }],
            features: Some(core::NodeFeatures {
                supplemental_groups_policy: Some(true),
            }),
            declared_features: vec![],
        }),
    };
    assert_eq!(
        decode(&envelope("v1", "Node", node.encode_to_vec())).unwrap(),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"],
            "providerID": "aws:///eu-west-1a/i-0123",
            "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "4", "memory": "8Gi"}, "allocatable": {"pods": "110"},
            "conditions": [{"type": "Ready", "status": "True",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": "198.18.0.11"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "v1.34.0",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "",
                "swap": {"capacity": 0}},
            "images": [{"names": ["echo:1"], "sizeBytes": 1024}],
            "runtimeHandlers": [{"name": "", "features": {"recursiveReadOnlyMounts": true,
                "userNamespaces": false}}],
            "features": {"supplementalGroupsPolicy": true}
        }})
    );
}

#[test]
fn delete_options_in_any_group_version() {
    let opts = meta::DeleteOptions {
        grace_period_seconds: Some(0),
        preconditions: Some(meta::Preconditions {
            uid: s("u1"),
            resource_version: None,
        }),
        orphan_dependents: None,
        propagation_policy: s("Background"),
        dry_run: vec![],
        ignore_store_read_error_with_cluster_breaking_potential: None,
    };
    for api_version in ["v1", "coordination.k8s.io/v1", "meta.k8s.io/v1"] {
        assert_eq!(
            decode(&envelope(
                api_version,
                "DeleteOptions",
                opts.encode_to_vec()
            ))
            .unwrap(),
            json!({"apiVersion": api_version, "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": "u1"}, "propagationPolicy": "Background"})
        );
    }
}

/// The body kubectl 1.32 sends for `kubectl create deployment web --image=nginx --replicas=2
/// --port=80`, captured from the wire.
const KUBECTL_CREATE_DEPLOYMENT: &[&str] = &[
    "6b3873000a150a07617070732f7631120a4465706c6f796d656e7412b8010a1f0a0377656212001a0022002a",
    "003200380042005a0a0a0361707012037765621286010802120c0a0a0a0361707012037765621a6c0a1c0a00",
    "12001a0022002a003200380042005a0a0a036170701203776562124c122e0a056e67696e7812056e67696e78",
    "2a00320a0a001000185022002a0042006a007200800100880100900100a201001a00320042004a0052005800",
    "600068008201008a01009a0100c2010022020a00280038001a0c0800100018002000280038001a002200",
];

fn unhex(parts: &[&str]) -> Vec<u8> {
    let text: String = parts.concat();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn kubectl_create_deployment_decodes_to_its_json() {
    let obj = decode(&unhex(KUBECTL_CREATE_DEPLOYMENT)).unwrap();
    assert_eq!(
        obj,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx",
                        "ports": [{"containerPort": 80}], "resources": {}}]}
                },
            },
        })
    );
}

#[test]
fn deployment_templates_with_fields_the_lab_does_not_decode_are_refused_by_name() {
    use k8s_pb::api::apps::v1 as apps;
    let with_spec = |spec: core::PodSpec| apps::Deployment {
        metadata: named("web"),
        spec: Some(apps::DeploymentSpec {
            template: Some(core::PodTemplateSpec {
                metadata: None,
                spec: Some(spec),
            }),
            ..Default::default()
        }),
        status: None,
    };
    let volumes = with_spec(core::PodSpec {
        volumes: vec![core::Volume::default()],
        ..Default::default()
    });
    let mount = with_spec(core::PodSpec {
        containers: vec![core::Container {
            volume_mounts: vec![core::VolumeMount::default()],
            ..Default::default()
        }],
        ..Default::default()
    });
    for (d, field) in [
        (volumes, "PodSpec.volumes"),
        (mount, "Container.volumeMounts"),
    ] {
        let err = decode(&envelope("apps/v1", "Deployment", d.encode_to_vec())).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains(field), "{}", err.message);
        assert!(err.message.contains("application/json"), "{}", err.message);
    }
}

#[test]
fn deployment_strategy_and_probe_reach_json() {
    use k8s_pb::api::apps::v1 as apps;
    let d = apps::Deployment {
        metadata: named("web"),
        spec: Some(apps::DeploymentSpec {
            replicas: Some(0),
            strategy: Some(apps::DeploymentStrategy {
                r#type: s("RollingUpdate"),
                rolling_update: Some(apps::RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(0),
                        str_val: None,
                    }),
                    max_surge: Some(IntOrString {
                        r#type: Some(1),
                        int_val: None,
                        str_val: s("50%"),
                    }),
                }),
            }),
            min_ready_seconds: Some(3),
            template: Some(core::PodTemplateSpec {
                metadata: None,
                spec: Some(core::PodSpec {
                    containers: vec![core::Container {
                        name: s("echo"),
                        readiness_probe: Some(core::Probe {
                            handler: Some(core::ProbeHandler {
                                http_get: Some(core::HttpGetAction {
                                    path: s("/healthz"),
                                    port: Some(IntOrString {
                                        r#type: Some(0),
                                        int_val: Some(8080),
                                        str_val: None,
                                    }),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            period_seconds: Some(1),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        status: None,
    };
    let obj = decode(&envelope("apps/v1", "Deployment", d.encode_to_vec())).unwrap();
    let spec = &obj["spec"];
    assert_eq!(spec["replicas"], 0, "a pointer field keeps its zero");
    assert_eq!(
        spec["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "50%"}})
    );
    assert_eq!(spec["minReadySeconds"], 3);
    assert_eq!(
        spec["template"]["spec"]["containers"][0]["readinessProbe"],
        json!({"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1})
    );
}
