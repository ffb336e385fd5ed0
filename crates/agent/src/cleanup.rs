//! `berth agent --cleanup`, as kube-proxy's `--cleanup`: removes everything berth programs on
//! the node it runs on, and nothing else — the nftables tables `ip berth` and `ip6 berth`, and
//! every `BERTH-*` chain with the jumps into it, in each iptables table, for both families and
//! both iptables implementations (legacy x_tables and nf_tables). A tool that is not installed
//! has nothing of berth's to remove.
//!
//! Legacy tables are read only where the kernel already has them (`/proc/net/ip_tables_names`):
//! `iptables-legacy-save -t nat` would load the module and create an empty table otherwise.

use berth_core::IpFamily;
use berth_datapath::iptables::sync::removal_payload;
use berth_datapath::iptables::{Backend, CommandIptables, Iptables};
use berth_datapath::nft::{remove_table, CommandNft, Nft};
use berth_datapath::Table;

/// What one step of the cleanup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupStep {
    /// `nftables ip`, `iptables-legacy nat`, ...
    pub what: String,
    pub outcome: Result<bool, String>,
}

impl std::fmt::Display for CleanupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Ok(true) => write!(f, "{}: berth's rules removed", self.what),
            Ok(false) => write!(f, "{}: nothing of berth's", self.what),
            Err(e) => write!(f, "{}: failed: {e}", self.what),
        }
    }
}

fn absent_tool(err: &berth_datapath::Error) -> bool {
    matches!(err, berth_datapath::Error::Spawn { source, .. }
        if source.kind() == std::io::ErrorKind::NotFound)
}

/// Tables the legacy x_tables of `family` have in this network namespace.
fn legacy_tables(family: IpFamily) -> Vec<Table> {
    let path = match family {
        IpFamily::V4 => "/proc/net/ip_tables_names",
        IpFamily::V6 => "/proc/net/ip6_tables_names",
    };
    let names = std::fs::read_to_string(path).unwrap_or_default();
    Table::ALL
        .into_iter()
        .filter(|t| names.lines().any(|n| n.trim() == t.as_str()))
        .collect()
}

/// Removes berth's chains and jumps from `tables` of one iptables; whether anything was there.
fn clean_iptables(
    iptables: &mut dyn Iptables,
    tables: &[Table],
) -> Result<bool, berth_datapath::Error> {
    let mut changed = false;
    for table in tables {
        let payload = removal_payload(*table, &iptables.save(*table)?);
        if !payload.is_empty() {
            iptables.restore(&payload)?;
            changed = true;
        }
    }
    Ok(changed)
}

/// Runs every step in this process's network namespace, each whatever the others did.
pub fn cleanup_node() -> Vec<CleanupStep> {
    let mut steps = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        let what = format!(
            "nftables table {} berth",
            match family {
                IpFamily::V4 => "ip",
                IpFamily::V6 => "ip6",
            }
        );
        // Adding then deleting the table removes it whether or not it exists, in one
        // transaction; nothing else in nftables is named.
        let outcome = match CommandNft::new().apply(&remove_table(family)) {
            Ok(()) => Ok(true),
            Err(e) if absent_tool(&e) => Ok(false),
            Err(e) => Err(e.to_string()),
        };
        steps.push(CleanupStep { what, outcome });
    }
    for backend in [Backend::Legacy, Backend::Nft] {
        for family in [IpFamily::V4, IpFamily::V6] {
            let tables = match backend {
                Backend::Legacy => legacy_tables(family),
                _ => Table::ALL.to_vec(),
            };
            let mut iptables = CommandIptables::with_backend(family, backend);
            let what = format!("{} ({backend:?})", family_tool(family));
            let outcome = match clean_iptables(&mut iptables, &tables) {
                Ok(changed) => Ok(changed),
                Err(e) if absent_tool(&e) => Ok(false),
                Err(e) => Err(e.to_string()),
            };
            steps.push(CleanupStep { what, outcome });
        }
    }
    steps
}

fn family_tool(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    }
}
