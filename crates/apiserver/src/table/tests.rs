//! Cells compared with what upstream's printers produce for the same objects
//! (pkg/printers/internalversion/printers_test.go cases, and kubectl output seen on clusters).

use super::printers::Printer;
use super::*;
use crate::resource::{built_ins, from_crd};

const NOW: &str = "2026-01-01T01:00:00Z";
const FIVE_MIN_AGO: &str = "2026-01-01T00:55:00Z";

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(NOW)
        .unwrap()
        .with_timezone(&Utc)
}

fn cells(p: Printer, obj: Value) -> Vec<Value> {
    p.cells(&obj, now())
}

fn names(cols: &[Column]) -> Vec<(&str, i64)> {
    cols.iter().map(|c| (c.name.as_str(), c.priority)).collect()
}

fn svc(spec: Value, status: Value) -> Value {
    json!({"metadata": {"name": "web", "creationTimestamp": FIVE_MIN_AGO}, "spec": spec, "status": status})
}

#[test]
fn service_columns_as_kubectl_get_svc_shows_them() {
    assert_eq!(
        names(&Printer::Service.columns()),
        vec![
            ("Name", 0),
            ("Type", 0),
            ("Cluster-IP", 0),
            ("External-IP", 0),
            ("Port(s)", 0),
            ("Age", 0),
            ("Selector", 1)
        ]
    );
}

#[test]
fn service_cells() {
    // (spec, status, [type, cluster-ip, external-ip, ports, selector])
    let cases = [
        (
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                "selector": {"k8s-app": "kube-dns"}}),
            json!({}),
            [
                "ClusterIP",
                "10.96.0.10",
                "<none>",
                "53/UDP,53/TCP",
                "k8s-app=kube-dns",
            ],
        ),
        (
            json!({"type": "LoadBalancer", "clusterIPs": ["10.96.0.5"],
                "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}],
                "selector": {"b": "2", "a": "1"}}),
            json!({}),
            [
                "LoadBalancer",
                "10.96.0.5",
                "<pending>",
                "80:30080/TCP",
                "a=1,b=2",
            ],
        ),
        (
            json!({"type": "LoadBalancer", "clusterIPs": ["10.96.0.5"], "externalIPs": ["198.18.0.9"],
                "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}),
            json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.201"}, {"ip": "198.18.0.200"},
                {"hostname": "nlb.example"}]}}),
            [
                "LoadBalancer",
                "10.96.0.5",
                "198.18.0.200,198.18.0.201,nlb.example,198.18.0.9",
                "80:30080/TCP",
                "<none>",
            ],
        ),
        (
            json!({"type": "NodePort", "clusterIP": "10.96.0.7", "externalIPs": ["198.18.0.9", "198.18.0.8"],
                "ports": [{"port": 8443, "nodePort": 31000, "protocol": "SCTP"}]}),
            json!({}),
            [
                "NodePort",
                "10.96.0.7",
                "198.18.0.9,198.18.0.8",
                "8443:31000/SCTP",
                "<none>",
            ],
        ),
        (
            json!({"type": "ExternalName", "externalName": "db.example.com"}),
            json!({}),
            [
                "ExternalName",
                "<none>",
                "db.example.com",
                "<none>",
                "<none>",
            ],
        ),
        (
            json!({"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"], "ports": []}),
            json!({}),
            ["ClusterIP", "None", "<none>", "<none>", "<none>"],
        ),
    ];
    for (spec, status, want) in cases {
        let got = cells(Printer::Service, svc(spec.clone(), status));
        let want: Vec<Value> = [
            json!("web"),
            json!(want[0]),
            json!(want[1]),
            json!(want[2]),
            json!(want[3]),
            json!("5m"),
            json!(want[4]),
        ]
        .to_vec();
        assert_eq!(got, want, "{spec}");
    }
}

fn pod(spec: Value, status: Value) -> Value {
    json!({"metadata": {"name": "web-1", "creationTimestamp": FIVE_MIN_AGO}, "spec": spec, "status": status})
}

#[test]
fn pod_cells() {
    let one = json!({"containers": [{"name": "echo"}], "nodeName": "n1"});
    let running = json!({"phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}],
        "containerStatuses": [{"name": "echo", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": FIVE_MIN_AGO}}}]});
    // (spec, status, deleting, [ready, status, restarts, ip, node])
    let cases = [
        (
            one.clone(),
            running.clone(),
            false,
            ["1/1", "Running", "0", "10.244.1.5", "n1"],
        ),
        (
            one.clone(),
            running,
            true,
            ["1/1", "Terminating", "0", "10.244.1.5", "n1"],
        ),
        (
            json!({"containers": [{"name": "a"}, {"name": "b"}]}),
            json!({"phase": "Pending"}),
            false,
            ["0/2", "Pending", "0", "<none>", "<none>"],
        ),
        (
            one.clone(),
            json!({"phase": "Running", "containerStatuses": [{"name": "echo", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T00:58:00Z"}}}]}),
            false,
            ["0/1", "CrashLoopBackOff", "3 (2m ago)", "<none>", "n1"],
        ),
        (
            one.clone(),
            json!({"phase": "Succeeded", "containerStatuses": [{"name": "echo", "ready": false,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}),
            false,
            ["0/1", "Completed", "0", "<none>", "n1"],
        ),
        (
            one.clone(),
            json!({"phase": "Failed", "containerStatuses": [{"name": "echo",
                "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}),
            false,
            ["0/1", "Signal:9", "0", "<none>", "n1"],
        ),
        (
            json!({"initContainers": [{"name": "init"}], "containers": [{"name": "echo"}]}),
            json!({"phase": "Pending", "initContainerStatuses": [{"name": "init",
                "state": {"waiting": {"reason": "PodInitializing"}}}]}),
            false,
            ["0/1", "Init:0/1", "0", "<none>", "<none>"],
        ),
        (
            json!({"initContainers": [{"name": "init"}], "containers": [{"name": "echo"}]}),
            json!({"phase": "Pending", "initContainerStatuses": [{"name": "init",
                "state": {"terminated": {"exitCode": 2}}}]}),
            false,
            ["0/1", "Init:ExitCode:2", "0", "<none>", "<none>"],
        ),
        (
            // A sidecar (restartable init container) counts as a container.
            json!({"initContainers": [{"name": "proxy", "restartPolicy": "Always"}],
                "containers": [{"name": "echo"}]}),
            json!({"phase": "Running", "conditions": [{"type": "Initialized", "status": "True"}],
                "initContainerStatuses": [{"name": "proxy", "started": true, "ready": true,
                    "state": {"running": {}}}],
                "containerStatuses": [{"name": "echo", "ready": true, "state": {"running": {}}}]}),
            false,
            ["2/2", "Running", "0", "<none>", "<none>"],
        ),
    ];
    for (spec, status, deleting, want) in cases {
        let mut obj = pod(spec, status);
        if deleting {
            obj["metadata"]["deletionTimestamp"] = json!(NOW);
        }
        let got = cells(Printer::Pod, obj.clone());
        assert_eq!(
            got,
            vec![
                json!("web-1"),
                json!(want[0]),
                json!(want[1]),
                json!(want[2]),
                json!("5m"),
                json!(want[3]),
                json!(want[4]),
                json!("<none>"),
                json!("<none>"),
            ],
            "{obj}"
        );
    }
}

#[test]
fn pod_readiness_gates_and_finished_rows() {
    let obj = pod(
        json!({"containers": [{"name": "c"}], "readinessGates": [{"conditionType": "a"}, {"conditionType": "b"}]}),
        json!({"phase": "Running", "conditions": [{"type": "a", "status": "True"}, {"type": "b", "status": "False"}]}),
    );
    assert_eq!(cells(Printer::Pod, obj.clone())[8], json!("1/2"));
    assert!(super::pod::pod_row_conditions(&obj).is_none());
    let done = pod(json!({}), json!({"phase": "Succeeded"}));
    assert_eq!(
        super::pod::pod_row_conditions(&done).unwrap()[0]["type"],
        "Completed"
    );
}

#[test]
fn node_cells() {
    let node = json!({"metadata": {"name": "n1", "creationTimestamp": FIVE_MIN_AGO,
            "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "lab",
                "node-role.kubernetes.io/": "x"}},
        "spec": {"unschedulable": true},
        "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
            "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "198.18.0.11"}],
            "nodeInfo": {"kubeletVersion": "v1.34.0-berth", "osImage": "", "kernelVersion": "6.1"}}});
    assert_eq!(
        cells(Printer::Node, node),
        vec![
            json!("n1"),
            json!("Ready,SchedulingDisabled"),
            json!("control-plane,lab"),
            json!("5m"),
            json!("v1.34.0-berth"),
            json!("198.18.0.11"),
            json!("<none>"),
            json!("<unknown>"),
            json!("6.1"),
            json!("<unknown>"),
        ]
    );
    let bare = json!({"metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
    let got = cells(Printer::Node, bare);
    assert_eq!(
        (&got[1], &got[2], &got[3]),
        (&json!("NotReady"), &json!("<none>"), &json!("<unknown>"))
    );
    let no_conditions = cells(Printer::Node, json!({"metadata": {"name": "n3"}}));
    assert_eq!(no_conditions[1], json!("Unknown"));
}

#[test]
fn endpoints_cells() {
    let mk = |subsets: Value| json!({"metadata": {"name": "web", "creationTimestamp": FIVE_MIN_AGO}, "subsets": subsets});
    let cases = [
        (json!([]), "<none>"),
        (
            json!([{"addresses": [{"ip": "10.244.1.5"}, {"ip": "10.244.2.5"}], "ports": [{"port": 8080}]}]),
            "10.244.1.5:8080,10.244.2.5:8080",
        ),
        (
            json!([{"addresses": [{"ip": "10.244.1.5"}, {"ip": "10.244.2.5"}],
                "ports": [{"port": 8080}, {"port": 9090}]}]),
            "10.244.1.5:8080,10.244.2.5:8080,10.244.1.5:9090 + 1 more...",
        ),
        (
            json!([{"addresses": [{"ip": "fd00::5"}], "ports": [{"port": 80}]}]),
            "[fd00::5]:80",
        ),
        (json!([{"addresses": [{"ip": "10.244.1.5"}]}]), "10.244.1.5"),
        (
            json!([{"notReadyAddresses": [{"ip": "10.244.1.5"}], "ports": [{"port": 80}]}]),
            "<none>",
        ),
    ];
    for (subsets, want) in cases {
        assert_eq!(
            cells(Printer::Endpoints, mk(subsets.clone())),
            vec![json!("web"), json!(want), json!("5m")],
            "{subsets}"
        );
    }
}

#[test]
fn endpoint_slice_cells() {
    let slice = json!({"metadata": {"name": "web-abc", "creationTimestamp": FIVE_MIN_AGO},
        "addressType": "IPv4",
        "ports": [{"port": 8080, "name": "http"}, {"name": "named"}, {}, {"port": 1}],
        "endpoints": [{"addresses": ["10.244.1.5"]}, {"addresses": ["10.244.2.5"]}]});
    assert_eq!(
        cells(Printer::EndpointSlice, slice),
        vec![
            json!("web-abc"),
            json!("IPv4"),
            json!("8080,named,* + 1 more..."),
            json!("10.244.1.5,10.244.2.5"),
            json!("5m"),
        ]
    );
    let empty = json!({"metadata": {"name": "e"}, "addressType": "IPv6"});
    let got = cells(Printer::EndpointSlice, empty);
    assert_eq!((&got[2], &got[3]), (&json!("<unset>"), &json!("<unset>")));
}

#[test]
fn event_cells_old_and_new_style() {
    assert_eq!(
        names(&Printer::Event.columns()),
        vec![
            ("Last Seen", 0),
            ("Type", 0),
            ("Reason", 0),
            ("Object", 0),
            ("Subobject", 1),
            ("Source", 1),
            ("Message", 0),
            ("First Seen", 1),
            ("Count", 1),
            ("Name", 1)
        ]
    );
    let old_style = json!({"metadata": {"name": "web.1"}, "type": "Warning", "reason": "Failed",
        "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{echo}"},
        "source": {"component": "kubelet", "host": "n1"}, "message": " pull failed \n",
        "firstTimestamp": "2026-01-01T00:40:00Z", "lastTimestamp": FIVE_MIN_AGO, "count": 4});
    assert_eq!(
        cells(Printer::Event, old_style),
        vec![
            json!("5m"),
            json!("Warning"),
            json!("Failed"),
            json!("pod/web-1"),
            json!("spec.containers{echo}"),
            json!("kubelet, n1"),
            json!("pull failed"),
            json!("20m"),
            json!(4),
            json!("web.1"),
        ]
    );
    // What berth's controller writes through events.k8s.io, as stored (core shape).
    let new_style = json!({"metadata": {"name": "web.2"}, "type": "Normal", "reason": "EnsuredLoadBalancer",
        "involvedObject": {"kind": "Service", "name": "web"}, "source": {},
        "reportingComponent": "berth-controller", "reportingInstance": "controller-0",
        "message": "assigned", "eventTime": "2026-01-01T00:50:00.000000Z"});
    let got = cells(Printer::Event, new_style.clone());
    assert_eq!(
        got,
        vec![
            json!("10m"),
            json!("Normal"),
            json!("EnsuredLoadBalancer"),
            json!("service/web"),
            json!(""),
            json!("berth-controller, controller-0"),
            json!("assigned"),
            json!("10m"),
            json!(1),
            json!("web.2"),
        ]
    );
    let mut series = new_style;
    series["series"] = json!({"count": 7, "lastObservedTime": "2026-01-01T00:59:00.000000Z"});
    let got = cells(Printer::Event, series);
    assert_eq!((&got[0], &got[8]), (&json!("60s"), &json!(7)));
    let no_name = cells(
        Printer::Event,
        json!({"metadata": {"name": "x"}, "involvedObject": {"kind": "Node"}}),
    );
    assert_eq!(
        (&no_name[0], &no_name[3]),
        (&json!("<unknown>"), &json!("node"))
    );
}

#[test]
fn service_cidr_cells_join_the_cidrs() {
    let meta = json!({"name": "kubernetes", "creationTimestamp": FIVE_MIN_AGO});
    assert_eq!(
        cells(
            Printer::ServiceCidr,
            json!({"metadata": meta, "spec": {"cidrs": ["10.96.0.0/16", "fd00:96::/112"]}})
        ),
        vec![
            json!("kubernetes"),
            json!("10.96.0.0/16,fd00:96::/112"),
            json!("5m")
        ]
    );
    assert_eq!(
        cells(Printer::ServiceCidr, json!({"metadata": meta, "spec": {}}))[1],
        json!("")
    );
    let names: Vec<String> = Printer::ServiceCidr
        .columns()
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(names, ["Name", "CIDRs", "Age"]);
}

#[test]
fn lease_namespace_configmap_cells() {
    let meta = json!({"name": "x", "creationTimestamp": FIVE_MIN_AGO});
    assert_eq!(
        cells(
            Printer::Lease,
            json!({"metadata": meta, "spec": {"holderIdentity": "controller-0"}})
        ),
        vec![json!("x"), json!("controller-0"), json!("5m")]
    );
    assert_eq!(
        cells(Printer::Lease, json!({"metadata": meta, "spec": {}}))[1],
        json!("")
    );
    assert_eq!(
        cells(
            Printer::Namespace,
            json!({"metadata": meta, "status": {"phase": "Active"}})
        ),
        vec![json!("x"), json!("Active"), json!("5m")]
    );
    assert_eq!(
        cells(
            Printer::ConfigMap,
            json!({"metadata": meta, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}})
        ),
        vec![json!("x"), json!(3), json!("5m")]
    );
}

#[test]
fn deployment_and_replica_set_cells_as_kubectl_shows_them() {
    let spec = json!({"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
        "template": {"spec": {"containers": [
            {"name": "nginx", "image": "nginx"}, {"name": "side", "image": "busybox:1"}]}}});
    let deployment = json!({"metadata": {"name": "web", "creationTimestamp": FIVE_MIN_AGO},
        "spec": spec, "status": {"replicas": 4, "readyReplicas": 2, "updatedReplicas": 1,
        "availableReplicas": 2}});
    assert_eq!(
        names(&Printer::Deployment.columns()),
        vec![
            ("Name", 0),
            ("Ready", 0),
            ("Up-to-date", 0),
            ("Available", 0),
            ("Age", 0),
            ("Containers", 1),
            ("Images", 1),
            ("Selector", 1)
        ]
    );
    assert_eq!(
        cells(Printer::Deployment, deployment.clone()),
        vec![
            json!("web"),
            json!("2/3"),
            json!(1),
            json!(2),
            json!("5m"),
            json!("nginx,side"),
            json!("nginx,busybox:1"),
            json!("app=web")
        ]
    );
    assert_eq!(
        names(&Printer::ReplicaSet.columns())[..5],
        [
            ("Name", 0),
            ("Desired", 0),
            ("Current", 0),
            ("Ready", 0),
            ("Age", 0)
        ]
    );
    assert_eq!(
        cells(Printer::ReplicaSet, deployment)[1..4],
        [json!(3), json!(4), json!(2)]
    );
    // Before the controller wrote any status; replicas unset means the default of one.
    let fresh = json!({"metadata": {"name": "web"}, "spec": {}});
    assert_eq!(cells(Printer::Deployment, fresh.clone())[1], json!("0/1"));
    assert_eq!(
        cells(Printer::ReplicaSet, fresh.clone())[1..4],
        [json!(1), json!(0), json!(0)]
    );
    assert_eq!(cells(Printer::ReplicaSet, fresh)[7], json!("<none>"));
}

#[test]
fn every_built_in_prints_as_many_cells_as_it_has_columns() {
    for info in built_ins() {
        let layout = Layout::of(&info);
        let obj = json!({"metadata": {"name": "x"}});
        assert_eq!(
            layout.cells(&obj, &obj, now()).len(),
            layout.columns().len(),
            "{}",
            info.plural
        );
    }
    let crd = built_ins().into_iter().find(|i| i.is_crd()).unwrap();
    assert_eq!(Layout::of(&crd), Layout::Default);
    assert_eq!(
        names(&Layout::Default.columns()),
        vec![("Name", 0), ("Created At", 0)]
    );
}

fn mk_crd(columns: Value) -> Value {
    json!({"spec": {"group": "berth.dev", "scope": "Cluster",
        "names": {"plural": "ippools", "kind": "IPPool"},
        "versions": [{"name": "v1alpha1", "served": true, "storage": true,
            "additionalPrinterColumns": columns}]}})
}

#[test]
fn custom_resources_print_their_crd_columns() {
    let crd = mk_crd(json!([
        {"name": "Addresses", "type": "string", "jsonPath": ".spec.addresses"},
        {"name": "Auto Assign", "type": "boolean", "jsonPath": ".spec.autoAssign"},
        {"name": "Assigned (v4)", "type": "integer", "jsonPath": ".status.assignedIPv4"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "priority": 1},
        {"name": "Share", "type": "number", "jsonPath": "{.status.share}"},
        {"name": "Size", "type": "string", "jsonPath": ".status.assignedIPv4"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Broken", "type": "date", "jsonPath": ".spec.when"},
        {"name": "", "type": "string", "jsonPath": ".spec.skipped"}
    ]));
    let info = from_crd(&crd).remove(0);
    let layout = Layout::of(&info);
    assert_eq!(
        names(&layout.columns()),
        vec![
            ("Name", 0),
            ("Addresses", 0),
            ("Auto Assign", 0),
            ("Assigned (v4)", 0),
            ("Ready", 1),
            ("Share", 0),
            ("Size", 0),
            ("Age", 0),
            ("Broken", 0)
        ]
    );
    let pool = json!({"metadata": {"name": "default", "creationTimestamp": FIVE_MIN_AGO},
        "spec": {"addresses": ["198.18.0.200-198.18.0.250"], "autoAssign": true, "when": "soon"},
        "status": {"assignedIPv4": 2, "share": 0.5,
            "conditions": [{"type": "Overlap", "status": "False"}, {"type": "Ready", "status": "True"}]}});
    assert_eq!(
        layout.cells(&pool, &pool, now()),
        vec![
            json!("default"),
            json!("[\"198.18.0.200-198.18.0.250\"]"),
            json!(true),
            json!(2),
            json!("True"),
            json!(0.5),
            json!("2"),
            json!("5m"),
            json!("<invalid>"),
        ]
    );
    let bare = json!({"metadata": {"name": "empty"}});
    let got = layout.cells(&bare, &bare, now());
    assert!(got[1..].iter().all(Value::is_null), "{got:?}");
}

#[test]
fn custom_resources_without_columns_show_their_age() {
    let info = from_crd(&mk_crd(json!(null))).remove(0);
    let layout = Layout::of(&info);
    assert_eq!(names(&layout.columns()), vec![("Name", 0), ("Age", 0)]);
    let obj = json!({"metadata": {"name": "p", "creationTimestamp": FIVE_MIN_AGO}});
    assert_eq!(
        layout.cells(&obj, &obj, now()),
        vec![json!("p"), json!("5m")]
    );
}

#[test]
fn rows_carry_the_object_as_asked() {
    let layout = Layout::BuiltIn(Printer::Lease);
    let obj = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l", "resourceVersion": "7"}, "spec": {}});
    let meta = layout.row(&obj, &obj, now(), "meta.k8s.io/v1", IncludeObject::Metadata);
    assert_eq!(
        meta["object"],
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": "l", "resourceVersion": "7"}})
    );
    let full = layout.row(&obj, &obj, now(), "meta.k8s.io/v1", IncludeObject::Object);
    assert_eq!(full["object"], obj);
    let none = layout.row(&obj, &obj, now(), "meta.k8s.io/v1", IncludeObject::None);
    assert!(none.get("object").is_none());
    let t = table(
        "meta.k8s.io/v1",
        &layout.columns(),
        vec![none],
        json!({"resourceVersion": "7"}),
    );
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["columnDefinitions"][0]["format"], "name");
    assert_eq!(t["columnDefinitions"][1]["name"], "Holder");
}

#[test]
fn negotiation_follows_the_clients_order() {
    const KUBECTL: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let table_v1 = Wanted::Table {
        api_version: "meta.k8s.io/v1",
        include: IncludeObject::Metadata,
    };
    let cases: &[(Option<&str>, Result<Wanted, u16>)] = &[
        (None, Ok(Wanted::Json)),
        (Some(""), Ok(Wanted::Json)),
        (Some("application/json"), Ok(Wanted::Json)),
        (Some("*/*"), Ok(Wanted::Json)),
        (Some(KUBECTL), Ok(table_v1)),
        (
            Some("application/json;as=Table;v=v1beta1;g=meta.k8s.io"),
            Ok(Wanted::Table {
                api_version: "meta.k8s.io/v1beta1",
                include: IncludeObject::Metadata,
            }),
        ),
        (
            Some("application/vnd.kubernetes.protobuf,application/json"),
            Ok(Wanted::Json),
        ),
        (Some("application/vnd.kubernetes.protobuf"), Err(406)),
        (
            Some("application/json;as=Table;v=v2;g=meta.k8s.io"),
            Err(406),
        ),
        (
            Some("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            Ok(Wanted::Metadata {
                api_version: "meta.k8s.io/v1",
            }),
        ),
        (
            Some("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1"),
            Ok(Wanted::Metadata {
                api_version: "meta.k8s.io/v1beta1",
            }),
        ),
        (
            Some("application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io,application/json"),
            Ok(Wanted::Json),
        ),
        (Some("application/json;as=Table;v=v1;g=example.com"), Err(406)),
        (
            Some("application/json, application/json;as=Table;v=v1;g=meta.k8s.io"),
            Ok(Wanted::Json),
        ),
    ];
    for (accept, want) in cases {
        let got = negotiate(*accept, None).map_err(|e| e.code);
        assert_eq!(&got, want, "{accept:?}");
    }
    assert_eq!(
        negotiate(Some(KUBECTL), Some("None")).unwrap(),
        Wanted::Table {
            api_version: "meta.k8s.io/v1",
            include: IncludeObject::None
        }
    );
    assert_eq!(negotiate(Some(KUBECTL), Some("All")).unwrap_err().code, 400);
    assert_eq!(
        negotiate(Some("application/json"), Some("All")).unwrap(),
        Wanted::Json,
        "only Tables read includeObject"
    );
}

#[test]
fn kubectl_jsonpaths_become_queries() {
    assert_eq!(query_path(".spec.x"), "$.spec.x");
    assert_eq!(query_path("{.spec.x}"), "$.spec.x");
    assert_eq!(query_path("spec.x"), "$.spec.x");
    assert_eq!(query_path("$.spec.x"), "$.spec.x");
}
