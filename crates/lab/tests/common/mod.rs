//! Shared helpers for the lab's tests: a lab API server per test (127.0.0.1, free port), a dir.

#![allow(clippy::unwrap_used, dead_code)]

use berth_lab::LabApiServerHandle;
use kube::Client;

pub async fn start() -> (LabApiServerHandle, Client) {
    berth_testing::start_lab().await
}

pub fn unique_dir(tag: &str) -> std::path::PathBuf {
    berth_testing::unique_dir(&format!("berth-lab-{tag}"))
}
