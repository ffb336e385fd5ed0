//! The rendered FRR configuration, compared whole with committed golden files, and checked by
//! FRR's own parser (`vtysh --dryrun`) where FRR is installed. `BERTH_UPDATE_GOLDEN=1` rewrites
//! the files.

// A panic is a test failure here.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use berth_api::{BFDProfileSpec, BGPAdvertisementSpec, BGPPeerSpec, SecretRef};
use berth_bgp::{render_frr_config, PoolFacts, RenderedConfig, SpeakerInput, SpeakerNode};
use berth_core::parse_address;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn mk_peer(my_asn: u32, peer_asn: u32, address: &str) -> BGPPeerSpec {
    BGPPeerSpec {
        my_asn,
        peer_asn,
        peer_address: address.into(),
        peer_port: None,
        source_address: None,
        hold_time: None,
        keepalive_time: None,
        connect_time: None,
        router_id: None,
        node_selectors: Vec::new(),
        password_secret: None,
        bfd_profile: None,
        ebgp_multi_hop: None,
        enable_graceful_restart: None,
    }
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([(key.to_string(), value.to_string())].into()),
        ..Default::default()
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Two top-of-rack routers (one with BFD, MD5 and a non-default port), an IPv6 peer, and peers
/// that must be left out: another AS, a missing BFD profile, an unreadable password, another
/// rack's router.
fn render_rack_a() -> RenderedConfig {
    let node = SpeakerNode {
        name: "node1".into(),
        labels: labels(&[("rack", "a")]),
        router_id: Some("198.18.0.11".parse().unwrap()),
    };
    let peers = vec![
        (
            "tor-a1".to_string(),
            BGPPeerSpec {
                bfd_profile: Some("fast".into()),
                password_secret: Some(SecretRef {
                    name: "tor-a1-md5".into(),
                    namespace: None,
                }),
                peer_port: Some(1179),
                node_selectors: vec![selector("rack", "a")],
                ..mk_peer(64512, 64513, "198.18.0.1")
            },
        ),
        (
            "tor-a2".to_string(),
            BGPPeerSpec {
                hold_time: Some("90s".into()),
                keepalive_time: Some("30s".into()),
                connect_time: Some("10s".into()),
                source_address: Some("198.18.0.11".into()),
                enable_graceful_restart: Some(false),
                bfd_profile: Some("slow".into()),
                ..mk_peer(64512, 64514, "198.18.0.2")
            },
        ),
        (
            "tor-v6".to_string(),
            BGPPeerSpec {
                bfd_profile: Some("fast".into()),
                ebgp_multi_hop: Some(true),
                ..mk_peer(64512, 64515, "fd00:18::1")
            },
        ),
        ("other-as".to_string(), mk_peer(64600, 64513, "198.18.0.3")),
        (
            "no-profile".to_string(),
            BGPPeerSpec {
                bfd_profile: Some("missing".into()),
                ..mk_peer(64512, 64513, "198.18.0.4")
            },
        ),
        (
            "no-secret".to_string(),
            BGPPeerSpec {
                password_secret: Some(SecretRef {
                    name: "absent".into(),
                    namespace: None,
                }),
                ..mk_peer(64512, 64513, "198.18.0.5")
            },
        ),
        (
            "tor-b1".to_string(),
            BGPPeerSpec {
                node_selectors: vec![selector("rack", "b")],
                ..mk_peer(64512, 64513, "198.18.0.6")
            },
        ),
    ];
    let profiles = vec![
        ("fast".to_string(), BFDProfileSpec::default()),
        (
            "slow".to_string(),
            BFDProfileSpec {
                receive_interval: Some(300),
                transmit_interval: Some(300),
                detect_multiplier: Some(5),
                echo_mode: Some(true),
                echo_interval: Some(50),
                passive_mode: Some(true),
                minimum_ttl: Some(250),
            },
        ),
    ];
    let advertisements = vec![
        (
            "public".to_string(),
            BGPAdvertisementSpec {
                ip_pools: vec!["public".into()],
                communities: vec!["64512:100".into(), "large:64512:1:2".into()],
                local_pref: Some(200),
                ..Default::default()
            },
        ),
        (
            "aggregated".to_string(),
            BGPAdvertisementSpec {
                ip_pools: vec!["aggregated".into()],
                peers: vec!["tor-a2".into()],
                aggregation_length: Some(24),
                ..Default::default()
            },
        ),
        (
            "rack-b-only".to_string(),
            BGPAdvertisementSpec {
                node_selectors: vec![selector("rack", "b")],
                ..Default::default()
            },
        ),
    ];
    let pools = vec![
        PoolFacts {
            name: "public".into(),
            labels: BTreeMap::new(),
            ranges: vec![
                parse_address("198.19.10.0/25").unwrap(),
                parse_address("198.19.11.1-198.19.11.6").unwrap(),
                parse_address("fd00:19:10::/120").unwrap(),
            ],
        },
        PoolFacts {
            name: "aggregated".into(),
            labels: BTreeMap::new(),
            ranges: vec![parse_address("198.19.12.0/26").unwrap()],
        },
    ];
    let passwords = BTreeMap::from([("tor-a1".to_string(), "s3cret".to_string())]);
    render_frr_config(&SpeakerInput {
        node: &node,
        peers: &peers,
        profiles: &profiles,
        advertisements: &advertisements,
        pools: &pools,
        passwords: &passwords,
    })
}

fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("BERTH_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        text, want,
        "{name} differs from the rendering (BERTH_UPDATE_GOLDEN=1 rewrites it)"
    );
    check_with_frr(&path);
}

/// FRR's own parser, offline, where FRR is installed.
fn check_with_frr(path: &std::path::Path) {
    let Ok(out) = Command::new("vtysh")
        .args(["--dryrun", "--inputfile"])
        .arg(path)
        .args(["--config_dir"])
        .arg(std::env::temp_dir())
        .output()
    else {
        println!(
            "vtysh is not installed: {} checked against the golden file only",
            path.display()
        );
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("Unknown command"),
        "FRR rejects {}: {stdout}",
        path.display()
    );
}

#[test]
fn rack_a_node() {
    let rendered = render_rack_a();
    assert_eq!(rendered.peers, ["tor-a1", "tor-a2", "tor-v6"]);
    let skipped: Vec<(&str, &str)> = rendered
        .skipped
        .iter()
        .map(|s| (s.name.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("no-profile", "BFDProfile missing does not exist"),
            ("no-secret", "the password Secret cannot be read"),
            (
                "other-as",
                "myASN 64600 differs from 64512, which most peers of this node use: a node speaks as one AS"
            ),
        ]
    );
    golden("rack-a-node1.conf", &rendered.text);
}

#[test]
fn a_node_without_peers_renders_no_bgp_instance() {
    let node = SpeakerNode {
        name: "lonely".into(),
        labels: BTreeMap::new(),
        router_id: Some("198.18.0.20".parse().unwrap()),
    };
    let rendered = render_frr_config(&SpeakerInput {
        node: &node,
        peers: &[],
        profiles: &[],
        advertisements: &[],
        pools: &[],
        passwords: &BTreeMap::new(),
    });
    assert!(rendered.peers.is_empty());
    golden("no-peers.conf", &rendered.text);
}
