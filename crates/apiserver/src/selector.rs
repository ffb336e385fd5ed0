//! Label and field selectors, parsed from their query-string forms and matched against JSON objects.

use super::error::ApiError;
use super::resource::ResourceInfo;
use berth_core::{LabelSelectorRequirement, SelectorOperator};
use serde_json::Value;

/// One term of a `labelSelector` query. Equality terms are set terms with one value (`a=b` is
/// `a in (b)`, `a!=b` is `a notin (b)`), so they match with the same rules as an object's
/// selector; only the query syntax's `>` and `<` go beyond them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    Set(LabelSelectorRequirement),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

fn set(key: String, operator: SelectorOperator, values: Vec<String>) -> LabelRequirement {
    LabelRequirement::Set(LabelSelectorRequirement {
        key,
        operator,
        values,
    })
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let requirements = split_top_level(text)
            .into_iter()
            .filter(|t| !t.trim().is_empty())
            .map(parse_requirement)
            .collect::<Result<_, _>>()?;
        Ok(Self { requirements })
    }

    pub fn matches(&self, labels: &Value) -> bool {
        self.requirements
            .iter()
            .all(|r| requirement_matches(r, labels))
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Commas separate requirements except inside the parentheses of a set.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')
}

fn parse_error(term: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {why}: {term:?}"))
}

fn parse_requirement(term: &str) -> Result<LabelRequirement, ApiError> {
    let t = term.trim();
    if let Some(rest) = t.strip_prefix('!') {
        let key = rest.trim();
        if key.is_empty() || !key.chars().all(is_key_char) {
            return Err(parse_error(t, "invalid label key"));
        }
        return Ok(set(
            key.to_owned(),
            SelectorOperator::DoesNotExist,
            Vec::new(),
        ));
    }
    let key_end = t.find(|c: char| !is_key_char(c)).unwrap_or(t.len());
    let key = &t[..key_end];
    if key.is_empty() {
        return Err(parse_error(t, "found empty key"));
    }
    let key = key.to_owned();
    let rest = t[key_end..].trim_start();
    if rest.is_empty() {
        return Ok(set(key, SelectorOperator::Exists, Vec::new()));
    }
    let value = |v: &str| -> Result<String, ApiError> {
        let v = v.trim();
        if v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            Ok(v.to_owned())
        } else {
            Err(parse_error(t, "invalid label value"))
        }
    };
    let integer = |v: &str| {
        v.trim()
            .parse::<i64>()
            .map_err(|_| parse_error(t, "for 'Gt', 'Lt' operators, the value must be an integer"))
    };
    if let Some(v) = rest.strip_prefix("!=") {
        return Ok(set(key, SelectorOperator::NotIn, vec![value(v)?]));
    }
    if let Some(v) = rest.strip_prefix("==") {
        return Ok(set(key, SelectorOperator::In, vec![value(v)?]));
    }
    if let Some(v) = rest.strip_prefix('=') {
        return Ok(set(key, SelectorOperator::In, vec![value(v)?]));
    }
    if let Some(v) = rest.strip_prefix('>') {
        return Ok(LabelRequirement::GreaterThan(key, integer(v)?));
    }
    if let Some(v) = rest.strip_prefix('<') {
        return Ok(LabelRequirement::LessThan(key, integer(v)?));
    }
    if let Some(v) = rest.strip_prefix("notin") {
        return Ok(set(key, SelectorOperator::NotIn, parse_set(t, v)?));
    }
    if let Some(v) = rest.strip_prefix("in") {
        return Ok(set(key, SelectorOperator::In, parse_set(t, v)?));
    }
    Err(parse_error(t, "found unknown operator"))
}

fn parse_set(term: &str, text: &str) -> Result<Vec<String>, ApiError> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| parse_error(term, "expected a set of values in parentheses"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
    if values.iter().any(|v| {
        !v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    }) {
        return Err(parse_error(term, "invalid label value"));
    }
    Ok(values)
}

fn requirement_matches(req: &LabelRequirement, labels: &Value) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    match req {
        LabelRequirement::Set(r) => r.operator.admits(get(&r.key), &r.values),
        LabelRequirement::GreaterThan(k, n) => get(k)
            .and_then(|l| l.parse::<i64>().ok())
            .is_some_and(|l| l > *n),
        LabelRequirement::LessThan(k, n) => get(k)
            .and_then(|l| l.parse::<i64>().ok())
            .is_some_and(|l| l < *n),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub value: String,
    pub equal: bool,
}

/// A parsed `fieldSelector`, checked against the fields the resource supports, as upstream does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    pub fn parse(text: &str, info: &ResourceInfo) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !supported_fields(info).contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                value: value.trim().to_owned(),
                equal,
            });
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements
            .iter()
            .all(|r| (field_value(obj, &r.field) == r.value) == r.equal)
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The single `metadata.name=x` a watch on one object uses, so lookups can skip a scan.
    pub fn exact_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.equal && r.field == "metadata.name")
            .map(|r| r.value.as_str())
    }
}

fn supported_fields(info: &ResourceInfo) -> Vec<&'static str> {
    let mut fields = vec!["metadata.name", "metadata.namespace"];
    let extra: &[&str] = match (info.group.as_str(), info.plural.as_str()) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "services") => &["spec.clusterIP", "spec.type"],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "namespaces") => &["status.phase"],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        _ => &[],
    };
    fields.extend_from_slice(extra);
    fields
}

/// The string form of a selectable field; absent fields compare as "" (and booleans as "false"), as upstream.
fn field_value(obj: &Value, field: &str) -> String {
    if field == "source" {
        return obj["source"]["component"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
    }
    let mut cur = obj;
    for part in field.split('.') {
        cur = &cur[part];
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null if field == "spec.hostNetwork" || field == "spec.unschedulable" => {
            "false".to_owned()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::built_ins;
    use serde_json::json;

    fn info(plural: &str) -> ResourceInfo {
        built_ins()
            .into_iter()
            .find(|r| r.plural == plural && r.group.is_empty())
            .unwrap()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap()
    }

    #[test]
    fn label_operators() {
        let labels = json!({"app": "web", "tier": "front", "weight": "7"});
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("app notin (web,db)", false),
            ("missing notin (x)", true),
            ("missing in (x)", false),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier in (front,back),!missing", true),
            ("app=web,tier=back", false),
            ("weight>5", true),
            ("weight<5", false),
            ("app>1", false),
            ("app=", false),
        ];
        for (s, want) in cases {
            assert_eq!(sel(s).matches(&labels), want, "{s}");
        }
    }

    #[test]
    fn empty_value_matches_empty_label() {
        assert!(sel("a=").matches(&json!({"a": ""})));
    }

    #[test]
    fn labels_absent_object() {
        assert!(sel("!a").matches(&Value::Null));
        assert!(!sel("a").matches(&Value::Null));
    }

    #[test]
    fn label_parse_errors() {
        for bad in ["=x", "a in x", "a ~ b", "a>x", "a=b c", "!"] {
            let err = LabelSelector::parse(bad).unwrap_err();
            assert_eq!(err.code, 400, "{bad}");
        }
    }

    #[test]
    fn qualified_keys() {
        let labels = json!({"kubernetes.io/service-name": "web"});
        assert!(sel("kubernetes.io/service-name=web").matches(&labels));
        assert_eq!(sel("a in (x,y),b").requirements.len(), 2);
    }

    #[test]
    fn field_selectors_for_pods_and_services() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}});
        let pods = info("pods");
        assert!(FieldSelector::parse("spec.nodeName=n1", &pods)
            .unwrap()
            .matches(&pod));
        assert!(!FieldSelector::parse("spec.nodeName!=n1", &pods)
            .unwrap()
            .matches(&pod));
        assert!(
            FieldSelector::parse("metadata.name==p,metadata.namespace=ns", &pods)
                .unwrap()
                .matches(&pod)
        );
        assert!(FieldSelector::parse("spec.hostNetwork=false", &pods)
            .unwrap()
            .matches(&pod));
        assert!(FieldSelector::parse("status.podIP=", &pods)
            .unwrap()
            .matches(&pod));

        let svc = json!({"metadata": {"name": "s"}, "spec": {"clusterIP": "10.96.0.1", "type": "NodePort"}});
        let services = info("services");
        assert!(FieldSelector::parse("spec.clusterIP=10.96.0.1", &services)
            .unwrap()
            .matches(&svc));
        assert!(FieldSelector::parse("spec.type=NodePort", &services)
            .unwrap()
            .matches(&svc));
        assert!(!FieldSelector::parse("spec.type!=NodePort", &services)
            .unwrap()
            .matches(&svc));
    }

    #[test]
    fn unknown_field_is_bad_request_as_upstream() {
        let err = FieldSelector::parse("spec.nodeName=x", &info("services")).unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "field label not supported: spec.nodeName");
        assert_eq!(
            FieldSelector::parse("nonsense", &info("pods"))
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn exact_name_shortcut() {
        let fs = FieldSelector::parse("metadata.name=a", &info("pods")).unwrap();
        assert_eq!(fs.exact_name(), Some("a"));
        assert_eq!(
            FieldSelector::parse("metadata.name!=a", &info("pods"))
                .unwrap()
                .exact_name(),
            None
        );
    }

    #[test]
    fn event_source_field() {
        let ev = json!({"source": {"component": "berth"}, "type": "Warning"});
        let events = info("events");
        assert!(FieldSelector::parse("source=berth,type=Warning", &events)
            .unwrap()
            .matches(&ev));
    }
}
