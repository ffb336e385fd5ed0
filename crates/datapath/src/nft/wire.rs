//! Netlink attribute framing for the nftables batch: one growing buffer, messages and nested
//! attributes opened and closed in place, so a cold load of 100,000 rules is a single
//! allocation and no tree of owned attributes.
//!
//! Layouts (from the kernel's uapi `linux/netlink.h`, `linux/netfilter/nfnetlink.h`): a message
//! is a 16-byte `nlmsghdr` (length, type, flags, sequence, port id; host order) followed by the
//! 4-byte `nfgenmsg` (family, version, resource id in network order) and attributes. An
//! attribute is a 4-byte header (length including the header, type) and its value, padded to 4
//! bytes; a nested attribute carries `NLA_F_NESTED` in its type.

/// `NLA_F_NESTED`: the attribute's value is itself a list of attributes.
pub const NLA_F_NESTED: u16 = 1 << 15;
/// The netfilter subsystem of nftables (`NFNL_SUBSYS_NFTABLES`).
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN` / `NFNL_MSG_BATCH_END`.
pub const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub const NFNL_MSG_BATCH_END: u16 = 17;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;

pub const NLMSG_HDRLEN: usize = 16;

// Set flags (`NFT_SET_*`), data types and verdicts, as the batch writer declares sets and the
// decoder reads them back.
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_SET_OBJECT: u32 = 0x40;
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
/// nft's datatype numbers, six bits each in a concatenation's type.
pub const TYPE_IPV4_ADDR: u32 = 7;
pub const TYPE_IPV6_ADDR: u32 = 8;
pub const TYPE_INET_PROTO: u32 = 12;
pub const TYPE_INET_SERVICE: u32 = 13;
pub const NF_ACCEPT: u32 = 1;
const NFGENMSG_LEN: usize = 4;

/// The largest value one attribute can hold: its length is a `u16`.
pub const MAX_ATTR_VALUE: usize = u16::MAX as usize - 4;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A buffer of netlink messages under construction.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

/// Where an open message or nest starts; closing it writes its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an open message or nest must be closed"]
pub struct Mark(usize);

impl Writer {
    pub fn with_capacity(bytes: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(bytes),
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// Opens a netfilter message: `nlmsghdr` and `nfgenmsg` (version 0).
    pub fn begin_message(
        &mut self,
        kind: u16,
        flags: u16,
        seq: u32,
        family: u8,
        res_id: u16,
    ) -> Mark {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        debug_assert_eq!(self.buf.len() - start, NLMSG_HDRLEN + NFGENMSG_LEN);
        Mark(start)
    }

    /// Closes a message: writes its length.
    pub fn end_message(&mut self, mark: Mark) {
        let len = (self.buf.len() - mark.0) as u32;
        self.buf[mark.0..mark.0 + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Drops everything written since `mark` (a message that turned out to have no content).
    pub fn truncate(&mut self, mark: Mark) {
        self.buf.truncate(mark.0);
    }

    /// Sets `flag` in the header of the message that starts at byte `at`.
    pub fn or_flags(&mut self, at: usize, flag: u16) {
        let flags = u16::from_ne_bytes([self.buf[at + 6], self.buf[at + 7]]) | flag;
        self.buf[at + 6..at + 8].copy_from_slice(&flags.to_ne_bytes());
    }

    /// Keeps only the `nlmsghdr` of an open message (for messages without `nfgenmsg`).
    pub fn truncate_to_header(&mut self, mark: Mark) {
        self.buf.truncate(mark.0 + NLMSG_HDRLEN);
    }

    /// Raw bytes, as they are.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes written since `mark`.
    pub fn since(&self, mark: Mark) -> usize {
        self.buf.len() - mark.0
    }

    pub fn put(&mut self, kind: u16, value: &[u8]) {
        let len = 4 + value.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(self.buf.len() + align4(len) - len, 0);
    }

    /// A big-endian `u32`, as nftables attributes carry numbers.
    pub fn put_u32(&mut self, kind: u16, value: u32) {
        self.put(kind, &value.to_be_bytes());
    }

    pub fn put_u64(&mut self, kind: u16, value: u64) {
        self.put(kind, &value.to_be_bytes());
    }

    /// A NUL-terminated string.
    pub fn put_str(&mut self, kind: u16, value: &str) {
        let len = 4 + value.len() + 1;
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self.buf.resize(self.buf.len() + align4(len) - len, 0);
    }

    pub fn begin_nest(&mut self, kind: u16) -> Mark {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        Mark(start)
    }

    pub fn end_nest(&mut self, mark: Mark) {
        let len = (self.buf.len() - mark.0) as u16;
        self.buf[mark.0..mark.0 + 2].copy_from_slice(&len.to_ne_bytes());
    }
}

/// One attribute read from a buffer: its type (flags cleared) and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr<'a> {
    pub kind: u16,
    pub value: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn u32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.value.get(..4)?.try_into().ok()?))
    }

    pub fn u64(&self) -> Option<u64> {
        Some(u64::from_be_bytes(self.value.get(..8)?.try_into().ok()?))
    }

    pub fn str(&self) -> Option<&'a str> {
        let bytes = self.value.split(|b| *b == 0).next()?;
        std::str::from_utf8(bytes).ok()
    }

    pub fn nested(&self) -> Attrs<'a> {
        Attrs(self.value)
    }
}

/// The attributes of a buffer, in order; stops at the first malformed one.
#[derive(Debug, Clone, Copy)]
pub struct Attrs<'a>(pub &'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let header = self.0.get(..4)?;
        let len = u16::from_ne_bytes([header[0], header[1]]) as usize;
        let kind = u16::from_ne_bytes([header[2], header[3]]) & !(NLA_F_NESTED | 1 << 14);
        if len < 4 || len > self.0.len() {
            self.0 = &[];
            return None;
        }
        let value = &self.0[4..len];
        self.0 = self.0.get(align4(len)..).unwrap_or(&[]);
        Some(Attr { kind, value })
    }
}

impl<'a> Attrs<'a> {
    /// The first attribute of `kind`.
    pub fn get(self, kind: u16) -> Option<Attr<'a>> {
        self.into_iter().find(|a| a.kind == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nests_measured() {
        let mut w = Writer::default();
        let msg = w.begin_message(0x0a00, NLM_F_REQUEST, 7, 2, 0);
        w.put_str(1, "berth");
        let nest = w.begin_nest(4);
        w.put_u32(1, 2);
        w.put(2, &[6]);
        w.end_nest(nest);
        w.end_message(msg);
        let bytes = w.bytes();
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len()
        );
        assert_eq!(&bytes[16..20], &[2, 0, 0, 0]);
        let attrs: Vec<Attr> = Attrs(&bytes[20..]).collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].str(), Some("berth"));
        assert_eq!(attrs[0].value.len(), 6);
        let inner: Vec<Attr> = attrs[1].nested().collect();
        assert_eq!(inner[0].u32(), Some(2));
        assert_eq!(inner[1].value, &[6]);
    }

    #[test]
    fn a_truncated_buffer_ends_the_attributes() {
        let mut w = Writer::default();
        w.put_u32(1, 5);
        w.put_u32(2, 6);
        let bytes = &w.bytes()[..12];
        assert_eq!(Attrs(bytes).count(), 1);
        assert_eq!(Attrs(&[9, 0, 1]).count(), 0);
    }
}
