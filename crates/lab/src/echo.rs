//! A tiny TCP and UDP echo server for pods, and the client side that talks to it.
//!
//! Every answer is one JSON line naming the pod and the client address the pod sees, e.g.
//! `{"pod":"p1","client":"198.18.0.100:40000"}`: that is what datapath tests assert on (which
//! endpoint was chosen, whether the source was masqueraded). A TCP connection answers once when it
//! opens and again for every line the client sends, so a connection can stay open across changes.
//!
//! Sockets are bound inside the pod's network namespace ([`crate::netns`]) and served by plain
//! threads of this process, so a test needs no extra program in the namespace.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::netns::{
    bind_tcp_in_netns, bind_udp_in_netns, connect_tcp_in_netns, run_in_netns, NetnsError,
};

/// How often the UDP loop checks for a stop request while no datagram arrives.
const UDP_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum EchoError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the echo server answered {line:?}, which is not an echo reply")]
    Decode {
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the echo server at {0} closed the connection without answering")]
    Closed(SocketAddr),
}

impl EchoError {
    /// The socket error behind the failure, to tell a refused connection (REJECT) from one that
    /// timed out (DROP).
    pub fn io_kind(&self) -> Option<ErrorKind> {
        match self {
            EchoError::Netns(err) => err.io_kind(),
            EchoError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EchoError {
    let what = what.into();
    move |source| EchoError::Io { what, source }
}

/// One answer of the echo server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoReply {
    pub pod: String,
    pub client: SocketAddr,
}

impl EchoReply {
    pub fn to_line(&self) -> String {
        // Serializing a struct of a string and an address cannot fail; an empty line would be
        // rejected by every reader anyway.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }

    pub fn parse(line: &str) -> Result<Self, EchoError> {
        serde_json::from_str(line.trim_end()).map_err(|source| EchoError::Decode {
            line: line.to_string(),
            source,
        })
    }
}

/// An echo server whose sockets are bound in a pod's namespace but not yet served.
pub struct EchoServer {
    pod: String,
    tcp: Option<TcpListener>,
    udp: Option<UdpSocket>,
}

impl EchoServer {
    /// Binds `tcp` and `udp` (either may be absent) inside `netns`, answering as `pod`.
    pub fn bind(
        netns: &str,
        pod: &str,
        tcp: Option<SocketAddr>,
        udp: Option<SocketAddr>,
    ) -> Result<Self, EchoError> {
        let tcp = tcp.map(|addr| bind_tcp_in_netns(netns, addr)).transpose()?;
        let udp = udp.map(|addr| bind_udp_in_netns(netns, addr)).transpose()?;
        Ok(EchoServer {
            pod: pod.to_string(),
            tcp,
            udp,
        })
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn udp_addr(&self) -> Option<SocketAddr> {
        self.udp.as_ref().and_then(|s| s.local_addr().ok())
    }

    /// Serves on background threads until the returned handle is dropped.
    pub fn start(self) -> Result<EchoHandle, EchoError> {
        let stop = Arc::new(AtomicBool::new(false));
        let connections: Connections = Arc::default();
        let tcp_addr = self.tcp_addr();
        let udp_addr = self.udp_addr();
        if let Some(socket) = &self.udp {
            socket
                .set_read_timeout(Some(UDP_POLL))
                .map_err(io_err("setting the UDP echo socket's read timeout"))?;
        }
        let tcp = self.tcp.map(|listener| {
            let fd = listener.as_raw_fd();
            let (pod, stop, connections) = (self.pod.clone(), stop.clone(), connections.clone());
            let thread = std::thread::spawn(move || serve_tcp(listener, &pod, &stop, &connections));
            (fd, thread)
        });
        let udp = self.udp.map(|socket| {
            let (pod, stop) = (self.pod.clone(), stop.clone());
            std::thread::spawn(move || serve_udp(&socket, &pod, &stop))
        });
        Ok(EchoHandle {
            pod: self.pod,
            tcp_addr,
            udp_addr,
            stop,
            tcp,
            udp,
            connections,
        })
    }
}

/// Open TCP connections by id, so that stopping the server can close them.
type Connections = Arc<Mutex<HashMap<u64, TcpStream>>>;

fn serve_tcp(listener: TcpListener, pod: &str, stop: &AtomicBool, connections: &Connections) {
    let next_id = AtomicU64::new(0);
    let mut workers = Vec::new();
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else {
            // Aborted handshakes and the like: the listener itself is still good.
            continue;
        };
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        if let (Ok(clone), Ok(mut guard)) = (stream.try_clone(), connections.lock()) {
            guard.insert(id, clone);
        }
        let (pod, connections) = (pod.to_string(), connections.clone());
        workers.push(std::thread::spawn(move || {
            // A client that goes away mid-answer is its own business, not the server's.
            let _ = serve_connection(stream, &pod);
            if let Ok(mut guard) = connections.lock() {
                guard.remove(&id);
            }
        }));
        workers.retain(|w: &JoinHandle<()>| !w.is_finished());
    }
    // Connections still open would keep their workers reading forever.
    if let Ok(guard) = connections.lock() {
        for stream in guard.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
    for worker in workers {
        let _ = worker.join();
    }
}

fn serve_connection(stream: TcpStream, pod: &str) -> std::io::Result<()> {
    let client = stream.peer_addr()?;
    let reply = EchoReply {
        pod: pod.to_string(),
        client,
    }
    .to_line();
    let mut writer = stream.try_clone()?;
    writer.write_all(reply.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        writer.write_all(reply.as_bytes())?;
    }
}

fn serve_udp(socket: &UdpSocket, pod: &str, stop: &AtomicBool) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) {
        match socket.recv_from(&mut buf) {
            Ok((_, client)) => {
                let reply = EchoReply {
                    pod: pod.to_string(),
                    client,
                }
                .to_line();
                let _ = socket.send_to(reply.as_bytes(), client);
            }
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            // ICMP errors from earlier replies surface here; the socket keeps working.
            Err(_) => {}
        }
    }
}

/// A running echo server; dropping it stops the server and closes its connections.
pub struct EchoHandle {
    pod: String,
    tcp_addr: Option<SocketAddr>,
    udp_addr: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    /// The listener's descriptor and the thread that owns the listener.
    tcp: Option<(RawFd, JoinHandle<()>)>,
    udp: Option<JoinHandle<()>>,
    connections: Connections,
}

impl EchoHandle {
    pub fn pod(&self) -> &str {
        &self.pod
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    pub fn udp_addr(&self) -> Option<SocketAddr> {
        self.udp_addr
    }

    /// TCP connections currently open, as the server sees them: a connection the client has
    /// just closed counts until its worker has read the end of it.
    pub fn open_connections(&self) -> usize {
        self.connections.lock().map_or(0, |guard| guard.len())
    }

    /// [`Self::open_connections`] once it equals `expected`, or its last value after `timeout`:
    /// closes reach the server's workers some time after the client made them.
    pub fn open_connections_settled(&self, expected: usize, timeout: Duration) -> usize {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let open = self.open_connections();
            if open == expected || std::time::Instant::now() >= deadline {
                return open;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for EchoHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some((fd, thread)) = self.tcp.take() {
            // Wakes the blocked accept(). The descriptor is still the listener's while its
            // thread runs, and only a panic could have ended that thread early.
            if !thread.is_finished() {
                let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
            }
            let _ = thread.join();
        }
        if let Some(thread) = self.udp.take() {
            let _ = thread.join();
        }
    }
}

/// An open TCP connection to an echo server, made from inside a namespace.
pub struct EchoConnection {
    peer: SocketAddr,
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl EchoConnection {
    /// Connects from `netns` to `addr` and returns the connection with the server's first answer.
    pub fn open(
        netns: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<(Self, EchoReply), EchoError> {
        let stream = connect_tcp_in_netns(netns, addr, timeout)?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(io_err("setting the read timeout"))?;
        let writer = stream
            .try_clone()
            .map_err(io_err("cloning the echo connection"))?;
        let mut conn = EchoConnection {
            peer: addr,
            writer,
            reader: BufReader::new(stream),
        };
        let first = conn.read_reply()?;
        Ok((conn, first))
    }

    /// Asks again on the same connection.
    pub fn ping(&mut self) -> Result<EchoReply, EchoError> {
        self.writer
            .write_all(b"ping\n")
            .map_err(io_err(format!("writing to {}", self.peer)))?;
        self.read_reply()
    }

    fn read_reply(&mut self) -> Result<EchoReply, EchoError> {
        let mut line = String::new();
        let read = self
            .reader
            .read_line(&mut line)
            .map_err(io_err(format!("reading from {}", self.peer)))?;
        if read == 0 {
            return Err(EchoError::Closed(self.peer));
        }
        EchoReply::parse(&line)
    }
}

/// One TCP question: connect from `netns`, read the first answer, close.
pub fn tcp_echo(netns: &str, addr: SocketAddr, timeout: Duration) -> Result<EchoReply, EchoError> {
    EchoConnection::open(netns, addr, timeout).map(|(_, reply)| reply)
}

/// One UDP question from an ephemeral port in `netns`.
pub fn udp_echo(netns: &str, addr: SocketAddr, timeout: Duration) -> Result<EchoReply, EchoError> {
    let any: SocketAddr = if addr.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let socket = bind_udp_in_netns(netns, any)?;
    socket
        .set_read_timeout(Some(timeout))
        .map_err(io_err("setting the read timeout"))?;
    socket
        .send_to(b"ping\n", addr)
        .map_err(io_err(format!("sending to {addr}")))?;
    let mut buf = [0u8; 1500];
    let (len, _) = socket
        .recv_from(&mut buf)
        .map_err(io_err(format!("receiving from {addr}")))?;
    EchoReply::parse(&String::from_utf8_lossy(&buf[..len]))
}

/// Runs `connections` TCP questions one after another from one thread inside `netns`, for tests
/// that need many connections without a thread each. Stops at the first failure.
pub fn tcp_echo_many(
    netns: &str,
    addr: SocketAddr,
    connections: usize,
    timeout: Duration,
) -> Result<Vec<EchoReply>, EchoError> {
    run_in_netns(netns, move || {
        (0..connections)
            .map(|_| ask_here(addr, timeout))
            .collect::<Result<Vec<_>, _>>()
    })?
}

/// One TCP question from the calling thread's namespace.
fn ask_here(addr: SocketAddr, timeout: Duration) -> Result<EchoReply, EchoError> {
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(io_err(format!("connecting to {addr}")))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(io_err("setting the read timeout"))?;
    let mut line = String::new();
    let read = BufReader::new(stream)
        .read_line(&mut line)
        .map_err(io_err(format!("reading from {addr}")))?;
    if read == 0 {
        return Err(EchoError::Closed(addr));
    }
    EchoReply::parse(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip_as_one_json_line() {
        let reply = EchoReply {
            pod: "p1".into(),
            client: "198.18.0.100:40000".parse().unwrap(),
        };
        let line = reply.to_line();
        assert_eq!(line, "{\"pod\":\"p1\",\"client\":\"198.18.0.100:40000\"}\n");
        assert_eq!(EchoReply::parse(&line).unwrap(), reply);
    }

    #[test]
    fn garbage_is_a_decode_error() {
        let err = EchoReply::parse("HTTP/1.1 400 Bad Request\r\n").unwrap_err();
        assert!(matches!(err, EchoError::Decode { .. }), "{err}");
        assert_eq!(err.io_kind(), None);
    }

    /// Loopback in the test's own namespace is enough to exercise the protocol: the server
    /// only needs a namespace to bind in, and the client's is the same one.
    #[test]
    fn serves_tcp_and_udp_on_loopback() {
        let here: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let listener = TcpListener::bind(here).unwrap();
        let udp = UdpSocket::bind(here).unwrap();
        let server = EchoServer {
            pod: "p1".into(),
            tcp: Some(listener),
            udp: Some(udp),
        };
        let handle = server.start().unwrap();
        let tcp_addr = handle.tcp_addr().unwrap();
        let udp_addr = handle.udp_addr().unwrap();

        let stream = TcpStream::connect(tcp_addr).unwrap();
        let local = stream.local_addr().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut conn = EchoConnection {
            peer: tcp_addr,
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        };
        let first = conn.read_reply().unwrap();
        assert_eq!(first.pod, "p1");
        assert_eq!(first.client, local);
        assert_eq!(conn.ping().unwrap(), first);
        assert_eq!(handle.open_connections(), 1);

        let many: Vec<_> = (0..5)
            .map(|_| ask_here(tcp_addr, Duration::from_secs(5)).unwrap())
            .collect();
        assert!(many.iter().all(|r| r.pod == "p1"));

        let socket = UdpSocket::bind(here).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        socket.send_to(b"ping\n", udp_addr).unwrap();
        let mut buf = [0u8; 1500];
        let (len, _) = socket.recv_from(&mut buf).unwrap();
        let reply = EchoReply::parse(&String::from_utf8_lossy(&buf[..len])).unwrap();
        assert_eq!(reply.pod, "p1");
        assert_eq!(reply.client, socket.local_addr().unwrap());

        drop(handle);
        // Stopping closed the open connection rather than leaving it hanging.
        assert!(matches!(
            conn.ping(),
            Err(EchoError::Closed(_) | EchoError::Io { .. })
        ));
        assert!(TcpStream::connect_timeout(&tcp_addr, Duration::from_secs(1)).is_err());
    }
}
