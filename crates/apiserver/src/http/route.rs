//! URL paths of the Kubernetes API, parsed into what they address.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Version,
    Healthz,
    CoreGroup,
    Groups,
    Group(String),
    GroupVersion { group: String, version: String },
    OpenApi,
    OpenApiV3Root,
    OpenApiV3(String),
    Faults,
    Compact,
    Requests,
    Resource(ResourcePath),
    Unknown,
}

pub fn parse(path: &str) -> Route {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz"] | ["livez"] | ["readyz"] => Route::Healthz,
        ["api"] => Route::CoreGroup,
        ["apis"] => Route::Groups,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", rest @ ..] => Route::OpenApiV3(rest.join("/")),
        ["openapi", ..] => Route::OpenApi,
        ["lab", "faults"] => Route::Faults,
        ["lab", "compact"] => Route::Compact,
        ["lab", "requests"] => Route::Requests,
        ["api", version, rest @ ..] => resource("", version, rest),
        ["apis", group] => Route::Group((*group).to_owned()),
        ["apis", group, version, rest @ ..] => resource(group, version, rest),
        _ => Route::Unknown,
    }
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Route {
    let mk = |namespace: Option<&str>, plural: &str, name: Option<&str>, sub: Option<&str>| {
        Route::Resource(ResourcePath {
            group: group.to_owned(),
            version: version.to_owned(),
            namespace: namespace.map(str::to_owned),
            plural: plural.to_owned(),
            name: name.map(str::to_owned),
            subresource: sub.map(str::to_owned),
        })
    };
    match rest {
        [] => Route::GroupVersion {
            group: group.to_owned(),
            version: version.to_owned(),
        },
        [plural] => mk(None, plural, None, None),
        [plural, name] => mk(None, plural, Some(name), None),
        ["namespaces", name, sub @ ("status" | "finalize")] => {
            mk(None, "namespaces", Some(name), Some(sub))
        }
        ["namespaces", ns, plural] => mk(Some(ns), plural, None, None),
        [plural, name, sub] => mk(None, plural, Some(name), Some(sub)),
        ["namespaces", ns, plural, name] => mk(Some(ns), plural, Some(name), None),
        ["namespaces", ns, plural, name, sub] => mk(Some(ns), plural, Some(name), Some(sub)),
        _ => Route::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn discovery_routes() {
        assert_eq!(parse("/api"), Route::CoreGroup);
        assert_eq!(parse("/apis"), Route::Groups);
        assert_eq!(parse("/version"), Route::Version);
        assert_eq!(
            parse("/api/v1"),
            Route::GroupVersion {
                group: String::new(),
                version: "v1".into()
            }
        );
        assert_eq!(
            parse("/apis/discovery.k8s.io/v1/"),
            Route::GroupVersion {
                group: "discovery.k8s.io".into(),
                version: "v1".into()
            }
        );
        assert_eq!(
            parse("/apis/discovery.k8s.io"),
            Route::Group("discovery.k8s.io".into())
        );
        assert_eq!(parse("/openapi/v3"), Route::OpenApiV3Root);
        assert_eq!(
            parse("/openapi/v3/apis/discovery.k8s.io/v1"),
            Route::OpenApiV3("apis/discovery.k8s.io/v1".into())
        );
        assert_eq!(parse("/openapi/v2"), Route::OpenApi);
        assert_eq!(parse("/lab/faults"), Route::Faults);
        assert_eq!(parse("/lab/requests"), Route::Requests);
        assert_eq!(parse("/nope"), Route::Unknown);
    }

    #[test]
    fn resource_routes() {
        let r = res("/api/v1/namespaces/default/services/web/status");
        assert_eq!(
            (
                r.namespace.as_deref(),
                r.plural.as_str(),
                r.name.as_deref(),
                r.subresource.as_deref()
            ),
            (Some("default"), "services", Some("web"), Some("status"))
        );
        let r = res("/api/v1/pods");
        assert_eq!((r.namespace, r.name), (None, None));
        let r = res("/api/v1/namespaces/team");
        assert_eq!(
            (r.plural.as_str(), r.name.as_deref()),
            ("namespaces", Some("team"))
        );
        let r = res("/api/v1/namespaces/team/status");
        assert_eq!(
            (r.plural.as_str(), r.subresource.as_deref()),
            ("namespaces", Some("status"))
        );
        let r = res("/api/v1/namespaces/team/pods");
        assert_eq!(
            (r.namespace.as_deref(), r.plural.as_str()),
            (Some("team"), "pods")
        );
        let r = res("/apis/berth.dev/v1alpha1/ippools/p/status");
        assert_eq!(
            (
                r.group.as_str(),
                r.name.as_deref(),
                r.subresource.as_deref()
            ),
            ("berth.dev", Some("p"), Some("status"))
        );
        let r = res("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l");
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref()),
            (Some("kube-system"), Some("l"))
        );
        assert_eq!(parse("/api/v1/a/b/c/d/e/f"), Route::Unknown);
    }
}
