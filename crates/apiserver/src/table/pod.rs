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
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let init_specs = spec["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // Sidecars: init containers that restart always count as containers.
    let total = spec["containers"].as_array().map_or(0, Vec::len)
        + init_specs
            .iter()
            .filter(|c| c["restartPolicy"] == "Always")
            .count();
    let mut reason = phase_reason(status, &conditions);
    let init = init_progress(status, &init_specs);
    let mut ready = init.ready;
    let mut restarts = init.all;
    let initializing = init.blocked.is_some();
    if let Some(blocked) = init.blocked {
        reason = blocked;
    }
    let initialized = conditions
        .iter()
        .any(|c| c["type"] == "Initialized" && c["status"] == "True");
    if !initializing || initialized {
        let app = container_progress(status, &conditions, init.sidecars, reason);
        ready += app.ready;
        restarts = app.restarts;
        reason = app.reason;
    }
    if let Some(deleting) = deletion_reason(obj, phase) {
        reason = deleting.to_owned();
    }
    let pod_ip = status["podIPs"][0]["ip"]
        .as_str()
        .or_else(|| status["podIP"].as_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("<none>");
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
        json!(restarts.cell(now)),
        age,
        json!(pod_ip),
        json!(none_if_empty(&spec["nodeName"])),
        json!(none_if_empty(&status["nominatedNodeName"])),
        json!(readiness_gates_cell(spec, &conditions)),
    ]
}

/// Restarts counted, and the latest time a counted container last finished.
#[derive(Default)]
struct Restarts {
    count: i64,
    last: Option<String>,
}

impl Restarts {
    fn add(&mut self, count: i64, finished: Option<&str>) {
        self.count += count;
        if let Some(t) = finished {
            if self.last.as_deref().is_none_or(|c| c < t) {
                self.last = Some(t.to_owned());
            }
        }
    }

    fn cell(self, now: DateTime<Utc>) -> String {
        match self.last {
            Some(t) if self.count != 0 => format!("{} ({} ago)", self.count, since(Some(&t), now)),
            _ => self.count.to_string(),
        }
    }
}

/// The reason before any container is looked at: the pod's own, its phase, or a scheduling gate.
fn phase_reason(status: &Value, conditions: &[Value]) -> String {
    if conditions
        .iter()
        .any(|c| c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated")
    {
        return "SchedulingGated".to_owned();
    }
    status["reason"]
        .as_str()
        .filter(|r| !r.is_empty())
        .unwrap_or(str_at(&status["phase"]))
        .to_owned()
}

/// What the init containers say: ready sidecars, restarts (all, and the sidecars' alone), and
/// the `Init:` reason of the first one still holding the pod back.
struct InitProgress {
    ready: usize,
    all: Restarts,
    sidecars: Restarts,
    blocked: Option<String>,
}

fn init_progress(status: &Value, init_specs: &[Value]) -> InitProgress {
    let restartable = |container: &str| {
        init_specs
            .iter()
            .any(|c| c["name"] == container && c["restartPolicy"] == "Always")
    };
    let mut out = InitProgress {
        ready: 0,
        all: Restarts::default(),
        sidecars: Restarts::default(),
        blocked: None,
    };
    let init_statuses = status["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, c) in init_statuses.iter().enumerate() {
        let count = c["restartCount"].as_i64().unwrap_or_default();
        let finished = c["lastState"]["terminated"]["finishedAt"].as_str();
        out.all.add(count, finished);
        let sidecar = restartable(str_at(&c["name"]));
        if sidecar {
            out.sidecars.add(count, finished);
        }
        let terminated = &c["state"]["terminated"];
        if terminated.is_object() && terminated["exitCode"].as_i64().unwrap_or_default() == 0 {
            continue;
        }
        if sidecar && c["started"].as_bool() == Some(true) {
            if c["ready"].as_bool() == Some(true) {
                out.ready += 1;
            }
            continue;
        }
        out.blocked = Some(init_blocked_reason(c, i, init_specs.len()));
        break;
    }
    out
}

/// `Init:<reason>`, `Init:ExitCode:<n>`, `Init:Signal:<n>` or `Init:<i>/<n>` for the init
/// container at `i` that has not finished.
fn init_blocked_reason(c: &Value, i: usize, of: usize) -> String {
    let terminated = &c["state"]["terminated"];
    let waiting = str_at(&c["state"]["waiting"]["reason"]);
    if terminated.is_object() {
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
        format!("Init:{i}/{of}")
    }
}

/// What the app containers say, once init is done: ready ones, restarts added to the
/// sidecars', and the reason of the first (in upstream's reverse walk) that is not running.
struct ContainerProgress {
    ready: usize,
    restarts: Restarts,
    reason: String,
}

fn container_progress(
    status: &Value,
    conditions: &[Value],
    sidecars: Restarts,
    mut reason: String,
) -> ContainerProgress {
    let mut restarts = sidecars;
    let mut ready = 0;
    let mut has_running = false;
    let statuses = status["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in statuses.iter().rev() {
        restarts.add(
            c["restartCount"].as_i64().unwrap_or_default(),
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
    ContainerProgress {
        ready,
        restarts,
        reason,
    }
}

/// A pod being deleted reads `Unknown` when its node is lost, `Terminating` unless finished.
fn deletion_reason(obj: &Value, phase: &str) -> Option<&'static str> {
    if !obj["metadata"]["deletionTimestamp"].is_string() {
        return None;
    }
    if obj["status"]["reason"] == "NodeLost" {
        Some("Unknown")
    } else if !matches!(phase, "Succeeded" | "Failed") {
        Some("Terminating")
    } else {
        None
    }
}

/// `<passed>/<total>` readiness gates, or `<none>`.
fn readiness_gates_cell(spec: &Value, conditions: &[Value]) -> String {
    let gates = spec["readinessGates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if gates.is_empty() {
        return "<none>".to_owned();
    }
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
