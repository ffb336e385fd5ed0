//! Kubernetes label selectors (`matchLabels` + `matchExpressions`): their evaluation and their
//! validation, for IPPool namespace and Service selectors, L2Advertisement pool and node
//! selectors, and the lab apiserver's `labelSelector` queries.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::field::{FieldError, FieldErrorKind, FieldErrors};
use crate::name::{label_key_problem, label_value_problem};
use crate::UnknownValue;

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// `metav1.LabelSelector`. Requirements are ANDed; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub match_labels: Labels,
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    pub values: Vec<String>,
}

/// `In`, `NotIn`, `Exists`, `DoesNotExist`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl SelectorOperator {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::In => "In",
            Self::NotIn => "NotIn",
            Self::Exists => "Exists",
            Self::DoesNotExist => "DoesNotExist",
        }
    }

    /// Whether an object whose label has `value` (`None` when it lacks the key) satisfies the
    /// operator over `values`. `NotIn` and `DoesNotExist` match objects without the key, as in
    /// Kubernetes.
    pub fn admits(self, value: Option<&str>, values: &[String]) -> bool {
        match self {
            Self::In => value.is_some_and(|v| values.iter().any(|w| w == v)),
            Self::NotIn => value.is_none_or(|v| !values.iter().any(|w| w == v)),
            Self::Exists => value.is_some(),
            Self::DoesNotExist => value.is_none(),
        }
    }
}

impl fmt::Display for SelectorOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SelectorOperator {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "In" => Ok(Self::In),
            "NotIn" => Ok(Self::NotIn),
            "Exists" => Ok(Self::Exists),
            "DoesNotExist" => Ok(Self::DoesNotExist),
            other => Err(UnknownValue {
                what: "selector operator",
                value: other.to_string(),
            }),
        }
    }
}

impl LabelSelector {
    /// A selector with only `matchLabels`.
    pub fn from_labels<I, A, B>(labels: I) -> Self
    where
        I: IntoIterator<Item = (A, B)>,
        A: Into<String>,
        B: Into<String>,
    {
        Self {
            match_labels: labels
                .into_iter()
                .map(|(a, b)| (a.into(), b.into()))
                .collect(),
            match_expressions: Vec::new(),
        }
    }

    /// Whether `labels` satisfy every `matchLabels` entry and every expression.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// The apiserver's checks, with paths under `path` (empty for the selector itself).
    pub fn validate(&self, path: &str, errors: &mut FieldErrors) {
        validate_selector(
            &self.match_labels,
            self.match_expressions
                .iter()
                .map(|r| (r.key.as_str(), r.operator.as_str(), r.values.as_slice())),
            path,
            errors,
        );
    }
}

impl LabelSelectorRequirement {
    pub fn new(key: impl Into<String>, operator: SelectorOperator, values: &[&str]) -> Self {
        Self {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.operator
            .admits(labels.get(&self.key).map(String::as_str), &self.values)
    }
}

/// Checks a selector in its wire form as the apiserver does for built-in kinds: label key and
/// value syntax, known operators, and values per operator. `expressions` yields each
/// requirement's key, operator spelling and values. A selector that passes converts to a
/// [`LabelSelector`] without loss.
pub fn validate_selector<'a>(
    match_labels: &Labels,
    expressions: impl IntoIterator<Item = (&'a str, &'a str, &'a [String])>,
    path: &str,
    errors: &mut FieldErrors,
) {
    let at = join(path, "matchLabels");
    for (key, value) in match_labels {
        if let Some(problem) = label_key_problem(key) {
            errors.push(&at, Some(key), problem);
        }
        if let Some(problem) = label_value_problem(value) {
            errors.push(format!("{at}[{key}]"), Some(value), problem);
        }
    }
    for (i, (key, operator, values)) in expressions.into_iter().enumerate() {
        let at = join(path, &format!("matchExpressions[{i}]"));
        validate_requirement(key, operator, values, &at, errors);
    }
}

fn validate_requirement(
    key: &str,
    operator: &str,
    values: &[String],
    path: &str,
    errors: &mut FieldErrors,
) {
    if let Some(problem) = label_key_problem(key) {
        errors.push(format!("{path}.key"), Some(key), problem);
    }
    let values_at = format!("{path}.values");
    match operator.parse::<SelectorOperator>() {
        Ok(SelectorOperator::In | SelectorOperator::NotIn) if values.is_empty() => {
            errors.push_error(FieldError {
                path: values_at,
                kind: FieldErrorKind::Required {
                    detail: "must be specified when `operator` is 'In' or 'NotIn'".into(),
                },
            });
        }
        Ok(SelectorOperator::Exists | SelectorOperator::DoesNotExist) if !values.is_empty() => {
            errors.push_error(FieldError {
                path: values_at,
                kind: FieldErrorKind::Forbidden {
                    detail: "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                        .into(),
                },
            });
        }
        Ok(_) => {}
        Err(_) => errors.push(
            format!("{path}.operator"),
            Some(operator),
            "not a valid selector operator (In, NotIn, Exists, DoesNotExist)",
        ),
    }
    for (i, value) in values.iter().enumerate() {
        if let Some(problem) = label_value_problem(value) {
            errors.push(format!("{path}.values[{i}]"), Some(value), problem);
        }
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SelectorOperator::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn with_expr(key: &str, op: SelectorOperator, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: Labels::new(),
            match_expressions: vec![LabelSelectorRequirement::new(key, op, values)],
        }
    }

    fn check(selector: &LabelSelector) -> Vec<String> {
        let mut errors = FieldErrors::default();
        selector.validate("spec.sel", &mut errors);
        errors.iter().map(|e| e.path.clone()).collect()
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(LabelSelector::default().matches(&Labels::new()));
        assert!(LabelSelector::default().matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn match_labels_need_every_pair() {
        let s = LabelSelector::from_labels([("team", "a"), ("tier", "gold")]);
        assert!(s.matches(&labels(&[("team", "a"), ("tier", "gold"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("team", "a")])));
        assert!(!s.matches(&labels(&[("team", "a"), ("tier", "silver")])));
    }

    #[test]
    fn operators_table() {
        type Case = (LabelSelector, &'static [(&'static str, &'static str)], bool);
        let cases: &[Case] = &[
            (
                with_expr("env", In, &["prod", "stage"]),
                &[("env", "prod")],
                true,
            ),
            (with_expr("env", In, &["prod"]), &[("env", "dev")], false),
            (with_expr("env", In, &["prod"]), &[], false),
            (with_expr("env", NotIn, &["prod"]), &[("env", "dev")], true),
            (
                with_expr("env", NotIn, &["prod"]),
                &[("env", "prod")],
                false,
            ),
            (with_expr("env", NotIn, &["prod"]), &[], true),
            (with_expr("env", Exists, &[]), &[("env", "")], true),
            (with_expr("env", Exists, &[]), &[], false),
            (with_expr("env", DoesNotExist, &[]), &[], true),
            (with_expr("env", DoesNotExist, &[]), &[("env", "x")], false),
        ];
        for (sel, l, want) in cases {
            assert_eq!(sel.matches(&labels(l)), *want, "{sel:?} on {l:?}");
        }
    }

    #[test]
    fn labels_and_expressions_combine_with_and() {
        let mut s = LabelSelector::from_labels([("team", "a")]);
        s.match_expressions
            .push(LabelSelectorRequirement::new("env", NotIn, &["prod"]));
        assert!(s.matches(&labels(&[("team", "a"), ("env", "dev")])));
        assert!(!s.matches(&labels(&[("team", "a"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("team", "b")])));
    }

    #[test]
    fn validation() {
        assert!(!check(&with_expr("k", In, &[])).is_empty());
        assert!(!check(&with_expr("k", NotIn, &[])).is_empty());
        assert!(!check(&with_expr("k", Exists, &["v"])).is_empty());
        assert!(check(&with_expr("k", DoesNotExist, &[])).is_empty());
        assert!(check(&with_expr("k", In, &["v"])).is_empty());
        assert_eq!(In.to_string(), "In");
        for op in [In, NotIn, Exists, DoesNotExist] {
            assert_eq!(op.as_str().parse::<SelectorOperator>().unwrap(), op);
        }
        assert!("Near".parse::<SelectorOperator>().is_err());
    }

    #[test]
    fn validation_reports_every_problem_with_its_path() {
        let bad = LabelSelector {
            match_labels: labels(&[("bad key", "-v")]),
            match_expressions: vec![
                LabelSelectorRequirement::new("tier", In, &[]),
                LabelSelectorRequirement::new("gpu", Exists, &["yes"]),
                LabelSelectorRequirement::new("ok", NotIn, &["bad value"]),
            ],
        };
        assert_eq!(
            check(&bad),
            [
                "spec.sel.matchLabels",
                "spec.sel.matchLabels[bad key]",
                "spec.sel.matchExpressions[0].values",
                "spec.sel.matchExpressions[1].values",
                "spec.sel.matchExpressions[2].values[0]",
            ]
        );
        let mut errors = FieldErrors::default();
        with_expr("k", In, &[]).validate("", &mut errors);
        assert_eq!(
            errors.to_string(),
            "matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
        );
        let mut errors = FieldErrors::default();
        with_expr("k", Exists, &["v"]).validate("", &mut errors);
        assert_eq!(
            errors.to_string(),
            "matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
        );
    }

    #[test]
    fn unknown_operators_are_reported_on_the_wire_form() {
        let mut errors = FieldErrors::default();
        let values = vec!["a".to_string()];
        validate_selector(
            &Labels::new(),
            [("zone", "Near", values.as_slice())],
            "spec.sel",
            &mut errors,
        );
        assert_eq!(
            errors.to_string(),
            "spec.sel.matchExpressions[0].operator: Invalid value: \"Near\": not a valid selector operator (In, NotIn, Exists, DoesNotExist)"
        );
    }
}
