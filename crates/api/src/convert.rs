//! Conversions from Kubernetes API types to berth-core's vocabulary, in one place: label
//! selectors, which the CRDs carry as k8s-openapi's `LabelSelector`.

use berth_core::{
    validate_selector, FieldErrors, LabelSelector, LabelSelectorRequirement, Labels, UnknownValue,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

/// The selector in berth-core's terms; an unknown operator is an error.
pub fn to_selector(selector: &meta::LabelSelector) -> Result<LabelSelector, UnknownValue> {
    let match_expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .map(|req| {
            Ok(LabelSelectorRequirement {
                key: req.key.clone(),
                operator: req.operator.parse()?,
                values: req.values.clone().unwrap_or_default(),
            })
        })
        .collect::<Result<_, UnknownValue>>()?;
    Ok(LabelSelector {
        match_labels: selector.match_labels.clone().unwrap_or_default(),
        match_expressions,
    })
}

/// Requirements are ANDed and an empty selector matches everything. A selector with an unknown
/// operator matches nothing, so one that skipped validation can only narrow, never widen, a
/// choice.
pub fn selector_matches(selector: &meta::LabelSelector, labels: &Labels) -> bool {
    to_selector(selector).is_ok_and(|s| s.matches(labels))
}

/// Checks a label selector as the apiserver does for built-in kinds (see
/// [`berth_core::validate_selector`]). The controller matches with the selector afterwards,
/// so a selector that passes here cannot fail at matching time.
pub fn validate_label_selector(
    selector: &meta::LabelSelector,
    path: &str,
    errors: &mut FieldErrors,
) {
    let no_labels = Labels::new();
    validate_selector(
        selector.match_labels.as_ref().unwrap_or(&no_labels),
        selector.match_expressions.iter().flatten().map(|req| {
            (
                req.key.as_str(),
                req.operator.as_str(),
                req.values.as_deref().unwrap_or_default(),
            )
        }),
        path,
        errors,
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use berth_core::SelectorOperator;
    use std::collections::BTreeMap;

    pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub(crate) fn mk_selector(
        match_labels: &[(&str, &str)],
        exprs: &[(&str, &str, &[&str])],
    ) -> meta::LabelSelector {
        meta::LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!exprs.is_empty()).then(|| {
                exprs
                    .iter()
                    .map(|(k, op, vs)| meta::LabelSelectorRequirement {
                        key: k.to_string(),
                        operator: op.to_string(),
                        values: (!vs.is_empty())
                            .then(|| vs.iter().map(|v| v.to_string()).collect()),
                    })
                    .collect()
            }),
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> meta::LabelSelectorRequirement {
        meta::LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn check(selector: &meta::LabelSelector) -> Vec<String> {
        let mut errors = FieldErrors::default();
        validate_label_selector(selector, "spec.sel", &mut errors);
        errors.iter().map(|e| e.path.clone()).collect()
    }

    #[test]
    fn selector_operators() {
        let l = labels(&[("tier", "web"), ("gpu", "")]);
        assert!(selector_matches(&mk_selector(&[], &[]), &l));
        assert!(selector_matches(
            &mk_selector(&[], &[("tier", "NotIn", &["db"])]),
            &l
        ));
        assert!(selector_matches(
            &mk_selector(&[], &[("zone", "NotIn", &["a"])]),
            &l
        ));
        assert!(!selector_matches(
            &mk_selector(&[], &[("tier", "NotIn", &["web"])]),
            &l
        ));
        assert!(selector_matches(
            &mk_selector(&[], &[("gpu", "Exists", &[])]),
            &l
        ));
        assert!(!selector_matches(
            &mk_selector(&[], &[("tier", "In", &["db"])]),
            &l
        ));
        assert!(!selector_matches(
            &mk_selector(&[], &[("tier", "Near", &["web"])]),
            &l
        ));
        assert!(!selector_matches(
            &mk_selector(&[("tier", "web")], &[("gpu", "DoesNotExist", &[])]),
            &l
        ));
    }

    #[test]
    fn selectors() {
        let good = meta::LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "echo".into())])),
            match_expressions: Some(vec![
                req("tier", "In", &["web"]),
                req("gpu", "DoesNotExist", &[]),
            ]),
        };
        assert!(check(&good).is_empty());
        assert!(check(&meta::LabelSelector::default()).is_empty());

        let bad = meta::LabelSelector {
            match_labels: Some(BTreeMap::from([("bad key".into(), "-v".into())])),
            match_expressions: Some(vec![
                req("tier", "In", &[]),
                req("gpu", "Exists", &["yes"]),
                req("zone", "Near", &["a"]),
                req("ok", "NotIn", &["bad value"]),
            ]),
        };
        assert_eq!(
            check(&bad),
            [
                "spec.sel.matchLabels",
                "spec.sel.matchLabels[bad key]",
                "spec.sel.matchExpressions[0].values",
                "spec.sel.matchExpressions[1].values",
                "spec.sel.matchExpressions[2].operator",
                "spec.sel.matchExpressions[3].values[0]",
            ]
        );
    }

    #[test]
    fn conversion_keeps_every_requirement_and_refuses_unknown_operators() {
        let s = mk_selector(
            &[("app", "web")],
            &[("tier", "In", &["a", "b"]), ("gpu", "DoesNotExist", &[])],
        );
        let core = to_selector(&s).unwrap();
        assert_eq!(core.match_labels, labels(&[("app", "web")]));
        assert_eq!(
            core.match_expressions,
            vec![
                LabelSelectorRequirement::new("tier", SelectorOperator::In, &["a", "b"]),
                LabelSelectorRequirement::new("gpu", SelectorOperator::DoesNotExist, &[]),
            ]
        );
        let err = to_selector(&mk_selector(&[], &[("k", "Near", &["v"])])).unwrap_err();
        assert_eq!(err.to_string(), "unsupported selector operator \"Near\"");
    }
}
