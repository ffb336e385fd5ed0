//! The nftables writer that speaks netlink itself: a [`Transaction`] becomes one nfnetlink batch
//! (`NFNL_MSG_BATCH_BEGIN`, a message per table, chain, set, rule and run of elements,
//! `NFNL_MSG_BATCH_END`), handed to the kernel in one `send` on a `NETLINK_NETFILTER` socket.
//! The kernel applies a batch as one transaction: all of it or nothing, and a batch that never
//! reached `send` (the agent killed while building it) is nothing at all.
//!
//! The messages are those `nft -f` sends for the same text ([`crate::nft::render`]): the
//! equality test loads every golden ruleset both ways and compares what the kernel holds.
//! [`build_batch`] is pure; [`NetlinkNft`] owns the socket. Each message but the last goes
//! without `NLM_F_ACK`: the kernel reports every refused message and then acknowledges the
//! last one, so a 100,000-message batch costs one acknowledgement, and an error names the
//! object of the message it refers to ([`Error::Netlink`]).
//!
//! The batches and the kernel's answers to them are built and read in `batch` (pure, tested
//! without a kernel); the dump requests that read berth's tables back are in `read`.

mod batch;
mod read;

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use nix::sys::socket::{setsockopt, sockopt};

use crate::error::Error;
use crate::nft::adopt::{Observed, ObservedTables};
use crate::nft::dump::RawTable;
use crate::nft::render::{Command, Element, NftChain, Transaction, TABLE};
use crate::nft::shard::{Shard, MAIN};
use crate::nft::sync::Nft;
use batch::describe;
pub use batch::{build_batch, parse_replies, Batch, Reply};
use berth_core::IpFamily;

/// A `NETLINK_NETFILTER` socket, opened in the agent's network namespace or a named one.
pub struct NetlinkSocket {
    socket: Socket,
    seq: u32,
}

fn io_error(op: &str, source: io::Error) -> Error {
    Error::Netlink {
        object: format!("the netlink socket ({op})"),
        errno: source.raw_os_error().unwrap_or(0),
        message: source.to_string(),
    }
}

impl NetlinkSocket {
    /// Opens the socket, inside `/run/netns/<netns>` when a namespace is named: a thread enters
    /// the namespace, opens the socket and exits; the socket stays bound to that namespace.
    pub fn open(netns: Option<&str>) -> Result<Self, Error> {
        let socket = match netns {
            None => open_socket()?,
            Some(name) => {
                let path = format!("/run/netns/{name}");
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| {
                            let ns = std::fs::File::open(&path)
                                .map_err(|e| io_error("open the namespace", e))?;
                            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                                .map_err(|e| io_error("enter the namespace", e.into()))?;
                            open_socket()
                        })
                        .join()
                        .unwrap_or_else(|_| {
                            Err(io_error(
                                "open",
                                io::Error::other("the opening thread panicked"),
                            ))
                        })
                })?
            }
        };
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() as u32);
        Ok(NetlinkSocket { socket, seq })
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// Sends one batch in one `send` and reads the kernel's answers to it: `Ok` when the last
    /// message was acknowledged and nothing was refused.
    pub fn apply(&mut self, tx: &Transaction, table: &str) -> Result<usize, Error> {
        let batch = build_batch(tx, table, self.seq);
        self.seq = batch.last_seq.wrapping_add(1);
        self.send_batch(tx, &batch)
    }

    /// Applies `stages` in order, one batch (one transaction) each, stopping at the first the
    /// kernel refuses; the bytes sent in all. A thread of its own hands the batches to the
    /// kernel, so the next one is built while the kernel takes the last (at most one waits
    /// built: the memory of two or three batches, not of all of them).
    pub fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
        table: &str,
    ) -> Result<usize, Error> {
        let mut seq = self.seq;
        let (to_kernel, built) = std::sync::mpsc::sync_channel::<(Transaction, Batch)>(1);
        let result = std::thread::scope(|scope| {
            let sender = std::thread::Builder::new()
                .name("berth-nft-send".to_string())
                .spawn_scoped(scope, || {
                    let mut sent = 0;
                    for (tx, batch) in built {
                        sent += self.send_batch(&tx, &batch)?;
                    }
                    Ok(sent)
                })
                .map_err(|e| io_error("start the sending thread", e))?;
            for tx in stages.filter(|tx| !tx.is_empty()) {
                let batch = build_batch(&tx, table, seq);
                seq = batch.last_seq.wrapping_add(1);
                // The sender stopped at a refused batch: its error is the result.
                if to_kernel.send((tx, batch)).is_err() {
                    break;
                }
            }
            drop(to_kernel);
            sender.join().unwrap_or_else(|_| {
                Err(io_error(
                    "send",
                    io::Error::other("the sending thread panicked"),
                ))
            })
        });
        self.seq = seq;
        result
    }

    /// Sends one built batch in one `send` and reads the kernel's answers to it.
    fn send_batch(&mut self, tx: &Transaction, batch: &Batch) -> Result<usize, Error> {
        // The whole batch must fit the socket's send buffer to go in one message.
        let wanted = batch.bytes.len() + 65_536;
        setsockopt(&self.fd(), sockopt::SndBufForce, &wanted)
            .or_else(|_| setsockopt(&self.fd(), sockopt::SndBuf, &wanted))
            .map_err(|e| io_error("size the send buffer", e.into()))?;
        let sent = self
            .socket
            .send(&batch.bytes, 0)
            .map_err(|e| io_error("send", e))?;
        if sent != batch.bytes.len() {
            return Err(io_error(
                "send",
                io::Error::other(format!("sent {sent} of {} bytes", batch.bytes.len())),
            ));
        }
        let replies = self.replies(batch)?;
        let refused: Vec<&Reply> = replies.iter().filter(|r| r.error != 0).collect();
        if let Some(first) = refused.first() {
            let object = describe(tx, batch, first.seq);
            let errno = -first.error;
            let message = first
                .message
                .clone()
                .unwrap_or_else(|| io::Error::from_raw_os_error(errno).to_string());
            let more = refused.len() - 1;
            return Err(Error::Netlink {
                object: if more > 0 {
                    format!("{object} (and {more} more refused)")
                } else {
                    object
                },
                errno,
                message,
            });
        }
        Ok(batch.bytes.len())
    }

    /// Sends `bytes` as they are (whole batches or not) in one `send` and returns what the
    /// kernel answered: what the crash tests hand the kernel to show that no cut-short batch
    /// commits anything.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<Vec<Reply>, Error> {
        let wanted = bytes.len() + 65_536;
        setsockopt(&self.fd(), sockopt::SndBufForce, &wanted)
            .or_else(|_| setsockopt(&self.fd(), sockopt::SndBuf, &wanted))
            .map_err(|e| io_error("size the send buffer", e.into()))?;
        self.socket
            .send(bytes, 0)
            .map_err(|e| io_error("send", e))?;
        let mut out = Vec::new();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        loop {
            buf.clear();
            match self.socket.recv(&mut buf, libc::MSG_DONTWAIT) {
                Ok(_) => out.extend(parse_replies(&buf)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(out),
                Err(e) => return Err(io_error("receive", e)),
            }
        }
    }

    /// Reads answers until the last message's acknowledgement (or a refusal of the batch as a
    /// whole); the kernel has queued all of them by the time `send` returns.
    fn replies(&mut self, batch: &Batch) -> Result<Vec<Reply>, Error> {
        let mut out = Vec::new();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        loop {
            buf.clear();
            match self.socket.recv(&mut buf, libc::MSG_DONTWAIT) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io_error(
                        "receive",
                        io::Error::other("the kernel did not acknowledge the batch"),
                    ))
                }
                Err(e) => return Err(io_error("receive", e)),
            }
            for reply in parse_replies(&buf) {
                let done = reply.seq == batch.last_seq
                    || (reply.seq == batch.first_seq && reply.error != 0);
                if reply.seq >= batch.first_seq && reply.seq <= batch.last_seq {
                    out.push(reply);
                }
                if done {
                    self.drain();
                    return Ok(out);
                }
            }
        }
    }

    /// Whatever else is queued (further errors of a refused batch).
    fn drain(&mut self) {
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        loop {
            buf.clear();
            if self.socket.recv(&mut buf, libc::MSG_DONTWAIT).is_err() {
                return;
            }
        }
    }
}

fn open_socket() -> Result<Socket, Error> {
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(|e| io_error("create", e))?;
    socket.bind_auto().map_err(|e| io_error("bind", e))?;
    // Refusals echo only the refused message's header, with the kernel's reason attached.
    let _ = socket.set_cap_ack(true);
    let _ = socket.set_ext_ack(true);
    Ok(socket)
}

/// The real [`Nft`] over netlink: berth's table `ip berth` / `ip6 berth`, in the agent's network
/// namespace or a named one.
pub struct NetlinkNft {
    netns: Option<String>,
    socket: Option<NetlinkSocket>,
}

impl NetlinkNft {
    pub fn new() -> Self {
        NetlinkNft {
            netns: None,
            socket: None,
        }
    }

    /// Writes into the named network namespace (`/run/netns/<name>`).
    pub fn in_netns(name: impl Into<String>) -> Self {
        NetlinkNft {
            netns: Some(name.into()),
            socket: None,
        }
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    fn socket(&mut self) -> Result<&mut NetlinkSocket, Error> {
        if self.socket.is_none() {
            self.socket = Some(NetlinkSocket::open(self.netns.as_deref())?);
        }
        self.socket
            .as_mut()
            .ok_or_else(|| io_error("open", io::Error::other("no socket")))
    }

    /// Applies `tx` to the table `table` (berth's own, or a scratch table).
    pub fn apply_to(&mut self, tx: &Transaction, table: &str) -> Result<usize, Error> {
        let result = self.socket()?.apply(tx, table);
        if result.is_err() {
            // A socket that saw a failure starts over: nothing stale is read as an answer.
            self.socket = None;
        }
        result
    }

    /// berth's table of `family` as a netlink dump returns it (`None`: there is none), for
    /// `berth explain` to decode ([`crate::nft::decode`]).
    pub fn dump(&mut self, family: IpFamily) -> Result<Option<RawTable>, Error> {
        let result = self.socket()?.dump_table(family, TABLE);
        if result.is_err() {
            self.socket = None;
        }
        result
    }

    /// Whether the kernel accepts everything the backend programs: [`probe_transaction`] on a
    /// scratch table, which the same batch deletes again.
    pub fn usable(&mut self) -> bool {
        self.apply_to(&probe_transaction(), PROBE_TABLE).is_ok()
    }
}

impl Default for NetlinkNft {
    fn default() -> Self {
        NetlinkNft::new()
    }
}

impl Nft for NetlinkNft {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        if tx.is_empty() {
            return Ok(());
        }
        let bytes = self.apply_to(tx, TABLE)?;
        tx.set_written(bytes);
        Ok(())
    }

    fn read(&mut self, family: IpFamily) -> Result<Option<ObservedTables>, Error> {
        let result = self.socket()?.read_table(family, TABLE);
        if result.is_err() {
            self.socket = None;
        }
        result
    }

    fn read_each(
        &mut self,
        family: IpFamily,
        each: &mut dyn FnMut(Shard, Observed) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        let result = self.socket()?.read_each(family, TABLE, each);
        if result.is_err() {
            self.socket = None;
        }
        result
    }

    fn tables(&mut self, family: IpFamily) -> Result<Option<BTreeSet<Shard>>, Error> {
        let result = self.socket()?.tables(family, TABLE);
        if result.is_err() {
            self.socket = None;
        }
        result.map(Some)
    }

    fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
    ) -> Result<usize, Error> {
        let result = self.socket()?.apply_staged(stages, TABLE);
        if result.is_err() {
            self.socket = None;
        }
        result
    }

    fn can_read(&self) -> bool {
        true
    }
}

/// The scratch table of [`NetlinkNft::usable`].
pub const PROBE_TABLE: &str = "berth-probe";

/// Every kernel feature the backend uses (concatenated verdict maps and sets, a plain address set
/// with a `reject` rule, `fib`, `numgen`, `ct status`, a dynamic timeout set, DNAT, fully-random
/// masquerade) on a table the same
/// transaction deletes again: the kernel validates all of it and nothing stays.
pub fn probe_transaction() -> Transaction {
    use crate::nft::render::{Hook, NftRule};
    use crate::plan::model::{AddrSide, ChainName, Match, RecentAction, Rule, Table, Target};
    use berth_core::Protocol;
    let nat = |name: &str| NftChain::new(Table::Nat, &ChainName::new(name));
    let pre = ChainName::new("PREROUTING");
    let post = ChainName::new("POSTROUTING");
    let cluster_ips = NftChain::new(Table::Filter, &ChainName::new("cluster-ips"));
    let svc = nat("svc");
    let set = ChainName::new("affinity");
    let ep: IpAddr = [10, 0, 0, 1].into();
    let mut tx = Transaction::new(IpFamily::V4);
    let commands = [
        Command::AddTable(MAIN),
        Command::AddMaps(MAIN),
        Command::AddChain(
            NftChain::new(Table::Nat, &pre),
            Hook::of_builtin(Table::Nat, &pre),
        ),
        Command::AddChain(
            NftChain::new(Table::Nat, &post),
            Hook::of_builtin(Table::Nat, &post),
        ),
        Command::AddChain(svc.clone(), None),
        Command::AddChain(cluster_ips.clone(), None),
        Command::AddAffinitySet(MAIN, set.clone(), 10),
        Command::AddRule(NftChain::new(Table::Nat, &pre), NftRule::ServiceMap),
        Command::AddRule(NftChain::new(Table::Nat, &pre), NftRule::NodePortMap),
        Command::AddRule(
            NftChain::new(Table::Nat, &pre),
            NftRule::Rule(Rule::jump(
                vec![
                    Match::AddrTypeLocal {
                        side: AddrSide::Dst,
                        negated: false,
                    },
                    Match::Protocol(Protocol::Tcp),
                ],
                &ChainName::new("svc"),
            )),
        ),
        Command::AddRule(
            svc.clone(),
            NftRule::Rule(Rule::new(
                vec![
                    Match::Random { one_in: 2 },
                    Match::Recent {
                        name: set.clone(),
                        action: RecentAction::Set,
                    },
                    Match::Protocol(Protocol::Tcp),
                ],
                Target::Dnat("10.0.0.1:80".parse().unwrap_or_else(|_| (ep, 80).into())),
            )),
        ),
        Command::AddRule(
            NftChain::new(Table::Nat, &post),
            NftRule::Hairpin(ChainName::new("svc")),
        ),
        Command::AddRule(
            NftChain::new(Table::Nat, &post),
            NftRule::Rule(Rule::new(vec![], Target::Masquerade { random_fully: true })),
        ),
        Command::AddElement(Element::Service((ep, Protocol::Tcp, 80), svc)),
        Command::AddRule(cluster_ips, NftRule::ClusterIpSet),
        Command::AddElement(Element::Hairpin(ep)),
        Command::AddElement(Element::ClusterIp([10, 96, 0, 1].into())),
        Command::DeleteTable(MAIN),
    ];
    tx.commands.extend(commands);
    tx
}
