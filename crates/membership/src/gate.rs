//! What a datagram must show before any costly work (the HMAC, SWIM): the right size and
//! version, a source that is a known agent's advertised endpoint naming that agent as its
//! sender, and room in that source's budget. Pure: the caller passes the clock. A LAN
//! neighbour sending junk as fast as it can costs each agent a receive and a few comparisons
//! per datagram, and never reaches the task that runs SWIM's timers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::frame::{Refusal, MAGIC, MAX_DATAGRAM, MIN_DATAGRAM};

/// The agents datagrams may come from: advertised endpoint -> node name.
pub type Sources = Arc<HashMap<SocketAddr, String>>;

/// Datagrams a source may send per second, sustained. SWIM with the default timing sends a
/// peer a few datagrams per probe period (ping, ack, indirect probes, gossip): a few dozen a
/// second at most. The budget is ten times that, so only a flood reaches it.
pub const RATE_PER_SECOND: u32 = 500;
/// Datagrams a source may send at once before the rate applies.
pub const BURST: u32 = 500;

/// Token buckets per source, and the checks.
#[derive(Debug)]
pub struct Gate {
    rate: f64,
    burst: f64,
    buckets: HashMap<SocketAddr, Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new(RATE_PER_SECOND, BURST)
    }
}

impl Gate {
    pub fn new(rate_per_second: u32, burst: u32) -> Self {
        Gate {
            rate: f64::from(rate_per_second),
            burst: f64::from(burst.max(1)),
            buckets: HashMap::new(),
        }
    }

    /// Whether `datagram` from `from` may go on to authentication, given the known `sources`.
    pub fn admit(
        &mut self,
        datagram: &[u8],
        from: SocketAddr,
        sources: &HashMap<SocketAddr, String>,
        now: Instant,
    ) -> Result<(), Refusal> {
        if datagram.len() < MIN_DATAGRAM || datagram.len() > MAX_DATAGRAM {
            return Err(Refusal::Size);
        }
        if !datagram.starts_with(MAGIC) {
            return Err(Refusal::Version);
        }
        let Some(node) = sources.get(&from) else {
            return Err(Refusal::UnknownSource);
        };
        if sender_of(datagram) != Some(node.as_bytes()) {
            return Err(Refusal::UnknownSource);
        }
        // Sources that left are forgotten, so memory follows the cluster, not the senders.
        if self.buckets.len() > sources.len() * 2 + 16 {
            self.buckets.retain(|addr, _| sources.contains_key(addr));
        }
        let bucket = self.buckets.entry(from).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at);
        bucket.tokens = (bucket.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Err(Refusal::RateLimited);
        }
        bucket.tokens -= 1.0;
        Ok(())
    }

    /// How long until `from` has budget again (for tests and logs).
    pub fn refill_in(&self, from: SocketAddr) -> Duration {
        match self.buckets.get(&from) {
            Some(b) if b.tokens < 1.0 && self.rate > 0.0 => {
                Duration::from_secs_f64((1.0 - b.tokens) / self.rate)
            }
            _ => Duration::ZERO,
        }
    }
}

/// The sender name of an envelope, read without authenticating it.
fn sender_of(datagram: &[u8]) -> Option<&[u8]> {
    let rest = datagram.get(MAGIC.len()..)?;
    let (len, rest) = rest.split_first()?;
    rest.get(..usize::from(*len))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::frame::{seal, Key};

    fn key() -> Key {
        Key::new(b"0123456789abcdef0123456789abcdef").unwrap()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn sources() -> HashMap<SocketAddr, String> {
        HashMap::from([
            (addr("198.18.0.11:7947"), "node-1".to_string()),
            (addr("198.18.0.12:7947"), "node-2".to_string()),
        ])
    }

    fn from_node_2() -> Vec<u8> {
        seal(&key(), "node-2", "node-1", 1, b"payload")
    }

    #[test]
    fn what_cannot_be_genuine_is_dropped_with_its_reason() {
        let mut gate = Gate::default();
        let now = Instant::now();
        let known = sources();
        let node_2 = addr("198.18.0.12:7947");
        // (what, datagram, from, verdict)
        type Row = (&'static str, Vec<u8>, SocketAddr, Result<(), Refusal>);
        let rows: Vec<Row> = vec![
            ("genuine", from_node_2(), node_2, Ok(())),
            ("empty", Vec::new(), node_2, Err(Refusal::Size)),
            ("too short", b"BRM1xx".to_vec(), node_2, Err(Refusal::Size)),
            (
                "longer than any we send",
                vec![b'B'; MAX_DATAGRAM + 1],
                node_2,
                Err(Refusal::Size),
            ),
            (
                "another version",
                {
                    let mut d = from_node_2();
                    d[3] = b'2';
                    d
                },
                node_2,
                Err(Refusal::Version),
            ),
            (
                "random bytes",
                vec![0x5a; 200],
                node_2,
                Err(Refusal::Version),
            ),
            (
                "from no agent's endpoint",
                from_node_2(),
                addr("198.18.0.66:7947"),
                Err(Refusal::UnknownSource),
            ),
            (
                "an agent's address, another port",
                from_node_2(),
                addr("198.18.0.12:40000"),
                Err(Refusal::UnknownSource),
            ),
            (
                "naming a sender other than the agent at that address",
                seal(&key(), "node-3", "node-1", 1, b"x"),
                node_2,
                Err(Refusal::UnknownSource),
            ),
            (
                "a sender name that runs past the end",
                {
                    let mut d = b"BRM1".to_vec();
                    d.push(255);
                    d.extend_from_slice(&[b'n'; 60]);
                    d
                },
                node_2,
                Err(Refusal::UnknownSource),
            ),
        ];
        for (what, datagram, from, want) in rows {
            assert_eq!(gate.admit(&datagram, from, &known, now), want, "{what}");
        }
    }

    #[test]
    fn each_source_has_its_own_budget_refilled_over_time() {
        let mut gate = Gate::new(100, 10);
        let known = sources();
        let now = Instant::now();
        let node_2 = addr("198.18.0.12:7947");
        let node_1 = addr("198.18.0.11:7947");
        let genuine_1 = seal(&key(), "node-1", "node-2", 1, b"x");
        for _ in 0..10 {
            assert_eq!(gate.admit(&from_node_2(), node_2, &known, now), Ok(()));
        }
        assert_eq!(
            gate.admit(&from_node_2(), node_2, &known, now),
            Err(Refusal::RateLimited)
        );
        assert_eq!(gate.refill_in(node_2), Duration::from_millis(10));
        // Another source is not affected.
        assert_eq!(gate.admit(&genuine_1, node_1, &known, now), Ok(()));
        // 50 ms later, five more.
        let later = now + Duration::from_millis(50);
        for _ in 0..5 {
            assert_eq!(gate.admit(&from_node_2(), node_2, &known, later), Ok(()));
        }
        assert_eq!(
            gate.admit(&from_node_2(), node_2, &known, later),
            Err(Refusal::RateLimited)
        );
        // Never more than the burst, however long the pause.
        let much_later = now + Duration::from_secs(3600);
        for _ in 0..10 {
            assert_eq!(
                gate.admit(&from_node_2(), node_2, &known, much_later),
                Ok(())
            );
        }
        assert_eq!(
            gate.admit(&from_node_2(), node_2, &known, much_later),
            Err(Refusal::RateLimited)
        );
    }

    #[test]
    fn a_flood_from_unknown_sources_leaves_no_state() {
        let mut gate = Gate::default();
        let known = sources();
        let now = Instant::now();
        for i in 0..10_000u32 {
            let from =
                SocketAddr::from(([198, 18, 1, (i % 250) as u8], 1024 + (i % 60_000) as u16));
            assert_eq!(
                gate.admit(&from_node_2(), from, &known, now),
                Err(Refusal::UnknownSource)
            );
        }
        assert!(gate.buckets.is_empty());
    }
}
