//! Deployments from protobuf, as `kubectl create deployment` sends them. The pod template keeps
//! what kubectl's generator and a Go client building a simple workload set (containers with
//! name, image, command, args, ports, env, resources, pull policy and probes; labels,
//! annotations, node selector, grace period); any other field of the template is refused by
//! name rather than silently dropped, so such a client knows to send JSON.

use super::{list, object_meta, undecodable, Fields};
use crate::error::ApiError;
use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// A pointer to an `IntOrString` (`maxUnavailable`, a probe's port): present whenever it was
/// sent, zero included (`maxUnavailable: 0` means no pod may be unavailable).
fn int_or_string_set(v: Option<IntOrString>) -> Value {
    match v {
        None => Value::Null,
        Some(IntOrString {
            r#type,
            int_val,
            str_val,
        }) => match r#type {
            Some(1) => json!(str_val.unwrap_or_default()),
            _ => json!(int_val.unwrap_or_default()),
        },
    }
}

/// The first field named whose value is set, as an error.
fn refuse_set(kind: &str, fields: &[(&str, bool)]) -> Result<(), ApiError> {
    match fields.iter().find(|(_, set)| *set) {
        Some((name, _)) => Err(undecodable(format!(
            "{kind}.{name} is not decoded by the lab from protobuf; send the object as application/json"
        ))),
        None => Ok(()),
    }
}

pub(super) fn deployment(d: apps::Deployment) -> Result<Value, ApiError> {
    let apps::Deployment {
        metadata,
        spec,
        status,
    } = d;
    let spec = match spec {
        Some(s) => deployment_spec(s)?,
        None => Value::Null,
    };
    let status = status.map_or(Value::Null, deployment_status);
    Ok(Fields::default()
        .nested("metadata", object_meta(metadata))
        .nested("spec", spec)
        .nested("status", status)
        .done())
}

fn deployment_spec(s: apps::DeploymentSpec) -> Result<Value, ApiError> {
    let apps::DeploymentSpec {
        replicas,
        selector,
        template,
        strategy,
        min_ready_seconds,
        revision_history_limit,
        paused,
        progress_deadline_seconds,
    } = s;
    let template = match template {
        Some(t) => pod_template(t)?,
        None => Value::Null,
    };
    let strategy = strategy.map_or(Value::Null, |s| {
        let apps::DeploymentStrategy {
            r#type,
            rolling_update,
        } = s;
        let rolling = rolling_update.map_or(Value::Null, |r| {
            let apps::RollingUpdateDeployment {
                max_unavailable,
                max_surge,
            } = r;
            Fields::default()
                .nested("maxUnavailable", int_or_string_set(max_unavailable))
                .nested("maxSurge", int_or_string_set(max_surge))
                .done()
        });
        Fields::default()
            .text("type", r#type)
            .nested("rollingUpdate", rolling)
            .done()
    });
    Ok(Fields::default()
        .some("replicas", replicas)
        .nested("selector", selector.map_or(Value::Null, label_selector))
        .nested("template", template)
        .nested("strategy", strategy)
        .int("minReadySeconds", min_ready_seconds.map(i64::from))
        .some("revisionHistoryLimit", revision_history_limit)
        .flag("paused", paused)
        .some("progressDeadlineSeconds", progress_deadline_seconds)
        .done())
}

fn deployment_status(s: apps::DeploymentStatus) -> Value {
    let apps::DeploymentStatus {
        observed_generation,
        replicas,
        updated_replicas,
        ready_replicas,
        available_replicas,
        unavailable_replicas,
        terminating_replicas,
        conditions,
        collision_count,
    } = s;
    let condition = |c: apps::DeploymentCondition| {
        let apps::DeploymentCondition {
            r#type,
            status,
            last_update_time,
            last_transition_time,
            reason,
            message,
        } = c;
        Fields::default()
            .some("type", r#type)
            .some("status", status)
            .some("lastUpdateTime", super::time(last_update_time))
            .some("lastTransitionTime", super::time(last_transition_time))
            .text("reason", reason)
            .text("message", message)
            .done()
    };
    Fields::default()
        .int("observedGeneration", observed_generation)
        .int("replicas", replicas.map(i64::from))
        .int("updatedReplicas", updated_replicas.map(i64::from))
        .int("readyReplicas", ready_replicas.map(i64::from))
        .int("availableReplicas", available_replicas.map(i64::from))
        .int("unavailableReplicas", unavailable_replicas.map(i64::from))
        .some("terminatingReplicas", terminating_replicas)
        .nested(
            "conditions",
            Value::Array(conditions.into_iter().map(condition).collect()),
        )
        .some("collisionCount", collision_count)
        .done()
}

pub(super) fn label_selector(s: meta::LabelSelector) -> Value {
    let meta::LabelSelector {
        match_labels,
        match_expressions,
    } = s;
    let requirement = |r: meta::LabelSelectorRequirement| {
        let meta::LabelSelectorRequirement {
            key,
            operator,
            values,
        } = r;
        Fields::default()
            .some("key", key)
            .some("operator", operator)
            .strings("values", values)
            .done()
    };
    Fields::default()
        .map("matchLabels", match_labels)
        .nested(
            "matchExpressions",
            Value::Array(match_expressions.into_iter().map(requirement).collect()),
        )
        .done()
}

fn pod_template(t: core::PodTemplateSpec) -> Result<Value, ApiError> {
    let core::PodTemplateSpec { metadata, spec } = t;
    let spec = match spec {
        Some(s) => pod_spec(s)?,
        None => Value::Null,
    };
    // The template's metadata keeps an empty object, as Go's JSON does for a struct field.
    let mut out = Map::new();
    out.insert("metadata".to_owned(), object_meta(metadata));
    if !spec.is_null() {
        out.insert("spec".to_owned(), spec);
    }
    Ok(Value::Object(out))
}

fn pod_spec(s: core::PodSpec) -> Result<Value, ApiError> {
    let core::PodSpec {
        volumes,
        init_containers,
        containers,
        ephemeral_containers,
        restart_policy,
        termination_grace_period_seconds,
        active_deadline_seconds,
        dns_policy,
        node_selector,
        service_account_name,
        service_account,
        automount_service_account_token,
        node_name,
        host_network,
        host_pid,
        host_ipc,
        share_process_namespace,
        security_context,
        image_pull_secrets,
        hostname,
        subdomain,
        affinity,
        scheduler_name,
        tolerations,
        host_aliases,
        priority_class_name,
        priority,
        dns_config,
        readiness_gates,
        runtime_class_name,
        enable_service_links,
        preemption_policy,
        overhead,
        topology_spread_constraints,
        set_hostname_as_fqdn,
        os,
        host_users,
        scheduling_gates,
        resource_claims,
        resources,
        hostname_override,
        workload_ref,
    } = s;
    refuse_set(
        "PodSpec",
        &[
            ("volumes", !volumes.is_empty()),
            ("initContainers", !init_containers.is_empty()),
            ("ephemeralContainers", !ephemeral_containers.is_empty()),
            ("activeDeadlineSeconds", active_deadline_seconds.is_some()),
            (
                "automountServiceAccountToken",
                automount_service_account_token.is_some(),
            ),
            ("hostNetwork", host_network == Some(true)),
            ("hostPID", host_pid == Some(true)),
            ("hostIPC", host_ipc == Some(true)),
            ("shareProcessNamespace", share_process_namespace.is_some()),
            (
                "securityContext",
                security_context.is_some_and(|c| c != core::PodSecurityContext::default()),
            ),
            ("imagePullSecrets", !image_pull_secrets.is_empty()),
            (
                "hostname",
                hostname.as_deref().is_some_and(|h| !h.is_empty()),
            ),
            (
                "subdomain",
                subdomain.as_deref().is_some_and(|h| !h.is_empty()),
            ),
            ("affinity", affinity.is_some()),
            ("tolerations", !tolerations.is_empty()),
            ("hostAliases", !host_aliases.is_empty()),
            ("priority", priority.is_some()),
            ("dnsConfig", dns_config.is_some()),
            ("readinessGates", !readiness_gates.is_empty()),
            ("runtimeClassName", runtime_class_name.is_some()),
            ("enableServiceLinks", enable_service_links.is_some()),
            ("preemptionPolicy", preemption_policy.is_some()),
            ("overhead", !overhead.is_empty()),
            (
                "topologySpreadConstraints",
                !topology_spread_constraints.is_empty(),
            ),
            ("setHostnameAsFQDN", set_hostname_as_fqdn.is_some()),
            ("os", os.is_some()),
            ("hostUsers", host_users.is_some()),
            ("schedulingGates", !scheduling_gates.is_empty()),
            ("resourceClaims", !resource_claims.is_empty()),
            ("resources", resources.is_some()),
            ("hostnameOverride", hostname_override.is_some()),
            ("workloadRef", workload_ref.is_some()),
        ],
    )?;
    let containers: Result<Vec<Value>, ApiError> = containers.into_iter().map(container).collect();
    Ok(Fields::default()
        .nested("containers", Value::Array(containers?))
        .text("restartPolicy", restart_policy)
        .some(
            "terminationGracePeriodSeconds",
            termination_grace_period_seconds,
        )
        .text("dnsPolicy", dns_policy)
        .map("nodeSelector", node_selector)
        .text("serviceAccountName", service_account_name)
        .text("serviceAccount", service_account)
        .text("nodeName", node_name)
        .text("schedulerName", scheduler_name)
        .text("priorityClassName", priority_class_name)
        .done())
}

fn container(c: core::Container) -> Result<Value, ApiError> {
    let core::Container {
        name,
        image,
        command,
        args,
        working_dir,
        ports,
        env_from,
        env,
        resources,
        resize_policy,
        restart_policy,
        restart_policy_rules,
        volume_mounts,
        volume_devices,
        liveness_probe,
        readiness_probe,
        startup_probe,
        lifecycle,
        termination_message_path,
        termination_message_policy,
        image_pull_policy,
        security_context,
        stdin,
        stdin_once,
        tty,
    } = c;
    refuse_set(
        "Container",
        &[
            ("envFrom", !env_from.is_empty()),
            ("resizePolicy", !resize_policy.is_empty()),
            ("restartPolicy", restart_policy.is_some()),
            ("restartPolicyRules", !restart_policy_rules.is_empty()),
            ("volumeMounts", !volume_mounts.is_empty()),
            ("volumeDevices", !volume_devices.is_empty()),
            ("livenessProbe", liveness_probe.is_some()),
            ("startupProbe", startup_probe.is_some()),
            ("lifecycle", lifecycle.is_some()),
            ("securityContext", security_context.is_some()),
        ],
    )?;
    let port = |p: core::ContainerPort| {
        let core::ContainerPort {
            name,
            host_port,
            container_port,
            protocol,
            host_ip,
        } = p;
        Fields::default()
            .text("name", name)
            .int("hostPort", host_port.map(i64::from))
            .some("containerPort", container_port)
            .text("protocol", protocol)
            .text("hostIP", host_ip)
            .done()
    };
    let env_var = |e: core::EnvVar| -> Result<Value, ApiError> {
        let core::EnvVar {
            name,
            value,
            value_from,
        } = e;
        refuse_set("EnvVar", &[("valueFrom", value_from.is_some())])?;
        Ok(Fields::default()
            .some("name", name)
            .text("value", value)
            .done())
    };
    let env: Result<Vec<Value>, ApiError> = env.into_iter().map(env_var).collect();
    let readiness = match readiness_probe {
        Some(p) => probe(p)?,
        None => Value::Null,
    };
    let resources = match resources {
        Some(r) => Some(resource_requirements(r)?),
        None => None,
    };
    Ok(Fields::default()
        .some("name", name)
        .text("image", image)
        .strings("command", command)
        .strings("args", args)
        .text("workingDir", working_dir)
        .nested("ports", list(ports, port))
        .nested("env", Value::Array(env?))
        // Go's encoder writes `resources: {}` (a struct without omitempty), as kubectl sends it.
        .some("resources", resources)
        .nested("readinessProbe", readiness)
        .text("terminationMessagePath", termination_message_path)
        .text("terminationMessagePolicy", termination_message_policy)
        .text("imagePullPolicy", image_pull_policy)
        .flag("stdin", stdin)
        .flag("stdinOnce", stdin_once)
        .flag("tty", tty)
        .done())
}

fn resource_requirements(r: core::ResourceRequirements) -> Result<Value, ApiError> {
    let core::ResourceRequirements {
        limits,
        requests,
        claims,
    } = r;
    refuse_set("ResourceRequirements", &[("claims", !claims.is_empty())])?;
    let quantities = |m: BTreeMap<String, Quantity>| -> Value {
        m.into_iter()
            .map(|(k, Quantity { string })| (k, json!(string.unwrap_or_default())))
            .collect::<Map<String, Value>>()
            .into()
    };
    Ok(Fields::default()
        .nested("limits", quantities(limits))
        .nested("requests", quantities(requests))
        .done())
}

/// A readiness probe: the lab kubelet follows `httpGet`; the others are kept as sent.
fn probe(p: core::Probe) -> Result<Value, ApiError> {
    let core::Probe {
        handler,
        initial_delay_seconds,
        timeout_seconds,
        period_seconds,
        success_threshold,
        failure_threshold,
        termination_grace_period_seconds,
    } = p;
    let handler = handler.unwrap_or_default();
    let core::ProbeHandler {
        exec,
        http_get,
        tcp_socket,
        grpc,
    } = handler;
    refuse_set(
        "Probe",
        &[
            ("exec", exec.is_some()),
            ("tcpSocket", tcp_socket.is_some()),
            ("grpc", grpc.is_some()),
        ],
    )?;
    let http_get = match http_get {
        Some(h) => {
            let core::HttpGetAction {
                path,
                port,
                host,
                scheme,
                http_headers,
            } = h;
            refuse_set(
                "HTTPGetAction",
                &[("httpHeaders", !http_headers.is_empty())],
            )?;
            Fields::default()
                .text("path", path)
                .nested("port", int_or_string_set(port))
                .text("host", host)
                .text("scheme", scheme)
                .done()
        }
        None => Value::Null,
    };
    let int = |v: Option<i32>| v.map(i64::from);
    Ok(Fields::default()
        .nested("httpGet", http_get)
        .int("initialDelaySeconds", int(initial_delay_seconds))
        .int("timeoutSeconds", int(timeout_seconds))
        .int("periodSeconds", int(period_seconds))
        .int("successThreshold", int(success_threshold))
        .int("failureThreshold", int(failure_threshold))
        .some(
            "terminationGracePeriodSeconds",
            termination_grace_period_seconds,
        )
        .done())
}
