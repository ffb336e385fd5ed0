//! Nodes from protobuf, as Go kubelets send them.

use super::{object_meta, time, Fields};
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

fn each<T>(items: Vec<T>, f: impl Fn(T) -> Value) -> Value {
    Value::Array(items.into_iter().map(f).collect())
}

/// A `ResourceList`: quantities as their canonical strings.
fn resources(list: BTreeMap<String, Quantity>) -> Value {
    let map: Map<String, Value> = list
        .into_iter()
        .map(|(k, Quantity { string })| (k, json!(string.unwrap_or_default())))
        .collect();
    Value::Object(map)
}

pub(super) fn node(n: core::Node) -> Value {
    let core::Node {
        metadata,
        spec,
        status,
    } = n;
    Fields::default()
        .nested("metadata", object_meta(metadata))
        .nested("spec", spec.map_or(Value::Null, node_spec))
        .nested("status", status.map_or(Value::Null, node_status))
        .done()
}

fn node_spec(s: core::NodeSpec) -> Value {
    let core::NodeSpec {
        pod_cidr,
        pod_cid_rs,
        provider_id,
        unschedulable,
        taints,
        config_source,
        external_id,
    } = s;
    let taint = |t: core::Taint| {
        let core::Taint {
            key,
            value,
            effect,
            time_added,
        } = t;
        Fields::default()
            .some("key", key)
            .text("value", value)
            .some("effect", effect)
            .some("timeAdded", time(time_added))
            .done()
    };
    let config_source = config_source.map_or(Value::Null, node_config_source);
    Fields::default()
        .text("podCIDR", pod_cidr)
        .strings("podCIDRs", pod_cid_rs)
        .text("providerID", provider_id)
        .flag("unschedulable", unschedulable)
        .nested("taints", each(taints, taint))
        .nested("configSource", config_source)
        .text("externalID", external_id)
        .done()
}

fn node_config_source(s: core::NodeConfigSource) -> Value {
    let core::NodeConfigSource { config_map } = s;
    let config_map = config_map.map_or(Value::Null, |c| {
        let core::ConfigMapNodeConfigSource {
            namespace,
            name,
            uid,
            resource_version,
            kubelet_config_key,
        } = c;
        Fields::default()
            .some("namespace", namespace)
            .some("name", name)
            .text("uid", uid)
            .text("resourceVersion", resource_version)
            .some("kubeletConfigKey", kubelet_config_key)
            .done()
    });
    Fields::default().nested("configMap", config_map).done()
}

fn node_status(s: core::NodeStatus) -> Value {
    let core::NodeStatus {
        capacity,
        allocatable,
        phase,
        conditions,
        addresses,
        daemon_endpoints,
        node_info,
        images,
        volumes_in_use,
        volumes_attached,
        config,
        runtime_handlers,
        features,
        declared_features,
    } = s;
    let condition = |c: core::NodeCondition| {
        let core::NodeCondition {
            r#type,
            status,
            last_heartbeat_time,
            last_transition_time,
            reason,
            message,
        } = c;
        Fields::default()
            .some("type", r#type)
            .some("status", status)
            .some("lastHeartbeatTime", time(last_heartbeat_time))
            .some("lastTransitionTime", time(last_transition_time))
            .text("reason", reason)
            .text("message", message)
            .done()
    };
    let address = |a: core::NodeAddress| {
        let core::NodeAddress { r#type, address } = a;
        Fields::default()
            .some("type", r#type)
            .some("address", address)
            .done()
    };
    // Go's struct: always encoded; the port's JSON name is `Port`.
    let core::NodeDaemonEndpoints { kubelet_endpoint } = daemon_endpoints.unwrap_or_default();
    let core::DaemonEndpoint { port } = kubelet_endpoint.unwrap_or_default();
    let daemon_endpoints = json!({"kubeletEndpoint": {"Port": port.unwrap_or_default()}});
    let image = |i: core::ContainerImage| {
        let core::ContainerImage { names, size_bytes } = i;
        Fields::default()
            .strings("names", names)
            .int("sizeBytes", size_bytes)
            .done()
    };
    let attached = |v: core::AttachedVolume| {
        let core::AttachedVolume { name, device_path } = v;
        Fields::default()
            .some("name", name)
            .some("devicePath", device_path)
            .done()
    };
    let config = config.map_or(Value::Null, |c| {
        let core::NodeConfigStatus {
            assigned,
            active,
            last_known_good,
            error,
        } = c;
        let source = |s: Option<core::NodeConfigSource>| s.map_or(Value::Null, node_config_source);
        Fields::default()
            .nested("assigned", source(assigned))
            .nested("active", source(active))
            .nested("lastKnownGood", source(last_known_good))
            .text("error", error)
            .done()
    });
    let handler = |h: core::NodeRuntimeHandler| {
        let core::NodeRuntimeHandler { name, features } = h;
        let features = features.map_or(Value::Null, |f| {
            let core::NodeRuntimeHandlerFeatures {
                recursive_read_only_mounts,
                user_namespaces,
            } = f;
            Fields::default()
                .some("recursiveReadOnlyMounts", recursive_read_only_mounts)
                .some("userNamespaces", user_namespaces)
                .done()
        });
        Fields::default()
            .some("name", name)
            .nested("features", features)
            .done()
    };
    let features = features.map_or(Value::Null, |f| {
        let core::NodeFeatures {
            supplemental_groups_policy,
        } = f;
        Fields::default()
            .some("supplementalGroupsPolicy", supplemental_groups_policy)
            .done()
    });
    let mut out = Fields::default()
        .nested("capacity", resources(capacity))
        .nested("allocatable", resources(allocatable))
        .text("phase", phase)
        .nested("conditions", each(conditions, condition))
        .nested("addresses", each(addresses, address))
        .nested("images", each(images, image))
        .strings("volumesInUse", volumes_in_use)
        .nested("volumesAttached", each(volumes_attached, attached))
        .nested("config", config)
        .nested("runtimeHandlers", each(runtime_handlers, handler))
        .nested("features", features)
        .strings("declaredFeatures", declared_features);
    out.0.insert("daemonEndpoints".to_owned(), daemon_endpoints);
    out.0.insert(
        "nodeInfo".to_owned(),
        node_info.map_or(json!({}), system_info),
    );
    out.done()
}

/// `NodeSystemInfo`: strings Go always encodes.
fn system_info(i: core::NodeSystemInfo) -> Value {
    let core::NodeSystemInfo {
        machine_id,
        system_uuid,
        boot_id,
        kernel_version,
        os_image,
        container_runtime_version,
        kubelet_version,
        kube_proxy_version,
        operating_system,
        architecture,
        swap,
    } = i;
    let text = |v: Option<String>| json!(v.unwrap_or_default());
    let swap = swap.map_or(Value::Null, |s| {
        let core::NodeSwapStatus { capacity } = s;
        Fields::default().some("capacity", capacity).done()
    });
    let mut out = Fields::default().nested("swap", swap);
    for (key, value) in [
        ("machineID", machine_id),
        ("systemUUID", system_uuid),
        ("bootID", boot_id),
        ("kernelVersion", kernel_version),
        ("osImage", os_image),
        ("containerRuntimeVersion", container_runtime_version),
        ("kubeletVersion", kubelet_version),
        ("kubeProxyVersion", kube_proxy_version),
        ("operatingSystem", operating_system),
        ("architecture", architecture),
    ] {
        out.0.insert(key.to_owned(), text(value));
    }
    out.done()
}
