//! ARP and NDP frames (Ethernet II), parsed and built with etherparse: requests and Neighbor
//! Solicitations in; replies, Neighbor Advertisements and gratuitous announcements out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::icmpv6::NeighborAdvertisementHeader;
use etherparse::{
    ArpEthIpv4Packet, ArpOperation, EtherType, Icmpv6Type, LinkSlice, NetSlice, PacketBuilder,
    SlicedPacket, TransportSlice,
};

/// An Ethernet MAC address.
pub type Mac = [u8; 6];

pub const BROADCAST: Mac = [0xff; 6];
/// ff02::1, all nodes.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// Hop limit every NDP message must carry (RFC 4861 §7.1): proof it was not routed.
pub const NDP_HOP_LIMIT: u8 = 255;
const NDP_OPTION_SOURCE_LINK_LAYER: u8 = 1;
const NDP_OPTION_TARGET_LINK_LAYER: u8 = 2;

/// A frame the responder may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    ArpRequest {
        eth_source: Mac,
        sender_mac: Mac,
        sender_ip: Ipv4Addr,
        target_ip: Ipv4Addr,
    },
    /// An ARP reply, or a request announcing the sender's own address.
    ArpAnnouncement {
        sender_mac: Mac,
        sender_ip: Ipv4Addr,
    },
    NeighborSolicitation {
        eth_source: Mac,
        /// `::` for duplicate address detection.
        source: Ipv6Addr,
        target: Ipv6Addr,
        /// The Source Link-Layer Address option, if present.
        source_mac: Option<Mac>,
    },
    /// Well formed, but nothing the responder answers (another ICMPv6 type, IPv4...).
    Other,
}

/// Why a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("not an Ethernet II frame: {0}")]
    Ethernet(String),
    #[error("ARP for hardware or protocol other than Ethernet/IPv4")]
    ArpNotEthernetIpv4,
    #[error("neighbor discovery with hop limit {0}, not 255")]
    HopLimit(u8),
    #[error("ICMPv6 checksum does not match")]
    Checksum,
    #[error("neighbor solicitation too short")]
    ShortSolicitation,
    #[error("neighbor solicitation for multicast target {0}")]
    MulticastTarget(Ipv6Addr),
}

fn mac_of(bytes: &[u8]) -> Option<Mac> {
    bytes.try_into().ok()
}

/// Reads a frame as captured on an Ethernet interface.
pub fn parse_frame(bytes: &[u8]) -> Result<Inbound, Malformed> {
    let packet =
        SlicedPacket::from_ethernet(bytes).map_err(|e| Malformed::Ethernet(e.to_string()))?;
    let Some(LinkSlice::Ethernet2(eth)) = &packet.link else {
        return Err(Malformed::Ethernet("no Ethernet II header".into()));
    };
    let eth_source = eth.source();
    match &packet.net {
        Some(NetSlice::Arp(arp)) => {
            let arp = arp
                .to_packet()
                .try_eth_ipv4()
                .map_err(|_| Malformed::ArpNotEthernetIpv4)?;
            Ok(read_arp(eth_source, &arp))
        }
        Some(NetSlice::Ipv6(ip)) => {
            let Some(TransportSlice::Icmpv6(icmp)) = &packet.transport else {
                return Ok(Inbound::Other);
            };
            if icmp.icmp_type() != Icmpv6Type::NeighborSolicitation {
                return Ok(Inbound::Other);
            }
            let header = ip.header();
            if header.hop_limit() != NDP_HOP_LIMIT {
                return Err(Malformed::HopLimit(header.hop_limit()));
            }
            let source = header.source_addr();
            if !icmp.is_checksum_valid(source.octets(), header.destination_addr().octets()) {
                return Err(Malformed::Checksum);
            }
            let payload = icmp.payload();
            let target: [u8; 16] = payload
                .get(..16)
                .and_then(|t| t.try_into().ok())
                .ok_or(Malformed::ShortSolicitation)?;
            let target = Ipv6Addr::from(target);
            if target.is_multicast() {
                return Err(Malformed::MulticastTarget(target));
            }
            Ok(Inbound::NeighborSolicitation {
                eth_source,
                source,
                target,
                source_mac: source_link_layer(payload.get(16..).unwrap_or_default()),
            })
        }
        _ => Ok(Inbound::Other),
    }
}

fn read_arp(eth_source: Mac, arp: &ArpEthIpv4Packet) -> Inbound {
    let sender_ip = arp.sender_ipv4_addr();
    let target_ip = arp.target_ipv4_addr();
    if arp.operation == ArpOperation::REQUEST && sender_ip != target_ip {
        Inbound::ArpRequest {
            eth_source,
            sender_mac: arp.sender_mac,
            sender_ip,
            target_ip,
        }
    } else {
        Inbound::ArpAnnouncement {
            sender_mac: arp.sender_mac,
            sender_ip,
        }
    }
}

/// The Source Link-Layer Address option among NDP options (type, length in 8-octet units, value).
fn source_link_layer(mut options: &[u8]) -> Option<Mac> {
    while options.len() >= 8 {
        let kind = options[0];
        let len = usize::from(options[1]) * 8;
        if len == 0 || len > options.len() {
            return None;
        }
        if kind == NDP_OPTION_SOURCE_LINK_LAYER {
            return mac_of(options.get(2..8)?);
        }
        options = &options[len..];
    }
    None
}

fn write_arp(eth_destination: Mac, arp: ArpEthIpv4Packet) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2(arp.sender_mac, eth_destination).arp(arp.into());
    let mut out = Vec::with_capacity(builder.size());
    // Writing into a Vec cannot fail.
    let _ = builder.write(&mut out);
    out
}

/// The reply to an ARP request for `ip`, from `mac`.
pub fn build_arp_reply(
    mac: Mac,
    ip: Ipv4Addr,
    requester_mac: Mac,
    requester_ip: Ipv4Addr,
) -> Vec<u8> {
    write_arp(
        requester_mac,
        ArpEthIpv4Packet {
            operation: ArpOperation::REPLY,
            sender_mac: mac,
            sender_ipv4: ip.octets(),
            target_mac: requester_mac,
            target_ipv4: requester_ip.octets(),
        },
    )
}

/// The two forms of gratuitous ARP: some routers ignore replies, some hosts requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GratuitousForm {
    Request,
    Reply,
}

/// A broadcast announcing that `ip` is at `mac` (sender and target address both `ip`).
pub fn build_gratuitous_arp(mac: Mac, ip: Ipv4Addr, form: GratuitousForm) -> Vec<u8> {
    let (operation, target_mac) = match form {
        GratuitousForm::Request => (ArpOperation::REQUEST, [0; 6]),
        GratuitousForm::Reply => (ArpOperation::REPLY, BROADCAST),
    };
    write_arp(
        BROADCAST,
        ArpEthIpv4Packet {
            operation,
            sender_mac: mac,
            sender_ipv4: ip.octets(),
            target_mac,
            target_ipv4: ip.octets(),
        },
    )
}

/// The Ethernet address of an IPv6 multicast group (33:33 + its last 32 bits).
pub fn multicast_mac(group: Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// ff02::1:ffXX:XXXX, where Neighbor Solicitations for `ip` are sent.
pub fn solicited_node(ip: Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

fn write_na(
    mac: Mac,
    eth_destination: Mac,
    target: Ipv6Addr,
    destination: Ipv6Addr,
    solicited: bool,
) -> Vec<u8> {
    let header = NeighborAdvertisementHeader {
        router: false,
        solicited,
        r#override: true,
    };
    let builder = PacketBuilder::ethernet2(mac, eth_destination)
        .ipv6(target.octets(), destination.octets(), NDP_HOP_LIMIT)
        .icmpv6(Icmpv6Type::NeighborAdvertisement(header));
    let mut payload = Vec::with_capacity(24);
    payload.extend_from_slice(&target.octets());
    payload.extend_from_slice(&[NDP_OPTION_TARGET_LINK_LAYER, 1]);
    payload.extend_from_slice(&mac);
    let mut out = Vec::with_capacity(builder.size(payload.len()));
    // Writing into a Vec cannot fail; the payload is far below the IPv6 length limit.
    let _ = builder.write(&mut out, &payload);
    out
}

/// The Neighbor Advertisement answering a solicitation for `target`: to the solicitor, or to
/// all nodes when it was duplicate address detection (source `::`).
pub fn build_neighbor_advertisement(
    mac: Mac,
    target: Ipv6Addr,
    solicitor: Ipv6Addr,
    solicitor_mac: Mac,
) -> Vec<u8> {
    if solicitor.is_unspecified() {
        return build_unsolicited_na(mac, target);
    }
    write_na(mac, solicitor_mac, target, solicitor, true)
}

/// An unsolicited Neighbor Advertisement to all nodes (override set), sent on takeover.
pub fn build_unsolicited_na(mac: Mac, target: Ipv6Addr) -> Vec<u8> {
    write_na(mac, multicast_mac(ALL_NODES), target, ALL_NODES, false)
}

/// The gratuitous frames announcing `ip` at `mac`: ARP request and reply, or one unsolicited NA.
pub fn build_gratuitous(mac: Mac, ip: IpAddr) -> Vec<Vec<u8>> {
    match ip {
        IpAddr::V4(ip) => vec![
            build_gratuitous_arp(mac, ip, GratuitousForm::Request),
            build_gratuitous_arp(mac, ip, GratuitousForm::Reply),
        ],
        IpAddr::V6(ip) => vec![build_unsolicited_na(mac, ip)],
    }
}

/// Builds the frames a client on the LAN sends: for tests, probes and the benchmark.
pub mod client {
    use super::*;

    /// A broadcast ARP request from `mac`/`ip` asking for `target`.
    pub fn build_arp_request(mac: Mac, ip: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
        write_arp(
            BROADCAST,
            ArpEthIpv4Packet {
                operation: ArpOperation::REQUEST,
                sender_mac: mac,
                sender_ipv4: ip.octets(),
                target_mac: [0; 6],
                target_ipv4: target.octets(),
            },
        )
    }

    /// A Neighbor Solicitation for `target` to its solicited-node group, with hop limit `hops`.
    pub fn build_neighbor_solicitation(
        mac: Mac,
        source: Ipv6Addr,
        target: Ipv6Addr,
        hops: u8,
    ) -> Vec<u8> {
        let group = solicited_node(target);
        write_ns(mac, multicast_mac(group), source, group, target, hops)
    }

    /// A Neighbor Solicitation sent straight to `target` at `to`, the MAC a neighbour entry
    /// holds: how a kernel confirms a stale entry (RFC 4861 §7.3.3) before it falls back to
    /// the solicited-node group.
    pub fn build_unicast_neighbor_solicitation(
        mac: Mac,
        source: Ipv6Addr,
        target: Ipv6Addr,
        to: Mac,
    ) -> Vec<u8> {
        write_ns(mac, to, source, target, target, NDP_HOP_LIMIT)
    }

    fn write_ns(
        mac: Mac,
        eth_destination: Mac,
        source: Ipv6Addr,
        destination: Ipv6Addr,
        target: Ipv6Addr,
        hops: u8,
    ) -> Vec<u8> {
        let builder = PacketBuilder::ethernet2(mac, eth_destination)
            .ipv6(source.octets(), destination.octets(), hops)
            .icmpv6(Icmpv6Type::NeighborSolicitation);
        let mut payload = Vec::with_capacity(24);
        payload.extend_from_slice(&target.octets());
        if !source.is_unspecified() {
            payload.extend_from_slice(&[NDP_OPTION_SOURCE_LINK_LAYER, 1]);
            payload.extend_from_slice(&mac);
        }
        let mut out = Vec::with_capacity(builder.size(payload.len()));
        let _ = builder.write(&mut out, &payload);
        out
    }

    /// What an answer on the LAN says: `ip` is at `mac`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Answer {
        pub ip: IpAddr,
        pub mac: Mac,
        /// Sent unasked (gratuitous ARP, unsolicited NA), not in reply to a request.
        pub gratuitous: bool,
    }

    /// The answer a frame carries: an ARP reply or announcement, or a Neighbor Advertisement
    /// with a target link-layer option.
    pub fn read_answer(bytes: &[u8]) -> Option<Answer> {
        let packet = SlicedPacket::from_ethernet(bytes).ok()?;
        match packet.net? {
            NetSlice::Arp(arp) => {
                let arp = arp.to_packet().try_eth_ipv4().ok()?;
                let gratuitous = arp.sender_ipv4 == arp.target_ipv4;
                (arp.operation == ArpOperation::REPLY || gratuitous).then(|| Answer {
                    ip: IpAddr::V4(arp.sender_ipv4_addr()),
                    mac: arp.sender_mac,
                    gratuitous,
                })
            }
            NetSlice::Ipv6(_) => {
                let Some(TransportSlice::Icmpv6(icmp)) = packet.transport else {
                    return None;
                };
                let Icmpv6Type::NeighborAdvertisement(flags) = icmp.icmp_type() else {
                    return None;
                };
                let payload = icmp.payload();
                let target: [u8; 16] = payload.get(..16)?.try_into().ok()?;
                let options = payload.get(16..)?;
                if options.first() != Some(&NDP_OPTION_TARGET_LINK_LAYER) {
                    return None;
                }
                Some(Answer {
                    ip: IpAddr::V6(Ipv6Addr::from(target)),
                    mac: mac_of(options.get(2..8)?)?,
                    gratuitous: !flags.solicited,
                })
            }
            _ => None,
        }
    }

    /// The Ethernet type of a frame, for tests.
    pub fn ether_type(bytes: &[u8]) -> Option<EtherType> {
        match SlicedPacket::from_ethernet(bytes).ok()?.link? {
            LinkSlice::Ethernet2(eth) => Some(eth.ether_type()),
            _ => None,
        }
    }
}
