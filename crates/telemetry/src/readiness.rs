//! Named readiness checks that components flip as they start and stop, read by `/readyz`.
//!
//! A flip is one atomic store, so components may report from hot loops. The list of checks sits
//! behind a lock that only registration and `/readyz` take.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::Error;

#[derive(Debug)]
struct CheckState {
    ready: AtomicBool,
    /// Whether a live [`ReadinessCheck`] handle owns this check.
    held: AtomicBool,
}

#[derive(Debug, Clone)]
struct Entry {
    name: Arc<str>,
    state: Arc<CheckState>,
}

/// The process's set of readiness checks. Cloning shares the set.
///
/// The process is ready when every registered check is ready; with no checks registered it is
/// ready, as nothing has declared a reason not to be.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    checks: Arc<RwLock<Vec<Entry>>>,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check, initially not ready. A name may be registered again once the previous handle
    /// for it is dropped (a component restarting), but not while that handle is alive.
    pub fn register(&self, name: &str) -> Result<ReadinessCheck, Error> {
        let mut checks = self.checks.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = checks.iter().find(|e| &*e.name == name) {
            if entry.state.held.swap(true, Ordering::AcqRel) {
                return Err(Error::DuplicateReadinessCheck(name.to_owned()));
            }
            entry.state.ready.store(false, Ordering::Release);
            return Ok(ReadinessCheck {
                name: entry.name.clone(),
                state: entry.state.clone(),
            });
        }
        let entry = Entry {
            name: Arc::from(name),
            state: Arc::new(CheckState {
                ready: AtomicBool::new(false),
                held: AtomicBool::new(true),
            }),
        };
        checks.push(entry.clone());
        Ok(ReadinessCheck {
            name: entry.name,
            state: entry.state,
        })
    }

    /// A snapshot of every check, in registration order.
    pub fn report(&self) -> ReadinessReport {
        let checks = self.checks.read().unwrap_or_else(PoisonError::into_inner);
        ReadinessReport {
            checks: checks
                .iter()
                .map(|e| CheckStatus {
                    name: e.name.to_string(),
                    ready: e.state.ready.load(Ordering::Acquire),
                })
                .collect(),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.report().is_ready()
    }
}

/// A component's handle on its own check. Dropping it marks the check not ready: a component that
/// has stopped cannot vouch for itself.
#[derive(Debug)]
pub struct ReadinessCheck {
    name: Arc<str>,
    state: Arc<CheckState>,
}

impl ReadinessCheck {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn set_ready(&self, ready: bool) {
        self.state.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.state.ready.load(Ordering::Acquire)
    }
}

impl Drop for ReadinessCheck {
    fn drop(&mut self) {
        self.state.ready.store(false, Ordering::Release);
        self.state.held.store(false, Ordering::Release);
    }
}

/// One check's state at the time of a [`ReadinessReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckStatus {
    pub name: String,
    pub ready: bool,
}

/// A point-in-time view of all checks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadinessReport {
    pub checks: Vec<CheckStatus>,
}

impl ReadinessReport {
    pub fn is_ready(&self) -> bool {
        self.checks.iter().all(|c| c.ready)
    }

    /// Names of the checks that are not ready, in registration order.
    pub fn failing(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| !c.ready)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// The body of `/readyz`, in the apiserver's verbose layout so that operators read it the
    /// same way: `[+]name ok` / `[-]name failed`, then a verdict line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for check in &self.checks {
            let (mark, word) = if check.ready {
                ('+', "ok")
            } else {
                ('-', "failed")
            };
            out.push_str(&format!("[{mark}]{} {word}\n", check.name));
        }
        out.push_str(if self.is_ready() {
            "readyz check passed\n"
        } else {
            "readyz check failed\n"
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_status(name: &str, ready: bool) -> CheckStatus {
        CheckStatus {
            name: name.to_owned(),
            ready,
        }
    }

    #[test]
    fn no_checks_means_ready() {
        let readiness = Readiness::new();
        assert!(readiness.is_ready());
        assert_eq!(readiness.report().render(), "readyz check passed\n");
    }

    #[test]
    fn new_checks_start_not_ready() {
        let readiness = Readiness::new();
        let check = readiness.register("leader").unwrap();
        assert!(!check.is_ready());
        assert!(!readiness.is_ready());
        assert_eq!(readiness.report().failing(), vec!["leader"]);
    }

    #[test]
    fn ready_only_when_every_check_is() {
        let readiness = Readiness::new();
        let a = readiness.register("informers").unwrap();
        let b = readiness.register("datapath").unwrap();
        a.set_ready(true);
        assert!(!readiness.is_ready());
        assert_eq!(readiness.report().failing(), vec!["datapath"]);
        b.set_ready(true);
        assert!(readiness.is_ready());
        a.set_ready(false);
        assert_eq!(readiness.report().failing(), vec!["informers"]);
    }

    #[test]
    fn clones_share_the_same_checks() {
        let readiness = Readiness::new();
        let other = readiness.clone();
        let check = other.register("leader").unwrap();
        check.set_ready(true);
        assert_eq!(readiness.report().checks, vec![mk_status("leader", true)]);
    }

    #[test]
    fn duplicate_live_names_are_rejected() {
        let readiness = Readiness::new();
        let _held = readiness.register("leader").unwrap();
        let err = readiness.register("leader").unwrap_err();
        assert!(matches!(err, Error::DuplicateReadinessCheck(ref n) if n == "leader"));
        assert_eq!(readiness.report().checks.len(), 1);
    }

    #[test]
    fn dropping_a_handle_marks_the_check_failed() {
        let readiness = Readiness::new();
        let check = readiness.register("announcer").unwrap();
        check.set_ready(true);
        drop(check);
        assert_eq!(readiness.report().failing(), vec!["announcer"]);
    }

    #[test]
    fn a_dropped_name_can_be_registered_again_and_starts_not_ready() {
        let readiness = Readiness::new();
        let first = readiness.register("announcer").unwrap();
        first.set_ready(true);
        drop(first);
        let second = readiness.register("announcer").unwrap();
        assert_eq!(second.name(), "announcer");
        assert!(!second.is_ready());
        second.set_ready(true);
        assert!(readiness.is_ready());
        assert_eq!(readiness.report().checks.len(), 1);
    }

    #[test]
    fn report_keeps_registration_order() {
        let readiness = Readiness::new();
        let _c = readiness.register("c").unwrap();
        let _a = readiness.register("a").unwrap();
        let _b = readiness.register("b").unwrap();
        let names: Vec<_> = readiness
            .report()
            .checks
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["c", "a", "b"]);
    }

    #[test]
    fn render_marks_each_check() {
        let report = ReadinessReport {
            checks: vec![mk_status("leader", true), mk_status("informers", false)],
        };
        assert_eq!(
            report.render(),
            "[+]leader ok\n[-]informers failed\nreadyz check failed\n"
        );
        let report = ReadinessReport {
            checks: vec![mk_status("leader", true)],
        };
        assert_eq!(report.render(), "[+]leader ok\nreadyz check passed\n");
    }

    #[test]
    fn flips_from_another_thread_are_seen() {
        let readiness = Readiness::new();
        let check = readiness.register("worker").unwrap();
        let check = std::thread::spawn(move || {
            check.set_ready(true);
            check
        })
        .join()
        .unwrap();
        assert!(readiness.is_ready());
        assert!(check.is_ready());
    }
}
