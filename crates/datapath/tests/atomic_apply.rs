//! Nothing half-written reaches the kernel: a payload cut short — as one is when the agent is
//! SIGKILLed or OOM-killed while writing it — must leave the old ruleset in place, on both
//! backends, through the real `nft` and `iptables-restore` inside a network namespace, and on the
//! netlink writer, whose batch is built whole in memory and sent in one `send`: there a cut batch
//! can only be one the kernel refuses, which every prefix and byte cut of a real batch shows.
//!
//! Each test first shows the hazard is real: the same prefixes piped straight into the program
//! (as berth once streamed them) commit something for some cut points (`nft -f -` commits the
//! prefix it read; `iptables-restore` commits each table at its `COMMIT`). Then every line-boundary
//! prefix and a few hundred byte cuts go through berth's own apply path, and none may change the
//! kernel's ruleset. Root, iproute2, nft and iptables (skips with a message elsewhere, fails under
//! `CI=true`).
//!
//! Address plan: none; the namespace `berth-aa<pid>-<n>` has no interfaces, only tables.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use berth_core::IpFamily;
use berth_datapath::backend::Payload;
use berth_datapath::fake::MemoryNft;
use berth_datapath::iptables::CommandIptables;
use berth_datapath::iptables::Iptables;
use berth_datapath::iptables::{render, ChainSelection};
use berth_datapath::nft::netlink::{build_batch, NetlinkSocket};
use berth_datapath::nft::CommandNft;
use berth_datapath::nft::NftSyncer;
use berth_datapath::*;
use berth_testing::{require, Requirement};
use common::netns::Netns;
use common::*;

/// How many random byte cuts each test makes beside the line boundaries.
const RANDOM_CUTS: usize = 300;

impl Netns {
    /// Runs `program args` in the namespace with `stdin` piped in whole; whether it succeeded.
    fn run(&self, program: &str, args: &[&str], stdin: &[u8]) -> (bool, String) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.0, program])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

/// The payload an agent killed after `cut` bytes would have handed over: its first `cut` bytes
/// are written, then rendering stops with an error.
struct Killed<'a> {
    text: &'a [u8],
    cut: usize,
}

impl Payload for Killed<'_> {
    fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()> {
        out.write_all(&self.text[..self.cut])?;
        Err(std::io::Error::other("the agent was killed"))
    }
}

/// Every offset just after a newline, short of the whole text, and `RANDOM_CUTS` byte offsets
/// from a fixed-seed xorshift (printed on failure through the cut itself).
fn cut_points(text: &[u8]) -> (Vec<usize>, Vec<usize>) {
    let lines: Vec<usize> = text
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b == b'\n' && i + 1 < text.len())
        .map(|(i, _)| i + 1)
        .collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let random = (0..RANDOM_CUTS)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            1 + (state % (text.len() as u64 - 1)) as usize
        })
        .collect();
    (lines, random)
}

/// The full-sync transaction of `view` (table deleted and rebuilt inside it), as text.
fn full_transaction(view: &NodeView) -> String {
    let mut syncer = NftSyncer::new(MemoryNft::new(IpFamily::V4), IpFamily::V4);
    syncer
        .sync(&plan(view, &mk_options(Dispatch::Linear)))
        .unwrap();
    syncer.nft().transactions.last().cloned().unwrap()
}

/// A smaller, different state than the fixed set: what the node held before the sync.
fn old_view() -> NodeView {
    let mut view = mk_fixed_view();
    view.services.truncate(2);
    for svc in &mut view.services {
        svc.endpoints.edit(|eps| eps.truncate(1));
    }
    view
}

#[test]
fn no_prefix_of_an_nft_transaction_commits() {
    require!(Requirement::Netns, Requirement::Nft);
    let ns = Netns::new("aa", "1");
    let list = || ns.run("nft", &["list", "ruleset"], b"").1;
    let old_tx = full_transaction(&old_view());
    let new_tx = full_transaction(&mk_fixed_view());
    let put_back_old = || {
        let (ok, _) = ns.run("nft", &["-f", "-"], old_tx.as_bytes());
        assert!(ok, "the old transaction applies");
    };
    put_back_old();
    let old = list();
    assert!(old.contains("table ip berth"), "{old}");

    // The hazard: piped straight into `nft -f -`, some prefixes commit.
    let (lines, random) = cut_points(new_tx.as_bytes());
    let mut committed = Vec::new();
    for &cut in &lines {
        ns.run("nft", &["-f", "-"], &new_tx.as_bytes()[..cut]);
        if list() != old {
            committed.push(cut);
            put_back_old();
        }
    }
    assert!(
        !committed.is_empty(),
        "no prefix of the transaction commits when piped: this test shows nothing"
    );
    eprintln!(
        "nft: {} of {} line prefixes committed when piped straight in",
        committed.len(),
        lines.len()
    );

    // berth's path: none commits, whatever the cut.
    let mut nft = CommandNft::in_netns(&ns.0);
    for &cut in lines.iter().chain(&random) {
        let killed = Killed {
            text: new_tx.as_bytes(),
            cut,
        };
        assert!(nft.apply_payload(&killed).is_err());
        assert_eq!(list(), old, "cut at byte {cut} of {}", new_tx.len());
    }
    // And the whole transaction still applies.
    nft.apply_payload(&new_tx).unwrap();
    assert_ne!(list(), old);
}

/// The full-sync transaction of `view` as the netlink writer's batch.
fn full_batch(view: &NodeView) -> Vec<u8> {
    let mut keeper = NftSyncer::new(Keep::default(), IpFamily::V4);
    keeper
        .sync(&plan(view, &mk_options(Dispatch::Linear)))
        .unwrap();
    build_batch(keeper.nft().0.as_ref().unwrap(), "berth", 1000).bytes
}

/// An [`Nft`] that keeps the last transaction.
#[derive(Default)]
struct Keep(Option<berth_datapath::nft::Transaction>);

impl berth_datapath::nft::Nft for Keep {
    fn apply(&mut self, tx: &berth_datapath::nft::Transaction) -> Result<(), Error> {
        self.0 = Some(tx.clone());
        Ok(())
    }
}

/// Offsets of every message boundary of a batch, short of the whole.
fn message_boundaries(batch: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < batch.len() {
        let len = u32::from_ne_bytes(batch[at..at + 4].try_into().unwrap()) as usize;
        at += len;
        if at < batch.len() {
            out.push(at);
        }
    }
    out
}

#[test]
fn no_prefix_of_a_netlink_batch_commits() {
    require!(Requirement::Netns, Requirement::Nft);
    let ns = Netns::new("aa", "3");
    let list = || ns.run("nft", &["list", "ruleset"], b"").1;
    let old_tx = full_transaction(&old_view());
    let (ok, _) = ns.run("nft", &["-f", "-"], old_tx.as_bytes());
    assert!(ok, "the old transaction applies");
    let old = list();
    let batch = full_batch(&mk_fixed_view());
    let mut socket = NetlinkSocket::open(Some(&ns.0)).unwrap();
    let (_, random) = cut_points(&batch);
    let boundaries = message_boundaries(&batch);
    assert!(boundaries.len() > 50, "{}", boundaries.len());
    for &cut in boundaries.iter().chain(&random) {
        socket.send_raw(&batch[..cut]).unwrap();
        assert_eq!(list(), old, "cut at byte {cut} of {}", batch.len());
    }
    // And the whole batch applies, acknowledged without an error.
    let replies = socket.send_raw(&batch).unwrap();
    assert!(replies.iter().all(|r| r.error == 0), "{replies:?}");
    assert_ne!(list(), old);
    eprintln!(
        "netlink: {} message boundaries and {} byte cuts of a {}-byte batch committed nothing",
        boundaries.len(),
        random.len(),
        batch.len()
    );
}

#[test]
fn no_prefix_of_an_iptables_restore_commits() {
    require!(Requirement::Netns, Requirement::Iptables);
    let ns = Netns::new("aa", "2");
    let save = || {
        ["filter", "nat"]
            .iter()
            .map(|table| ns.run("iptables-save", &["-t", table], b"").1)
            .flat_map(|dump| {
                dump.lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| l.split(" [").next().unwrap_or(l).to_string())
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let options = mk_options(Dispatch::Tree);
    let old_payload = render(&plan(&old_view(), &options), &ChainSelection::all());
    let new_payload = render(&plan(&mk_fixed_view(), &options), &ChainSelection::all());
    assert!(new_payload.matches("COMMIT").count() >= 2, "{new_payload}");
    // Both tables emptied of every chain, then the old payload: the same state whatever a
    // landed prefix left behind.
    let reset_to_old = || {
        for table in ["filter", "nat"] {
            for flag in ["-F", "-X"] {
                ns.run("iptables", &["-w", "5", "-t", table, flag], b"");
            }
        }
        let (ok, _) = ns.run("iptables-restore", &["--noflush"], old_payload.as_bytes());
        assert!(ok, "the old payload restores");
    };
    reset_to_old();
    let old = save();

    // The hazard: piped straight in, a cut after the first table's COMMIT lands that table.
    let (lines, random) = cut_points(new_payload.as_bytes());
    let mut committed = 0;
    for &cut in &lines {
        ns.run(
            "iptables-restore",
            &["--noflush"],
            &new_payload.as_bytes()[..cut],
        );
        if save() != old {
            committed += 1;
            reset_to_old();
        }
    }
    assert!(
        committed > 0,
        "no prefix of the payload commits when piped: this test shows nothing"
    );
    eprintln!(
        "iptables-restore: {committed} of {} line prefixes committed when piped straight in",
        lines.len()
    );

    let mut ipt = CommandIptables::in_netns(IpFamily::V4, &ns.0);
    for &cut in lines.iter().chain(&random) {
        let killed = Killed {
            text: new_payload.as_bytes(),
            cut,
        };
        assert!(ipt.restore(&killed).is_err());
        assert_eq!(save(), old, "cut at byte {cut} of {}", new_payload.len());
    }
    ipt.restore(&new_payload).unwrap();
    assert_ne!(save(), old);
}
