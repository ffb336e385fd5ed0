//! The identity every endpoints object is tracked, queued and written by.

use std::fmt;

/// A namespaced object's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ObjectKey {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl ObjectKey {
    pub(crate) fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub(crate) fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        ObjectKey::new(
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap_or(""),
        )
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
