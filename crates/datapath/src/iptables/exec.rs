//! The real [`Iptables`]: `iptables-restore --noflush`, `iptables-save` and `iptables` for the
//! built-in jumps, for one family (`ip6tables*` for IPv6). Works with iptables-nft and -legacy.
//! [`CommandIptables::in_netns`] runs the same commands inside a named network namespace
//! (`ip netns exec`), which is how the lab programs its node namespaces.

use std::process::Output;

use crate::backend::Payload;
use crate::error::Error;
use crate::exec;
use crate::iptables::rule_text::{rule_args, split_words};
use crate::iptables::sync::Iptables;
use crate::plan::model::{ChainName, JumpRule, Table};
use berth_core::IpFamily;

/// Seconds to wait for the xtables lock held by another program.
const LOCK_WAIT_SECONDS: &str = "5";

/// Which iptables implementation runs the commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// `iptables`, whichever implementation the system's alternatives point at.
    #[default]
    System,
    /// `iptables-nft`: rules become nf_tables rules.
    Nft,
    /// `iptables-legacy`: the x_tables blob, replaced whole on every restore.
    Legacy,
}

impl Backend {
    fn suffix(self) -> &'static str {
        match self {
            Backend::System => "",
            Backend::Nft => "-nft",
            Backend::Legacy => "-legacy",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CommandIptables {
    backend: Backend,
    /// Whether the commands are iptables-nft, once asked.
    nft_based: Option<bool>,
    iptables: String,
    restore: String,
    save: String,
    /// Named network namespace to run in; `None` is the agent's own.
    netns: Option<String>,
}

impl CommandIptables {
    pub fn new(family: IpFamily) -> Self {
        CommandIptables::with_backend(family, Backend::System)
    }

    pub fn with_backend(family: IpFamily, backend: Backend) -> Self {
        let family_base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let base = format!("{family_base}{}", backend.suffix());
        CommandIptables {
            backend,
            nft_based: None,
            restore: format!("{base}-restore"),
            save: format!("{base}-save"),
            iptables: base,
            netns: None,
        }
    }

    /// Whether full restores start each table with a chain-less listing
    /// ([`crate::iptables::render::Rendered::listing_first`]); by default only on iptables-nft. `false`
    /// restores as kube-proxy does, for comparison.
    pub fn listing_first(mut self, listing: bool) -> Self {
        self.nft_based = Some(listing);
        self
    }

    /// Runs every command inside the named network namespace (`ip netns exec <name> ...`).
    pub fn in_netns(family: IpFamily, name: impl Into<String>) -> Self {
        CommandIptables::new(family).netns_named(name)
    }

    /// The same commands, run inside the named network namespace.
    pub fn netns_named(self, name: impl Into<String>) -> Self {
        CommandIptables {
            netns: Some(name.into()),
            ..self
        }
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// The program and arguments that run `program args` where this instance works.
    #[cfg(test)]
    fn command_line(&self, program: &str, args: &[String]) -> (String, Vec<String>) {
        exec::command_line(self.netns.as_deref(), program, args)
    }

    fn run(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<&dyn Payload>,
    ) -> Result<Output, Error> {
        exec::run(self.netns.as_deref(), program, args, stdin)
    }

    fn run_ok(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<&dyn Payload>,
    ) -> Result<Output, Error> {
        exec::run_ok(self.netns.as_deref(), program, args, stdin)
    }

    fn table_args(table: Table, rest: &[&str]) -> Vec<String> {
        let mut args = vec![
            "-w".to_string(),
            LOCK_WAIT_SECONDS.to_string(),
            "-t".into(),
            table.as_str().into(),
        ];
        args.extend(rest.iter().map(|s| s.to_string()));
        args
    }
}

/// Whether an `iptables-save -t filter` listing sets the `FORWARD` policy to DROP.
pub fn forward_policy_drops(filter_save: &str) -> bool {
    filter_save.lines().any(|line| {
        let mut words = line.split_whitespace();
        words.next() == Some(":FORWARD") && words.next() == Some("DROP")
    })
}

impl CommandIptables {
    /// Whether this iptables drops forwarded packets by policy; `false` when it cannot be read
    /// (no such tool: nothing of iptables can drop them either).
    pub fn forward_drops(&mut self) -> bool {
        self.save(Table::Filter)
            .is_ok_and(|listing| forward_policy_drops(&listing))
    }
}

impl Iptables for CommandIptables {
    fn restore(&mut self, payload: &dyn Payload) -> Result<(), Error> {
        let args = vec![
            "--noflush".to_string(),
            "-w".into(),
            LOCK_WAIT_SECONDS.into(),
        ];
        self.run_ok(&self.restore.clone(), &args, Some(payload))
            .map(|_| ())
    }

    fn save(&mut self, table: Table) -> Result<String, Error> {
        let args = vec!["-t".to_string(), table.as_str().to_string()];
        let output = self.run_ok(&self.save.clone(), &args, None)?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn ensure_chain(&mut self, table: Table, chain: &ChainName) -> Result<(), Error> {
        if self.chain_exists(table, chain)? {
            return Ok(());
        }
        self.run_ok(
            &self.iptables.clone(),
            &Self::table_args(table, &["-N", chain.as_str()]),
            None,
        )
        .map(|_| ())
    }

    fn chain_exists(&mut self, table: Table, chain: &ChainName) -> Result<bool, Error> {
        let output = self.run(
            &self.iptables.clone(),
            &Self::table_args(table, &["-S", chain.as_str()]),
            None,
        )?;
        Ok(output.status.success())
    }

    fn restore_lists_first(&mut self) -> bool {
        let backend = self.backend;
        *self.nft_based.get_or_insert_with(|| match backend {
            Backend::Nft => true,
            Backend::Legacy => false,
            // `iptables -V` prints "(nf_tables)" or "(legacy)".
            Backend::System => exec::run(None, "iptables", &["-V".to_string()], None)
                .map(|out| String::from_utf8_lossy(&out.stdout).contains("nf_tables"))
                .unwrap_or(false),
        })
    }

    fn ensure_jump(&mut self, jump: &JumpRule) -> Result<(), Error> {
        let rule = split_words(&rule_args(&jump.rule))?;
        let mut check = Self::table_args(jump.table, &["-C", jump.from.as_str()]);
        check.extend(rule.iter().cloned());
        if self
            .run(&self.iptables.clone(), &check, None)?
            .status
            .success()
        {
            return Ok(());
        }
        let mut insert = Self::table_args(jump.table, &["-I", jump.from.as_str(), "1"]);
        insert.extend(rule);
        self.run_ok(&self.iptables.clone(), &insert, None)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_forward_drop_policy_is_read_from_the_listing() {
        let docker = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:DOCKER - [0:0]\nCOMMIT\n";
        assert!(forward_policy_drops(docker));
        let open =
            "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j DROP\nCOMMIT\n";
        assert!(!forward_policy_drops(open));
        assert!(!forward_policy_drops(""));
    }

    #[test]
    fn runs_in_its_own_namespace_by_default() {
        let ipt = CommandIptables::new(IpFamily::V6);
        assert_eq!(ipt.netns(), None);
        let (program, args) = ipt.command_line("ip6tables-save", &strings(&["-t", "nat"]));
        assert_eq!(program, "ip6tables-save");
        assert_eq!(args, ["-t", "nat"]);
    }

    #[test]
    fn backends_name_their_programs() {
        let legacy = CommandIptables::with_backend(IpFamily::V4, Backend::Legacy);
        assert_eq!(
            (
                legacy.iptables.as_str(),
                legacy.restore.as_str(),
                legacy.save.as_str()
            ),
            (
                "iptables-legacy",
                "iptables-legacy-restore",
                "iptables-legacy-save"
            )
        );
        let nft = CommandIptables::with_backend(IpFamily::V6, Backend::Nft).netns_named("ns");
        assert_eq!(
            (
                nft.iptables.as_str(),
                nft.restore.as_str(),
                nft.save.as_str()
            ),
            (
                "ip6tables-nft",
                "ip6tables-nft-restore",
                "ip6tables-nft-save"
            )
        );
        assert_eq!(nft.netns(), Some("ns"));
        let system = CommandIptables::new(IpFamily::V4);
        assert_eq!(system.restore, "iptables-restore");
    }

    #[test]
    fn a_named_namespace_prefixes_ip_netns_exec() {
        let ipt = CommandIptables::in_netns(IpFamily::V4, "berth-t1-node1");
        assert_eq!(ipt.netns(), Some("berth-t1-node1"));
        let (program, args) = ipt.command_line(&ipt.restore, &strings(&["--noflush"]));
        assert_eq!(program, "ip");
        assert_eq!(
            args,
            [
                "netns",
                "exec",
                "berth-t1-node1",
                "iptables-restore",
                "--noflush"
            ]
        );
    }
}
