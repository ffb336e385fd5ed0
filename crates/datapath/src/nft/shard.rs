//! nat sharding: which of berth's nftables tables holds a chain, set or map element.
//!
//! The kernel validates a transaction that adds a jump, a verdict-map element, a NAT or a reject
//! rule by walking every chain of each *table* the transaction touches: at 10,000 Services one
//! table costs 60–70 ms per change, whatever the change. So with K shards (`--nft-shards`) the
//! chains of each Service port (`BERTH-SVC/SVL/EXT/FW-<hash>`, the endpoint chains and affinity
//! sets they use) live in one of K tables `berth-1` … `berth-K`, chosen from the port's hash
//! (stateless: the same Service lands in the same shard after a restart), and a change to one
//! Service validates 1/K of the Service chains. The main table `berth` keeps everything else:
//! filter chains, nat postrouting and masquerade, the hairpin and `cluster-ips` sets.
//!
//! Each shard carries its own dispatch: `service-ips` and `node-ports` verdict maps holding its
//! Services' elements, a copy of the mark chain its Service chains jump to, and nat base chains —
//! the Service-address lookup at the planned priorities (prerouting `dstnat`, output -100), the
//! node-port lookup one later ([`NODE_PORT_PRIORITY`]). The kernel runs every nat base chain of a
//! hook inside the one NAT hook, in priority order, and stops once a chain bound a translation,
//! so a Service address in any shard still wins over a node port in another, as `service-ips`
//! came before the node-port jump in the single table. With K = 1 the layout is the single
//! table of before, unchanged.

use crate::error::Error;
use crate::plan::model::{ChainName, Table};
use crate::plan::names;

/// A table of berth's in one family: 0 is the main table, 1..=K the shards.
pub type Shard = u16;

/// The main table.
pub const MAIN: Shard = 0;
/// The most shards berth programs.
pub const MAX_SHARDS: u16 = 256;
/// The agent's default count (`--nft-shards`), chosen by measurement (docs/benchmarks.md, "nat
/// shards").
pub const DEFAULT_SHARDS: u16 = 32;
/// The priority of a shard's node-port base chains: right after the Service-address lookup of
/// every shard (`dstnat` = -100 in prerouting, -100 in output).
pub const NODE_PORT_PRIORITY: &str = "-99";
/// A shard's chain holding the planned jumps to node-port dispatch (the tail of
/// `BERTH-SERVICES`), run from the node-port base chains.
pub const NODE_PORT_JUMPS: &str = "BERTH-NODEPORT-JUMPS";

/// A shard's node-port base chain of the built-in chain `from` (`BERTH-NODEPORTS-PREROUTING`).
pub fn node_port_base(from: &ChainName) -> ChainName {
    ChainName::new(format!("BERTH-NODEPORTS-{from}"))
}

/// How many nat shards berth spreads Service chains over (1: one table, no shards).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shards(u16);

impl Default for Shards {
    fn default() -> Self {
        Shards(1)
    }
}

/// Where a planned chain lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// In one table.
    In(Shard),
    /// A Service port's endpoint chain: with its Service port's chains, wherever they are.
    WithUser,
    /// The mark chain: in the main table and copied into every shard.
    Everywhere,
    /// `BERTH-SERVICES` / `BERTH-NODEPORTS` of nat when sharded: split over the shards'
    /// dispatch chains.
    Dispatch,
}

impl Shards {
    /// `count` shards; 1 to [`MAX_SHARDS`].
    pub fn new(count: u16) -> Result<Self, Error> {
        if (1..=MAX_SHARDS).contains(&count) {
            Ok(Shards(count))
        } else {
            Err(Error::InvalidInput {
                object: "nft-shards".to_string(),
                field: "count".to_string(),
                value: format!("{count}: must be 1 to {MAX_SHARDS}"),
            })
        }
    }

    pub fn count(self) -> u16 {
        self.0
    }

    pub fn is_sharded(self) -> bool {
        self.0 > 1
    }

    /// The shard tables (none when not sharded).
    pub fn shards(self) -> impl Iterator<Item = Shard> {
        let last = if self.is_sharded() { self.0 } else { 0 };
        1..=last
    }

    /// The shard of a Service port, from the hash its chains share (base32 of a sha256 prefix:
    /// already uniform, so its leading digits taken as a number spread Services evenly).
    pub fn of_service_port(self, hash: &str) -> Shard {
        if !self.is_sharded() {
            return MAIN;
        }
        let value = hash.bytes().take(12).fold(0u64, |acc, b| {
            let digit = match b {
                b'A'..=b'Z' => b - b'A',
                b'2'..=b'7' => b - b'2' + 26,
                other => other % 32,
            };
            acc * 32 + u64::from(digit)
        });
        // Below MAX_SHARDS, so the cast keeps the value.
        1 + (value % u64::from(self.0)) as u16
    }

    /// Where a planned chain of `table` lives.
    pub fn place(self, table: Table, chain: &ChainName) -> Placement {
        if !self.is_sharded() || table != Table::Nat {
            return Placement::In(MAIN);
        }
        let name = chain.as_str();
        if let Some(hash) = service_port_hash(name) {
            return Placement::In(self.of_service_port(hash));
        }
        if name.starts_with(names::ENDPOINT_CHAIN_PREFIX) {
            return Placement::WithUser;
        }
        match name {
            names::MARK_MASQ => Placement::Everywhere,
            names::SERVICES | names::NODEPORTS => Placement::Dispatch,
            _ => Placement::In(MAIN),
        }
    }
}

/// The hash of a Service port's own chain (`BERTH-SVC-`, `-SVL-`, `-EXT-`, `-FW-`).
pub fn service_port_hash(name: &str) -> Option<&str> {
    ["BERTH-SVC-", "BERTH-SVL-", "BERTH-EXT-", "BERTH-FW-"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .filter(|hash| !hash.is_empty())
}

/// The hook of a shard's node-port base chain (`BERTH-NODEPORTS-PREROUTING` → `prerouting`).
pub fn node_port_hook(name: &ChainName) -> Option<&'static str> {
    match name.as_str().strip_prefix("BERTH-NODEPORTS-")? {
        "PREROUTING" => Some("prerouting"),
        "OUTPUT" => Some("output"),
        _ => None,
    }
}

/// The name of a table of berth's: `base` for the main table, `base-<n>` for shard n.
pub fn table_name(base: &str, shard: Shard) -> String {
    if shard == MAIN {
        base.to_string()
    } else {
        format!("{base}-{shard}")
    }
}

/// The shard a table name of berth's stands for: `Some(0)` for `base`, `Some(n)` for
/// `base-<n>` (n ≥ 1, no leading zero); `None` for any other table (never touched).
pub fn parse_table_name(base: &str, name: &str) -> Option<Shard> {
    if name == base {
        return Some(MAIN);
    }
    let digits = name.strip_prefix(base)?.strip_prefix('-')?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<Shard>().ok().filter(|n| *n >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(name: &str) -> ChainName {
        ChainName::new(name)
    }

    #[test]
    fn counts_outside_one_to_the_maximum_are_refused() {
        assert!(Shards::new(0).is_err());
        assert!(Shards::new(MAX_SHARDS + 1).is_err());
        assert_eq!(Shards::new(1).unwrap().shards().count(), 0);
        assert_eq!(
            Shards::new(16).unwrap().shards().collect::<Vec<_>>(),
            (1..=16).collect::<Vec<_>>()
        );
    }

    #[test]
    fn unsharded_everything_is_in_the_main_table() {
        let one = Shards::default();
        for name in [
            "BERTH-SVC-ABC",
            "BERTH-SEP-X",
            "BERTH-MARK-MASQ",
            "BERTH-SERVICES",
        ] {
            assert_eq!(one.place(Table::Nat, &chain(name)), Placement::In(MAIN));
        }
    }

    #[test]
    fn a_service_ports_chains_share_a_shard_and_filter_stays_main() {
        let k = Shards::new(16).unwrap();
        let hash = "SOX67RRJJH7SC6LM";
        let shard = k.of_service_port(hash);
        assert!((1..=16).contains(&shard));
        for prefix in ["BERTH-SVC-", "BERTH-SVL-", "BERTH-EXT-", "BERTH-FW-"] {
            let name = chain(&format!("{prefix}{hash}"));
            assert_eq!(k.place(Table::Nat, &name), Placement::In(shard));
            assert_eq!(k.place(Table::Filter, &name), Placement::In(MAIN));
        }
        assert_eq!(
            k.place(Table::Nat, &chain("BERTH-SEP-7IH2HK7NV54MFXL7")),
            Placement::WithUser
        );
        assert_eq!(
            k.place(Table::Nat, &chain(names::MARK_MASQ)),
            Placement::Everywhere
        );
        for dispatch in [names::SERVICES, names::NODEPORTS] {
            assert_eq!(k.place(Table::Nat, &chain(dispatch)), Placement::Dispatch);
            assert_eq!(
                k.place(Table::Filter, &chain(dispatch)),
                Placement::In(MAIN)
            );
        }
        for main in [
            names::POSTROUTING,
            "POSTROUTING",
            "BERTH-SVC-",
            "BERTH-DST-X",
        ] {
            assert_eq!(k.place(Table::Nat, &chain(main)), Placement::In(MAIN));
        }
    }

    #[test]
    fn service_ports_spread_over_every_shard_evenly() {
        let k = Shards::new(16).unwrap();
        let mut counts = [0usize; 17];
        for i in 0..16_000 {
            counts[usize::from(k.of_service_port(&names::hash16(&format!("ns/svc{i}:p80tcp"))))] +=
                1;
        }
        assert_eq!(counts[0], 0);
        // 1,000 expected per shard.
        assert!(
            counts[1..].iter().all(|n| (850..1150).contains(n)),
            "{counts:?}"
        );
    }

    #[test]
    fn the_shard_is_stable_across_counts_of_one_value() {
        let a = Shards::new(32).unwrap();
        let b = Shards::new(32).unwrap();
        assert_eq!(
            a.of_service_port("ABCDEFGH23456777"),
            b.of_service_port("ABCDEFGH23456777")
        );
    }

    #[test]
    fn table_names_round_trip_and_others_are_not_berths() {
        for shard in [0, 1, 16, 256] {
            assert_eq!(
                parse_table_name("berth", &table_name("berth", shard)),
                Some(shard)
            );
        }
        for other in [
            "berth-probe",
            "berth-0",
            "berth-01",
            "berth-",
            "berthx",
            "kube-proxy",
            "berth-1a",
        ] {
            assert_eq!(parse_table_name("berth", other), None, "{other}");
        }
    }
}
