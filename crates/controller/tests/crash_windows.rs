//! Windows in which a crash (or a failed write) used to leave two Services naming one address:
//! an address must stay held while the status of a Service that no longer needs it still
//! names it.
//!
//! Address plan: service CIDR 10.96.0.0/16, node ports 30000-32767, one pool of one address,
//! 198.18.0.10.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth_controller::provider::{build_l2_ingress, LbRequest, Provider, ProviderError};
use berth_controller::AllocationController;
use berth_ipam::ServiceKey;
use common::*;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::LoadBalancerIngress;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The `l2` provider, except that deleting fails while `fail_delete` is set, so the write that
/// clears a former LoadBalancer's status does not happen.
struct StuckDelete {
    fail_delete: AtomicBool,
}

impl Provider for StuckDelete {
    fn ensure<'a>(
        &'a self,
        req: LbRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<LoadBalancerIngress>, ProviderError>> {
        Box::pin(async move { Ok(build_l2_ingress(req.addresses)) })
    }

    fn delete<'a>(&'a self, _service: &'a ServiceKey) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            if self.fail_delete.load(Ordering::Relaxed) {
                Err(ProviderError("stuck on purpose".into()))
            } else {
                Ok(())
            }
        })
    }
}

#[tokio::test]
async fn an_address_is_not_given_away_while_a_former_load_balancer_still_names_it() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "one",
        json!({"addresses": ["198.18.0.10-198.18.0.10"]}),
    )
    .await;
    let provider = Arc::new(StuckDelete {
        fail_delete: AtomicBool::new(false),
    });
    let mut registry = Registry::default();
    let ctrl = AllocationController::new(client.clone(), mk_config(), &mut registry)
        .with_provider(provider.clone());
    let token = CancellationToken::new();
    let task = tokio::spawn({
        let token = token.clone();
        async move { ctrl.run(token).await.unwrap() }
    });

    let lb = json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
    create_svc(&client, "a", lb.clone()).await;
    wait_svc(&client, "a", "ingress", |s| {
        ingress_ips(s) == ["198.18.0.10"]
    })
    .await;

    provider.fail_delete.store(true, Ordering::Relaxed);
    patch_svc(
        &client,
        "a",
        json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
    )
    .await;
    wait_until("the clear to fail", || async {
        events_for(&client, "a")
            .await
            .iter()
            .any(|(reason, _)| reason == "SyncLoadBalancerFailed")
    })
    .await;

    create_svc(&client, "b", lb).await;
    let b = wait_svc(&client, "b", "a decision", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&b).unwrap().0, "False", "{b:#?}");
    assert!(ingress_ips(&b).is_empty());
    assert_eq!(ingress_ips(&get_svc(&client, "a").await), ["198.18.0.10"]);

    // Once the clear lands, the address moves on.
    provider.fail_delete.store(false, Ordering::Relaxed);
    let mut moved = false;
    for _ in 0..600 {
        let b = get_svc(&client, "b").await;
        if ingress_ips(&b) == ["198.18.0.10"] {
            assert!(ingress_ips(&get_svc(&client, "a").await).is_empty());
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved, "b never got the address a gave up");
    token.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    server.shutdown().await.unwrap();
}
