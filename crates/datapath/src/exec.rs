//! Running the tools: a program (inside a named network namespace when asked) with a payload as
//! its whole input, staged in memory before it starts. The real backends
//! ([`crate::iptables::exec`], [`crate::nft::exec`]) run everything through here.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write as _};
use std::process::{Command, Output, Stdio};

use nix::sys::memfd::{memfd_create, MFdFlags};

use crate::backend::Payload;
use crate::error::Error;

/// The program and arguments that run `program args`, inside `netns` when one is named.
pub(crate) fn command_line(
    netns: Option<&str>,
    program: &str,
    args: &[String],
) -> (String, Vec<String>) {
    match netns {
        None => (program.to_string(), args.to_vec()),
        Some(ns) => {
            let mut full = vec![
                "netns".to_string(),
                "exec".into(),
                ns.to_string(),
                program.into(),
            ];
            full.extend(args.iter().cloned());
            ("ip".to_string(), full)
        }
    }
}

/// Runs a command with `stdin` as its whole input.
///
/// The payload is rendered completely into an anonymous in-memory file before the program
/// starts, and the program reads that file as its standard input. A pipe fed while rendering
/// would let a killed agent hand the program a prefix followed by end-of-file, and `nft -f -`
/// commits whatever prefix it got (a deleted table, a map without elements, `dnat to 1`). With
/// the file, either the agent dies before the program exists, or the program reads all of it.
pub(crate) fn run(
    netns: Option<&str>,
    program: &str,
    args: &[String],
    stdin: Option<&dyn Payload>,
) -> Result<Output, Error> {
    let (program, args) = command_line(netns, program, args);
    let command = format!("{program} {}", args.join(" "));
    let spawn_err = |source| Error::Spawn {
        command: command.clone(),
        source,
    };
    let input = match stdin {
        Some(payload) => Stdio::from(staged(payload).map_err(spawn_err)?),
        None => Stdio::null(),
    };
    // `wait_with_output` drains stdout and stderr together, so a program that answers as it
    // reads (iptables-restore listing a table for `-S`) never waits on a full pipe.
    Command::new(&program)
        .args(&args)
        .stdin(input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|child| child.wait_with_output())
        .map_err(spawn_err)
}

/// The whole payload in an anonymous in-memory file (`memfd_create`), positioned at its start.
/// Nothing names it: it is gone when the last holder closes it, whoever is killed when.
fn staged(payload: &dyn Payload) -> std::io::Result<File> {
    let fd = memfd_create("berth-payload", MFdFlags::MFD_CLOEXEC).map_err(std::io::Error::from)?;
    let mut file = File::from(fd);
    {
        let mut out = BufWriter::with_capacity(1 << 16, &mut file);
        payload.write_to(&mut out)?;
        out.flush()?;
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(file)
}

/// [`run`], failing unless the command exits successfully.
pub(crate) fn run_ok(
    netns: Option<&str>,
    program: &str,
    args: &[String],
    stdin: Option<&dyn Payload>,
) -> Result<Output, Error> {
    let output = run(netns, program, args, stdin)?;
    if output.status.success() {
        Ok(output)
    } else {
        let (program, args) = command_line(netns, program, args);
        Err(Error::Command {
            command: format!("{program} {}", args.join(" ")),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_answers_while_it_reads_does_not_deadlock() {
        // `cat` writes back what it reads, as iptables-restore does for `-S`: 4 MiB is far more
        // than a pipe holds, so output read only after the input would hang both sides.
        let payload = "berth\n".repeat(700_000);
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(run_ok(None, "cat", &[], Some(&payload)));
        });
        let output = finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("cat and berth wait for each other")
            .unwrap();
        assert_eq!(output.stdout.len(), 4_200_000);
    }
}
