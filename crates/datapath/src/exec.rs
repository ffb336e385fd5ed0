//! The real [`Iptables`]: `iptables-restore --noflush`, `iptables-save` and `iptables` for the
//! built-in jumps, for one family (`ip6tables*` for IPv6). Works with iptables-nft and -legacy.

use std::io::{BufWriter, Write as _};
use std::process::{Command, Output, Stdio};

use crate::input::IpFamily;
use crate::model::{ChainName, JumpRule, Table};
use crate::render::Payload;
use crate::rule_text::{rule_args, split_words};
use crate::sync::Iptables;
use crate::Error;

/// Seconds to wait for the xtables lock held by another program.
const LOCK_WAIT_SECONDS: &str = "5";

#[derive(Debug, Clone)]
pub struct CommandIptables {
    iptables: String,
    restore: String,
    save: String,
}

impl CommandIptables {
    pub fn new(family: IpFamily) -> Self {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        CommandIptables {
            iptables: base.to_string(),
            restore: format!("{base}-restore"),
            save: format!("{base}-save"),
        }
    }

    fn run(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<&dyn Payload>,
    ) -> Result<Output, Error> {
        let command = format!("{program} {}", args.join(" "));
        let spawn_err = |source| Error::Spawn {
            command: command.clone(),
            source,
        };
        let mut child = Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        if let (Some(payload), Some(pipe)) = (stdin, child.stdin.take()) {
            // Streamed through a buffer: the payload is rendered as the restore reads it.
            let mut pipe = BufWriter::with_capacity(1 << 16, pipe);
            payload.write_to(&mut pipe).map_err(spawn_err)?;
            pipe.flush().map_err(spawn_err)?;
        }
        child.wait_with_output().map_err(spawn_err)
    }

    fn run_ok(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<&dyn Payload>,
    ) -> Result<Output, Error> {
        let output = self.run(program, args, stdin)?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(Error::Command {
                command: format!("{program} {}", args.join(" ")),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            })
        }
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
