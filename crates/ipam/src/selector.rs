//! A plain Kubernetes label selector (`matchLabels` + `matchExpressions`) and its
//! evaluation, for IPPool `namespaceSelector`s and `serviceSelector`s.

use std::collections::BTreeMap;
use std::fmt;

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// `metav1.LabelSelector`. The empty selector matches everything, as in Kubernetes.
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

impl fmt::Display for SelectorOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::In => "In",
            Self::NotIn => "NotIn",
            Self::Exists => "Exists",
            Self::DoesNotExist => "DoesNotExist",
        })
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

    /// The API server's structural rules: `In`/`NotIn` need values, `Exists`/`DoesNotExist`
    /// take none. Returns the first violation, worded as the API server does.
    pub fn validate(&self) -> Result<(), String> {
        for (i, req) in self.match_expressions.iter().enumerate() {
            let needs_values =
                matches!(req.operator, SelectorOperator::In | SelectorOperator::NotIn);
            if needs_values && req.values.is_empty() {
                return Err(format!(
                    "matchExpressions[{i}].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
                ));
            }
            if !needs_values && !req.values.is_empty() {
                return Err(format!(
                    "matchExpressions[{i}].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                ));
            }
        }
        Ok(())
    }

    /// Whether `labels` satisfy every `matchLabels` entry and every expression.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
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

    /// `NotIn` and `DoesNotExist` match objects without the key, as in Kubernetes.
    pub fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.contains(v)),
            SelectorOperator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
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
        assert!(with_expr("k", In, &[]).validate().is_err());
        assert!(with_expr("k", NotIn, &[]).validate().is_err());
        assert!(with_expr("k", Exists, &["v"]).validate().is_err());
        assert!(with_expr("k", DoesNotExist, &[]).validate().is_ok());
        assert!(with_expr("k", In, &["v"]).validate().is_ok());
        assert_eq!(In.to_string(), "In");
    }
}
