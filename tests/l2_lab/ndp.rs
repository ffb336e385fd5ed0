//! IPv6 in the L2 lab: an IPv6 pool and a dual-stack LoadBalancer Service whose IPv6 address the
//! agents announce by NDP, and a capture in the client namespace that records every Neighbor
//! Advertisement on the LAN and sends the Neighbor Solicitations.
//!
//! Address plan: pool `v6` fd00:198:18::c8-fd00:198:18::d7, advertised beside `default`;
//! Service `web6` (Cluster policy) at 198.18.0.202 and [`VIP6`] fd00:198:18::c8, ClusterIPs
//! 10.96.0.20 and fd00:96::14; solicitations come from fd00:198:18:1::<n> (a fresh source for
//! each, so every answer names the solicitation it answers) at [`PROBE_MAC`], an address and MAC
//! no host has. fd00:198:18::1ff is in no pool.

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use berth_l2::frame::client::{
    build_neighbor_solicitation, build_unicast_neighbor_solicitation, read_answer,
};
use berth_l2::frame::{Mac, NDP_HOP_LIMIT};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use super::{advertise, apply, mk_slice, Tap, LIMIT, PROBE_MAC};

pub const VIP6: &str = "fd00:198:18::c8";
/// In no pool: nobody may answer for it.
pub const STRAY6: &str = "fd00:198:18::1ff";

pub fn vip6() -> Ipv6Addr {
    VIP6.parse().unwrap()
}

/// One Neighbor Advertisement seen on the LAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Na {
    pub at: Instant,
    pub target: Ipv6Addr,
    pub mac: Mac,
    /// The IPv6 destination: the solicitor, or ff02::1 when unsolicited.
    pub to: Ipv6Addr,
    pub solicited: bool,
    pub r#override: bool,
}

/// An NA with a target link-layer option, read from an Ethernet frame (IPv6 without extension
/// headers, as NDP is sent).
fn read_na(frame: &[u8]) -> Option<Na> {
    let answer = read_answer(frame)?;
    let std::net::IpAddr::V6(target) = answer.ip else {
        return None;
    };
    let to: [u8; 16] = frame.get(38..54)?.try_into().ok()?;
    let flags = *frame.get(58)?;
    Some(Na {
        at: Instant::now(),
        target,
        mac: answer.mac,
        to: Ipv6Addr::from(to),
        solicited: flags & 0x40 != 0,
        r#override: flags & 0x20 != 0,
    })
}

/// Every NA the client namespace sees, and a way to send solicitations from it.
pub struct NdpCapture {
    tap: Tap<Na>,
    next_source: AtomicU16,
}

impl NdpCapture {
    pub fn start(netns: &str) -> NdpCapture {
        NdpCapture {
            tap: Tap::start(netns, read_na),
            next_source: AtomicU16::new(1),
        }
    }

    /// Sends one Neighbor Solicitation for `target` from a fresh source: to its solicited-node
    /// group, or with `to`, unicast to that MAC and to `target` itself. Returns the source.
    pub fn solicit(&self, target: Ipv6Addr, to: Option<Mac>) -> Ipv6Addr {
        let n = self.next_source.fetch_add(1, Ordering::Relaxed);
        let source = Ipv6Addr::new(0xfd00, 0x198, 0x18, 1, 0, 0, 0, n);
        let frame = match to {
            None => build_neighbor_solicitation(PROBE_MAC, source, target, NDP_HOP_LIMIT),
            Some(mac) => build_unicast_neighbor_solicitation(PROBE_MAC, source, target, mac),
        };
        self.tap.send.send(frame).unwrap();
        source
    }

    /// The NAs sent to `source` (the answers to the solicitation it sent).
    pub fn answers_to(&self, source: Ipv6Addr) -> Vec<Na> {
        self.tap
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|na| na.to == source)
            .copied()
            .collect()
    }

    /// The NAs for `target` since `from` that `pick` keeps.
    pub fn since(&self, target: Ipv6Addr, from: Instant, pick: impl Fn(&Na) -> bool) -> Vec<Na> {
        self.tap
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|na| na.at >= from && na.target == target && pick(na))
            .copied()
            .collect()
    }

    /// The MACs that answered one multicast solicitation for `target` within 300 ms.
    pub async fn ask(&self, target: Ipv6Addr) -> Vec<Mac> {
        let source = self.solicit(target, None);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.answers_to(source).iter().map(|na| na.mac).collect()
    }

    /// Solicits until exactly `mac` answers (or, with `None`, until nobody does).
    pub async fn until(&self, target: Ipv6Addr, mac: Option<Mac>, what: &str) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let got = self.ask(target).await;
            if got.len() <= 1 && got.first().copied() == mac {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {target} answered by {got:?}"
            );
        }
    }
}

/// Adds the IPv6 pool, advertises it beside `default`, and gives Service `web6` its addresses.
pub async fn announce_ipv6(client: &Client) {
    apply(
        client,
        "berth.dev/v1alpha1",
        "IPPool",
        json!({"metadata": {"name": "v6"},
               "spec": {"addresses": ["fd00:198:18::c8-fd00:198:18::d7"]}}),
    )
    .await;
    apply(
        client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default", "v6"]})),
    )
    .await;
    apply(
        client,
        "v1",
        "Service",
        json!({
            "metadata": {"namespace": "default", "name": "web6"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20",
                     "clusterIPs": ["10.96.0.20", "fd00:96::14"],
                     "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                     "externalTrafficPolicy": "Cluster",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                "nodePort": 30084, "protocol": "TCP"}]}
        }),
    )
    .await;
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default")
        .patch_status(
            "web6",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [
                {"ip": "198.18.0.202", "ipMode": "VIP"},
                {"ip": VIP6, "ipMode": "VIP"}]}}})),
        )
        .await
        .unwrap();
    apply(
        client,
        "discovery.k8s.io/v1",
        "EndpointSlice",
        mk_slice("web6", &[("10.244.1.2", "n1", true)]),
    )
    .await;
}
