//! Label selector matching with Kubernetes semantics, for pools, namespaces, Services and nodes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Requirements are ANDed and an empty selector matches everything. An unknown operator matches
/// nothing, so a selector that skipped validation can only narrow, never widen, a choice.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub(crate) fn mk_selector(
        match_labels: &[(&str, &str)],
        exprs: &[(&str, &str, &[&str])],
    ) -> LabelSelector {
        LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!exprs.is_empty()).then(|| {
                exprs
                    .iter()
                    .map(|(k, op, vs)| LabelSelectorRequirement {
                        key: k.to_string(),
                        operator: op.to_string(),
                        values: (!vs.is_empty())
                            .then(|| vs.iter().map(|v| v.to_string()).collect()),
                    })
                    .collect()
            }),
        }
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
}
