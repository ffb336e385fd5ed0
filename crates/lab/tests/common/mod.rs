//! Shared helpers for the lab API server tests: a server per test, on 127.0.0.1, free port.

#![allow(clippy::unwrap_used, dead_code)]

use berth_lab::{LabApiServer, LabApiServerHandle};
use kube::Client;

pub async fn start() -> (LabApiServerHandle, Client) {
    let server = LabApiServer::builder().start().await.unwrap();
    let client = server.client().unwrap();
    (server, client)
}

pub fn unique_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "berth-lab-{tag}-{}-{}",
        std::process::id(),
        uuid_like()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}
