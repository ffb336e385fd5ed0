//! The real [`Link`]: two AF_PACKET sockets bound to one interface, one for ARP (`ETH_P_ARP`)
//! and one for IPv6 (`ETH_P_IPV6`), each with a classic BPF filter so the kernel hands over only
//! ARP requests and ICMPv6 Neighbor Solicitations that arrived from the wire (never our own
//! frames on their way out), made async with tokio's `AsyncFd`. Solicited-node groups are
//! joined with `PACKET_ADD_MEMBERSHIP`, which programs the NIC's multicast filter. The VIP is
//! never configured on the interface.
//!
//! The two calls socket2 does not wrap (binding a `sockaddr_ll`, adding a packet membership)
//! are the crate's only unsafe code, in [`sys`].

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::Ipv6Addr;

use nix::net::if_::InterfaceFlags;
use socket2::{Domain, SockFilter, Socket, Type};
use tokio::io::unix::AsyncFd;

use crate::frame::{multicast_mac, Mac};
use crate::responder::Interface;
use crate::transport::Link;
use crate::Error;

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;

// Classic BPF opcodes (linux/filter.h).
const LD_B_ABS: u16 = 0x30;
const LD_H_ABS: u16 = 0x28;
const JEQ_K: u16 = 0x15;
const RET_K: u16 = 0x06;
/// `SKF_AD_OFF + SKF_AD_PKTTYPE`: loads the packet type (incoming, outgoing...).
const PKTTYPE: u32 = 0xffff_f004;
const PACKET_OUTGOING: u32 = 4;
const ACCEPT: u32 = 0xffff;

/// ARP requests (opcode 1) that are not our own outgoing frames.
fn arp_filter() -> [SockFilter; 6] {
    [
        SockFilter::new(LD_B_ABS, 0, 0, PKTTYPE),
        SockFilter::new(JEQ_K, 3, 0, PACKET_OUTGOING),
        SockFilter::new(LD_H_ABS, 0, 0, 20),
        SockFilter::new(JEQ_K, 0, 1, 1),
        SockFilter::new(RET_K, 0, 0, ACCEPT),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

/// IPv6 packets whose next header is ICMPv6 (58) of type Neighbor Solicitation (135).
fn ndp_filter() -> [SockFilter; 8] {
    [
        SockFilter::new(LD_B_ABS, 0, 0, PKTTYPE),
        SockFilter::new(JEQ_K, 5, 0, PACKET_OUTGOING),
        SockFilter::new(LD_B_ABS, 0, 0, 20),
        SockFilter::new(JEQ_K, 0, 3, 58),
        SockFilter::new(LD_B_ABS, 0, 0, 54),
        SockFilter::new(JEQ_K, 0, 1, 135),
        SockFilter::new(RET_K, 0, 0, ACCEPT),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

/// ARP frames of any kind, and Neighbor Solicitations and Advertisements: what a probe or a
/// capture on the LAN reads.
fn neighbour_arp_filter() -> [SockFilter; 4] {
    [
        SockFilter::new(LD_B_ABS, 0, 0, PKTTYPE),
        SockFilter::new(JEQ_K, 1, 0, PACKET_OUTGOING),
        SockFilter::new(RET_K, 0, 0, ACCEPT),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

fn neighbour_ndp_filter() -> [SockFilter; 9] {
    [
        SockFilter::new(LD_B_ABS, 0, 0, PKTTYPE),
        SockFilter::new(JEQ_K, 6, 0, PACKET_OUTGOING),
        SockFilter::new(LD_B_ABS, 0, 0, 20),
        SockFilter::new(JEQ_K, 0, 4, 58),
        SockFilter::new(LD_B_ABS, 0, 0, 54),
        SockFilter::new(JEQ_K, 1, 0, 135),
        SockFilter::new(JEQ_K, 0, 1, 136),
        SockFilter::new(RET_K, 0, 0, ACCEPT),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

/// Which frames a [`PacketLink`] receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// ARP requests and Neighbor Solicitations: what the announcer answers.
    Requests,
    /// Every ARP frame and every Neighbor Solicitation and Advertisement: for probes and
    /// captures.
    Neighbour,
}

/// What the announcer needs to know of a local interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceState {
    pub mac: Option<Mac>,
    /// Administratively up with carrier.
    pub up: bool,
    pub loopback: bool,
}

/// The interfaces of the network namespace this process runs in.
pub fn local_interfaces() -> Result<BTreeMap<String, InterfaceState>, Error> {
    let mut out: BTreeMap<String, InterfaceState> = BTreeMap::new();
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| Error::Interfaces(e.into()))?;
    for addr in addrs {
        let entry = out
            .entry(addr.interface_name.clone())
            .or_insert(InterfaceState {
                mac: None,
                up: false,
                loopback: false,
            });
        entry.up = addr.flags.contains(InterfaceFlags::IFF_UP)
            && addr.flags.contains(InterfaceFlags::IFF_LOWER_UP);
        entry.loopback = addr.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        if let Some(mac) = addr
            .address
            .as_ref()
            .and_then(|a| a.as_link_addr())
            .and_then(|l| l.addr())
        {
            entry.mac = Some(mac);
        }
    }
    Ok(out)
}

/// An interface's ARP and NDP sockets.
#[derive(Debug)]
pub struct PacketLink {
    interface: Interface,
    ifindex: u32,
    arp: AsyncFd<Socket>,
    ndp: AsyncFd<Socket>,
}

fn open_socket(ifindex: u32, protocol: u16, filter: &[SockFilter]) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::PACKET,
        Type::RAW,
        Some(i32::from(protocol.to_be()).into()),
    )?;
    // Filter first: nothing unfiltered is queued once the socket is bound.
    socket.attach_filter(filter)?;
    sys::bind_to_interface(&socket, ifindex, protocol)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn read_one(fd: &AsyncFd<Socket>) -> Option<io::Result<Vec<u8>>> {
    let mut buf = vec![0u8; 1600];
    match fd.get_ref().read(&mut buf) {
        Ok(n) => {
            buf.truncate(n);
            Some(Ok(buf))
        }
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => None,
        Err(err) => Some(Err(err)),
    }
}

impl PacketLink {
    /// Opens the announcer's sockets on interface `name`. Needs CAP_NET_RAW.
    pub fn open(name: &str) -> Result<Self, Error> {
        Self::open_with(name, Listen::Requests)
    }

    /// Opens sockets on `name` that receive `listen`. Must run inside a tokio runtime.
    pub fn open_with(name: &str, listen: Listen) -> Result<Self, Error> {
        let open = |source: io::Error| Error::OpenSocket {
            interface: name.to_string(),
            source,
        };
        let ifindex = nix::net::if_::if_nametoindex(name).map_err(|e| open(e.into()))?;
        let mac = local_interfaces()?
            .get(name)
            .and_then(|s| s.mac)
            .ok_or_else(|| Error::NoMac(name.to_string()))?;
        let (arp, ndp) = match listen {
            Listen::Requests => (
                open_socket(ifindex, ETH_P_ARP, &arp_filter()),
                open_socket(ifindex, ETH_P_IPV6, &ndp_filter()),
            ),
            Listen::Neighbour => (
                open_socket(ifindex, ETH_P_ARP, &neighbour_arp_filter()),
                open_socket(ifindex, ETH_P_IPV6, &neighbour_ndp_filter()),
            ),
        };
        let (arp, ndp) = (arp.map_err(open)?, ndp.map_err(open)?);
        Ok(PacketLink {
            interface: Interface {
                name: name.to_string(),
                mac,
            },
            ifindex,
            arp: sys::register(arp).map_err(open)?,
            ndp: sys::register(ndp).map_err(open)?,
        })
    }
}

impl Link for PacketLink {
    fn interface(&self) -> &Interface {
        &self.interface
    }

    async fn recv(&mut self) -> io::Result<Vec<u8>> {
        loop {
            let (mut guard, fd) = tokio::select! {
                guard = self.arp.readable() => (guard?, &self.arp),
                guard = self.ndp.readable() => (guard?, &self.ndp),
            };
            match read_one(fd) {
                Some(result) => return result,
                None => guard.clear_ready(),
            }
        }
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        // Either socket sends on the bound interface; the frame carries its own EtherType.
        self.arp.get_ref().send(frame).map(|_| ())
    }

    fn join(&mut self, group: Ipv6Addr) -> io::Result<()> {
        sys::packet_membership(self.ndp.get_ref(), self.ifindex, multicast_mac(group), true)
    }

    fn leave(&mut self, group: Ipv6Addr) -> io::Result<()> {
        sys::packet_membership(
            self.ndp.get_ref(),
            self.ifindex,
            multicast_mac(group),
            false,
        )
    }
}

/// The raw system calls socket2 does not wrap.
#[allow(unsafe_code)]
mod sys {
    use std::io;
    use std::os::fd::AsRawFd;

    use socket2::Socket;
    use tokio::io::unix::AsyncFd;

    use crate::frame::Mac;

    /// Registers the socket with tokio's reactor.
    pub fn register(socket: Socket) -> io::Result<AsyncFd<Socket>> {
        // SAFETY: a `Socket` owns its descriptor: it stays open, and `as_raw_fd` returns the
        // same one, until the `Socket` (owned by the `AsyncFd` from here on) is dropped.
        unsafe { AsyncFd::register(socket) }.map_err(io::Error::from)
    }

    /// Binds an AF_PACKET socket to one interface and protocol.
    pub fn bind_to_interface(socket: &Socket, ifindex: u32, protocol: u16) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value of it.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol.to_be();
        addr.sll_ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index"))?;
        let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: the pointer and length describe `addr`, which lives across the call; the
        // kernel only reads it.
        let rc = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
                len,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Adds (or drops) the Ethernet multicast address `mac` to the interface's filter.
    pub fn packet_membership(socket: &Socket, ifindex: u32, mac: Mac, add: bool) -> io::Result<()> {
        let mut address = [0u8; 8];
        address[..6].copy_from_slice(&mac);
        let mreq = libc::packet_mreq {
            mr_ifindex: i32::try_from(ifindex)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index"))?,
            mr_type: libc::PACKET_MR_MULTICAST as u16,
            mr_alen: 6,
            mr_address: address,
        };
        let option = if add {
            libc::PACKET_ADD_MEMBERSHIP
        } else {
            libc::PACKET_DROP_MEMBERSHIP
        };
        // SAFETY: the pointer and length describe `mreq`, which lives across the call; the
        // kernel only reads it.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_PACKET,
                option,
                std::ptr::addr_of!(mreq).cast::<libc::c_void>(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
