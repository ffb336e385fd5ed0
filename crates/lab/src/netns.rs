//! Sockets inside named network namespaces (the `ip netns` convention: `/run/netns/<name>`).
//!
//! A socket belongs to the namespace it was created in, for its whole life. So a short-lived thread
//! enters the namespace, binds or connects, and ends; the socket it returns keeps working in that
//! namespace while every thread of the process stays in its own. Nothing here creates or changes
//! a namespace. [`http_get`] is the one HTTP request the lab makes from a namespace: the kubelet's
//! readiness probes and `lab up`'s health checks and proofs.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

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
    #[error("connecting to {addr} from network namespace {name}")]
    Connect {
        name: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the thread working in network namespace {0} ended without an answer")]
    Thread(String),
    #[error("{what}")]
    Exchange {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{target} answered {answer:?}, which is not HTTP")]
    NotHttp { target: String, answer: String },
}

impl NetnsError {
    /// The socket error behind a failed bind or connect, so callers can tell "refused" from
    /// "timed out" (a REJECT from a DROP).
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            NetnsError::Bind { source, .. } | NetnsError::Connect { source, .. } => {
                Some(source.kind())
            }
            _ => None,
        }
    }
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

/// Runs `work` on a fresh thread that has entered the named namespace, and returns its result.
/// Sockets `work` creates stay in that namespace; the calling thread never moves.
pub fn run_in_netns<T, F>(name: &str, work: F) -> Result<T, NetnsError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let path = netns_path(name)?;
    let ns = File::open(&path).map_err(|source| NetnsError::Open {
        name: name.to_string(),
        path,
        source,
    })?;
    let owned = name.to_string();
    let worker = std::thread::spawn(move || {
        setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            name: owned,
            source,
        })?;
        Ok(work())
    });
    worker
        .join()
        .map_err(|_| NetnsError::Thread(name.to_string()))?
}

/// Binds a TCP listener to `addr` inside the named network namespace.
pub fn bind_tcp_in_netns(name: &str, addr: SocketAddr) -> Result<TcpListener, NetnsError> {
    run_in_netns(name, move || TcpListener::bind(addr))?.map_err(|source| NetnsError::Bind {
        name: name.to_string(),
        addr,
        source,
    })
}

/// Binds a TCP listener to `addr` inside the named network namespace; an IPv6 address is bound
/// IPv6-only (`IPV6_V6ONLY`), so `[::]:port` and `0.0.0.0:port` can both be bound and each
/// client is seen in its own family, whatever `net.ipv6.bindv6only` says.
pub fn bind_tcp_family_in_netns(name: &str, addr: SocketAddr) -> Result<TcpListener, NetnsError> {
    run_in_netns(name, move || bind_tcp_family(addr))?.map_err(|source| NetnsError::Bind {
        name: name.to_string(),
        addr,
        source,
    })
}

fn bind_tcp_family(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    // As std's TcpListener::bind does, so a restarted pod server finds its port at once.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    Ok(socket.into())
}

/// Binds a UDP socket to `addr` inside the named network namespace.
pub fn bind_udp_in_netns(name: &str, addr: SocketAddr) -> Result<UdpSocket, NetnsError> {
    run_in_netns(name, move || UdpSocket::bind(addr))?.map_err(|source| NetnsError::Bind {
        name: name.to_string(),
        addr,
        source,
    })
}

/// Opens a TCP connection from inside the named network namespace, as a client living there would.
pub fn connect_tcp_in_netns(
    name: &str,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, NetnsError> {
    run_in_netns(name, move || TcpStream::connect_timeout(&addr, timeout))?.map_err(|source| {
        NetnsError::Connect {
            name: name.to_string(),
            addr,
            source,
        }
    })
}

/// One HTTP GET from inside `netns`; returns the status code and the body. Blocking.
pub fn http_get(
    netns: &str,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), NetnsError> {
    let io = |source| NetnsError::Exchange {
        what: format!("GET http://{addr}{path} from {netns}"),
        source,
    };
    let mut stream = connect_tcp_in_netns(netns, addr, timeout)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: berth-lab\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(io)?;
    parse_response(&answer).ok_or_else(|| NetnsError::NotHttp {
        target: format!("http://{addr}{path}"),
        answer: answer.chars().take(200).collect(),
    })
}

/// The status code and body of an HTTP/1.x response.
pub fn parse_response(answer: &str) -> Option<(u16, String)> {
    let status_line = answer.lines().next()?;
    let mut parts = status_line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Some((code, body.to_string()))
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
        let missing = "berth-no-such-namespace-for-sure";
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let err = bind_tcp_in_netns(missing, any).unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err}");
        let err = bind_tcp_family_in_netns(missing, any).unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err}");
        let err = bind_udp_in_netns(missing, any).unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err}");
        let err = connect_tcp_in_netns(missing, any, Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err}");
        assert_eq!(err.io_kind(), None);
    }

    #[test]
    fn io_kind_exposes_the_socket_error() {
        let err = NetnsError::Connect {
            name: "n".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(err.io_kind(), Some(std::io::ErrorKind::ConnectionRefused));
    }

    #[test]
    fn responses_are_read_as_status_and_body() {
        assert_eq!(
            parse_response("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 3\r\n\r\nno\n"),
            Some((503, "no\n".to_string()))
        );
        assert_eq!(
            parse_response("HTTP/1.0 200 OK\r\n\r\n{\"pod\":\"a\"}"),
            Some((200, "{\"pod\":\"a\"}".to_string()))
        );
        assert_eq!(parse_response("{\"pod\":\"a\"}\n"), None);
        assert_eq!(parse_response(""), None);
    }
}
