//! ARP and NDP frames through the responder: what a LAN client sends, what comes back, and the
//! typed reason for every frame left unanswered. Frames are checked with etherparse, field by
//! field, as a receiving host would read them.
//!
//! Address plan: client 198.18.0.100 / fd00:198:18::100 at 02:00:00:00:00:64; the node's eth0
//! at 02:00:00:00:00:0b; owned VIPs 198.18.0.200 and fd00:198:18::c8.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use berth_l2::frame::client::{
    build_arp_request, build_neighbor_solicitation, build_unicast_neighbor_solicitation,
    read_answer,
};
use berth_l2::frame::{
    build_gratuitous, multicast_mac, parse_frame, solicited_node, Inbound, Mac, Malformed,
    ALL_NODES, BROADCAST,
};
use berth_l2::{respond, Ignored, Interface, Refusal};
use etherparse::{ArpOperation, Icmpv6Type, LinkSlice, NetSlice, SlicedPacket, TransportSlice};

const CLIENT_MAC: Mac = [2, 0, 0, 0, 0, 0x64];
const NODE_MAC: Mac = [2, 0, 0, 0, 0, 0x0b];

fn client_v4() -> Ipv4Addr {
    "198.18.0.100".parse().unwrap()
}
fn client_v6() -> Ipv6Addr {
    "fd00:198:18::100".parse().unwrap()
}
fn vip4() -> Ipv4Addr {
    "198.18.0.200".parse().unwrap()
}
fn vip6() -> Ipv6Addr {
    "fd00:198:18::c8".parse().unwrap()
}

fn eth0() -> Interface {
    Interface {
        name: "eth0".into(),
        mac: NODE_MAC,
    }
}

/// Owns the two VIPs on eth0; refuses everything else as not in a pool.
fn decide(ip: IpAddr, interface: &str) -> Result<(), Refusal> {
    if ip != IpAddr::V4(vip4()) && ip != IpAddr::V6(vip6()) {
        return Err(Refusal::NotInPool);
    }
    if interface != "eth0" {
        return Err(Refusal::InterfaceNotSelected);
    }
    Ok(())
}

fn eth_of(frame: &[u8]) -> ([u8; 6], [u8; 6]) {
    let packet = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(LinkSlice::Ethernet2(eth)) = packet.link else {
        panic!("no ethernet")
    };
    (eth.source(), eth.destination())
}

#[test]
fn an_arp_request_for_an_owned_ip_gets_a_unicast_reply_with_the_interface_mac() {
    let request = build_arp_request(CLIENT_MAC, client_v4(), vip4());
    let reply = respond(&request, &eth0(), decide).unwrap();
    assert_eq!(eth_of(&reply), (NODE_MAC, CLIENT_MAC));
    let packet = SlicedPacket::from_ethernet(&reply).unwrap();
    let Some(NetSlice::Arp(arp)) = packet.net else {
        panic!("not ARP")
    };
    let arp = arp.to_packet().try_eth_ipv4().unwrap();
    assert_eq!(arp.operation, ArpOperation::REPLY);
    assert_eq!(arp.sender_mac, NODE_MAC);
    assert_eq!(arp.sender_ipv4_addr(), vip4());
    assert_eq!(arp.target_mac, CLIENT_MAC);
    assert_eq!(arp.target_ipv4_addr(), client_v4());
    assert_eq!(
        read_answer(&reply).map(|a| (a.ip, a.mac)),
        Some((IpAddr::V4(vip4()), NODE_MAC))
    );
}

#[test]
fn a_neighbor_solicitation_gets_a_solicited_override_advertisement() {
    let ns = build_neighbor_solicitation(CLIENT_MAC, client_v6(), vip6(), 255);
    assert_eq!(eth_of(&ns).1, multicast_mac(solicited_node(vip6())));
    let na = respond(&ns, &eth0(), decide).unwrap();
    assert_eq!(eth_of(&na), (NODE_MAC, CLIENT_MAC));
    let packet = SlicedPacket::from_ethernet(&na).unwrap();
    let Some(NetSlice::Ipv6(ip)) = &packet.net else {
        panic!("not IPv6")
    };
    assert_eq!(ip.header().hop_limit(), 255);
    assert_eq!(ip.header().source_addr(), vip6());
    assert_eq!(ip.header().destination_addr(), client_v6());
    let Some(TransportSlice::Icmpv6(icmp)) = &packet.transport else {
        panic!("not ICMPv6")
    };
    assert!(icmp.is_checksum_valid(vip6().octets(), client_v6().octets()));
    let Icmpv6Type::NeighborAdvertisement(flags) = icmp.icmp_type() else {
        panic!("not an NA")
    };
    assert!(flags.solicited && flags.r#override && !flags.router);
    assert_eq!(
        read_answer(&na).map(|a| (a.ip, a.mac)),
        Some((IpAddr::V6(vip6()), NODE_MAC))
    );
}

#[test]
fn unicast_and_duplicate_address_solicitations_are_answered_too() {
    // Neighbour unreachability detection: to the VIP itself at the cached MAC, still answered,
    // and to the solicitor (MetalLB's announcer stayed silent: metallb#2685, #2920).
    let nud = build_unicast_neighbor_solicitation(CLIENT_MAC, client_v6(), vip6(), NODE_MAC);
    assert_eq!(eth_of(&nud).1, NODE_MAC);
    let na = respond(&nud, &eth0(), decide).unwrap();
    assert_eq!(eth_of(&na), (NODE_MAC, CLIENT_MAC));
    assert_eq!(
        read_answer(&na).map(|a| (a.ip, a.mac, a.gratuitous)),
        Some((IpAddr::V6(vip6()), NODE_MAC, false))
    );
    // Duplicate address detection (source ::): the answer goes to all nodes, not solicited.
    let dad = build_neighbor_solicitation(CLIENT_MAC, Ipv6Addr::UNSPECIFIED, vip6(), 255);
    let na = respond(&dad, &eth0(), decide).unwrap();
    assert_eq!(eth_of(&na).1, multicast_mac(ALL_NODES));
    let packet = SlicedPacket::from_ethernet(&na).unwrap();
    let Some(TransportSlice::Icmpv6(icmp)) = &packet.transport else {
        panic!("not ICMPv6")
    };
    let Icmpv6Type::NeighborAdvertisement(flags) = icmp.icmp_type() else {
        panic!("not an NA")
    };
    assert!(!flags.solicited && flags.r#override);
}

#[test]
fn gratuitous_arp_comes_in_request_and_reply_form_and_ipv6_as_unsolicited_na() {
    let frames = build_gratuitous(NODE_MAC, IpAddr::V4(vip4()));
    assert_eq!(frames.len(), 2);
    let mut operations = Vec::new();
    for frame in &frames {
        assert_eq!(eth_of(frame), (NODE_MAC, BROADCAST));
        let packet = SlicedPacket::from_ethernet(frame).unwrap();
        let Some(NetSlice::Arp(arp)) = packet.net else {
            panic!("not ARP")
        };
        let arp = arp.to_packet().try_eth_ipv4().unwrap();
        assert_eq!(arp.sender_ipv4_addr(), vip4());
        assert_eq!(arp.target_ipv4_addr(), vip4());
        assert_eq!(arp.sender_mac, NODE_MAC);
        operations.push(arp.operation);
        assert_eq!(
            read_answer(frame).map(|a| (a.ip, a.mac)),
            Some((IpAddr::V4(vip4()), NODE_MAC))
        );
        // Another node's responder takes it for an announcement, never a question.
        assert_eq!(
            respond(
                frame,
                &Interface {
                    name: "eth0".into(),
                    mac: CLIENT_MAC
                },
                decide
            ),
            Err(Ignored::NotARequest)
        );
    }
    assert_eq!(operations, [ArpOperation::REQUEST, ArpOperation::REPLY]);

    let frames = build_gratuitous(NODE_MAC, IpAddr::V6(vip6()));
    assert_eq!(frames.len(), 1);
    assert_eq!(eth_of(&frames[0]), (NODE_MAC, multicast_mac(ALL_NODES)));
    let packet = SlicedPacket::from_ethernet(&frames[0]).unwrap();
    let Some(NetSlice::Ipv6(ip)) = &packet.net else {
        panic!("not IPv6")
    };
    assert_eq!(ip.header().destination_addr(), ALL_NODES);
    assert_eq!(ip.header().hop_limit(), 255);
    let Some(TransportSlice::Icmpv6(icmp)) = &packet.transport else {
        panic!("not ICMPv6")
    };
    assert!(icmp.is_checksum_valid(vip6().octets(), ALL_NODES.octets()));
    let Icmpv6Type::NeighborAdvertisement(flags) = icmp.icmp_type() else {
        panic!("not an NA")
    };
    assert!(!flags.solicited && flags.r#override);
    assert_eq!(
        read_answer(&frames[0]).map(|a| (a.ip, a.mac)),
        Some((IpAddr::V6(vip6()), NODE_MAC))
    );
}

#[test]
fn every_ignored_frame_has_its_reason() {
    let other: Ipv4Addr = "198.18.0.77".parse().unwrap();
    let cases: Vec<(&str, Vec<u8>, Interface, Ignored)> = vec![
        (
            "not ours",
            build_arp_request(CLIENT_MAC, client_v4(), other),
            eth0(),
            Ignored::Refused {
                ip: IpAddr::V4(other),
                reason: Refusal::NotInPool,
            },
        ),
        (
            "wrong interface",
            build_arp_request(CLIENT_MAC, client_v4(), vip4()),
            Interface {
                name: "eth1".into(),
                mac: NODE_MAC,
            },
            Ignored::Refused {
                ip: IpAddr::V4(vip4()),
                reason: Refusal::InterfaceNotSelected,
            },
        ),
        (
            "our own request on the way out",
            build_arp_request(NODE_MAC, client_v4(), vip4()),
            eth0(),
            Ignored::FromSelf,
        ),
        (
            "a solicitation that was routed (hop limit 64)",
            build_neighbor_solicitation(CLIENT_MAC, client_v6(), vip6(), 64),
            eth0(),
            Ignored::Malformed(Malformed::HopLimit(64)),
        ),
        (
            "a truncated frame",
            build_arp_request(CLIENT_MAC, client_v4(), vip4())[..20].to_vec(),
            eth0(),
            Ignored::Malformed(Malformed::Ethernet(String::new())),
        ),
        (
            "an ARP reply",
            berth_l2::frame::build_arp_reply(CLIENT_MAC, client_v4(), NODE_MAC, vip4()),
            eth0(),
            Ignored::NotARequest,
        ),
    ];
    for (what, frame, interface, expected) in cases {
        let got = respond(&frame, &interface, decide).unwrap_err();
        match (&got, &expected) {
            (
                Ignored::Malformed(Malformed::Ethernet(_)),
                Ignored::Malformed(Malformed::Ethernet(_)),
            ) => {}
            _ => assert_eq!(got, expected, "{what}"),
        }
        assert!(!got.label().is_empty());
    }
    // A corrupted checksum is refused before any decision.
    let mut ns = build_neighbor_solicitation(CLIENT_MAC, client_v6(), vip6(), 255);
    let last = ns.len() - 1;
    ns[last] ^= 0xff;
    assert_eq!(
        respond(&ns, &eth0(), decide),
        Err(Ignored::Malformed(Malformed::Checksum))
    );
}

#[test]
fn parse_reads_what_the_client_builders_write() {
    let request = build_arp_request(CLIENT_MAC, client_v4(), vip4());
    assert_eq!(
        parse_frame(&request),
        Ok(Inbound::ArpRequest {
            eth_source: CLIENT_MAC,
            sender_mac: CLIENT_MAC,
            sender_ip: client_v4(),
            target_ip: vip4(),
        })
    );
    let ns = build_neighbor_solicitation(CLIENT_MAC, client_v6(), vip6(), 255);
    assert_eq!(
        parse_frame(&ns),
        Ok(Inbound::NeighborSolicitation {
            eth_source: CLIENT_MAC,
            source: client_v6(),
            target: vip6(),
            source_mac: Some(CLIENT_MAC),
        })
    );
    assert_eq!(
        solicited_node(vip6()),
        "ff02::1:ff00:c8".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!(
        multicast_mac(solicited_node(vip6())),
        [0x33, 0x33, 0xff, 0, 0, 0xc8]
    );
}
