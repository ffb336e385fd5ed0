//! The speakers on a thread of their own (`spawn_speakers`, as the agent runs them) keep
//! answering while the runtime that started them stalls; on that runtime (the control) the
//! same stalls leave requests unanswered. One node owns the address on an in-memory LAN; a
//! client on a thread and runtime of its own asks every 20 ms and waits for each answer.
//!
//! Timing is proven by the mechanism, not the clock: the caller's runtime (the test's only
//! thread) is blocked for 1 s three times, and a request counts as missed only when its answer
//! takes longer than half that, which a speaker on the blocked runtime cannot beat.
//!
//! Address plan: pool `default` 198.18.0.200-198.18.0.250, the address 198.18.0.210 owned by
//! node-1 at 02:00:00:00:00:0b; the client 198.18.0.100 at 02:00:00:00:00:64.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use berth_l2::frame::client::{build_arp_request, read_answer};
use berth_l2::frame::Mac;
use berth_l2::{
    run_link_with, spawn_speakers, Answers, L2Index, L2Metrics, Link, LinkOptions, MemoryLan,
    MemoryLink,
};
use common::*;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node-1";
const NODE_MAC: Mac = [2, 0, 0, 0, 0, 0x0b];
const CLIENT_MAC: Mac = [2, 0, 0, 0, 0, 0x64];
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 210);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// How long the caller's runtime is blocked, each time.
const STALL: Duration = Duration::from_millis(1000);
/// Between stalls, the caller's runtime runs.
const BETWEEN: Duration = Duration::from_millis(300);
const STALLS: u32 = 3;
/// An answer later than this missed: a speaker on the stalled runtime answers a request made
/// early in a stall only when the stall ends.
const MISSED_AFTER: Duration = Duration::from_millis(500);

/// The answers of a node that owns `VIP`.
fn answers() -> Answers {
    let mut index = L2Index::new(NODE);
    index.reset_pools(&[mk_pool(
        "default",
        json!(null),
        &["198.18.0.200-198.18.0.250"],
    )]);
    index.reset_advertisements(&[mk_adv("lan", json!({}))]);
    index.reset_nodes(&[mk_plain_node(NODE)]);
    index.reset_services(&[mk_lb("web", &[&VIP.to_string()], "Cluster", json!(null))]);
    index.reset_slices(&[]);
    index.set_live(Arc::new([NODE.to_string()].into()));
    index.set_local_up(["eth0".to_string()].into());
    index.answers()
}

/// What the client saw: requests sent, and those whose answer came later than
/// [`MISSED_AFTER`] or never.
#[derive(Debug, Default)]
struct Asked {
    sent: u32,
    missed: u32,
}

/// Asks for `VIP` every 20 ms for `span`, on a thread and runtime of its own, waiting for each
/// answer before the next request.
fn ask_from_own_thread(mut client: MemoryLink, span: Duration) -> std::thread::JoinHandle<Asked> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut asked = Asked::default();
            let end = tokio::time::Instant::now() + span;
            while tokio::time::Instant::now() < end {
                client
                    .send(&build_arp_request(CLIENT_MAC, CLIENT, VIP))
                    .unwrap();
                asked.sent += 1;
                if !answered_within(&mut client, MISSED_AFTER).await {
                    asked.missed += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            asked
        })
    })
}

/// Whether the owner's reply (not a gratuitous announcement) arrives within `limit`.
async fn answered_within(client: &mut MemoryLink, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let Ok(frame) = tokio::time::timeout_at(deadline, client.recv()).await else {
            return false;
        };
        let answer = frame.ok().and_then(|f| read_answer(&f));
        if answer.is_some_and(|a| !a.gratuitous && a.ip == IpAddr::V4(VIP) && a.mac == NODE_MAC) {
            return true;
        }
    }
}

/// Blocks this thread (the caller's runtime) [`STALLS`] times, letting it run between.
async fn stall_the_caller() {
    for _ in 0..STALLS {
        std::thread::sleep(STALL);
        tokio::time::sleep(BETWEEN).await;
    }
}

/// Starts the client once the owner answers, stalls the caller, and returns what the client
/// saw.
async fn ask_through_stalls(lan: &MemoryLan) -> Asked {
    let mut client = lan.attach("eth0", CLIENT_MAC);
    // Ready: the owner answers before the stalls begin.
    let mut ready = false;
    for _ in 0..50 {
        client
            .send(&build_arp_request(CLIENT_MAC, CLIENT, VIP))
            .unwrap();
        if answered_within(&mut client, Duration::from_millis(100)).await {
            ready = true;
            break;
        }
    }
    assert!(ready, "the owner never answered");
    let asking = ask_from_own_thread(client, (STALL + BETWEEN) * STALLS);
    stall_the_caller().await;
    asking.join().unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn speakers_on_their_own_thread_answer_while_the_callers_runtime_stalls() {
    let lan = MemoryLan::default();
    let (_answers, rx) = watch::channel(Arc::new(answers()));
    let metrics = L2Metrics::default();
    let stop = CancellationToken::new();
    let opener = lan.clone();
    let speakers = spawn_speakers(
        vec!["eth0".to_string(), "missing".to_string()],
        move |name| {
            if name == "eth0" {
                Ok(opener.attach(name, NODE_MAC))
            } else {
                Err(berth_l2::Error::NoMac(name.to_string()))
            }
        },
        rx,
        metrics.clone(),
        LinkOptions::default(),
        stop.clone(),
    );
    let (opened, running) = speakers.opened().await;
    assert_eq!(
        opened,
        ["eth0"],
        "the interface that cannot open is left out"
    );

    let asked = ask_through_stalls(&lan).await;
    assert!(asked.sent > 20, "{asked:?}");
    assert_eq!(
        asked.missed, 0,
        "requests missed while the caller stalled: {asked:?}"
    );

    stop.cancel();
    running.join().await.unwrap();
    assert!(metrics.replies_sent.get() >= u64::from(asked.sent));
}

/// The control: the same speaker on the caller's runtime misses requests in every stall.
#[tokio::test(flavor = "current_thread")]
async fn a_speaker_on_the_callers_runtime_misses_requests_while_it_stalls() {
    let lan = MemoryLan::default();
    let (_answers, rx) = watch::channel(Arc::new(answers()));
    let stop = CancellationToken::new();
    let link = lan.attach("eth0", NODE_MAC);
    let speaker = tokio::spawn(run_link_with(
        link,
        rx,
        L2Metrics::default(),
        LinkOptions::default(),
        stop.clone().cancelled_owned(),
    ));

    let asked = ask_through_stalls(&lan).await;
    assert!(asked.missed >= STALLS, "{asked:?}");

    stop.cancel();
    speaker.await.unwrap();
}
