//! The responder: one captured frame in, a reply out, or the typed reason it was ignored. The
//! decision (is this address ours on this interface?) is injected, so the responder is pure.

use std::net::IpAddr;

use crate::answers::Refusal;
use crate::frame::{
    build_arp_reply, build_neighbor_advertisement, multicast_mac, parse_frame, Inbound, Mac,
    Malformed, ALL_NODES,
};

/// Why a frame got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    Malformed(Malformed),
    /// Not an ARP request nor a Neighbor Solicitation.
    NotARequest,
    /// Our own frame, seen on the way out.
    FromSelf,
    /// The decision refused the target address.
    Refused {
        ip: IpAddr,
        reason: Refusal,
    },
}

impl Ignored {
    /// A bounded label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Ignored::Malformed(_) => "malformed",
            Ignored::NotARequest => "not_a_request",
            Ignored::FromSelf => "from_self",
            Ignored::Refused { reason, .. } => match reason {
                Refusal::NotInPool => "not_in_pool",
                Refusal::NotOurs => "not_ours",
                Refusal::NotAdvertised => "not_advertised",
                Refusal::NotElected { .. } => "not_elected",
                Refusal::InterfaceNotSelected => "interface_not_selected",
            },
        }
    }
}

/// The interface a frame arrived on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: Mac,
}

/// The answer to `frame` received on `interface`, asking `decide(target, interface name)`.
pub fn respond(
    frame: &[u8],
    interface: &Interface,
    decide: impl Fn(IpAddr, &str) -> Result<(), Refusal>,
) -> Result<Vec<u8>, Ignored> {
    let inbound = parse_frame(frame).map_err(Ignored::Malformed)?;
    match inbound {
        Inbound::ArpRequest {
            eth_source,
            sender_mac,
            sender_ip,
            target_ip,
        } => {
            if eth_source == interface.mac {
                return Err(Ignored::FromSelf);
            }
            let ip = IpAddr::V4(target_ip);
            decide(ip, &interface.name).map_err(|reason| Ignored::Refused { ip, reason })?;
            Ok(build_arp_reply(
                interface.mac,
                target_ip,
                sender_mac,
                sender_ip,
            ))
        }
        Inbound::NeighborSolicitation {
            eth_source,
            source,
            target,
            source_mac,
        } => {
            if eth_source == interface.mac {
                return Err(Ignored::FromSelf);
            }
            let ip = IpAddr::V6(target);
            decide(ip, &interface.name).map_err(|reason| Ignored::Refused { ip, reason })?;
            let to = if source.is_unspecified() {
                multicast_mac(ALL_NODES)
            } else {
                source_mac.unwrap_or(eth_source)
            };
            Ok(build_neighbor_advertisement(
                interface.mac,
                target,
                source,
                to,
            ))
        }
        Inbound::ArpAnnouncement { .. } | Inbound::Other => Err(Ignored::NotARequest),
    }
}
