//! The `aws-nlb` class end to end against the lab API server, with the in-memory ELBv2 (which
//! enforces AWS's rules) behind the real provider: the finalizer comes before the first AWS
//! call, the status gets the NLB's hostname, node changes move targets, deleting or changing
//! the Service's type removes everything, and a Service deleted while the controller was down
//! is cleaned up when it starts.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use berth_api::names::{annotation as ann, class, finalizer};
use berth_aws::{MemoryElbv2, NlbProvider, ProviderConfig};
use berth_controller::load_balancer::{aws_runner, AwsLoopConfig};
use berth_controller::AllocationController;
use common::*;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const SUBNETS: [&str; 2] = ["subnet-0000000a", "subnet-0000000b"];

fn instance(i: usize) -> String {
    format!("i-{i:017x}")
}

fn fake_provider() -> Arc<NlbProvider<MemoryElbv2>> {
    let fake = MemoryElbv2::new();
    for s in SUBNETS {
        fake.add_subnet(s, "vpc-00000001");
    }
    for i in 0..3 {
        fake.add_instance(&instance(i));
    }
    let config = ProviderConfig {
        cluster_name: "lab".into(),
        default_subnets: SUBNETS.iter().map(|s| s.to_string()).collect(),
        quotas: Default::default(),
    };
    Arc::new(NlbProvider::new(fake, config, Duration::from_secs(3600)))
}

fn spawn(
    client: Client,
    provider: Arc<NlbProvider<MemoryElbv2>>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let mut registry = Registry::default();
    let runner = aws_runner(
        provider,
        AwsLoopConfig {
            default_class: Some(class::L2),
            sweep_interval: Duration::from_secs(3600),
        },
    );
    let ctrl = AllocationController::new(client, mk_config(), &mut registry).with_aws(runner);
    let token = CancellationToken::new();
    let t = token.clone();
    let task = tokio::spawn(async move { ctrl.run(t).await.unwrap() });
    (token, task)
}

async fn stop(token: CancellationToken, task: tokio::task::JoinHandle<()>) {
    token.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("controller stops")
        .expect("controller does not panic");
}

async fn create_nodes(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..3 {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{i}")},
            "spec": {"providerID": format!("aws:///us-east-1a/{}", instance(i))},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        nodes
            .patch_status(
                &format!("node-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .unwrap();
    }
}

fn nlb(ports: serde_json::Value) -> serde_json::Value {
    json!({"type": "LoadBalancer", "loadBalancerClass": class::AWS_NLB, "ports": ports})
}

fn hostname(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

fn targets(provider: &NlbProvider<MemoryElbv2>) -> usize {
    provider
        .client()
        .snapshot()
        .targets
        .values()
        .map(|t| t.len())
        .sum()
}

#[tokio::test]
async fn an_aws_nlb_service_gets_an_nlb_and_gives_it_back() {
    let (_server, client) = start_lab().await;
    create_nodes(&client).await;
    let provider = fake_provider();
    let (token, task) = spawn(client.clone(), provider.clone());

    create_svc(&client, "web", nlb(json!([{"port": 80}]))).await;
    let web = wait_svc(&client, "web", "hostname", |s| hostname(s).is_some()).await;
    assert!(web
        .finalizers()
        .iter()
        .any(|f| f == finalizer::LOAD_BALANCER));
    assert!(web.annotations().contains_key(ann::AWS_LOAD_BALANCER_ARN));
    let snap = provider.client().snapshot();
    assert_eq!(
        (
            snap.load_balancers.len(),
            snap.target_groups.len(),
            snap.listeners.len()
        ),
        (1, 1, 1)
    );
    assert_eq!(
        hostname(&web).unwrap(),
        snap.load_balancers[0].dns_name.to_lowercase()
    );
    assert_eq!(targets(&provider), 3);
    wait_until("EnsuredLoadBalancer", || async {
        events_for(&client, "web")
            .await
            .iter()
            .any(|(reason, _)| reason == "EnsuredLoadBalancer")
    })
    .await;

    // A node excluded from load balancers stops being a target.
    let nodes: Api<Node> = Api::all(client.clone());
    let exclude = json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": ""}}});
    nodes
        .patch("node-2", &PatchParams::default(), &Patch::Merge(&exclude))
        .await
        .unwrap();
    wait_until("two targets", || async { targets(&provider) == 2 }).await;

    // Deleting the Service removes the NLB first, then the finalizer, then the Service.
    delete_svc(&client, "web").await;
    let services: Api<Service> = Api::default_namespaced(client.clone());
    wait_until("web gone", || async {
        services.get_opt("web").await.unwrap().is_none()
    })
    .await;
    let snap = provider.client().snapshot();
    assert!(
        snap.load_balancers.is_empty() && snap.target_groups.is_empty(),
        "{snap:#?}"
    );

    // A Service that stops being a LoadBalancer gives everything back and is let go.
    create_svc(&client, "api", nlb(json!([{"port": 443}]))).await;
    wait_svc(&client, "api", "hostname", |s| hostname(s).is_some()).await;
    patch_svc(
        &client,
        "api",
        json!({"spec": {"type": "ClusterIP", "loadBalancerClass": null}}),
    )
    .await;
    let api = wait_svc(&client, "api", "released", |s| s.finalizers().is_empty()).await;
    assert_eq!(hostname(&api), None);
    assert!(!api.annotations().contains_key(ann::AWS_LOAD_BALANCER_ARN));
    assert!(provider.client().snapshot().load_balancers.is_empty());

    // Deleted while the controller is down: the next controller cleans up.
    create_svc(&client, "db", nlb(json!([{"port": 5432}]))).await;
    wait_svc(&client, "db", "hostname", |s| hostname(s).is_some()).await;
    stop(token, task).await;
    delete_svc(&client, "db").await;
    let db = get_svc(&client, "db").await;
    assert!(
        db.metadata.deletion_timestamp.is_some(),
        "held by the finalizer"
    );
    assert_eq!(provider.client().snapshot().load_balancers.len(), 1);
    let (token, task) = spawn(client.clone(), provider.clone());
    wait_until("db gone", || async {
        services.get_opt("db").await.unwrap().is_none()
    })
    .await;
    assert!(provider.client().snapshot().load_balancers.is_empty());
    stop(token, task).await;
    // Every reconcile that did something was timed, by what it did.
    let m = provider.metrics();
    for action in ["apply", "cleanup", "release"] {
        assert!(m.reconciles(action) > 0, "no {action} reconcile timed");
    }
}
