//! Several `Membership` instances against the lab API server, talking SWIM over real UDP on
//! 127.0.0.1 (each on its own free port, advertised on its Lease). Nothing leaves loopback.
//!
//! Timing is proven by the event and by what could have caused it, not by the clock: with
//! Leases of 60 s, a crashed member that drops out within the test's limit was dropped by SWIM;
//! with a suspicion timeout of 60 s, a stopped member that drops out was dropped by its
//! deleted Lease or its SWIM leave.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use berth_membership::frame::{seal, Key, Refusal};
use berth_membership::identity::Peer;
use berth_membership::metrics::ChangeLabels;
use berth_membership::swim::Swim;
use berth_membership::{LiveNodes, Membership, MembershipMetrics, MembershipOptions};
use berth_testing::start_lab;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "kube-node-lease";
const KEY: &[u8] = b"berth membership test key, 32+ bytes";
/// Far beyond anything these tests wait for: an outcome inside it is the mechanism's.
const LONG: Duration = Duration::from_secs(60);
/// How long a test waits for an event before failing.
const LIMIT: Duration = Duration::from_secs(20);

fn mk_options(node: &str) -> MembershipOptions {
    MembershipOptions {
        node_name: node.into(),
        lease_namespace: NAMESPACE.into(),
        lease_duration: LONG,
        bind: SocketAddr::from(([127, 0, 0, 1], 0)),
        key: Some(KEY.to_vec()),
        // Loose enough for a loaded two-core machine.
        probe_period: Duration::from_millis(200),
        probe_timeout: Duration::from_millis(100),
        suspicion_timeout: Duration::from_millis(600),
        takeover_hold: Duration::from_millis(100),
        heartbeat_interval: Duration::from_millis(50),
        withdraw_after: Duration::from_millis(200),
        failure_timeout: Duration::from_millis(400),
        ..MembershipOptions::default()
    }
}

struct Running {
    live: watch::Receiver<LiveNodes>,
    metrics: MembershipMetrics,
    stop: CancellationToken,
    task: JoinHandle<Result<(), berth_membership::Error>>,
}

fn start(client: &Client, options: MembershipOptions) -> Running {
    let config = options.validate().expect("valid options");
    let (membership, live) = Membership::new(config, client.clone());
    let metrics = membership.metrics().clone();
    let stop = CancellationToken::new();
    let task = tokio::spawn(membership.run(stop.clone()));
    Running {
        live,
        metrics,
        stop,
        task,
    }
}

/// As [`start`], on a thread and runtime of its own, as the agent runs it.
fn start_dedicated(client: &Client, options: MembershipOptions) -> Running {
    let config = options.validate().expect("valid options");
    let (membership, live) = Membership::new(config, client.clone());
    let metrics = membership.metrics().clone();
    let stop = CancellationToken::new();
    let task = membership.spawn_dedicated(stop.clone());
    Running {
        live,
        metrics,
        stop,
        task,
    }
}

/// Live-set changes (up and down) a member has counted.
fn changes(metrics: &MembershipMetrics) -> u64 {
    ["up", "down"]
        .into_iter()
        .map(|change| {
            metrics
                .changes
                .get_or_create(&ChangeLabels { change })
                .get()
        })
        .sum()
}

/// The lab with the Nodes `names`: peers take part only as Nodes of the cluster.
async fn start_lab_with_nodes(names: &[&str]) -> (berth_lab::LabApiServerHandle, Client) {
    let (server, client) = start_lab().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for name in names {
        nodes
            .create(
                &PostParams::default(),
                &berth_testing::mk_node(name, serde_json::json!({}), &[]),
            )
            .await
            .expect("creating a Node");
    }
    (server, client)
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| n.to_string()).collect()
}

async fn wait_for(running: &mut Running, what: &str, want: BTreeSet<String>) {
    let result = tokio::time::timeout(LIMIT, running.live.wait_for(|set| **set == want))
        .await
        .map(|r| r.is_ok());
    match result {
        Ok(true) => {}
        _ => panic!(
            "timed out waiting for {what}: want {want:?}, have {:?}",
            **running.live.borrow()
        ),
    }
}

async fn lease_exists(client: &Client, node: &str) -> bool {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    leases
        .get_opt(&format!("berth-agent-{node}"))
        .await
        .expect("reading a Lease")
        .is_some()
}

async fn endpoint_of(client: &Client, node: &str) -> SocketAddr {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let lease = leases
        .get(&format!("berth-agent-{node}"))
        .await
        .expect("reading a Lease");
    lease.metadata.annotations.expect("annotations")["berth.dev/membership-endpoint"]
        .parse()
        .expect("an endpoint")
}

#[tokio::test]
async fn a_crashed_member_is_dropped_by_its_heartbeats_long_before_its_lease_expires() {
    let (_server, client) = start_lab_with_nodes(&["node-a", "node-b", "node-c"]).await;
    let mut a = start(&client, mk_options("node-a"));
    let mut b = start(&client, mk_options("node-b"));
    let c = start(&client, mk_options("node-c"));
    let all = names(&["node-a", "node-b", "node-c"]);
    wait_for(&mut a, "three live members on a", all.clone()).await;
    wait_for(&mut b, "three live members on b", all).await;

    // A crash: the task is gone, its Lease stays (fresh for a minute), nobody is told.
    c.task.abort();
    let _ = c.task.await;
    let survivors = names(&["node-a", "node-b"]);
    wait_for(&mut a, "node-c dropped on a", survivors.clone()).await;
    wait_for(&mut b, "node-c dropped on b", survivors).await;
    assert!(
        lease_exists(&client, "node-c").await,
        "the Lease was not what dropped it"
    );

    // The detection time was measured from the last datagram heard: at least the failure
    // timeout, and the heartbeats, not the Lease, fired.
    let detections: Vec<_> = [&a, &b]
        .iter()
        .map(|r| r.metrics.detection.clone())
        .collect();
    let mut text = String::new();
    let mut registry = prometheus_client::registry::Registry::default();
    for (i, d) in detections.into_iter().enumerate() {
        registry.register(format!("d{i}"), "detection", d);
    }
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding");
    for i in 0..2 {
        let count = line_value(&text, &format!("d{i}_count"));
        let sum = line_value(&text, &format!("d{i}_sum"));
        assert!(count >= 1.0, "{text}");
        assert!(
            sum / count >= 0.4 && sum / count < LONG.as_secs_f64(),
            "{text}"
        );
    }
    for r in [a, b] {
        assert_eq!(authentication_refusals(&r.metrics), 0);
        r.stop.cancel();
        r.task.await.expect("joined").expect("stopped cleanly");
    }
}

/// The caller's runtime stalls (here the test's only thread, which also serves the API
/// server, blocked for longer than the failure timeout): members on threads of their own keep
/// their heartbeats and timers, so nobody flaps. On the caller's runtime the same stalls
/// drop every peer.
#[tokio::test]
async fn a_stalled_caller_runtime_changes_nothing_for_dedicated_members() {
    let (_server, client) = start_lab_with_nodes(&["node-a", "node-b", "node-c"]).await;
    let mut members: Vec<Running> = ["node-a", "node-b", "node-c"]
        .into_iter()
        .map(|node| start_dedicated(&client, mk_options(node)))
        .collect();
    let all = names(&["node-a", "node-b", "node-c"]);
    for member in &mut members {
        wait_for(member, "three live members", all.clone()).await;
    }
    // Past the takeover holds and the last joins.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<u64> = members.iter().map(|m| changes(&m.metrics)).collect();
    for _ in 0..3 {
        // Two and a half failure timeouts (400 ms) without this runtime.
        std::thread::sleep(Duration::from_millis(1000));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after: Vec<u64> = members.iter().map(|m| changes(&m.metrics)).collect();
    assert_eq!(before, after, "live-set changes while the caller stalled");
    for member in &members {
        assert_eq!(**member.live.borrow(), all);
    }
    for member in members {
        member.stop.cancel();
        member.task.await.expect("joined").expect("stopped cleanly");
    }
}

fn line_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
}

#[tokio::test]
async fn a_graceful_stop_is_seen_at_once_and_deletes_the_lease() {
    let (_server, client) = start_lab_with_nodes(&["node-a", "node-b"]).await;
    // A suspicion timeout of a minute: only the deleted Lease or the SWIM leave can drop b.
    let slow = |node: &str| MembershipOptions {
        suspicion_timeout: LONG,
        ..mk_options(node)
    };
    let mut a = start(&client, slow("node-a"));
    let mut b = start(&client, slow("node-b"));
    let both = names(&["node-a", "node-b"]);
    wait_for(&mut a, "two live members on a", both.clone()).await;
    wait_for(&mut b, "two live members on b", both).await;

    b.stop.cancel();
    b.task.await.expect("joined").expect("stopped cleanly");
    // b withdrew itself before it stopped.
    assert!(!b.live.borrow().contains("node-b"));
    wait_for(&mut a, "node-b dropped on a", names(&["node-a"])).await;
    assert!(!lease_exists(&client, "node-b").await);
    // A leave is not a detection.
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("d", "detection", a.metrics.detection.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding");
    assert_eq!(line_value(&text, "d_count"), 0.0, "{text}");

    // b comes back (a new process): a counts it again.
    let mut b = start(&client, slow("node-b"));
    wait_for(&mut a, "node-b back on a", names(&["node-a", "node-b"])).await;
    wait_for(&mut b, "node-b back on b", names(&["node-a", "node-b"])).await;
    for r in [a, b] {
        r.stop.cancel();
        r.task.await.expect("joined").expect("stopped cleanly");
    }
}

#[tokio::test]
async fn forged_unsigned_and_misaddressed_datagrams_change_nothing() {
    let (_server, client) = start_lab_with_nodes(&["node-a", "node-b", "node-c"]).await;
    let mut a = start(&client, mk_options("node-a"));
    let mut b = start(&client, mk_options("node-b"));
    let both = names(&["node-a", "node-b"]);
    wait_for(&mut a, "two live members on a", both.clone()).await;
    wait_for(&mut b, "two live members on b", both.clone()).await;
    let a_at = endpoint_of(&client, "node-a").await;
    a.live.mark_unchanged();

    let attacker = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let attacker_at = attacker.local_addr().expect("addr");
    // 1. From no agent's endpoint, everything stops at the gate, before the HMAC: a
    //    neighbour without the key speaking SWIM as node-b (announcing node-b's departure,
    //    and a node-z that does not exist), unframed junk, and datagrams sealed with the
    //    key (misaddressed, old) but sent from the wrong place.
    let wrong_key = Key::new(b"the attacker's own key, 32 bytes!").expect("key");
    let mut rogue_datagrams = 0;
    for node in ["node-b", "node-z"] {
        let mut rogue = Swim::new(
            Peer {
                node: node.into(),
                addr: attacker_at,
                generation: u64::MAX / 2,
            },
            foca_config(),
            wrong_key.clone(),
            Duration::from_secs(5),
        );
        let now = std::time::Instant::now();
        rogue.announce(Peer::from_lease("node-a", a_at), now);
        rogue.leave(now);
        let (out, _) = rogue.drain(unix_micros());
        assert!(!out.is_empty());
        for datagram in out {
            attacker
                .send_to(&datagram.datagram, a_at)
                .await
                .expect("send");
            rogue_datagrams += 1;
        }
    }
    attacker.send_to(b"hello", a_at).await.expect("send");
    attacker.send_to(&[0u8; 200], a_at).await.expect("send");
    let key = Key::new(KEY).expect("key");
    let elsewhere = seal(&key, "node-b", "node-c", unix_micros(), b"x");
    attacker.send_to(&elsewhere, a_at).await.expect("send");
    let old = seal(&key, "node-b", "node-a", unix_micros() - 60_000_000, b"x");
    attacker.send_to(&old, a_at).await.expect("send");
    let gated = berth_testing::eventually(
        "the datagrams dropped at the gate",
        LIMIT,
        Duration::from_millis(50),
        || {
            let metrics = a.metrics.clone();
            let want = rogue_datagrams + 4;
            async move { (metrics.refused_total() >= want).then_some(metrics) }
        },
    )
    .await;
    assert_eq!(gated.refused_count(Refusal::Size), 1);
    assert_eq!(gated.refused_count(Refusal::Version), 1);
    assert_eq!(
        gated.refused_count(Refusal::UnknownSource),
        rogue_datagrams + 2
    );
    assert_eq!(gated.refused_total(), rogue_datagrams + 4);

    // 2. From a known endpoint (node-c is a Node whose Lease advertises the attacker's
    //    address, and runs no agent), the envelope is authenticated: a wrong key, another
    //    recipient, a stamp outside the window, and one genuine datagram sent twice.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    leases
        .create(
            &PostParams::default(),
            &berth_membership::lease::build_lease(
                "node-c",
                NAMESPACE,
                LONG,
                Some(attacker_at),
                k8s_openapi::jiff::Timestamp::now(),
            ),
        )
        .await
        .expect("node-c's Lease");
    // a hears of the Lease and asks node-c to join: then it admits datagrams from there.
    let mut invite = [0u8; 2048];
    tokio::time::timeout(LIMIT, attacker.recv_from(&mut invite))
        .await
        .expect("node-a invites node-c")
        .expect("receive");
    let forged = seal(&wrong_key, "node-c", "node-a", unix_micros(), b"x");
    attacker.send_to(&forged, a_at).await.expect("send");
    let misaddressed = seal(&key, "node-c", "node-b", unix_micros(), b"x");
    attacker.send_to(&misaddressed, a_at).await.expect("send");
    let stale = seal(&key, "node-c", "node-a", unix_micros() - 60_000_000, b"x");
    attacker.send_to(&stale, a_at).await.expect("send");
    let genuine = seal(&key, "node-c", "node-a", unix_micros(), b"x");
    attacker.send_to(&genuine, a_at).await.expect("send");
    attacker.send_to(&genuine, a_at).await.expect("send");
    let refused = berth_testing::eventually(
        "the datagrams refused after the HMAC",
        LIMIT,
        Duration::from_millis(50),
        || {
            let metrics = a.metrics.clone();
            let want = rogue_datagrams + 8;
            async move { (metrics.refused_total() >= want).then_some(metrics) }
        },
    )
    .await;
    assert_eq!(refused.refused_count(Refusal::BadTag), 1);
    assert_eq!(refused.refused_count(Refusal::WrongRecipient), 1);
    assert_eq!(refused.refused_count(Refusal::Stale), 1);
    assert_eq!(refused.refused_count(Refusal::Replayed), 1);
    // Nothing changed: a still counts b, and no node-z.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(**a.live.borrow(), both);
    assert!(
        !a.live.has_changed().expect("running"),
        "a's live set moved"
    );
    for r in [a, b] {
        r.stop.cancel();
        r.task.await.expect("joined").expect("stopped cleanly");
    }
}

#[tokio::test]
async fn lease_only_mode_follows_the_leases() {
    let (_server, client) = start_lab_with_nodes(&["node-a", "node-b", "node-c"]).await;
    let lease_only = |node: &str| MembershipOptions {
        lease_duration: Duration::from_secs(2),
        takeover_hold: Duration::from_millis(100),
        ..MembershipOptions::lease_only(node, NAMESPACE)
    };
    let mut a = start(&client, lease_only("node-a"));
    let mut b = start(&client, lease_only("node-b"));
    let c = start(&client, lease_only("node-c"));
    let all = names(&["node-a", "node-b", "node-c"]);
    wait_for(&mut a, "three live members on a", all.clone()).await;
    wait_for(&mut b, "three live members on b", all).await;

    // A graceful stop deletes the Lease: dropped at once.
    b.stop.cancel();
    b.task.await.expect("joined").expect("stopped cleanly");
    wait_for(&mut a, "node-b dropped on a", names(&["node-a", "node-c"])).await;
    // A crash: dropped when its Lease expires.
    c.task.abort();
    let _ = c.task.await;
    wait_for(&mut a, "node-c dropped on a", names(&["node-a"])).await;
    assert!(
        lease_exists(&client, "node-c").await,
        "expired, not deleted"
    );
    a.stop.cancel();
    a.task.await.expect("joined").expect("stopped cleanly");
}

/// A compromised node (or anyone with Lease rights) writes fresh agent Leases for nodes that
/// do not exist, advertising SWIM endpoints nobody answers on: counted over the Leases, every
/// real agent would be in the minority and withdraw. Counted over the Nodes, nothing changes:
/// no live-set change on any agent, no ghost probed, no refusal.
#[tokio::test]
async fn ghost_leases_change_nothing() {
    let (_server, client) = start_lab_with_nodes(&["node-a", "node-b", "node-c"]).await;
    let mut agents = Vec::new();
    for node in ["node-a", "node-b", "node-c"] {
        agents.push(start(&client, mk_options(node)));
    }
    let all = names(&["node-a", "node-b", "node-c"]);
    let mut before = Vec::new();
    for agent in &mut agents {
        wait_for(agent, "three live members", all.clone()).await;
        agent.live.mark_unchanged();
        before.push(agent.metrics.refused_total());
    }
    // An endpoint that is bound, so datagrams to it are not refused by the kernel, and read.
    let sink = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let sink_at = sink.local_addr().expect("addr");
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..5 {
        let node = format!("ghost-{i}");
        // Four with an endpoint (SWIM members nobody hears: counted over the Leases, every
        // real agent would be in the minority), one without (it would be counted live).
        let endpoint = (i < 4).then_some(sink_at);
        let lease = berth_membership::lease::build_lease(
            &node,
            NAMESPACE,
            LONG,
            endpoint,
            k8s_openapi::jiff::Timestamp::now(),
        );
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("a ghost Lease");
    }
    // Several probe periods and Lease events later, nothing has moved.
    let mut heard = [0u8; 2048];
    let probed = tokio::time::timeout(Duration::from_secs(2), sink.recv_from(&mut heard)).await;
    assert!(probed.is_err(), "a ghost endpoint was sent SWIM datagrams");
    for ((agent, node), before) in agents
        .iter()
        .zip(["node-a", "node-b", "node-c"])
        .zip(before)
    {
        assert!(
            !agent.live.has_changed().expect("running"),
            "{node}'s live set changed: {:?}",
            **agent.live.borrow()
        );
        assert_eq!(**agent.live.borrow(), all, "{node}");
        assert_eq!(agent.metrics.refused_total(), before, "{node}");
    }
    for r in agents {
        r.stop.cancel();
        r.task.await.expect("joined").expect("stopped cleanly");
    }
}

/// Datagrams refused after the HMAC: forged, misaddressed, stale or replayed. (A starting
/// agent's first datagrams may reach a peer that has not seen its Lease yet: those stop at the
/// gate as from an unknown source, and are sent again.)
fn authentication_refusals(metrics: &MembershipMetrics) -> u64 {
    [
        Refusal::Malformed,
        Refusal::BadTag,
        Refusal::WrongRecipient,
        Refusal::Stale,
        Refusal::Replayed,
    ]
    .into_iter()
    .map(|r| metrics.refused_count(r))
    .sum()
}

fn foca_config() -> foca::Config {
    foca::Config::simple()
}

fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}
