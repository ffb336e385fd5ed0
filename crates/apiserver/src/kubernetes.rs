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

/// Creates `default/kubernetes` in a fresh store.
pub fn seed_kubernetes_service(
    store: &mut Store,
    endpoint: SocketAddr,
    now: &str,
) -> Result<(), ApiError> {
    let ctx = WriteCtx {
        now,
        door: Door::Main,
        managed: Managed::Track("kube-apiserver"),
    };
    for obj in build_kubernetes_service(endpoint, now) {
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
        store.create(&info, "default", obj, &ctx)?;
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
