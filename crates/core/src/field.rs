//! Field errors in the apiserver's own words (`spec.addresses[0]: Invalid value: "x": reason`),
//! so a problem reads the same whether the apiserver or berth found it.

use std::fmt;

/// One problem with one field, printed the way the apiserver prints `field.Error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path from the object root, e.g. `spec.addresses[2]`.
    pub path: String,
    pub kind: FieldErrorKind,
}

/// The apiserver's field error types that berth reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Invalid value: <value>: <detail>`; `value` is already rendered (strings quoted), and
    /// left out when there is no single value to show.
    Invalid {
        value: Option<String>,
        detail: String,
    },
    /// `Required value: <detail>`.
    Required { detail: String },
    /// `Forbidden: <detail>`.
    Forbidden { detail: String },
    /// `Duplicate value: <value>`.
    Duplicate { value: String },
    /// `Too many: <count>: must have at most <max> items`.
    TooMany { count: usize, max: usize },
}

impl FieldError {
    /// `Invalid value` with a value already rendered as the apiserver would (see [`quoted`]).
    pub fn invalid(path: impl Into<String>, value: String, detail: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: FieldErrorKind::Invalid {
                value: Some(value),
                detail: detail.into(),
            },
        }
    }

    /// What is wrong, without the path and the error type.
    pub fn detail(&self) -> String {
        match &self.kind {
            FieldErrorKind::Invalid { detail, .. }
            | FieldErrorKind::Required { detail }
            | FieldErrorKind::Forbidden { detail } => detail.clone(),
            FieldErrorKind::Duplicate { value } => value.clone(),
            FieldErrorKind::TooMany { max, .. } => format!("must have at most {max} items"),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = &self.path;
        match &self.kind {
            FieldErrorKind::Invalid {
                value: Some(value),
                detail,
            } => write!(f, "{path}: Invalid value: {value}: {detail}"),
            FieldErrorKind::Invalid {
                value: None,
                detail,
            } => write!(f, "{path}: Invalid value: {detail}"),
            FieldErrorKind::Required { detail } => write!(f, "{path}: Required value: {detail}"),
            FieldErrorKind::Forbidden { detail } => write!(f, "{path}: Forbidden: {detail}"),
            FieldErrorKind::Duplicate { value } => write!(f, "{path}: Duplicate value: {value}"),
            FieldErrorKind::TooMany { count, max } => {
                write!(
                    f,
                    "{path}: Too many: {count}: must have at most {max} items"
                )
            }
        }
    }
}

/// Every problem found in one object, in field order; printed as the apiserver's aggregate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, FieldError> {
        self.0.iter()
    }

    /// Adds an `Invalid value` error; `value` is the offending string as the user wrote it.
    pub fn push(
        &mut self,
        path: impl Into<String>,
        value: Option<&str>,
        reason: impl Into<String>,
    ) {
        self.0.push(FieldError {
            path: path.into(),
            kind: FieldErrorKind::Invalid {
                value: value.map(quoted),
                detail: reason.into(),
            },
        });
    }

    pub fn push_error(&mut self, error: FieldError) {
        self.0.push(error);
    }

    /// `Ok` when nothing was found.
    pub fn into_result(self) -> Result<(), FieldErrors> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Same layout as the apiserver's aggregated errors: one problem, or a bracketed list.
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                f.write_str("[")?;
                for (i, e) in many.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl std::error::Error for FieldErrors {}

impl<'a> IntoIterator for &'a FieldErrors {
    type Item = &'a FieldError;
    type IntoIter = std::slice::Iter<'a, FieldError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Renders a string value as the apiserver does (Go `%q`).
pub fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// Renders a string list as the apiserver does (Go `%#v` of `[]string`).
pub fn quoted_list<T: fmt::Display>(items: &[T]) -> String {
    let inner: Vec<String> = items.iter().map(|i| quoted(&i.to_string())).collect();
    format!("[]string{{{}}}", inner.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_render_like_the_apiserver() {
        let mut errors = FieldErrors::default();
        errors.push("spec.addresses[0]", Some("x"), "bad");
        assert_eq!(
            errors.to_string(),
            "spec.addresses[0]: Invalid value: \"x\": bad"
        );
        errors.push(
            "spec.serviceAllocation.priority",
            None,
            "must be at most 1000",
        );
        assert_eq!(
            errors.to_string(),
            "[spec.addresses[0]: Invalid value: \"x\": bad, spec.serviceAllocation.priority: Invalid value: must be at most 1000]"
        );
        assert_eq!(errors.len(), 2);
        assert!(errors.clone().into_result().is_err());
        assert!(FieldErrors::default().into_result().is_ok());
    }

    #[test]
    fn every_kind_has_the_apiserver_wording() {
        let at = |kind| FieldError {
            path: "spec.f".into(),
            kind,
        };
        let cases = [
            (
                FieldError::invalid("spec.f", quoted("v"), "why"),
                "spec.f: Invalid value: \"v\": why",
            ),
            (
                at(FieldErrorKind::Required {
                    detail: "why".into(),
                }),
                "spec.f: Required value: why",
            ),
            (
                at(FieldErrorKind::Forbidden {
                    detail: "why".into(),
                }),
                "spec.f: Forbidden: why",
            ),
            (
                at(FieldErrorKind::Duplicate {
                    value: quoted("IPv4"),
                }),
                "spec.f: Duplicate value: \"IPv4\"",
            ),
            (
                at(FieldErrorKind::TooMany { count: 3, max: 2 }),
                "spec.f: Too many: 3: must have at most 2 items",
            ),
        ];
        for (error, want) in cases {
            assert_eq!(error.to_string(), want);
        }
        assert_eq!(
            FieldError::invalid("spec.f", quoted("v"), "why").detail(),
            "why"
        );
    }

    #[test]
    fn values_render_as_go_does() {
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        assert_eq!(
            quoted_list(&["10.0.0.1", "fd00::1"]),
            "[]string{\"10.0.0.1\", \"fd00::1\"}"
        );
        assert_eq!(quoted_list::<String>(&[]), "[]string{}");
    }
}
