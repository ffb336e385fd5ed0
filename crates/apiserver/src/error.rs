//! Errors: [`ApiError`] is what a client sees (a Kubernetes `Status`), [`Error`] is what the
//! embedding program sees when the server itself cannot run.

use serde_json::{json, Value};

/// A failed API call, rendered as a `metav1.Status` body with the apiserver's own reasons and words,
/// because clients (kube-rs, kubectl, berth's controller) branch on `reason` and `code`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
        )
        .with_details(json!({"name": name, "group": group, "kind": resource}))
    }

    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
        )
        .with_details(json!({"name": name, "group": group, "kind": resource}))
    }

    /// The optimistic-concurrency failure, worded as the apiserver words it.
    pub fn conflict(resource: &str, group: &str, name: &str) -> Self {
        Self::conflict_with(
            resource,
            group,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict_with(resource: &str, group: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(resource, group)
            ),
        )
        .with_details(json!({"name": name, "group": group, "kind": resource}))
    }

    /// Server-side apply conflicts: one cause per (manager, field), as `kubectl apply --server-side` prints.
    pub fn apply_conflicts(
        resource: &str,
        group: &str,
        name: &str,
        conflicts: &[(String, String)],
    ) -> Self {
        let listed: Vec<String> = conflicts
            .iter()
            .map(|(manager, field)| format!("conflict with \"{manager}\": {field}"))
            .collect();
        let message = if conflicts.len() == 1 {
            format!("Apply failed with 1 conflict: {}", listed.join(""))
        } else {
            format!(
                "Apply failed with {} conflicts: {}",
                conflicts.len(),
                listed.join("\n")
            )
        };
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(manager, field)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{manager}\""), "field": field})
            })
            .collect();
        Self::new(409, "Conflict", message)
            .with_details(json!({"name": name, "group": group, "kind": resource, "causes": causes}))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 for an object that fails validation: `<Kind> "<name>" is invalid: <field>: <why>`.
    pub fn invalid(kind: &str, group: &str, name: &str, field: &str, why: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {field}: {why}"),
        )
        .with_details(json!({
            "name": name, "group": group, "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}]
        }))
    }

    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// A watch or list resumed from a version older than the retained history.
    pub fn too_old(requested: u64, oldest: u64) -> Self {
        Self::gone(format!("too old resource version: {requested} ({oldest})"))
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"))
    }

    /// Bodies other than JSON (kubectl's typed generators send protobuf) are refused, as a server
    /// without that codec would.
    pub fn unsupported_protobuf(message: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_body(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf; got {content_type:?}"))
    }

    pub fn page_not_found(path: &str) -> Self {
        Self::new(404, "NotFound", format!("the server could not find the requested resource ({path})"))
            .with_details(json!({"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]}))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn too_many_requests(retry_after_seconds: u64) -> Self {
        Self::new(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        )
        .with_details(json!({"retryAfterSeconds": retry_after_seconds}))
    }

    /// The `metav1.Status` body for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".to_owned(), details.clone());
        }
        status
    }
}

fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// Failures of the server as a program (binding, kubeconfig, client construction).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("using a pre-bound listener")]
    Listener(#[source] std::io::Error),
    #[error("writing kubeconfig {path}")]
    WriteKubeconfig {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("building a kube client for {url}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
    #[error("invalid fault settings: {0}")]
    Faults(String),
    #[error("the server has no listener")]
    NoListener,
    #[error("serving HTTP")]
    Serve(#[source] std::io::Error),
    #[error("creating default/kubernetes: {0}")]
    Seed(#[source] ApiError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_uses_apiserver_wording() {
        let err = ApiError::conflict("services", "", "web");
        assert_eq!(err.code, 409);
        assert_eq!(
            err.message,
            "Operation cannot be fulfilled on services \"web\": the object has been modified; please apply your changes to the latest version and try again"
        );
        let status = err.to_status();
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["details"]["kind"], "services");
    }

    #[test]
    fn group_qualifies_resource_in_messages() {
        let err = ApiError::not_found("leases", "coordination.k8s.io", "a");
        assert_eq!(err.message, "leases.coordination.k8s.io \"a\" not found");
        assert_eq!(err.to_status()["code"], 404);
    }

    #[test]
    fn apply_conflicts_name_manager_and_field() {
        let err = ApiError::apply_conflicts(
            "services",
            "",
            "web",
            &[("alice".into(), ".spec.type".into())],
        );
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"alice\": .spec.type"
        );
        let causes = &err.to_status()["details"]["causes"];
        assert_eq!(causes[0]["field"], ".spec.type");
        assert_eq!(causes[0]["reason"], "FieldManagerConflict");
    }
}
