//! The authenticated envelope around every membership datagram, and the replay guard.
//!
//! ```text
//! "BRM1" | sender len u8 | sender | recipient len u8 | recipient | stamp u64 BE | payload | tag
//! ```
//! `tag` is HMAC-SHA256 over everything before it, with the cluster's shared key. `stamp` is
//! the sender's clock in microseconds since the Unix epoch, made strictly increasing per
//! sender. A receiver accepts a datagram only when the tag verifies (constant time), it names
//! the receiver, its stamp lies within the clock window of the sender's clock as the receiver
//! reckons it (its own clock plus the sender's offset, [`crate::lease`]), and that
//! sender's stamp has not been accepted before. Without the key nothing can be forged; a
//! recorded datagram cannot be played to another node (recipient), later than the window
//! (stamp), or twice (seen stamps, kept for the window).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The envelope's first bytes: its format and version.
pub const MAGIC: &[u8; 4] = b"BRM1";
const TAG_LEN: usize = 32;
/// The shortest envelope: one-byte names and an empty payload.
pub const MIN_DATAGRAM: usize = MAGIC.len() + 2 + 2 + 8 + TAG_LEN;
/// The largest datagram sent or accepted: fits an Ethernet MTU with IP and UDP headers.
pub const MAX_DATAGRAM: usize = 1400;
/// The envelope's size with the longest names.
pub const MAX_OVERHEAD: usize = MAGIC.len() + 1 + 255 + 1 + 255 + 8 + TAG_LEN;
/// The shortest key accepted.
pub const MIN_KEY_LEN: usize = 16;
/// Stamps kept per sender, whatever the window: a bound on memory.
const MAX_SEEN_PER_SENDER: usize = 4096;

/// The shared secret. Leading and trailing ASCII whitespace of the file is not part of it (a
/// Secret written with `echo` ends with a newline).
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    pub fn new(bytes: &[u8]) -> Result<Key, String> {
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < MIN_KEY_LEN {
            return Err(format!(
                "{} bytes; at least {MIN_KEY_LEN} are needed",
                trimmed.len()
            ));
        }
        Ok(Key(trimmed.to_vec()))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable_mac(),
        }
    }
}

#[cold]
fn unreachable_mac() -> HmacSha256 {
    // Not reachable (see above); an all-zero key keeps this total without a panic.
    <HmacSha256 as Mac>::new(&Default::default())
}

/// Why a datagram was dropped; a bounded metric label. The first five are decided before any
/// costly work ([`crate::gate`]), the rest after the HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Shorter than the smallest envelope or longer than any agent sends.
    Size,
    /// Not this envelope format or version (no `BRM1`).
    Version,
    /// Not from a known agent's advertised endpoint, or naming another sender than that agent.
    UnknownSource,
    /// The source sent more than its budget per second.
    RateLimited,
    /// Admitted, but the queue to the membership task was full.
    Backlog,
    /// Too short, wrong magic, lengths that do not add up, names that are not UTF-8.
    Malformed,
    /// The tag does not verify: no key, a different key, or altered bytes.
    BadTag,
    /// Authentic, but addressed to another node.
    WrongRecipient,
    /// Authentic, but its stamp is outside the clock window.
    Stale,
    /// Authentic, but this sender's stamp was already accepted.
    Replayed,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Size => "size",
            Refusal::Version => "version",
            Refusal::UnknownSource => "unknown_source",
            Refusal::RateLimited => "rate_limited",
            Refusal::Backlog => "backlog",
            Refusal::Malformed => "malformed",
            Refusal::BadTag => "bad_tag",
            Refusal::WrongRecipient => "wrong_recipient",
            Refusal::Stale => "stale",
            Refusal::Replayed => "replayed",
        }
    }

    pub const ALL: [Refusal; 10] = [
        Refusal::Size,
        Refusal::Version,
        Refusal::UnknownSource,
        Refusal::RateLimited,
        Refusal::Backlog,
        Refusal::Malformed,
        Refusal::BadTag,
        Refusal::WrongRecipient,
        Refusal::Stale,
        Refusal::Replayed,
    ];
}

/// A datagram whose tag verified.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    pub sender: &'a str,
    pub recipient: &'a str,
    pub stamp: u64,
    pub payload: &'a [u8],
}

/// The envelope for `payload` from `sender` to `recipient`. Names longer than 255 bytes are
/// cut by the caller's validation (Node names are at most 253).
pub fn seal(key: &Key, sender: &str, recipient: &str, stamp: u64, payload: &[u8]) -> Vec<u8> {
    let sender = &sender.as_bytes()[..sender.len().min(255)];
    let recipient = &recipient.as_bytes()[..recipient.len().min(255)];
    let mut out = Vec::with_capacity(
        MAGIC.len() + 2 + sender.len() + recipient.len() + 8 + payload.len() + TAG_LEN,
    );
    out.extend_from_slice(MAGIC);
    out.push(sender.len() as u8);
    out.extend_from_slice(sender);
    out.push(recipient.len() as u8);
    out.extend_from_slice(recipient);
    out.extend_from_slice(&stamp.to_be_bytes());
    out.extend_from_slice(payload);
    let mut mac = key.mac();
    mac.update(&out);
    out.extend_from_slice(&mac.finalize().into_bytes());
    out
}

/// Checks the envelope and the tag; freshness and replay are [`ReplayGuard`]'s.
pub fn open<'a>(key: &Key, datagram: &'a [u8]) -> Result<Opened<'a>, Refusal> {
    if datagram.len() > MAX_DATAGRAM || datagram.len() < MAGIC.len() + 2 + 8 + TAG_LEN {
        return Err(Refusal::Malformed);
    }
    let (body, tag) = datagram.split_at(datagram.len() - TAG_LEN);
    let mut mac = key.mac();
    mac.update(body);
    // `verify_slice` compares in constant time.
    mac.verify_slice(tag).map_err(|_| Refusal::BadTag)?;
    let rest = body
        .strip_prefix(MAGIC.as_slice())
        .ok_or(Refusal::Malformed)?;
    let (sender, rest) = take_name(rest)?;
    let (recipient, rest) = take_name(rest)?;
    let (stamp, payload) = rest.split_first_chunk::<8>().ok_or(Refusal::Malformed)?;
    Ok(Opened {
        sender,
        recipient,
        stamp: u64::from_be_bytes(*stamp),
        payload,
    })
}

fn take_name(bytes: &[u8]) -> Result<(&str, &[u8]), Refusal> {
    let (len, rest) = bytes.split_first().ok_or(Refusal::Malformed)?;
    let len = usize::from(*len);
    if rest.len() < len || len == 0 {
        return Err(Refusal::Malformed);
    }
    let (name, rest) = rest.split_at(len);
    let name = std::str::from_utf8(name).map_err(|_| Refusal::Malformed)?;
    Ok((name, rest))
}

/// Stamps for outgoing datagrams: the clock in microseconds, but never twice the same and never
/// going back, so a receiver can tell a replay from a new message.
#[derive(Debug, Default)]
pub struct Stamper {
    last: u64,
}

impl Stamper {
    pub fn next(&mut self, now_micros: u64) -> u64 {
        self.last = now_micros.max(self.last.saturating_add(1));
        self.last
    }
}

/// Remembers, per sender, the stamps accepted within the clock window.
#[derive(Debug)]
pub struct ReplayGuard {
    window_micros: u64,
    seen: HashMap<String, SenderStamps>,
}

#[derive(Debug, Default)]
struct SenderStamps {
    /// Stamps at or below this were forgotten to bound memory: refused as replays.
    floor: u64,
    seen: BTreeSet<u64>,
}

impl ReplayGuard {
    pub fn new(window: Duration) -> Self {
        ReplayGuard {
            window_micros: u64::try_from(window.as_micros()).unwrap_or(u64::MAX),
            seen: HashMap::new(),
        }
    }

    /// Accepts `stamp` from `sender` once, if it is within the window of `now_micros`.
    pub fn admit(&mut self, sender: &str, stamp: u64, now_micros: u64) -> Result<(), Refusal> {
        if stamp.abs_diff(now_micros) > self.window_micros {
            return Err(Refusal::Stale);
        }
        let oldest = now_micros.saturating_sub(self.window_micros);
        let stamps = self.seen.entry(sender.to_string()).or_default();
        // Stamps older than the window are refused as stale anyway: forget them.
        while stamps.seen.first().is_some_and(|s| *s < oldest) {
            stamps.seen.pop_first();
        }
        if stamp <= stamps.floor || !stamps.seen.insert(stamp) {
            return Err(Refusal::Replayed);
        }
        if stamps.seen.len() > MAX_SEEN_PER_SENDER {
            // Only a key holder can get here. Forgetting the oldest keeps memory bounded;
            // the floor keeps it refused.
            if let Some(forgotten) = stamps.seen.pop_first() {
                stamps.floor = stamps.floor.max(forgotten);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key() -> Key {
        Key::new(b"0123456789abcdef0123456789abcdef\n").unwrap()
    }

    #[test]
    fn a_sealed_datagram_opens_to_what_was_sealed() {
        let datagram = seal(&key(), "node-a", "node-b", 42, b"swim");
        assert_eq!(
            open(&key(), &datagram).unwrap(),
            Opened {
                sender: "node-a",
                recipient: "node-b",
                stamp: 42,
                payload: b"swim",
            }
        );
        // An empty payload is fine too.
        let empty = seal(&key(), "a", "b", 1, b"");
        assert_eq!(open(&key(), &empty).unwrap().payload, b"");
    }

    #[test]
    fn keys_ignore_surrounding_whitespace_and_must_be_long_enough() {
        let a = seal(&key(), "a", "b", 1, b"x");
        let same = Key::new(b"  0123456789abcdef0123456789abcdef").unwrap();
        assert!(open(&same, &a).is_ok());
        assert!(Key::new(b"0123456789abcde\n").is_err());
        assert!(Key::new(b"0123456789abcdef").is_ok());
        assert_eq!(format!("{:?}", key()), "Key(..)");
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let datagram = seal(&key(), "node-a", "node-b", 7, b"payload");
        for byte in 0..datagram.len() {
            for bit in 0..8 {
                let mut forged = datagram.clone();
                forged[byte] ^= 1 << bit;
                assert_eq!(
                    open(&key(), &forged),
                    Err(Refusal::BadTag),
                    "byte {byte} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn another_key_unsigned_and_truncated_datagrams_are_refused() {
        let other = Key::new(b"another key of thirty-two bytes!").unwrap();
        let datagram = seal(&other, "node-a", "node-b", 7, b"payload");
        assert_eq!(open(&key(), &datagram), Err(Refusal::BadTag));
        // A bare payload (what an unauthenticated sender would send).
        assert_eq!(open(&key(), &[0u8; 60]), Err(Refusal::BadTag));
        assert_eq!(open(&key(), b"short"), Err(Refusal::Malformed));
        assert_eq!(
            open(&key(), &vec![0u8; MAX_DATAGRAM + 1]),
            Err(Refusal::Malformed)
        );
        let good = seal(&key(), "node-a", "node-b", 7, b"payload");
        assert_eq!(open(&key(), &good[..good.len() - 1]), Err(Refusal::BadTag));
    }

    #[test]
    fn a_tagged_body_with_bad_lengths_is_malformed() {
        // Correctly tagged (a key holder's bug), but the sender length runs past the end.
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&[200, b'a']);
        body.extend_from_slice(&[0u8; 8]);
        let mut mac = key().mac();
        mac.update(&body);
        body.extend_from_slice(&mac.finalize().into_bytes());
        assert_eq!(open(&key(), &body), Err(Refusal::Malformed));
    }

    #[test]
    fn stamps_never_repeat_nor_go_back() {
        let mut stamper = Stamper::default();
        assert_eq!(stamper.next(100), 100);
        assert_eq!(stamper.next(100), 101);
        assert_eq!(stamper.next(50), 102);
        assert_eq!(stamper.next(500), 500);
    }

    #[test]
    fn the_guard_admits_each_fresh_stamp_once_in_any_order() {
        let mut guard = ReplayGuard::new(Duration::from_secs(5));
        let now = 1_000_000_000;
        assert_eq!(guard.admit("a", now, now), Ok(()));
        assert_eq!(guard.admit("a", now, now), Err(Refusal::Replayed));
        // Reordered datagrams are fine; another sender has its own stamps.
        assert_eq!(guard.admit("a", now - 10, now), Ok(()));
        assert_eq!(guard.admit("b", now, now), Ok(()));
        // Outside the window either way.
        assert_eq!(guard.admit("a", now - 5_000_001, now), Err(Refusal::Stale));
        assert_eq!(guard.admit("a", now + 5_000_001, now), Err(Refusal::Stale));
        // Within the window of a later clock, an old stamp is still remembered...
        assert_eq!(
            guard.admit("a", now, now + 4_000_000),
            Err(Refusal::Replayed)
        );
        // ...and once it has left the window it is stale, not forgotten-and-admitted.
        assert_eq!(guard.admit("a", now, now + 6_000_000), Err(Refusal::Stale));
    }

    #[test]
    fn the_guard_keeps_bounded_memory() {
        let mut guard = ReplayGuard::new(Duration::from_secs(3600));
        let now = 10_000_000_000;
        let count = MAX_SEEN_PER_SENDER as u64 + 10;
        for i in 0..count {
            assert_eq!(guard.admit("a", now - count + i, now), Ok(()));
        }
        assert_eq!(guard.seen["a"].seen.len(), MAX_SEEN_PER_SENDER);
        // The forgotten stamps are still refused, and so is anything older.
        assert_eq!(guard.admit("a", now - count, now), Err(Refusal::Replayed));
        assert_eq!(
            guard.admit("a", now - count - 1, now),
            Err(Refusal::Replayed)
        );
    }
}
