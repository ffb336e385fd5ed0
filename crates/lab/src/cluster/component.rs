//! One process of the lab, as the plan describes it and the runner starts it.

use std::path::{Path, PathBuf};

/// One process of the lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    /// Runs inside this namespace (`ip netns exec`), else in the caller's.
    pub netns: Option<String>,
    /// The program, when it is not the `berth` binary (FRR's daemons).
    pub program: Option<String>,
    /// The program's arguments.
    pub args: Vec<String>,
    pub log: PathBuf,
}

impl Component {
    /// The full command line, `exe` being the `berth` binary.
    pub fn argv(&self, exe: &Path) -> Vec<String> {
        let mut argv = Vec::new();
        if let Some(ns) = &self.netns {
            argv.extend(["ip".into(), "netns".into(), "exec".into(), ns.clone()]);
        }
        argv.push(
            self.program
                .clone()
                .unwrap_or_else(|| exe.display().to_string()),
        );
        argv.extend(self.args.iter().cloned());
        argv
    }
}
