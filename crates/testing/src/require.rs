//! What a test needs from the machine (root, network namespaces, iptables, kubectl, ...) and what
//! happens when it is missing.
//!
//! Where the run is strict (`CI=true`, or `BERTH_REQUIRE_ROOT=1` for anyone), a missing requirement
//! fails the test with the reason: CI runs as root with every tool installed, so a skip there would
//! hide a broken machine or a broken test. Elsewhere the test skips, and says so on the process's
//! real stderr with a line `berth-test: SKIPPED <test>: <reason>` that libtest's output capture
//! does not swallow; `make test` counts those lines and lists their reasons.
//!
//! ```no_run
//! use berth_testing::Requirement;
//!
//! fn real_iptables() {
//!     berth_testing::require!(Requirement::Root, Requirement::Iptables);
//!     // ... runs only where both are there
//! }
//! # real_iptables();
//! ```

use std::io::Write;
use std::path::Path;

/// The marker `make test` looks for; a line carries one skipped test and its reason.
pub const SKIP_MARKER: &str = "berth-test: SKIPPED";

/// What a test that programs real iptables inside namespaces needs.
pub const DATAPATH_NEEDS: &[Requirement] = &[
    Requirement::Netns,
    Requirement::Program("sysctl"),
    Requirement::Iptables,
];

/// One thing a test needs from the machine it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// Effective uid 0.
    Root,
    /// Root, iproute2 and the kernel's network namespaces.
    Netns,
    /// `iptables`, `iptables-restore` and `iptables-save`.
    Iptables,
    /// `ip6tables`, `ip6tables-restore` and `ip6tables-save`.
    Ip6tables,
    /// `nft`.
    Nft,
    /// The `conntrack` tool.
    Conntrack,
    /// `kubectl`.
    Kubectl,
    /// moto's `moto_server` (the venv `make deps` builds puts it on `make test`'s PATH).
    Moto,
    /// Any other program, by name.
    Program(&'static str),
}

impl Requirement {
    /// The programs this requirement needs on the PATH.
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            Requirement::Root => &[],
            Requirement::Netns => &["ip"],
            Requirement::Iptables => &["iptables", "iptables-restore", "iptables-save"],
            Requirement::Ip6tables => &["ip6tables", "ip6tables-restore", "ip6tables-save"],
            Requirement::Nft => &["nft"],
            Requirement::Conntrack => &["conntrack"],
            Requirement::Kubectl => &["kubectl"],
            Requirement::Moto => &["moto_server"],
            Requirement::Program(_) => &[],
        }
    }

    /// Why this machine does not meet the requirement, if it does not.
    pub fn check(self) -> Result<(), String> {
        if matches!(self, Requirement::Root | Requirement::Netns) && !is_root() {
            return Err("needs root (effective uid 0)".to_string());
        }
        if self == Requirement::Netns && !Path::new("/proc/self/ns/net").exists() {
            return Err("needs network namespaces (no /proc/self/ns/net)".to_string());
        }
        let named = match self {
            Requirement::Program(name) => vec![name],
            other => other.programs().to_vec(),
        };
        let path = std::env::var_os("PATH").unwrap_or_default();
        for program in named {
            if find_program(program, std::env::split_paths(&path)).is_none() {
                return Err(format!("needs `{program}`, which is not on the PATH"));
            }
        }
        Ok(())
    }
}

/// What to do with a test whose requirements are checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Run,
    Skip(String),
    Fail(String),
}

/// The decision, from the reasons the requirements are not met and whether the run is strict.
pub fn decide(missing: &[String], strict: bool) -> Verdict {
    if missing.is_empty() {
        Verdict::Run
    } else if strict {
        Verdict::Fail(missing.join("; "))
    } else {
        Verdict::Skip(missing.join("; "))
    }
}

/// Whether a run with these values of `CI` and `BERTH_REQUIRE_ROOT` must fail rather than skip.
pub fn strict_from(ci: Option<&str>, require_root: Option<&str>) -> bool {
    let on = |value: Option<&str>| {
        value
            .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
    };
    on(ci) || on(require_root)
}

/// Whether this run is strict (`CI=true` or `BERTH_REQUIRE_ROOT=1`).
pub fn strict() -> bool {
    let ci = std::env::var("CI").ok();
    let root = std::env::var("BERTH_REQUIRE_ROOT").ok();
    strict_from(ci.as_deref(), root.as_deref())
}

/// The reasons among `needs` this machine does not meet, each said once.
pub fn missing(needs: &[Requirement]) -> Vec<String> {
    let mut reasons: Vec<String> = Vec::new();
    for need in needs {
        if let Err(reason) = need.check() {
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
        }
    }
    reasons
}

/// True when the running test can have everything in `needs`. Otherwise, in a strict run, panics
/// with the reason (the test fails); elsewhere prints the skip line and returns false, and the
/// caller returns early. The test is named after the current thread, which libtest names after it.
#[track_caller]
pub fn require(needs: &[Requirement]) -> bool {
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("a test")
        .to_string();
    require_for(&test, needs)
}

/// [`require`] for a test called `test` (for harnesses that name their own tests).
#[track_caller]
pub fn require_for(test: &str, needs: &[Requirement]) -> bool {
    match skip_reason(test, needs, strict()) {
        None => true,
        Some(reason) => {
            report_skip(test, &reason);
            false
        }
    }
}

/// Why `test` skips, or `None` when it runs; panics (fails the test) in a strict run.
#[track_caller]
fn skip_reason(test: &str, needs: &[Requirement], strict: bool) -> Option<String> {
    match decide(&missing(needs), strict) {
        Verdict::Run => None,
        Verdict::Skip(reason) => Some(reason),
        Verdict::Fail(reason) => panic!(
            "{test} cannot run: {reason} (CI=true or BERTH_REQUIRE_ROOT=1 turns a skip into a failure)"
        ),
    }
}

/// Prints the skip line for `test` where libtest's capture does not hide it.
pub fn report_skip(test: &str, reason: &str) {
    // One write, so lines of tests running in parallel do not interleave.
    let line = format!("\n{SKIP_MARKER} {test}: {reason}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Returns from the calling test, after [`require`] printed why, when the machine lacks any of the
/// requirements; in a strict run, fails the test instead.
#[macro_export]
macro_rules! require {
    ($($need:expr),+ $(,)?) => {
        if !$crate::require::require(&[$($need),+]) {
            return;
        }
    };
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| effective_uid(&status))
        == Some(0)
}

/// The effective uid from the text of `/proc/<pid>/status`.
fn effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
}

/// The first executable file called `program` in `dirs`.
fn find_program(
    program: &str,
    dirs: impl IntoIterator<Item = std::path::PathBuf>,
) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        let path = std::path::PathBuf::from(program);
        return path.is_file().then_some(path);
    }
    dirs.into_iter().map(|dir| dir.join(program)).find(|path| {
        std::fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strict_run_fails_what_another_run_skips() {
        let missing = vec!["needs root (effective uid 0)".to_string()];
        assert_eq!(
            decide(&missing, true),
            Verdict::Fail("needs root (effective uid 0)".into())
        );
        assert_eq!(
            decide(&missing, false),
            Verdict::Skip("needs root (effective uid 0)".into())
        );
        assert_eq!(decide(&[], true), Verdict::Run);
        assert_eq!(decide(&[], false), Verdict::Run);
    }

    #[test]
    fn every_reason_is_named() {
        let missing = vec!["needs `nft`".to_string(), "needs `kubectl`".to_string()];
        assert_eq!(
            decide(&missing, false),
            Verdict::Skip("needs `nft`; needs `kubectl`".into())
        );
    }

    #[test]
    fn ci_and_the_explicit_flag_make_a_run_strict() {
        assert!(strict_from(Some("true"), None));
        assert!(strict_from(Some("1"), None));
        assert!(strict_from(None, Some("1")));
        assert!(strict_from(Some("false"), Some("true")));
        assert!(!strict_from(None, None));
        assert!(!strict_from(Some("false"), Some("0")));
        assert!(!strict_from(Some(""), None));
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        assert_eq!(effective_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n"), Some(0));
        assert_eq!(effective_uid("Uid:\t0\t1000\t0\t0\n"), Some(1000));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn a_program_is_found_only_where_it_is_an_executable_file() {
        let dir = std::env::temp_dir().join(format!("berth-require-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let exe = dir.join("berth-fake-tool");
        let plain = dir.join("berth-plain-file");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::write(&plain, "").expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let dirs = || vec![dir.join("absent"), dir.clone()];
        assert_eq!(find_program("berth-fake-tool", dirs()), Some(exe.clone()));
        assert_eq!(find_program("berth-plain-file", dirs()), None);
        assert_eq!(find_program("berth-no-such-tool", dirs()), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_program_is_named_in_the_reason() {
        let reasons = missing(&[
            Requirement::Program("berth-no-such-program-anywhere"),
            Requirement::Program("berth-no-such-program-anywhere"),
        ]);
        assert_eq!(
            reasons,
            ["needs `berth-no-such-program-anywhere`, which is not on the PATH"]
        );
    }

    #[test]
    #[should_panic(expected = "x cannot run: needs `berth-no-such-program-anywhere`")]
    fn a_strict_run_fails_the_test_with_the_reason() {
        skip_reason(
            "x",
            &[Requirement::Program("berth-no-such-program-anywhere")],
            true,
        );
    }

    #[test]
    fn another_run_skips_and_runs_what_it_has() {
        let missing = Requirement::Program("berth-no-such-program-anywhere");
        assert_eq!(
            skip_reason("x", &[missing], false).as_deref(),
            Some("needs `berth-no-such-program-anywhere`, which is not on the PATH")
        );
        assert_eq!(
            skip_reason("x", &[Requirement::Program("/bin/sh")], true),
            None
        );
    }
}
