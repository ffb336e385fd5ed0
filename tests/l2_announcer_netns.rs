//! The L2 announcer end to end, in real network namespaces: a LAN bridge, three node namespaces
//! each running a real `berth agent --l2-announcer --membership on` process, a control-plane
//! namespace where the lab API server listens for them, and a client. A capture socket in the
//! client namespace sees every ARP answer on the LAN for the whole test and sends the ARP probes.
//! Needs root, iproute2 and iptables; skips with a message elsewhere, and fails instead under
//! `CI=true` or `BERTH_REQUIRE_ROOT=1`. Every namespace is `berth-tl<pid>-*`, deleted at the end
//! (also on failure). The address plan is at the top of `l2_lab/mod.rs`.

#![allow(clippy::unwrap_used)]

mod l2_lab;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use berth_lab::RecordedRequest;
use kube::api::Api;
use l2_lab::*;
use serde_json::json;

#[test]
fn one_node_answers_for_each_lb_ip_and_another_takes_over() {
    run_lab("tl", scenario);
}

async fn scenario(mut lab: L2Lab) -> L2Lab {
    let began = Instant::now();
    let client = lab.client.clone();
    let client_ns = lab.client_ns.clone();
    let macs = lab.macs.clone();
    let (web, web2) = (lab.web_ip.clone(), lab.web2_ip.clone());
    // The elected node answers, the client's kernel maps the VIP to its MAC, TCP gets through.
    let owner = owner_among(&NODES, VIP);
    lab.capture
        .until(VIP, Some(macs[owner.as_str()]), "first election")
        .await;
    eventually_tcp(&client_ns, "web", "TCP through the owner").await;
    let neigh = lab
        .topo
        .exec(&client_ns, &["ip", "neigh", "show", VIP])
        .unwrap();
    let owner_mac: String = macs[owner.as_str()]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    assert!(neigh.contains(&owner_mac), "{neigh}");
    records_say(
        &client,
        "web",
        &[owner.as_str()],
        "the owner's ServiceL2Status record",
    )
    .await;
    berth_testing::eventually(
        "the Announcing Event",
        LIMIT,
        Duration::from_millis(100),
        || {
            let client = client.clone();
            let owner = owner.clone();
            async move {
                let events =
                    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client, "default")
                        .list(&Default::default())
                        .await
                        .ok()?;
                events
                    .items
                    .iter()
                    .any(|e| {
                        e.note.as_deref().is_some_and(|n| {
                            n.starts_with(&format!("announcing from node {owner}"))
                        })
                    })
                    .then_some(())
            }
        },
    )
    .await;

    // Nothing answers outside the pools, nor for a pool no advertisement selects.
    assert!(lab.capture.probe("198.18.0.199").await.is_empty());
    assert!(lab.capture.probe("198.18.0.245").await.is_empty());

    // Local policy: only nodes with a Ready endpoint; the IP moves when the owner's goes.
    let local_owner = owner_among(&["n1", "n2"], LOCAL_VIP);
    lab.capture
        .until(LOCAL_VIP, Some(macs[local_owner.as_str()]), "local policy")
        .await;
    let other = if local_owner == "n1" { "n2" } else { "n1" };
    let (mine, theirs) = if local_owner == "n1" {
        (&web, &web2)
    } else {
        (&web2, &web)
    };
    apply(
        &client,
        "discovery.k8s.io/v1",
        "EndpointSlice",
        mk_slice(
            "local",
            &[(mine, &local_owner, false), (theirs, other, true)],
        ),
    )
    .await;
    lab.capture
        .until(LOCAL_VIP, Some(macs[other]), "the last local endpoint went")
        .await;

    // NetworkUnavailable, the exclusion label, node selectors and interfaces each move the IP.
    let next = owner_among(&without(&NODES, &[&owner]), VIP);
    set_node(&client, &owner, json!({}), true).await;
    lab.capture
        .until(VIP, Some(macs[next.as_str()]), "NetworkUnavailable")
        .await;
    set_node(&client, &owner, json!({}), false).await;
    lab.capture
        .until(VIP, Some(macs[owner.as_str()]), "network available again")
        .await;
    set_node(
        &client,
        &owner,
        json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""}),
        false,
    )
    .await;
    lab.capture
        .until(VIP, Some(macs[next.as_str()]), "excluded")
        .await;
    set_node(
        &client,
        &owner,
        json!({"node.kubernetes.io/exclude-from-external-load-balancers": null}),
        false,
    )
    .await;
    lab.capture
        .until(VIP, Some(macs[owner.as_str()]), "no longer excluded")
        .await;
    let chosen = without(&NODES, &[&owner, &next])[0];
    apply(
        &client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"],
        "nodeSelectors": [{"matchLabels": {"kubernetes.io/hostname": chosen}}]})),
    )
    .await;
    lab.capture
        .until(VIP, Some(macs[chosen]), "node selector")
        .await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"], "interfaces": ["eth1"]})),
    )
    .await;
    lab.capture.until(VIP, None, "no node has eth1").await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"], "interfaces": ["eth0"]})),
    )
    .await;
    lab.capture
        .until(VIP, Some(macs[owner.as_str()]), "eth0 selected")
        .await;
    eventually_tcp(&client_ns, "web", "TCP after the moves").await;

    // Failover: SIGKILL, link down, graceful stop. A new owner answers and TCP resumes; when the
    // old owner is back, it owns the IP again, without flapping.
    for (how, signal) in [
        ("SIGKILL", "-KILL"),
        ("link down", ""),
        ("graceful stop", "-TERM"),
    ] {
        let from = Instant::now();
        if signal.is_empty() {
            lab.set_link(&owner, false);
        } else {
            lab.agents.stop(&owner, signal);
        }
        lab.capture.until(VIP, Some(macs[next.as_str()]), how).await;
        eventually_tcp(&client_ns, "web", how).await;
        // The new owner records itself; a crashed owner's record goes with the takeover, a
        // stopped one deletes its own.
        records_say(
            &client,
            "web",
            &[next.as_str()],
            &format!("{how}: the record moved"),
        )
        .await;
        if signal.is_empty() {
            lab.set_link(&owner, true);
        } else {
            lab.agents.start(&owner);
        }
        lab.capture
            .until(VIP, Some(macs[owner.as_str()]), &format!("{how}: back"))
            .await;
        eventually_tcp(&client_ns, "web", &format!("{how}: back")).await;
        records_say(
            &client,
            "web",
            &[owner.as_str()],
            &format!("{how}: the record is back"),
        )
        .await;
        // Let a late gratuitous round of the interim owner pass before judging the sequence.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let runs = lab.capture.answerers_since(VIP, from);
        let expected_runs = [
            macs[owner.as_str()],
            macs[next.as_str()],
            macs[owner.as_str()],
        ];
        assert!(
            runs.ends_with(&expected_runs[1..]) && runs.len() <= 3,
            "{how}: answers for {VIP} went {runs:?}, expected {expected_runs:?}"
        );
    }
    quiet_window(&lab).await;
    announcing_interface_down(&mut lab).await;
    eprintln!("l2 announcer scenario took {:?}", began.elapsed());
    lab
}

/// Services announced at steady state: what the agents write over a quiet window once every
/// record is in, through three short stalls of one agent (SIGSTOP for 300 ms: its peers take
/// its addresses over and hand them back within half a second). Nothing but the Lease
/// renewals may be written: a status, Event or Lease rewritten on a timer, or a record and an
/// Event per Service for every flap of liveness (what a loaded machine makes), fails it.
async fn quiet_window(lab: &L2Lab) {
    const SERVICES: u32 = 30;
    let client = &lab.client;
    for i in 0..SERVICES {
        let name = format!("bulk-{i}");
        let cip = format!("10.96.1.{}", 10 + i);
        // Three Services on each address, as sharing Services are.
        let ip = format!("198.18.0.{}", 202 + i / 3);
        apply(
            client,
            "v1",
            "Service",
            mk_lb(
                &name,
                &cip,
                30200 + u16::try_from(i).unwrap(),
                "Cluster",
                8080,
            ),
        )
        .await;
        set_ingress(client, &name, &ip).await;
    }
    let want: BTreeSet<(String, String)> = (0..SERVICES)
        .map(|i| {
            let ip = format!("198.18.0.{}", 202 + i / 3);
            (format!("bulk-{i}"), owner_among(&NODES, &ip))
        })
        .collect();
    berth_testing::eventually(
        "every bulk Service's record",
        LIMIT,
        Duration::from_millis(200),
        || {
            let (client, want) = (client.clone(), want.clone());
            async move {
                let records = Api::<berth_api::ServiceL2Status>::all(client)
                    .list(&Default::default())
                    .await
                    .ok()?;
                let have: BTreeSet<(String, String)> = records
                    .items
                    .into_iter()
                    .filter(|r| r.spec.service_name.starts_with("bulk-"))
                    .map(|r| (r.spec.service_name, r.spec.node))
                    .collect();
                (have == want).then_some(())
            }
        },
    )
    .await;
    // The last takeovers' Events are on their way; then the window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let began = Instant::now();
    let before = lab.server.recorded_requests();
    let stalled = owner_among(&NODES, "198.18.0.202");
    let pid = lab.agents.children[&stalled].id().to_string();
    for _ in 0..3 {
        let signal = |s: &str| {
            std::process::Command::new("kill")
                .args([s, &pid])
                .status()
                .unwrap()
        };
        signal("-STOP");
        tokio::time::sleep(Duration::from_millis(300)).await;
        signal("-CONT");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = began.elapsed();
    let after = lab.server.recorded_requests();
    let made = requests_between(&before, &after);
    for r in &made {
        eprintln!(
            "quiet window: {} x {} {}/{} {}/{}",
            r.count, r.verb, r.api_group, r.resource, r.namespace, r.name
        );
    }
    let (leases, others): (Vec<&RecordedRequest>, Vec<&RecordedRequest>) = made
        .iter()
        .filter(|r| is_write(r))
        .partition(|r| r.resource == "leases");
    assert!(
        others.is_empty(),
        "writes other than Lease renewals at steady state: {others:?}"
    );
    // Each agent renews every third of its 3 s Lease.
    let renewals: u64 = leases.iter().map(|r| r.count).sum();
    let most = 3 * (window.as_secs() + 2);
    assert!(
        renewals <= most,
        "{renewals} Lease writes in {window:?}: {leases:?}"
    );
    // The stalls did move the addresses: the window saw what it was meant to.
    let moved = lab.capture.answerers_since("198.18.0.202", began);
    eprintln!("quiet window of {window:?}: answers for 198.18.0.202 went {moved:?}");
    assert!(
        moved.len() > 1,
        "the stalls of {stalled} moved no address: {moved:?}"
    );
}

/// Waits until the ServiceL2Status records of `default/<service>` name exactly `nodes`.
async fn records_say(client: &kube::Client, service: &str, nodes: &[&str], what: &str) {
    let want: std::collections::BTreeSet<String> = nodes.iter().map(|n| n.to_string()).collect();
    berth_testing::eventually(what, LIMIT, Duration::from_millis(100), || {
        let client = client.clone();
        let want = want.clone();
        async move {
            let records = Api::<berth_api::ServiceL2Status>::all(client)
                .list(&Default::default())
                .await
                .ok()?;
            let have: std::collections::BTreeSet<String> = records
                .items
                .into_iter()
                .filter(|r| r.spec.service_namespace == "default" && r.spec.service_name == service)
                .map(|r| r.spec.node)
                .collect();
            (have == want).then_some(())
        }
    })
    .await;
}

/// A node whose announcing interface is down while its LAN link (and so its membership) is
/// up is not elected: it tells its peers it is not ready and the next node answers, until the
/// interface has been up again for the hold. The owner of VIP gets a second port on the LAN
/// bridge, `eth1`, and announces only there.
async fn announcing_interface_down(lab: &mut L2Lab) {
    let owner = owner_among(&NODES, VIP);
    let next = owner_among(&without(&NODES, &[&owner]), VIP);
    let next_mac = lab.macs[next.as_str()];
    let ns = lab.topo.netns(&owner).unwrap().to_string();
    let (lan_ns, bridge) = {
        let layout = lab.topo.layout();
        (layout.lan_netns.clone(), layout.lan_bridge.clone())
    };
    let port = format!("ann-{owner}");
    let link = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.to_string()).collect() };
    for (netns, argv) in [
        (
            &ns,
            link(&[
                "ip", "link", "add", "eth1", "type", "veth", "peer", "name", &port, "netns",
                &lan_ns,
            ]),
        ),
        (
            &lan_ns,
            link(&["ip", "link", "set", &port, "master", &bridge, "up"]),
        ),
        (&ns, link(&["ip", "link", "set", "eth1", "up"])),
    ] {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        lab.topo.exec(netns, &argv).unwrap();
    }
    let eth1 = mac_of_link(&mut lab.topo, &ns, "eth1");
    // Every interface may announce (the advertisement named eth0 until now).
    apply(
        &lab.client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"]})),
    )
    .await;
    lab.agents.stop(&owner, "-TERM");
    lab.agents.interfaces.insert(owner.clone(), "eth1".into());
    lab.agents.start(&owner);
    lab.capture
        .until(VIP, Some(eth1), "the owner answering on eth1")
        .await;
    lab.topo
        .exec(&ns, &["ip", "link", "set", "eth1", "down"])
        .unwrap();
    lab.capture
        .until(VIP, Some(next_mac), "eth1 down, the LAN link up")
        .await;
    records_say(
        &lab.client,
        "web",
        &[next.as_str()],
        "eth1 down: the record moved",
    )
    .await;
    // Not elected for as long as the interface stays down.
    for _ in 0..5 {
        let answered = lab.capture.probe(VIP).await;
        assert_eq!(
            answered.into_iter().collect::<Vec<_>>(),
            [next_mac],
            "eth1 still down"
        );
    }
    lab.topo
        .exec(&ns, &["ip", "link", "set", "eth1", "up"])
        .unwrap();
    lab.capture.until(VIP, Some(eth1), "eth1 up again").await;
}
