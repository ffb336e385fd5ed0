//! The real [`Nft`]: one `nft -f -` per transaction, reading the whole text from an in-memory
//! file rendered before `nft` starts (see [`crate::exec`]), optionally inside a named network
//! namespace (`ip netns exec`).

use crate::backend::Payload;
use crate::error::Error;
use crate::exec::run_ok;
use crate::nft::render::Transaction;
use crate::nft::sync::Nft;

#[derive(Debug, Clone, Default)]
pub struct CommandNft {
    /// Named network namespace to run in; `None` is the agent's own.
    netns: Option<String>,
}

impl CommandNft {
    pub fn new() -> Self {
        CommandNft::default()
    }

    /// Runs `nft` inside the named network namespace.
    pub fn in_netns(name: impl Into<String>) -> Self {
        CommandNft {
            netns: Some(name.into()),
        }
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }
}

impl Nft for CommandNft {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        if tx.is_empty() {
            return Ok(());
        }
        self.apply_payload(tx)
    }
}

impl CommandNft {
    /// One `nft -f -` of any payload; `nft` starts only once the payload has been rendered whole,
    /// so a payload that fails while rendering (or an agent killed meanwhile) changes nothing.
    pub fn apply_payload(&mut self, payload: &dyn Payload) -> Result<(), Error> {
        let args = ["-f".to_string(), "-".to_string()];
        run_ok(self.netns.as_deref(), "nft", &args, Some(payload)).map(|_| ())
    }
}

/// A transaction that uses every kernel feature the backend needs (concatenated verdict maps and
/// sets, `th`, `fib`, `numgen`, `ct status`, dynamic timeout sets, fully-random masquerade) on a
/// scratch table, for `nft --check`: the kernel validates it and nothing is committed.
pub fn probe_text() -> String {
    [
        "add table ip berth-probe",
        "add chain ip berth-probe pre { type nat hook prerouting priority dstnat ; }",
        "add chain ip berth-probe post { type nat hook postrouting priority srcnat ; }",
        "add chain ip berth-probe svc",
        "add chain ip berth-probe masq",
        "add map ip berth-probe m { type ipv4_addr . inet_proto . inet_service : verdict ; }",
        "add set ip berth-probe s { type ipv4_addr ; flags dynamic,timeout ; timeout 10s ; }",
        "add set ip berth-probe h { type ipv4_addr . ipv4_addr ; }",
        "add rule ip berth-probe pre ip daddr . meta l4proto . th dport vmap @m",
        "add rule ip berth-probe pre fib daddr type local meta l4proto tcp th dport 30000 jump svc",
        "add rule ip berth-probe svc ip saddr @s numgen random mod 2 == 0 meta mark set meta mark | 0x4000",
        "add rule ip berth-probe svc numgen random mod 2 == 0 update @s { ip saddr } meta l4proto tcp dnat to 10.0.0.1:80",
        "add rule ip berth-probe masq meta mark set meta mark | 0x4000",
        "add rule ip berth-probe post ct status dnat ip saddr . ip daddr @h jump masq",
        "add rule ip berth-probe post meta mark & 0x4000 == 0x4000 masquerade fully-random",
        "add element ip berth-probe m { 10.0.0.2 . tcp . 80 : jump svc }",
        "add element ip berth-probe h { 10.0.0.1 . 10.0.0.1 }",
        "",
    ]
    .join("\n")
}

impl CommandNft {
    /// Whether `nft` runs here and the kernel accepts everything the backend programs: a
    /// `--check` of [`probe_text`], which changes nothing.
    pub fn usable(&self) -> bool {
        let args = ["--check".to_string(), "-f".to_string(), "-".to_string()];
        run_ok(self.netns.as_deref(), "nft", &args, Some(&probe_text())).is_ok()
    }
}
