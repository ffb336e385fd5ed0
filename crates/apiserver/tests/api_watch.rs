//! Watches through kube-rs: ordered events, resuming, 410 then relist, streaming lists, reflectors,
//! and recovery from injected watch drops.

#![allow(clippy::unwrap_used)]

mod common;

use berth_apiserver::{Faults, LabApiServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::json;
use std::time::Duration;

fn mk_cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": value}})).unwrap()
}

async fn next_event(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
) -> WatchEvent<ConfigMap> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("watch event in time")
        .expect("stream open")
        .unwrap()
}

fn describe(ev: &WatchEvent<ConfigMap>) -> String {
    match ev {
        WatchEvent::Added(o) => format!(
            "ADDED {} {}",
            o.metadata.name.as_deref().unwrap(),
            o.data.as_ref().unwrap()["v"]
        ),
        WatchEvent::Modified(o) => format!(
            "MODIFIED {} {}",
            o.metadata.name.as_deref().unwrap(),
            o.data.as_ref().unwrap()["v"]
        ),
        WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.as_deref().unwrap()),
        WatchEvent::Bookmark(b) => format!("BOOKMARK {}", b.metadata.resource_version),
        WatchEvent::Error(e) => format!("ERROR {}", e.code),
    }
}

#[tokio::test]
async fn ordered_events_and_resume_from_version() {
    let (server, client) = common::start().await;
    let cms = Api::<ConfigMap>::default_namespaced(client);
    let start = server.resource_version().to_string();
    let mut stream = cms
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &mk_cm("a", "1"))
        .await
        .unwrap();
    let mut cm = cms.get("a").await.unwrap();
    cm.data = Some([("v".to_owned(), "2".to_owned())].into());
    let modified = cms.replace("a", &PostParams::default(), &cm).await.unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(&next_event(&mut stream).await));
    }
    assert_eq!(seen, vec!["ADDED a 1", "MODIFIED a 2", "DELETED a"]);

    // Resuming from the MODIFIED version replays only what came after it.
    let rv = modified.metadata.resource_version.unwrap();
    let mut resumed = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    assert_eq!(describe(&next_event(&mut resumed).await), "DELETED a");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn label_selected_watch_sees_objects_enter_and_leave() {
    let (server, client) = common::start().await;
    let cms = Api::<ConfigMap>::default_namespaced(client);
    let start = server.resource_version().to_string();
    let mut stream = cms
        .watch(&WatchParams::default().labels("team=berth"), &start)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &mk_cm("other", "0"))
        .await
        .unwrap();
    let mut cm = mk_cm("joins", "1");
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cm = cms.get("joins").await.unwrap();
    cm.metadata.labels = Some([("team".to_owned(), "berth".to_owned())].into());
    let cm = cms
        .replace("joins", &PostParams::default(), &cm)
        .await
        .unwrap();
    let mut left = cm.clone();
    left.metadata.labels = None;
    let left = cms
        .replace("joins", &PostParams::default(), &left)
        .await
        .unwrap();
    assert_eq!(describe(&next_event(&mut stream).await), "ADDED joins 1");
    // As from the apiserver's watch cache: the object as it last matched, at the new version.
    match next_event(&mut stream).await {
        WatchEvent::Deleted(gone) => {
            assert_eq!(gone.metadata.name.as_deref(), Some("joins"));
            assert_eq!(gone.metadata.labels, cm.metadata.labels);
            assert_eq!(
                gone.metadata.resource_version,
                left.metadata.resource_version
            );
        }
        other => panic!("expected DELETED, got {}", describe(&other)),
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn expired_version_is_410_gone() {
    let server = LabApiServer::builder()
        .history_capacity(2)
        .start()
        .await
        .unwrap();
    let cms = Api::<ConfigMap>::default_namespaced(server.client().unwrap());
    let start = server.resource_version().to_string();
    for i in 0..5 {
        cms.create(&PostParams::default(), &mk_cm(&format!("c{i}"), "x"))
            .await
            .unwrap();
    }
    let mut stream = cms
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut stream).await {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected 410, got {}", describe(&other)),
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bookmarks_are_sent_when_asked() {
    let server = LabApiServer::builder()
        .bookmark_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let cms = Api::<ConfigMap>::default_namespaced(server.client().unwrap());
    let rv = server.resource_version().to_string();
    let mut stream = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        describe(&next_event(&mut stream).await),
        format!("BOOKMARK {rv}")
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn timeout_seconds_ends_the_watch() {
    let (server, client) = common::start().await;
    let cms = Api::<ConfigMap>::default_namespaced(client);
    let rv = server.resource_version().to_string();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let end = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap();
    assert!(end.is_none(), "the stream ends after timeoutSeconds");
    server.shutdown().await.unwrap();
}

/// Wait until the reflector's store holds exactly the wanted (name, value) pairs.
async fn store_converges(reader: &reflector::Store<ConfigMap>, want: &[(&str, &str)]) {
    let mut want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    want.sort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut have: Vec<(String, String)> = reader
            .state()
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    o.data.as_ref().unwrap()["v"].clone(),
                )
            })
            .collect();
        have.sort();
        if have == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector stuck at {have:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn reflector_sees_every_change(config: watcher::Config, faults: Option<Faults>) {
    let server = LabApiServer::builder()
        .history_capacity(50)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let cms = Api::<ConfigMap>::default_namespaced(client);
    cms.create(&PostParams::default(), &mk_cm("before", "0"))
        .await
        .unwrap();
    let (reader, writer) = reflector::store();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen_w = seen.clone();
    let stream =
        reflector(writer, watcher(cms.clone(), config).default_backoff()).applied_objects();
    let task = tokio::spawn(async move {
        let mut stream = stream.boxed();
        // Errors (410, dropped connections) are reported and then recovered from by the watcher itself.
        while let Some(item) = stream.next().await {
            if let Ok(obj) = item {
                seen_w.lock().unwrap().push((
                    obj.metadata.name.clone().unwrap(),
                    obj.data.unwrap()["v"].clone(),
                ));
            }
        }
    });
    store_converges(&reader, &[("before", "0")]).await;
    if let Some(f) = faults {
        server.set_faults(f).unwrap();
    }
    for round in 1..=20 {
        let name = format!("c{}", round % 4);
        let value = round.to_string();
        match cms.get_opt(&name).await.unwrap() {
            Some(mut cm) => {
                cm.data = Some([("v".to_owned(), value)].into());
                cms.replace(&name, &PostParams::default(), &cm)
                    .await
                    .unwrap();
            }
            None => {
                cms.create(&PostParams::default(), &mk_cm(&name, &value))
                    .await
                    .unwrap();
            }
        }
        if round % 7 == 0 {
            // Make every resume from before this point impossible: the watcher must relist.
            server.compact();
        }
    }
    cms.delete("before", &DeleteParams::default())
        .await
        .unwrap();
    store_converges(
        &reader,
        &[("c0", "20"), ("c1", "17"), ("c2", "18"), ("c3", "19")],
    )
    .await;
    // Per object, applied values only move forward.
    let seen = seen.lock().unwrap().clone();
    for name in ["c0", "c1", "c2", "c3"] {
        let values: Vec<u32> = seen
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.parse().unwrap())
            .collect();
        assert!(
            values.windows(2).all(|w| w[0] <= w[1]),
            "{name}: {values:?}"
        );
    }
    task.abort();
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn reflector_with_list_then_watch() {
    reflector_sees_every_change(watcher::Config::default(), None).await;
}

#[tokio::test]
async fn reflector_with_streaming_list() {
    reflector_sees_every_change(watcher::Config::default().streaming_lists(), None).await;
}

#[tokio::test]
async fn watcher_recovers_from_dropped_watches_and_410() {
    let faults = Faults {
        watch_drop_rate: 0.3,
        seed: 42,
        ..Faults::default()
    };
    reflector_sees_every_change(watcher::Config::default(), Some(faults.clone())).await;
    reflector_sees_every_change(watcher::Config::default().streaming_lists(), Some(faults)).await;
}

#[tokio::test]
async fn streaming_list_sends_state_then_initial_events_end() {
    let (server, client) = common::start().await;
    let cms = Api::<ConfigMap>::default_namespaced(client);
    for name in ["a", "b"] {
        cms.create(&PostParams::default(), &mk_cm(name, "1"))
            .await
            .unwrap();
    }
    // Even with a resourceVersion, a streaming list starts from the current state.
    let mut expected = vec!["ADDED a 1".to_owned(), "ADDED b 1".to_owned()];
    for rv in ["", "1"] {
        let mut stream = cms
            .watch(&WatchParams::streaming_lists(), rv)
            .await
            .unwrap()
            .boxed();
        let mut initial = Vec::new();
        loop {
            match next_event(&mut stream).await {
                WatchEvent::Bookmark(b) => {
                    assert_eq!(
                        b.metadata.resource_version,
                        server.resource_version().to_string()
                    );
                    let end = b
                        .metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str);
                    assert_eq!(end, Some("true"));
                    break;
                }
                other => initial.push(describe(&other)),
            }
        }
        initial.sort();
        expected.sort();
        assert_eq!(initial, expected);
        let name = format!("after{}", rv.len());
        cms.create(&PostParams::default(), &mk_cm(&name, "2"))
            .await
            .unwrap();
        assert_eq!(
            describe(&next_event(&mut stream).await),
            format!("ADDED {name} 2")
        );
        expected.push(format!("ADDED {name} 2"));
    }
    server.shutdown().await.unwrap();
}
