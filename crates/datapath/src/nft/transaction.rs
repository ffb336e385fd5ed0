//! What a sync hands a writer: one transaction per family, a list of [`Command`]s on berth's
//! tables with the map and set [`Element`]s they add or delete. Kept apart from the conversion
//! (`render.rs`), which decides what the tables hold, and from the forms a writer sends (the
//! `nft -f` text, the netlink batch), which each read the same transaction.

use std::cell::Cell;
use std::net::IpAddr;

use crate::backend::Payload;
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{
    Hook, NftChain, NftRule, NodePortKey, ServiceKey, CLUSTER_IP_SET, NODE_PORT_MAP, SERVICE_MAP,
};
use crate::nft::shard::{Shard, MAIN};
use crate::plan::model::ChainName;
use berth_core::IpFamily;

/// A map or set element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Element {
    Service(ServiceKey, NftChain),
    NodePort(NodePortKey, NftChain),
    /// `ep . ep` in the hairpin set.
    Hairpin(IpAddr),
    /// A ClusterIP in `cluster-ips`.
    ClusterIp(IpAddr),
}

impl Element {
    /// The table whose map or set holds the element: its target's (the hairpin set is main's).
    pub fn shard(&self) -> Shard {
        match self {
            Element::Service(_, target) | Element::NodePort(_, target) => target.shard,
            Element::Hairpin(_) | Element::ClusterIp(_) => MAIN,
        }
    }
}

/// One command of a transaction, in `nft` terms; each names one table of berth's ([`Command::shard`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    AddTable(Shard),
    DeleteTable(Shard),
    /// Declares the two verdict maps (and in the main table the hairpin and `cluster-ips` sets;
    /// idempotent).
    AddMaps(Shard),
    AddChain(NftChain, Option<Hook>),
    FlushChain(NftChain),
    DeleteChain(NftChain),
    AddRule(NftChain, NftRule),
    /// An affinity set, in the table of the chains that name it, and the timeout of its entries.
    AddAffinitySet(Shard, ChainName, u32),
    DeleteAffinitySet(Shard, ChainName),
    AddElement(Element),
    /// The element's key names it; its target says only which table's map holds it.
    DeleteElement(Element),
}

impl Command {
    /// The table of berth's the command names.
    pub fn shard(&self) -> Shard {
        match self {
            Command::AddTable(shard)
            | Command::DeleteTable(shard)
            | Command::AddMaps(shard)
            | Command::AddAffinitySet(shard, ..)
            | Command::DeleteAffinitySet(shard, _) => *shard,
            Command::AddChain(chain, _)
            | Command::FlushChain(chain)
            | Command::DeleteChain(chain)
            | Command::AddRule(chain, _) => chain.shard,
            Command::AddElement(element) | Command::DeleteElement(element) => element.shard(),
        }
    }
}

/// One `nft -f -` transaction for one family: the kernel applies all of it or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub family: IpFamily,
    pub commands: Vec<Command>,
    written: Cell<usize>,
}

impl Transaction {
    pub fn new(family: IpFamily) -> Self {
        Transaction {
            family,
            commands: Vec::new(),
            written: Cell::new(0),
        }
    }

    /// Bytes written by the last [`Payload::write_to`] (or sent by the netlink writer).
    pub fn written(&self) -> usize {
        self.written.get()
    }

    /// Records how many bytes a writer sent for this transaction.
    pub fn set_written(&self, bytes: usize) {
        self.written.set(bytes);
    }

    pub fn push(&mut self, command: Command) {
        self.commands.push(command);
    }

    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// The whole transaction as text.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_to(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The set or map an element belongs in.
pub(crate) fn element_set(element: &Element) -> &'static str {
    match element {
        Element::Service(..) => SERVICE_MAP,
        Element::NodePort(..) => NODE_PORT_MAP,
        Element::Hairpin(..) => HAIRPIN_SET,
        Element::ClusterIp(..) => CLUSTER_IP_SET,
    }
}
