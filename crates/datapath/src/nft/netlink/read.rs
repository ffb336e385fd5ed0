//! Reading berth's tables back: netlink dump requests for its tables, chains, rules, sets and
//! elements, as adoption and `berth explain` need them. Apart from writing because it is the
//! other direction on the same socket: requests and multi-part answers, no batches.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use nix::sys::socket::{setsockopt, sockopt};

use super::batch::{msg_type, NLMSG_ERROR};
use super::{io_error, NetlinkSocket};
use crate::error::Error;
use crate::nft::adopt::{observe_table, Observed, ObservedTables};
use crate::nft::dump::{set_msg, shard_of_message, RawTable};
use crate::nft::expr::nfproto;
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{CLUSTER_IP_SET, NODE_PORT_MAP, SERVICE_MAP};
use crate::nft::shard::{parse_table_name, table_name, Shard, MAIN};
use crate::nft::wire::{Attrs, Writer, NLMSG_HDRLEN, NLM_F_REQUEST};
use berth_core::IpFamily;

const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_GETTABLE: u16 = 1;
const NLMSG_DONE: u16 = 3;
const ENOENT: i32 = 2;

impl NetlinkSocket {
    /// One dump request; the attributes (after `nfgenmsg`) of every message it answers with.
    /// `Ok(None)` when the kernel says the object does not exist.
    fn dump(
        &mut self,
        kind: u16,
        family: IpFamily,
        attrs: impl FnOnce(&mut Writer),
    ) -> Result<Option<Vec<Vec<u8>>>, Error> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut w = Writer::default();
        let m = w.begin_message(
            msg_type(kind),
            NLM_F_REQUEST | crate::nft::wire::NLM_F_DUMP,
            seq,
            nfproto(family),
            0,
        );
        attrs(&mut w);
        w.end_message(m);
        setsockopt(
            &self.fd(),
            sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(30, 0),
        )
        .map_err(|e| io_error("set a receive timeout", e.into()))?;
        self.socket
            .send(w.bytes(), 0)
            .map_err(|e| io_error("send a dump request", e))?;
        let mut out = Vec::new();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 18);
        loop {
            buf.clear();
            self.socket
                .recv(&mut buf, 0)
                .map_err(|e| io_error("receive a dump", e))?;
            let mut at = 0;
            while at + NLMSG_HDRLEN <= buf.len() {
                let len =
                    u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
                let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                let msg_seq =
                    u32::from_ne_bytes([buf[at + 8], buf[at + 9], buf[at + 10], buf[at + 11]]);
                if len < NLMSG_HDRLEN || at + len > buf.len() {
                    break;
                }
                let body = &buf[at + NLMSG_HDRLEN..at + len];
                at += (len + 3) & !3;
                if msg_seq != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(Some(out)),
                    NLMSG_ERROR => {
                        let error = body
                            .get(..4)
                            .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        if error == 0 {
                            continue;
                        }
                        if -error == ENOENT {
                            return Ok(None);
                        }
                        return Err(Error::Netlink {
                            object: "a dump of berth's table".to_string(),
                            errno: -error,
                            message: io::Error::from_raw_os_error(-error).to_string(),
                        });
                    }
                    _ => out.push(body.get(4..).unwrap_or(&[]).to_vec()),
                }
            }
        }
    }

    /// The tables of berth's in `family` that exist (`base` and its shards `base-<n>`).
    pub fn tables(&mut self, family: IpFamily, base: &str) -> Result<BTreeSet<Shard>, Error> {
        let tables = self
            .dump(NFT_MSG_GETTABLE, family, |_| {})?
            .unwrap_or_default();
        Ok(tables
            .iter()
            .filter_map(|t| Attrs(t).get(1).and_then(|a| a.str()))
            .filter_map(|name| parse_table_name(base, name))
            .collect())
    }

    /// berth's tables of `family` (`base` and its shards) as the kernel holds them, as the
    /// dumps returned them: chains, rules, sets, and the elements of the maps and the hairpin
    /// set, each message naming its table. `None` when there is no main table. Tables of other
    /// names are never read.
    pub fn dump_table(&mut self, family: IpFamily, base: &str) -> Result<Option<RawTable>, Error> {
        let mut whole = RawTable::default();
        let found = self.dump_each(family, base, &mut |_, mut raw| {
            whole.chains.append(&mut raw.chains);
            whole.rules.append(&mut raw.rules);
            whole.sets.append(&mut raw.sets);
            whole.elements.append(&mut raw.elements);
            Ok(())
        })?;
        Ok(found.then_some(whole))
    }

    /// berth's tables of `family` one at a time, in shard order (the main one first): each
    /// table's messages are handed to `each` and let go before the next table is read, so a
    /// caller comparing table by table never holds the whole dump. `false`, having read no
    /// table, when there is no main table.
    pub fn dump_each(
        &mut self,
        family: IpFamily,
        base: &str,
        each: &mut dyn FnMut(Shard, RawTable) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        let tables = self.tables(family, base)?;
        if !tables.contains(&MAIN) {
            return Ok(false);
        }
        // The chain dump answers for all tables at once: read once, split by table.
        let mut chains: BTreeMap<Shard, Vec<Vec<u8>>> = BTreeMap::new();
        for chain in self
            .dump(NFT_MSG_GETCHAIN, family, |_| {})?
            .unwrap_or_default()
        {
            if let Some(shard) = shard_of_message(base, &chain).filter(|s| tables.contains(s)) {
                chains.entry(shard).or_default().push(chain);
            }
        }
        for shard in tables {
            let table = table_name(base, shard);
            let ours = |m: &Vec<u8>| Attrs(m).get(1).and_then(|a| a.str()) == Some(table.as_str());
            let mut raw = RawTable {
                chains: chains.remove(&shard).unwrap_or_default(),
                ..RawTable::default()
            };
            raw.rules = self
                .dump(NFT_MSG_GETRULE, family, |w| w.put_str(1, &table))?
                .unwrap_or_default();
            raw.sets = self
                .dump(NFT_MSG_GETSET, family, |w| w.put_str(1, &table))?
                .unwrap_or_default();
            raw.rules.retain(ours);
            raw.sets.retain(ours);
            let fixed: Vec<&str> = [SERVICE_MAP, NODE_PORT_MAP, HAIRPIN_SET, CLUSTER_IP_SET]
                .into_iter()
                .filter(|set| {
                    raw.sets
                        .iter()
                        .any(|m| set_msg(m).is_some_and(|s| s.name == *set))
                })
                .collect();
            for set in fixed {
                let messages = self
                    .dump(NFT_MSG_GETSETELEM, family, |w| {
                        w.put_str(1, &table);
                        w.put_str(2, set);
                    })?
                    .unwrap_or_default();
                raw.elements.extend(messages);
            }
            each(shard, raw)?;
        }
        Ok(true)
    }

    /// berth's tables of `family` one at a time as adoption compares them ([`observe_table`]),
    /// in shard order; `false` when there is no main table.
    pub fn read_each(
        &mut self,
        family: IpFamily,
        base: &str,
        each: &mut dyn FnMut(Shard, Observed) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        self.dump_each(family, base, &mut |shard, raw| {
            each(shard, observe_table(&raw))
        })
    }

    /// berth's tables of `family` as adoption compares them with the plan, all of them:
    /// [`NetlinkSocket::read_each`] collected (no dump of the whole held, nor split again).
    pub fn read_table(
        &mut self,
        family: IpFamily,
        base: &str,
    ) -> Result<Option<ObservedTables>, Error> {
        let mut tables = ObservedTables::new();
        let found = self.read_each(family, base, &mut |shard, observed| {
            tables.insert(shard, observed);
            Ok(())
        })?;
        Ok(found.then_some(tables))
    }
}
