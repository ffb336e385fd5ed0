//! Load-balancer providers: one trait, `ensure` (Service, eligible nodes) -> ingress and
//! `delete`. The `l2` provider has no external state: the ingress is the allocated address
//! with `ipMode: VIP`, and the agents announce it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use berth_api::names::label;
use berth_ipam::ServiceKey;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Node};

/// What a provider is asked to serve.
#[derive(Debug, Clone, Copy)]
pub struct LbRequest<'a> {
    pub service: &'a ServiceKey,
    /// Addresses allocated from IPPools (empty for providers that make their own).
    pub addresses: &'a [IpAddr],
    /// Names of the nodes that may receive traffic.
    pub nodes: &'a [String],
}

/// A provider failure, reported as `SyncLoadBalancerFailed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderError(pub String);

/// A load-balancer implementation.
pub trait Provider: Send + Sync {
    /// Makes the load balancer exist as requested; returns the Service's ingress.
    fn ensure<'a>(
        &'a self,
        req: LbRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<LoadBalancerIngress>, ProviderError>>;

    /// Removes whatever the provider made for the Service. Idempotent.
    fn delete<'a>(&'a self, service: &'a ServiceKey) -> BoxFuture<'a, Result<(), ProviderError>>;
}

/// Bare metal: the allocated addresses, announced over ARP by the agents.
#[derive(Debug, Clone, Copy, Default)]
pub struct L2Provider;

impl Provider for L2Provider {
    fn ensure<'a>(
        &'a self,
        req: LbRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<LoadBalancerIngress>, ProviderError>> {
        Box::pin(async move {
            if req.addresses.is_empty() {
                return Err(ProviderError(format!(
                    "no address is allocated to {}",
                    req.service
                )));
            }
            Ok(build_l2_ingress(req.addresses))
        })
    }

    fn delete<'a>(&'a self, _service: &'a ServiceKey) -> BoxFuture<'a, Result<(), ProviderError>> {
        // Nothing outside the cluster to remove: the agents stop announcing once the
        // address leaves the Service's status.
        Box::pin(async { Ok(()) })
    }
}

/// `status.loadBalancer.ingress` for VIP addresses.
pub fn build_l2_ingress(addresses: &[IpAddr]) -> Vec<LoadBalancerIngress> {
    addresses
        .iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip.to_string()),
            ip_mode: Some("VIP".to_string()),
            ..LoadBalancerIngress::default()
        })
        .collect()
}

/// Nodes that may receive load-balancer traffic: not excluded by label, not being deleted.
pub fn eligible_nodes(nodes: &BTreeMap<String, Node>) -> Vec<String> {
    nodes
        .iter()
        .filter(|(_, n)| n.metadata.deletion_timestamp.is_none())
        .filter(|(_, n)| {
            !n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn l2_ingress_is_the_vip() {
        let key = ServiceKey::new("ns", "a");
        let ips: Vec<IpAddr> = vec!["198.18.0.200".parse().unwrap(), "fd00::1".parse().unwrap()];
        let ingress = L2Provider
            .ensure(LbRequest {
                service: &key,
                addresses: &ips,
                nodes: &[],
            })
            .await
            .unwrap();
        assert_eq!(ingress.len(), 2);
        assert_eq!(ingress[0].ip.as_deref(), Some("198.18.0.200"));
        assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));
        let none = L2Provider
            .ensure(LbRequest {
                service: &key,
                addresses: &[],
                nodes: &[],
            })
            .await;
        assert!(none.is_err());
        assert!(L2Provider.delete(&key).await.is_ok());
    }

    #[test]
    fn excluded_and_deleting_nodes_are_not_eligible() {
        let mk = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        let mut nodes = BTreeMap::new();
        nodes.insert("a".to_string(), mk(json!({"metadata": {"name": "a"}})));
        nodes.insert(
            "b".to_string(),
            mk(json!({"metadata": {"name": "b", "labels": {label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: ""}}})),
        );
        nodes.insert(
            "c".to_string(),
            mk(json!({"metadata": {"name": "c", "deletionTimestamp": "2024-01-01T00:00:00Z"}})),
        );
        assert_eq!(eligible_nodes(&nodes), vec!["a".to_string()]);
    }
}
