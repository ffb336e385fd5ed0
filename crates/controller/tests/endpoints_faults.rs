//! With the lab's faults on (10% of writes fail, watches dropped) the endpoints controller keeps
//! going, and once the faults stop every Service's Endpoints and slices match its pods exactly,
//! with no duplicate or leftover slice.
//!
//! Address plan: pod j of Service i is 10.244.<i>.<j+1> on nodes n1/n2; Services 10.96.1.<i>.

#![allow(clippy::unwrap_used)]

mod endpoints_support;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use berth_controller::endpoints::EndpointsConfig;
use berth_lab::{Faults, LabApiServer};
use endpoints_support::*;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

/// The test's own writes go through the same faulty server, so it retries them.
async fn retry<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    for _ in 0..100 {
        match op().await {
            Ok(v) => return v,
            Err(kube::Error::Api(s)) if s.code >= 500 || s.code == 429 => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    panic!("still failing after 100 attempts");
}

#[derive(Debug, Clone)]
struct PodModel {
    app: String,
    ip: String,
    ready: bool,
}

const SERVICES: usize = 12;
const PODS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_after_errors_and_dropped_watches() {
    let env = Env::start_with(
        LabApiServer::builder(),
        EndpointsConfig {
            workers: 4,
            ..EndpointsConfig::default()
        },
    )
    .await;
    let mut pods: BTreeMap<String, PodModel> = BTreeMap::new();
    let mut services: BTreeMap<String, String> = BTreeMap::new();

    env.server
        .set_faults(Faults {
            error_rate: 0.1,
            watch_drop_rate: 0.1,
            seed: 42,
            ..Faults::default()
        })
        .unwrap();

    for i in 0..SERVICES {
        let name = format!("svc-{i}");
        let svc = mk_service(&name, &name, &format!("10.96.1.{}", i + 1), json!(8080));
        retry(|| {
            let svc = serde_json::from_value(svc.clone()).unwrap();
            let api = env.services();
            async move { api.create(&Default::default(), &svc).await }
        })
        .await;
        services.insert(name.clone(), name.clone());
        for j in 0..PODS {
            let pod_name = format!("{name}-p{j}");
            let node = if j % 2 == 0 { "n1" } else { "n2" };
            let pod = mk_pod(&pod_name, &name, node, 8080);
            retry(|| {
                let pod = serde_json::from_value(pod.clone()).unwrap();
                let api = env.pods();
                async move { api.create(&Default::default(), &pod).await }
            })
            .await;
            let model = PodModel {
                app: name.clone(),
                ip: format!("10.244.{}.{}", i, j + 1),
                ready: (i + j) % 3 != 0,
            };
            set_status(&env, &pod_name, &model).await;
            pods.insert(pod_name, model);
        }
    }

    // Changes while faults continue: readiness flips, deletions, a selector change, a deleted
    // Service, new pods.
    for (name, model) in pods.iter_mut().filter(|(n, _)| n.ends_with("p1")) {
        model.ready = !model.ready;
        set_status(&env, name, model).await;
    }
    for name in ["svc-0-p0", "svc-3-p2", "svc-5-p5"] {
        retry(|| {
            let api = env.pods();
            async move { api.delete(name, &DeleteParams::default()).await }
        })
        .await;
        pods.remove(name);
    }
    let patch = json!({"spec": {"selector": {"app": "svc-2"}}});
    retry(|| {
        let api = env.services();
        let patch = patch.clone();
        async move {
            api.patch("svc-1", &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    })
    .await;
    services.insert("svc-1".to_owned(), "svc-2".to_owned());
    retry(|| {
        let api = env.services();
        async move { api.delete("svc-4", &DeleteParams::default()).await }
    })
    .await;
    services.remove("svc-4");
    for j in PODS..PODS + 3 {
        let pod_name = format!("svc-6-p{j}");
        let pod = mk_pod(&pod_name, "svc-6", "n1", 8080);
        retry(|| {
            let pod = serde_json::from_value(pod.clone()).unwrap();
            let api = env.pods();
            async move { api.create(&Default::default(), &pod).await }
        })
        .await;
        let model = PodModel {
            app: "svc-6".to_owned(),
            ip: format!("10.244.6.{}", j + 1),
            ready: true,
        };
        set_status(&env, &pod_name, &model).await;
        pods.insert(pod_name, model);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    env.server.set_faults(Faults::default()).unwrap();

    for (name, app) in &services {
        let selected: Vec<&PodModel> = pods.values().filter(|p| &p.app == app).collect();
        let mut ready: Vec<String> = selected
            .iter()
            .filter(|p| p.ready)
            .map(|p| p.ip.clone())
            .collect();
        let mut not_ready: Vec<String> = selected
            .iter()
            .filter(|p| !p.ready)
            .map(|p| p.ip.clone())
            .collect();
        ready.sort();
        not_ready.sort();
        let mut in_slices: Vec<(String, bool, bool, bool)> = selected
            .iter()
            .map(|p| (p.ip.clone(), p.ready, p.ready, false))
            .collect();
        in_slices.sort();
        let want = Some((ready, not_ready));
        eventually(
            &format!("Endpoints of {name}"),
            Duration::from_secs(60),
            || async { (env.endpoint_ips(name).await == want).then_some(()) },
        )
        .await;
        eventually(
            &format!("slices of {name}"),
            Duration::from_secs(60),
            || async {
                let slices = env.berth_slices(name).await;
                (slices.len() == 1 && env.slice_endpoints(name).await == in_slices).then_some(())
            },
        )
        .await;
    }
    eventually(
        "the deleted Service's objects gone",
        Duration::from_secs(60),
        || async {
            (env.endpoint_ips("svc-4").await.is_none()
                && env.berth_slices("svc-4").await.is_empty())
            .then_some(())
        },
    )
    .await;
    env.stop().await;
}

async fn set_status(env: &Env, name: &str, model: &PodModel) {
    let status = json!({"status": {
        "phase": "Running",
        "podIP": model.ip,
        "podIPs": [{"ip": model.ip}],
        "conditions": [{"type": "Ready", "status": if model.ready { "True" } else { "False" }}]
    }});
    retry(|| {
        let api = env.pods();
        let status = status.clone();
        async move {
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
        }
    })
    .await;
}
