//! The announcer's edge: one [`Link`] per interface that receives ARP requests and Neighbor
//! Solicitations and sends frames. [`crate::packet::PacketLink`] is the real AF_PACKET socket;
//! [`MemoryLan`] is a LAN in memory that keeps the rules a real one imposes on the announcer: a
//! link that is down neither sends nor receives, and a multicast frame reaches only links that
//! joined its group, so an announcer that forgets to join a solicited-node group hears nothing.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::broadcast;

use crate::frame::{multicast_mac, Mac, BROADCAST};
use crate::responder::Interface;

/// One interface's frames.
pub trait Link: Send + 'static {
    fn interface(&self) -> &Interface;
    /// The next frame addressed to this interface that the link's filter passes.
    fn recv(&mut self) -> impl Future<Output = io::Result<Vec<u8>>> + Send;
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// Starts receiving the IPv6 multicast `group` (a solicited-node group).
    fn join(&mut self, group: Ipv6Addr) -> io::Result<()>;
    fn leave(&mut self, group: Ipv6Addr) -> io::Result<()>;
}

/// A frame seen on the LAN, with its sender's MAC.
pub type Captured = (Mac, Vec<u8>);

#[derive(Debug, Clone)]
struct Sent {
    from: Mac,
    frame: Vec<u8>,
}

/// A shared Ethernet segment in memory. Every frame sent on it is also kept, in order, for
/// tests to read back (a capture of the whole test).
#[derive(Debug, Clone)]
pub struct MemoryLan {
    bus: broadcast::Sender<Sent>,
    capture: Arc<Mutex<Vec<Captured>>>,
}

impl Default for MemoryLan {
    fn default() -> Self {
        MemoryLan {
            bus: broadcast::channel(1024).0,
            capture: Arc::default(),
        }
    }
}

impl MemoryLan {
    /// A new interface `name` with `mac` on this LAN, up.
    pub fn attach(&self, name: &str, mac: Mac) -> MemoryLink {
        MemoryLink {
            interface: Interface {
                name: name.to_string(),
                mac,
            },
            lan: self.clone(),
            rx: self.bus.subscribe(),
            groups: BTreeSet::new(),
            up: Arc::new(Mutex::new(true)),
        }
    }

    /// Every frame sent so far, with its sender's MAC.
    pub fn capture(&self) -> Vec<Captured> {
        self.capture
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// One interface on a [`MemoryLan`].
#[derive(Debug)]
pub struct MemoryLink {
    interface: Interface,
    lan: MemoryLan,
    rx: broadcast::Receiver<Sent>,
    groups: BTreeSet<Mac>,
    up: Arc<Mutex<bool>>,
}

/// Sets a [`MemoryLink`] up or down from outside its task.
#[derive(Debug, Clone)]
pub struct LinkSwitch(Arc<Mutex<bool>>);

impl LinkSwitch {
    pub fn set_up(&self, up: bool) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = up;
    }
}

impl MemoryLink {
    pub fn switch(&self) -> LinkSwitch {
        LinkSwitch(self.up.clone())
    }

    fn is_up(&self) -> bool {
        *self.up.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the NIC would pass a frame sent to `destination`.
    fn accepts(&self, destination: &[u8]) -> bool {
        let Ok(destination) = <Mac>::try_from(destination) else {
            return false;
        };
        destination == self.interface.mac
            || destination == BROADCAST
            || self.groups.contains(&destination)
    }
}

impl Link for MemoryLink {
    fn interface(&self) -> &Interface {
        &self.interface
    }

    async fn recv(&mut self) -> io::Result<Vec<u8>> {
        loop {
            match self.rx.recv().await {
                Ok(sent) => {
                    if sent.from == self.interface.mac || !self.is_up() {
                        continue;
                    }
                    if self.accepts(sent.frame.get(..6).unwrap_or_default()) {
                        return Ok(sent.frame);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(io::Error::new(io::ErrorKind::BrokenPipe, "LAN gone"));
                }
            }
        }
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if !self.is_up() {
            return Err(io::Error::new(io::ErrorKind::NetworkDown, "link down"));
        }
        self.lan
            .capture
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((self.interface.mac, frame.to_vec()));
        // Nobody listening is not an error on a LAN.
        let _ = self.lan.bus.send(Sent {
            from: self.interface.mac,
            frame: frame.to_vec(),
        });
        Ok(())
    }

    fn join(&mut self, group: Ipv6Addr) -> io::Result<()> {
        self.groups.insert(multicast_mac(group));
        Ok(())
    }

    fn leave(&mut self, group: Ipv6Addr) -> io::Result<()> {
        self.groups.remove(&multicast_mac(group));
        Ok(())
    }
}
