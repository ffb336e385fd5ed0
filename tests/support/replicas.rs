//! Real `berth controller` processes: started from the built binary against a kubeconfig, killed
//! with SIGKILL, and always killed and reaped when dropped (also when the test panics).

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const LEASE_NAMESPACE: &str = "kube-system";
pub const LEASE_NAME: &str = "berth-controller";
/// Short leader-election timings for tests that kill or cut leaders (duration > renew deadline >
/// retry period): many takeovers fit in a test, yet a debug-build API server on a busy machine
/// still has room; a leader that cannot renew within the deadline steps down, and writes it had
/// in flight land before the Lease expires for a standby.
pub const SHORT_LEASE_FLAGS: [&str; 6] = [
    "--lease-duration",
    "2s",
    "--renew-deadline",
    "1500ms",
    "--retry-period",
    "300ms",
];

/// A scratch directory for the kubeconfig and the replicas' logs, removed on drop unless the
/// test failed (the logs are what explains a failure).
pub struct ScratchDir {
    pub path: PathBuf,
}

impl ScratchDir {
    pub fn new(prefix: &str) -> Self {
        Self {
            path: berth_testing::unique_dir(prefix),
        }
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("BERTH_SIGKILL_KEEP_LOGS").is_some() {
            eprintln!("replica logs kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// One running controller process.
pub struct Replica {
    pub identity: String,
    pub admin: SocketAddr,
    pub log: PathBuf,
    child: Child,
}

impl Replica {
    /// SIGKILL (what `Child::kill` sends on Unix), then reap.
    pub fn kill(mut self) {
        self.kill_and_reap();
    }

    fn kill_and_reap(&mut self) {
        // The whole process group: a wrapper such as `faketime` forks the controller rather
        // than exec it, and killing the wrapper alone would leave the controller running.
        let _ = signal_group(&self.child, "-KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process id (a test may pause it with SIGSTOP).
    #[allow(dead_code)] // not every test pauses a replica
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` when the process ended by itself.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The `/metrics` text (empty when unreachable).
    pub async fn metrics(&self) -> String {
        http_get(self.admin, "/metrics").await.unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// A plain HTTP/1.0 GET on loopback; `None` on any failure.
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8(buf).ok()?;
        text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
}

/// A free loopback port: bound and released, so a short race with other tests is possible
/// and shows up as a replica that exits at once.
fn free_loopback_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// How every replica is started.
pub struct ReplicaSpec {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    pub log_dir: PathBuf,
    /// Flags after `controller` (service CIDRs, lease timings, ...).
    pub args: Vec<String>,
    /// The only environment besides `PATH` (e.g. credentials for a local AWS endpoint).
    pub env: Vec<(String, String)>,
}

/// A fixed number of slots, each holding at most one live process.
pub struct Replicas {
    spec: ReplicaSpec,
    slots: Vec<Option<Replica>>,
    started: u32,
    /// Per slot: its own kubeconfig and flags added after the spec's (each replica behind
    /// its own proxy to the API server or to AWS).
    overrides: std::collections::BTreeMap<usize, (PathBuf, Vec<String>)>,
    /// Per slot: a program (and its arguments) that runs the binary, e.g. `faketime -f +1h`.
    wrappers: std::collections::BTreeMap<usize, Vec<String>>,
}

impl Replicas {
    pub fn new(spec: ReplicaSpec, slots: usize) -> Self {
        Self {
            spec,
            slots: (0..slots).map(|_| None).collect(),
            started: 0,
            overrides: Default::default(),
            wrappers: Default::default(),
        }
    }

    /// Every process started in `slot` from now on runs as `wrapper... <bin> controller ...`.
    #[allow(dead_code)] // not every test wraps a replica
    pub fn set_slot_wrapper(&mut self, slot: usize, wrapper: Vec<String>) {
        self.wrappers.insert(slot, wrapper);
    }

    /// Every process started in `slot` from now on reads `kubeconfig` and gets `args` too.
    #[allow(dead_code)] // not every test gives slots their own paths
    pub fn set_slot(&mut self, slot: usize, kubeconfig: PathBuf, args: Vec<String>) {
        self.overrides.insert(slot, (kubeconfig, args));
    }

    /// Starts a fresh process in `slot` (a new identity each time, as a restarted pod has).
    pub fn start(&mut self, slot: usize) {
        assert!(self.slots[slot].is_none(), "slot {slot} is occupied");
        self.started += 1;
        let identity = format!("replica-{slot}-{}", self.started);
        let admin = free_loopback_addr();
        let log = self.spec.log_dir.join(format!("{identity}.log"));
        let out = File::create(&log).unwrap();
        let (kubeconfig, extra) = match self.overrides.get(&slot) {
            Some((k, a)) => (k.clone(), a.clone()),
            None => (self.spec.kubeconfig.clone(), Vec::new()),
        };
        let mut command = match self.wrappers.get(&slot).and_then(|w| w.split_first()) {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&self.spec.bin);
                c
            }
            None => Command::new(&self.spec.bin),
        };
        let child = command
            // Its own process group, so that a kill reaches a wrapper's child too.
            .process_group(0)
            .arg("controller")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--identity")
            .arg(&identity)
            .arg("--admin-listen")
            .arg(admin.to_string())
            .args(&self.spec.args)
            .args(&extra)
            // Only what the flags say: nothing from the environment of whoever runs the test.
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        self.slots[slot] = Some(Replica {
            identity,
            admin,
            log,
            child,
        });
    }

    pub fn kill(&mut self, slot: usize) {
        if let Some(r) = self.slots[slot].take() {
            r.kill();
        }
    }

    /// SIGTERM, then waits up to `grace` for the process to end; `false` when it did not (it
    /// is then SIGKILLed). The slot is empty afterwards either way.
    #[allow(dead_code)] // not every test stops gracefully
    pub async fn stop(&mut self, slot: usize, grace: Duration) -> bool {
        let Some(mut r) = self.slots[slot].take() else {
            return true;
        };
        let sent = signal_group(&r.child, "-TERM");
        let deadline = Instant::now() + grace;
        while sent.as_ref().is_ok_and(|s| s.success()) && Instant::now() < deadline {
            if r.exited().is_some() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        r.kill();
        false
    }

    pub fn get(&self, slot: usize) -> Option<&Replica> {
        self.slots[slot].as_ref()
    }

    pub fn slot_of(&self, identity: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.identity == identity))
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Panics (with the log) when a replica ended by itself: a controller must only die when
    /// it is killed.
    pub fn assert_all_running(&mut self) {
        for r in self.slots.iter_mut().flatten() {
            if let Some(status) = r.exited() {
                panic!(
                    "{} exited on its own ({status}):\n{}",
                    r.identity,
                    tail(&r.log, 40)
                );
            }
        }
    }

    /// The last lines of every live replica's log.
    pub fn logs(&self) -> String {
        self.slots
            .iter()
            .flatten()
            .map(|r| format!("--- {} ---\n{}", r.identity, tail(&r.log, 30)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The Lease holder, if any.
pub async fn lease_holder(client: &Client) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    api.get_opt(LEASE_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// Waits (at most `limit`) until a live replica other than `not` holds the Lease; returns its
/// slot and how long that took.
pub async fn wait_for_leader(
    client: &Client,
    replicas: &mut Replicas,
    not: Option<&str>,
    limit: Duration,
) -> (usize, Duration) {
    let start = Instant::now();
    loop {
        if let Some(holder) = lease_holder(client).await {
            if Some(holder.as_str()) != not {
                if let Some(slot) = replicas.slot_of(&holder) {
                    return (slot, start.elapsed());
                }
            }
        }
        replicas.assert_all_running();
        if start.elapsed() > limit {
            panic!(
                "no live replica took the lease within {limit:?} (holder {:?})\n{}",
                lease_holder(client).await,
                replicas.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A run's random seed: the value of `var` replays a run, else the clock picks one.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Sends `signal` (as `kill` spells it) to the process group `child` leads.
fn signal_group(child: &Child, signal: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args([signal, "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status()
}
