//! `printPod`: the most involved of upstream's printers, on its own.

use super::age::since;
use super::text::str_at;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// `printPod`: readiness counts, the status reason (init containers, waiting and terminated
/// states, `Terminating`), restarts, and the wide columns.
pub(super) fn pod_cells(obj: &Value, name: Value, age: Value, now: DateTime<Utc>) -> Vec<Value> {
    let spec = &obj["spec"];
    let status = &obj["status"];
    let phase = str_at(&status["phase"]);
    let mut reason = status["reason"]
        .as_str()
        .filter(|r| !r.is_empty())
        .unwrap_or(phase)
        .to_owned();
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    if conditions
        .iter()
        .any(|c| c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated")
    {
        reason = "SchedulingGated".to_owned();
    }
    let init_specs = spec["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // Sidecars: init containers that restart always count as containers.
    let restartable = |container: &str| {
        init_specs
            .iter()
            .any(|c| c["name"] == container && c["restartPolicy"] == "Always")
    };
    let total = spec["containers"].as_array().map_or(0, Vec::len)
        + init_specs
            .iter()
            .filter(|c| c["restartPolicy"] == "Always")
            .count();
    let mut ready = 0;
    let mut restarts: i64 = 0;
    let mut sidecar_restarts: i64 = 0;
    let mut last_restart: Option<String> = None;
    let mut last_sidecar_restart: Option<String> = None;
    let later = |cur: &mut Option<String>, t: Option<&str>| {
        if let Some(t) = t {
            if cur.as_deref().is_none_or(|c| c < t) {
                *cur = Some(t.to_owned());
            }
        }
    };
    let init_statuses = status["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut initializing = false;
    for (i, c) in init_statuses.iter().enumerate() {
        let count = c["restartCount"].as_i64().unwrap_or_default();
        let finished = c["lastState"]["terminated"]["finishedAt"].as_str();
        restarts += count;
        later(&mut last_restart, finished);
        let sidecar = restartable(str_at(&c["name"]));
        if sidecar {
            sidecar_restarts += count;
            later(&mut last_sidecar_restart, finished);
        }
        let terminated = &c["state"]["terminated"];
        let waiting = str_at(&c["state"]["waiting"]["reason"]);
        if terminated.is_object() && terminated["exitCode"].as_i64().unwrap_or_default() == 0 {
            continue;
        }
        if sidecar && c["started"].as_bool() == Some(true) {
            if c["ready"].as_bool() == Some(true) {
                ready += 1;
            }
            continue;
        }
        reason = if terminated.is_object() {
            match (
                str_at(&terminated["reason"]),
                terminated["signal"].as_i64().unwrap_or_default(),
            ) {
                ("", 0) => format!(
                    "Init:ExitCode:{}",
                    terminated["exitCode"].as_i64().unwrap_or_default()
                ),
                ("", signal) => format!("Init:Signal:{signal}"),
                (r, _) => format!("Init:{r}"),
            }
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            format!("Init:{waiting}")
        } else {
            format!("Init:{i}/{}", init_specs.len())
        };
        initializing = true;
        break;
    }
    let initialized = conditions
        .iter()
        .any(|c| c["type"] == "Initialized" && c["status"] == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        let statuses = status["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for c in statuses.iter().rev() {
            restarts += c["restartCount"].as_i64().unwrap_or_default();
            later(
                &mut last_restart,
                c["lastState"]["terminated"]["finishedAt"].as_str(),
            );
            let state = &c["state"];
            let terminated = &state["terminated"];
            if !str_at(&state["waiting"]["reason"]).is_empty() {
                reason = str_at(&state["waiting"]["reason"]).to_owned();
            } else if terminated.is_object() && !str_at(&terminated["reason"]).is_empty() {
                reason = str_at(&terminated["reason"]).to_owned();
            } else if terminated.is_object() {
                reason = match terminated["signal"].as_i64().unwrap_or_default() {
                    0 => format!(
                        "ExitCode:{}",
                        terminated["exitCode"].as_i64().unwrap_or_default()
                    ),
                    signal => format!("Signal:{signal}"),
                };
            } else if c["ready"].as_bool() == Some(true) && state["running"].is_object() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.to_owned();
        }
    }
    if obj["metadata"]["deletionTimestamp"].is_string() {
        if status["reason"] == "NodeLost" {
            reason = "Unknown".to_owned();
        } else if !matches!(phase, "Succeeded" | "Failed") {
            reason = "Terminating".to_owned();
        }
    }
    let restarts = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(&t), now)),
        _ => restarts.to_string(),
    };
    let pod_ip = status["podIPs"][0]["ip"]
        .as_str()
        .or_else(|| status["podIP"].as_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("<none>");
    let gates = spec["readinessGates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let gates = if gates.is_empty() {
        "<none>".to_owned()
    } else {
        let passed = gates
            .iter()
            .filter(|g| {
                conditions
                    .iter()
                    .find(|c| c["type"] == g["conditionType"])
                    .is_some_and(|c| c["status"] == "True")
            })
            .count();
        format!("{passed}/{}", gates.len())
    };
    let none_if_empty = |v: &Value| {
        v.as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("<none>")
            .to_owned()
    };
    vec![
        name,
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        age,
        json!(pod_ip),
        json!(none_if_empty(&spec["nodeName"])),
        json!(none_if_empty(&status["nominatedNodeName"])),
        json!(gates),
    ]
}

/// The conditions upstream puts on the row of a finished pod.
pub fn pod_row_conditions(obj: &Value) -> Option<Value> {
    match obj["status"]["phase"].as_str() {
        Some("Succeeded") => Some(json!([{"type": "Completed", "status": "True",
            "reason": "Succeeded", "message": "The pod has completed successfully."}])),
        Some("Failed") => Some(json!([{"type": "Completed", "status": "True",
            "reason": "Failed", "message": "The pod failed."}])),
        _ => None,
    }
}
