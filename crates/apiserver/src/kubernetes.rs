//! `default/kubernetes`: the Service, Endpoints and EndpointSlice a real API server keeps for
//! itself from the start, pointing at its own address. In-cluster clients find the API server
//! through it, and a service proxy programs it like any other Service.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde_json::{json, Value};

use super::error::ApiError;
use super::store::Store;
use super::write::{Door, Managed, WriteCtx};

/// The first address of the lab's service CIDR (10.96.0.0/16), as the API server takes the
/// first address of `--service-cluster-ip-range` for it.
pub const KUBERNETES_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The same in the lab's IPv6 service CIDR (fd00:96::/112), for an API server serving over
/// IPv6 (an IPv6-only lab): the Service takes the family of the server's address.
pub const KUBERNETES_CLUSTER_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 1);

/// The Service, its Endpoints and its EndpointSlice for an API server serving at `endpoint`.
pub fn build_kubernetes_service(endpoint: SocketAddr, now: &str) -> [Value; 3] {
    let ip = endpoint.ip().to_string();
    let port = endpoint.port();
    let (address_type, cluster_ip) = match endpoint.ip() {
        IpAddr::V4(_) => ("IPv4", KUBERNETES_CLUSTER_IP.to_string()),
        IpAddr::V6(_) => ("IPv6", KUBERNETES_CLUSTER_IP6.to_string()),
    };
    let labels = json!({"component": "apiserver", "provider": "kubernetes"});
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": labels,
            "creationTimestamp": now},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
            "ipFamilies": [address_type], "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
            "sessionAffinity": "None", "internalTrafficPolicy": "Cluster"
        },
        "status": {"loadBalancer": {}}
    });
    let endpoints = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"},
            "creationTimestamp": now},
        "subsets": [{"addresses": [{"ip": ip}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]
    });
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
            "creationTimestamp": now},
        "addressType": address_type,
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]
    });
    [service, endpoints, slice]
}

/// The finalizer an API server keeps on a ServiceCIDR while ClusterIPs inside it are allocated.
pub const SERVICE_CIDR_FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";

/// The default ServiceCIDR `kubernetes` an API server creates from its
/// `--service-cluster-ip-range` (one CIDR per family, primary first), Ready as its controller
/// marks it.
pub fn build_default_service_cidr(cidrs: &[String], now: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes", "creationTimestamp": now,
            "finalizers": [SERVICE_CIDR_FINALIZER]},
        "spec": {"cidrs": cidrs},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "",
            "message": "Kubernetes Service CIDR is ready", "lastTransitionTime": now}]}
    })
}

/// Creates the default ServiceCIDR `kubernetes` in a fresh store.
pub fn seed_default_service_cidr(
    store: &mut Store,
    cidrs: &[String],
    now: &str,
) -> Result<(), ApiError> {
    let object = build_default_service_cidr(cidrs, now);
    let status = object["status"].clone();
    seed(store, [object], now)?;
    // A create keeps no status: the ServiceCIDR controller writes it through `/status`.
    let info = store
        .catalogue()
        .find("networking.k8s.io", "v1", "servicecidrs")
        .cloned()
        .ok_or_else(|| ApiError::bad_request("servicecidrs are not served".to_owned()))?;
    let mut created = (*store.get(&info, "", "kubernetes")?).clone();
    created["status"] = status;
    let ctx = WriteCtx {
        now,
        door: Door::Status,
        managed: Managed::Track("kube-apiserver"),
    };
    store.update(&info, "", "kubernetes", created, &ctx)?;
    Ok(())
}

/// Creates `default/kubernetes` in a fresh store.
pub fn seed_kubernetes_service(
    store: &mut Store,
    endpoint: SocketAddr,
    now: &str,
) -> Result<(), ApiError> {
    seed(store, build_kubernetes_service(endpoint, now), now)
}

/// Creates `objects` as the API server's own (field manager `kube-apiserver`), each in the
/// namespace its metadata names.
fn seed(
    store: &mut Store,
    objects: impl IntoIterator<Item = Value>,
    now: &str,
) -> Result<(), ApiError> {
    let ctx = WriteCtx {
        now,
        door: Door::Main,
        managed: Managed::Track("kube-apiserver"),
    };
    for obj in objects {
        let (api_version, kind) = (
            obj["apiVersion"].as_str().unwrap_or_default().to_owned(),
            obj["kind"].as_str().unwrap_or_default().to_owned(),
        );
        let info = store
            .catalogue()
            .all()
            .iter()
            .find(|r| r.api_version() == api_version && r.kind == kind)
            .cloned()
            .ok_or_else(|| {
                ApiError::bad_request(format!("no resource for {api_version} {kind}"))
            })?;
        let namespace = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        store.create(&info, &namespace, obj, &ctx)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_service_points_at_the_api_server() {
        let [svc, eps, slice] =
            build_kubernetes_service("198.18.0.2:6443".parse().unwrap(), "2026-01-01T00:00:00Z");
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.1");
        assert_eq!(svc["spec"]["ports"][0]["port"], 443);
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 6443);
        assert_eq!(eps["subsets"][0]["addresses"][0]["ip"], "198.18.0.2");
        assert_eq!(slice["endpoints"][0]["addresses"][0], "198.18.0.2");
        assert_eq!(slice["ports"][0]["port"], 6443);
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "kubernetes"
        );
    }

    #[test]
    fn an_api_server_on_ipv6_gets_an_ipv6_service() {
        let [svc, eps, slice] = build_kubernetes_service(
            "[fd00:198:18::2]:6443".parse().unwrap(),
            "2026-01-01T00:00:00Z",
        );
        assert_eq!(svc["spec"]["clusterIP"], "fd00:96::1");
        assert_eq!(svc["spec"]["clusterIPs"], json!(["fd00:96::1"]));
        assert_eq!(svc["spec"]["ipFamilies"], json!(["IPv6"]));
        assert_eq!(eps["subsets"][0]["addresses"][0]["ip"], "fd00:198:18::2");
        assert_eq!(slice["addressType"], "IPv6");
    }

    #[test]
    fn the_default_service_cidr_holds_every_family_and_is_ready() {
        let now = "2026-01-01T00:00:00Z";
        let mut store = Store::new(100, now);
        let cidrs = ["10.96.0.0/16".to_owned(), "fd00:96::/112".to_owned()];
        seed_default_service_cidr(&mut store, &cidrs, now).unwrap();
        let info = store
            .catalogue()
            .find("networking.k8s.io", "v1", "servicecidrs")
            .cloned()
            .unwrap();
        let got = store.get(&info, "", "kubernetes").unwrap();
        assert_eq!(got["spec"]["cidrs"], json!(cidrs));
        assert_eq!(got["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(got["status"]["conditions"][0]["status"], "True");
        assert_eq!(
            got["metadata"]["finalizers"],
            json!([SERVICE_CIDR_FINALIZER])
        );
        assert!(got["metadata"].get("namespace").is_none());
    }

    #[test]
    fn a_fresh_store_holds_it_once_seeded() {
        let now = "2026-01-01T00:00:00Z";
        let mut store = Store::new(100, now);
        seed_kubernetes_service(&mut store, "198.18.0.2:6443".parse().unwrap(), now).unwrap();
        let find = |group: &str, plural: &str| {
            store
                .catalogue()
                .all()
                .iter()
                .find(|r| r.group == group && r.plural == plural)
                .cloned()
                .unwrap()
        };
        let svc = store
            .get(&find("", "services"), "default", "kubernetes")
            .unwrap();
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.1");
        assert!(!svc["metadata"]["uid"].as_str().unwrap().is_empty());
        store
            .get(&find("", "endpoints"), "default", "kubernetes")
            .unwrap();
        store
            .get(
                &find("discovery.k8s.io", "endpointslices"),
                "default",
                "kubernetes",
            )
            .unwrap();
    }
}
