//! The chart's admission policy, evaluated as the API server evaluates a
//! ValidatingAdmissionPolicy: match constraints, match conditions, variables in order, then every
//! validation, with the CEL interpreter over the request, `object` and `oldObject`. Each row is a
//! request an agent (honest or compromised) or another component could make; the policy must
//! let each node's agent write its own Lease and its own ServiceL2Status records and nothing
//! else (ghost Leases, a peer's Lease, the controller's leader Lease, a record naming a peer, a
//! token without its node); it may delete a peer's record (a crashed peer's, taken over).
//!
//! Needs the Python venv (`make deps`) to render the chart; skips without it, fails under
//! `CI=true`. Pure: no API server, no network.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use cel::{Context, Program, Value as Cel};
use serde_json::{json, Value};

const RELEASE_NAMESPACE: &str = "berth-system";
const AGENT: &str = "system:serviceaccount:berth-system:berth-agent";
const CONTROLLER: &str = "system:serviceaccount:berth-system:berth-controller";
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> Option<PathBuf> {
    let python = repo().join(".venv/bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import helm_python, yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ready {
        return Some(python);
    }
    let why = format!(
        "{} with helm-python-sdk is missing (run `make deps`)",
        python.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipping: {why}");
    None
}

/// `scripts/chart.py admission <values>`: the rendered policies and bindings.
fn admission(python: &PathBuf, values: Value) -> (Vec<Value>, Vec<Value>) {
    let out = Command::new(python)
        .arg(repo().join("scripts/chart.py"))
        .arg("admission")
        .arg(values.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chart.py admission: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        doc["policies"].as_array().unwrap().clone(),
        doc["bindings"].as_array().unwrap().clone(),
    )
}

/// One admission request, as the API server hands it to a policy.
struct Request {
    user: &'static str,
    /// The token's node, when it is bound to one.
    node: Option<String>,
    operation: &'static str,
    group: &'static str,
    resource: &'static str,
    namespace: &'static str,
    object: Value,
    old_object: Value,
}

/// An agent Lease as berth writes it, held by `holder`.
fn held_lease(name: &str, holder: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": name, "namespace": RELEASE_NAMESPACE},
           "spec": {"holderIdentity": holder}})
}

fn lease(name: &str) -> Value {
    held_lease(name, name.strip_prefix("berth-agent-").unwrap_or(name))
}

fn record(node: &str) -> Value {
    json!({"apiVersion": "berth.dev/v1alpha1", "kind": "ServiceL2Status",
           "metadata": {"name": "l2-0123", "namespace": RELEASE_NAMESPACE},
           "spec": {"node": node, "serviceNamespace": "web", "serviceName": "lb",
                    "addresses": ["198.18.0.200"]}})
}

/// An agent's write of a Lease (`object` and `oldObject` as the operation has them).
fn lease_request(node: Option<&str>, operation: &'static str, name: &str) -> Request {
    let (object, old_object) = match operation {
        "CREATE" => (lease(name), Value::Null),
        "UPDATE" => (lease(name), lease(name)),
        _ => (Value::Null, lease(name)),
    };
    Request {
        user: AGENT,
        node: node.map(String::from),
        operation,
        group: "coordination.k8s.io",
        resource: "leases",
        namespace: RELEASE_NAMESPACE,
        object,
        old_object,
    }
}

/// An agent's write of a record; an update turns `old` into `new`.
fn record_request(node: &'static str, operation: &'static str, old: &str, new: &str) -> Request {
    let (object, old_object) = match operation {
        "CREATE" => (record(new), Value::Null),
        "UPDATE" => (record(new), record(old)),
        _ => (Value::Null, record(old)),
    };
    Request {
        user: AGENT,
        node: Some(node.to_string()),
        operation,
        group: "berth.dev",
        resource: "servicel2statuses",
        namespace: RELEASE_NAMESPACE,
        object,
        old_object,
    }
}

fn session(node: &str) -> Value {
    json!({"apiVersion": "berth.dev/v1alpha1", "kind": "BGPSessionState",
           "metadata": {"name": "bgp-0123", "namespace": RELEASE_NAMESPACE},
           "spec": {"node": node, "peer": "tor", "bgpState": "Established"}})
}

/// An agent's write of a BGP session record; an update turns `old` into `new`.
fn session_request(node: &'static str, operation: &'static str, old: &str, new: &str) -> Request {
    let (object, old_object) = match operation {
        "CREATE" => (session(new), Value::Null),
        "UPDATE" => (session(new), session(old)),
        _ => (Value::Null, session(old)),
    };
    Request {
        operation,
        resource: "bgpsessionstates",
        object,
        old_object,
        ..record_request(node, "CREATE", "", node)
    }
}

fn cel_eval(expression: &str, context: &Context) -> Result<Cel, String> {
    let program = Program::compile(expression).map_err(|err| format!("{expression:?}: {err:?}"))?;
    program
        .execute(context)
        .map_err(|err| format!("{expression:?}: {err:?}"))
}

fn expect_bool(expression: &str, context: &Context) -> bool {
    match cel_eval(expression, context) {
        Ok(Cel::Bool(b)) => b,
        other => panic!("{expression:?} is not a boolean: {other:?}"),
    }
}

/// Whether the policy applies to the request: its resource rules and namespace selector
/// (the chart uses only `matchLabels` on `kubernetes.io/metadata.name`).
fn matches(policy: &Value, request: &Request) -> bool {
    let constraints = &policy["spec"]["matchConstraints"];
    let labels = constraints["namespaceSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    assert_eq!(
        labels.keys().collect::<Vec<_>>(),
        ["kubernetes.io/metadata.name"],
        "the test reads only this selector"
    );
    if labels["kubernetes.io/metadata.name"] != request.namespace {
        return false;
    }
    let has = |list: &Value, item: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .any(|v| v == item || v == "*")
    };
    constraints["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .any(|rule| {
            has(&rule["apiGroups"], request.group)
                && has(&rule["resources"], request.resource)
                && has(&rule["operations"], request.operation)
        })
}

/// The policy's verdict: `Ok` when admitted, else the message of the first failed validation.
fn admit(policy: &Value, request: &Request) -> Result<(), String> {
    if !matches(policy, request) {
        return Ok(());
    }
    let mut extra: HashMap<String, Vec<String>> = HashMap::new();
    if let Some(node) = &request.node {
        extra.insert(NODE_NAME.into(), vec![node.clone()]);
    }
    let request_value = json!({
        "operation": request.operation,
        "namespace": request.namespace,
        "resource": {"group": request.group, "resource": request.resource},
        "userInfo": {"username": request.user, "extra": extra},
    });
    let mut context = Context::default();
    context.add_variable("request", request_value).unwrap();
    context
        .add_variable("object", request.object.clone())
        .unwrap();
    context
        .add_variable("oldObject", request.old_object.clone())
        .unwrap();
    let spec = &policy["spec"];
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        if !expect_bool(condition["expression"].as_str().unwrap(), &context) {
            return Ok(());
        }
    }
    let mut variables: HashMap<String, Cel> = HashMap::new();
    for variable in spec["variables"].as_array().into_iter().flatten() {
        let value = cel_eval(variable["expression"].as_str().unwrap(), &context).unwrap();
        variables.insert(variable["name"].as_str().unwrap().to_string(), value);
        context.add_variable_from_value("variables", variables.clone());
    }
    for validation in spec["validations"].as_array().unwrap() {
        if expect_bool(validation["expression"].as_str().unwrap(), &context) {
            continue;
        }
        assert_eq!(validation["reason"], "Forbidden");
        let message = match validation["messageExpression"].as_str() {
            Some(expression) => match cel_eval(expression, &context).unwrap() {
                Cel::String(s) => s.to_string(),
                other => panic!("messageExpression gave {other:?}"),
            },
            None => validation["message"].as_str().unwrap().to_string(),
        };
        return Err(message);
    }
    Ok(())
}

/// The one policy of a rendering, checked to be bound with Deny.
fn the_policy(python: &PathBuf, values: Value) -> Value {
    let (policies, bindings) = admission(python, values);
    assert_eq!(policies.len(), 1, "{policies:#?}");
    assert_eq!(bindings.len(), 1, "{bindings:#?}");
    let policy = policies.into_iter().next().unwrap();
    assert_eq!(
        bindings[0]["spec"]["policyName"],
        policy["metadata"]["name"]
    );
    assert_eq!(bindings[0]["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    policy
}

#[test]
fn each_agent_writes_only_its_own_lease_and_records() {
    let Some(python) = python() else { return };
    let policy = the_policy(&python, json!({}));
    let me = Some("node-1");
    // (what, request, admitted, a part of the refusal's message)
    let rows: Vec<(&str, Request, Result<(), &str>)> = vec![
        (
            "its own Lease, created",
            lease_request(me, "CREATE", "berth-agent-node-1"),
            Ok(()),
        ),
        (
            "its own Lease, renewed",
            lease_request(me, "UPDATE", "berth-agent-node-1"),
            Ok(()),
        ),
        (
            "its own Lease, deleted on a graceful stop",
            lease_request(me, "DELETE", "berth-agent-node-1"),
            Ok(()),
        ),
        (
            "a ghost agent Lease",
            lease_request(me, "CREATE", "berth-agent-ghost-1"),
            Err("may write only the Lease berth-agent-node-1"),
        ),
        (
            "a peer's Lease, renewed for it",
            lease_request(me, "UPDATE", "berth-agent-node-2"),
            Err("may write only the Lease berth-agent-node-1"),
        ),
        (
            "a peer's Lease, deleted",
            lease_request(me, "DELETE", "berth-agent-node-2"),
            Err("may write only the Lease berth-agent-node-1"),
        ),
        (
            "the controller's leader Lease",
            lease_request(me, "UPDATE", "berth-controller"),
            Err("may write only the Lease berth-agent-node-1"),
        ),
        (
            "a name that only starts like its own",
            lease_request(me, "CREATE", "berth-agent-node-10"),
            Err("may write only the Lease berth-agent-node-1"),
        ),
        (
            "its own Lease with a token bound to no node",
            lease_request(None, "UPDATE", "berth-agent-node-1"),
            Err("bound to its Pod's node"),
        ),
        (
            "its own record, created",
            record_request("node-1", "CREATE", "", "node-1"),
            Ok(()),
        ),
        (
            "its own record, replaced",
            record_request("node-1", "UPDATE", "node-1", "node-1"),
            Ok(()),
        ),
        (
            "its own record, deleted",
            record_request("node-1", "DELETE", "node-1", ""),
            Ok(()),
        ),
        (
            "a record claiming a peer announces",
            record_request("node-1", "CREATE", "", "node-2"),
            Err("only ServiceL2Status records of node node-1"),
        ),
        (
            "a peer's record, taken over",
            record_request("node-1", "UPDATE", "node-2", "node-1"),
            Err("only ServiceL2Status records of node node-1"),
        ),
        (
            "a crashed peer's record, deleted by the node taking its addresses over",
            record_request("node-1", "DELETE", "node-2", ""),
            Ok(()),
        ),
    ];
    let mut rows = rows;
    rows.extend(session_rows());
    let mut failures = Vec::new();
    for (what, request, want) in &rows {
        let got = admit(&policy, request);
        let ok = match (want, &got) {
            (Ok(()), Ok(())) => true,
            (Err(part), Err(message)) => message.contains(part),
            _ => false,
        };
        if !ok {
            failures.push(format!("{what}: want {want:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A node's BGP session records: its own, never a peer's, whatever the operation (a session
/// record reports a fact only that node can see, so no one takes it over).
fn session_rows() -> Vec<(&'static str, Request, Result<(), &'static str>)> {
    let not_mine = "only BGPSessionState records of node node-1";
    vec![
        (
            "its own session record, created",
            session_request("node-1", "CREATE", "", "node-1"),
            Ok(()),
        ),
        (
            "its own session record, replaced",
            session_request("node-1", "UPDATE", "node-1", "node-1"),
            Ok(()),
        ),
        (
            "its own session record, deleted",
            session_request("node-1", "DELETE", "node-1", ""),
            Ok(()),
        ),
        (
            "a session record in a peer's name",
            session_request("node-1", "CREATE", "", "node-2"),
            Err(not_mine),
        ),
        (
            "a peer's session record, rewritten",
            session_request("node-1", "UPDATE", "node-2", "node-2"),
            Err(not_mine),
        ),
        (
            "a peer's session record, taken over",
            session_request("node-1", "UPDATE", "node-2", "node-1"),
            Err(not_mine),
        ),
        (
            "a peer's session record, deleted",
            session_request("node-1", "DELETE", "node-2", ""),
            Err(not_mine),
        ),
    ]
}

/// A node name too long for `berth-agent-<node>` gets a hashed Lease name (berth-api's
/// `agent_lease_name`); the policy then asks that the node hold the Lease, before and after.
#[test]
fn a_long_node_name_writes_its_hashed_lease_and_no_other() {
    let Some(python) = python() else { return };
    let policy = the_policy(&python, json!({}));
    let long = format!("{}.example.com", "a".repeat(239));
    let peer = format!("{}.example.org", "a".repeat(239));
    let name = berth_api::names::lease::agent_lease_name(&long);
    let peer_name = berth_api::names::lease::agent_lease_name(&peer);
    assert_ne!(name, format!("berth-agent-{long}"), "hashed");
    let write =
        |operation: &'static str, name: &str, old: Option<&str>, new: Option<&str>| Request {
            object: new.map(|h| held_lease(name, h)).unwrap_or(Value::Null),
            old_object: old.map(|h| held_lease(name, h)).unwrap_or(Value::Null),
            ..lease_request(Some(&long), operation, name)
        };
    assert_eq!(
        admit(&policy, &write("CREATE", &name, None, Some(&long))),
        Ok(())
    );
    assert_eq!(
        admit(&policy, &write("UPDATE", &name, Some(&long), Some(&long))),
        Ok(())
    );
    assert_eq!(
        admit(&policy, &write("DELETE", &name, Some(&long), None)),
        Ok(())
    );
    // A peer's hashed Lease, taken over by holding it, or held for the peer: refused.
    for (operation, old, new) in [
        ("UPDATE", Some(peer.as_str()), Some(long.as_str())),
        ("UPDATE", Some(peer.as_str()), Some(peer.as_str())),
        ("DELETE", Some(peer.as_str()), None),
        ("CREATE", None, Some(peer.as_str())),
    ] {
        let got = admit(&policy, &write(operation, &peer_name, old, new));
        assert!(got.is_err(), "{operation} {old:?} -> {new:?}: {got:?}");
    }
    // A short node name gains nothing from the rule: the exact name is required.
    assert!(admit(
        &policy,
        &Request {
            object: held_lease("berth-agent-ghost", "node-1"),
            ..lease_request(Some("node-1"), "CREATE", "berth-agent-ghost")
        }
    )
    .is_err());
}

#[test]
fn other_users_and_other_namespaces_are_not_the_policys_business() {
    let Some(python) = python() else { return };
    let policy = the_policy(&python, json!({}));
    // The controller renews its leader Lease: RBAC's business, not this policy's.
    let controller = Request {
        user: CONTROLLER,
        node: None,
        ..lease_request(None, "UPDATE", "berth-controller")
    };
    assert_eq!(admit(&policy, &controller), Ok(()));
    assert!(matches(&policy, &controller), "matched, then let go");
    // Another namespace's Leases (kubelets' node Leases, say) are not matched at all.
    let elsewhere = Request {
        namespace: "kube-node-lease",
        ..lease_request(Some("node-1"), "UPDATE", "node-2")
    };
    assert!(!matches(&policy, &elsewhere));
    assert_eq!(admit(&policy, &elsewhere), Ok(()));
}

#[test]
fn the_policy_follows_the_settings_that_write_per_node_objects() {
    let Some(python) = python() else { return };
    // Leases only (no announcer) and records only (no liveness) still need it.
    the_policy(
        &python,
        json!({"agent": {"config": {"membership": "off", "l2Announcer": false}}}),
    );
    let records_only = the_policy(&python, json!({"agent": {"config": {"membership": ""}}}));
    assert_eq!(
        admit(
            &records_only,
            &record_request("node-1", "CREATE", "", "node-2")
        )
        .map_err(|_| ()),
        Err(())
    );
    // The BGP speaker alone (the bgp value set) writes session records: guarded too.
    let bgp_only = the_policy(
        &python,
        json!({"agent": {"config": {"membership": "", "l2Announcer": false, "bgpSpeaker": true}}}),
    );
    for (what, request, want) in session_rows() {
        assert_eq!(
            admit(&bgp_only, &request).map_err(|_| ()),
            want.map_err(|_| ()),
            "{what}"
        );
    }
    // Nothing per node written: nothing to guard; and the switch turns it off.
    for values in [
        json!({"agent": {"config": {"membership": "", "l2Announcer": false}}}),
        json!({"agent": {"admissionPolicy": {"enabled": false}}}),
    ] {
        let (policies, bindings) = admission(&python, values.clone());
        assert!(
            policies.is_empty() && bindings.is_empty(),
            "{values}: {policies:?}"
        );
    }
    // A lease namespace of its own is the one the policy watches.
    let moved = the_policy(
        &python,
        json!({"agent": {"config": {"leaseNamespace": "berth-leases"}}}),
    );
    let there = Request {
        namespace: "berth-leases",
        ..lease_request(Some("node-1"), "CREATE", "berth-agent-ghost")
    };
    assert!(admit(&moved, &there).is_err());
}
