//! Sockets inside named network namespaces (the `ip netns` convention: `/run/netns/<name>`).
//!
//! A socket belongs to the namespace it was created in, for its whole life. So a short-lived thread
//! enters the namespace, binds, and ends; the listener it returns keeps serving that namespace while
//! every thread of the process stays in its own. Nothing here creates or changes a namespace.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;

use nix::sched::{setns, CloneFlags};

/// Where `ip netns add <name>` pins a namespace.
pub const NETNS_RUN_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("invalid network namespace name {0:?}: expected a plain file name")]
    InvalidName(String),
    #[error("opening network namespace {name} at {path}")]
    Open {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("entering network namespace {name}")]
    Enter {
        name: String,
        #[source]
        source: nix::Error,
    },
    #[error("binding {addr} in network namespace {name}")]
    Bind {
        name: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the thread binding in network namespace {0} ended without an answer")]
    Thread(String),
}

/// The path of a named namespace, refusing names that would escape [`NETNS_RUN_DIR`].
pub fn netns_path(name: &str) -> Result<PathBuf, NetnsError> {
    let plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0');
    if plain {
        Ok(PathBuf::from(NETNS_RUN_DIR).join(name))
    } else {
        Err(NetnsError::InvalidName(name.to_string()))
    }
}

/// Binds a TCP listener to `addr` inside the named network namespace.
pub fn bind_tcp_in_netns(name: &str, addr: SocketAddr) -> Result<TcpListener, NetnsError> {
    let path = netns_path(name)?;
    let ns = File::open(&path).map_err(|source| NetnsError::Open {
        name: name.to_string(),
        path,
        source,
    })?;
    let owned = name.to_string();
    let binder = std::thread::spawn(move || {
        setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            name: owned.clone(),
            source,
        })?;
        TcpListener::bind(addr).map_err(|source| NetnsError::Bind {
            name: owned,
            addr,
            source,
        })
    });
    binder
        .join()
        .map_err(|_| NetnsError::Thread(name.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_inside_the_run_dir() {
        assert_eq!(
            netns_path("berth-lab-node1").unwrap(),
            PathBuf::from("/run/netns/berth-lab-node1")
        );
        for bad in ["", ".", "..", "a/b", "../x", "nul\0"] {
            assert!(
                matches!(netns_path(bad), Err(NetnsError::InvalidName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_missing_namespace_is_an_error_not_a_panic() {
        let err = bind_tcp_in_netns(
            "berth-no-such-namespace-for-sure",
            "127.0.0.1:0".parse().unwrap(),
        )
        .unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err}");
    }
}
