//! The lab's record of itself (`lab.json` in the state directory): which namespaces and which
//! processes are its own, so `berth lab down` can remove them even after `lab up` was killed.
//!
//! A process is named by its pid and its start time (field 22 of `/proc/<pid>/stat`), so a pid
//! that the kernel gave to another program since is never signalled.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ClusterError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub name: String,
    pub pid: u32,
    pub start_time: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    pub name: String,
    /// Every namespace of the lab starts with `<prefix>-`.
    pub prefix: String,
    pub nodes: usize,
    /// `berth lab up` itself.
    pub up: Process,
    /// The components, in start order.
    pub components: Vec<Process>,
}

/// The start time (clock ticks after boot) in the text of `/proc/<pid>/stat`. The command name
/// (field 2) is in parentheses and may hold spaces and parentheses, so fields are counted after
/// the last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: field 3 (state) is the first; field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The process `pid` now, if it exists: its start time.
pub fn start_time_of(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

impl Process {
    pub fn current(name: &str) -> Result<Self, ClusterError> {
        let pid = std::process::id();
        Ok(Process {
            name: name.to_string(),
            pid,
            start_time: start_time_of(pid)
                .ok_or_else(|| ClusterError::Invalid("cannot read /proc/self/stat".into()))?,
        })
    }

    /// Whether this very process is still running (not a later one with the same pid). A zombie
    /// counts as gone.
    pub fn is_alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        let zombie = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some("Z");
        !zombie && parse_start_time(&stat) == Some(self.start_time)
    }
}

impl LabState {
    pub fn read(path: &Path) -> Result<Option<Self>, ClusterError> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| ClusterError::State {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(ClusterError::State {
                path: path.display().to_string(),
                reason: err.to_string(),
            }),
        }
    }

    /// Written to a temporary file and renamed, so a kill never leaves half a record.
    pub fn write(&self, path: &Path) -> Result<(), ClusterError> {
        let err = |e: std::io::Error| ClusterError::State {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let text = serde_json::to_string_pretty(self).map_err(|e| ClusterError::State {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_with_odd_command_names() {
        let stat = "4242 (berth (lab) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 12 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("4242 (short) S 1"), None);
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_not() {
        let me = Process::current("test").unwrap();
        assert!(me.is_alive());
        let other = Process {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!other.is_alive());
    }

    #[test]
    fn state_round_trips_through_its_file() {
        let dir = std::env::temp_dir().join(format!("berth-state-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lab.json");
        assert_eq!(LabState::read(&path).unwrap(), None);
        let state = LabState {
            name: "lab".into(),
            prefix: "berth-lab".into(),
            nodes: 3,
            up: Process::current("up").unwrap(),
            components: vec![Process {
                name: "apiserver".into(),
                pid: 7,
                start_time: 9,
            }],
        };
        state.write(&path).unwrap();
        assert_eq!(LabState::read(&path).unwrap(), Some(state));
        std::fs::write(&path, "{").unwrap();
        assert!(LabState::read(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
