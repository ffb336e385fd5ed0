//! Running the steps: the [`Runner`] trait, the real `ip` runner, and the [`Topology`] handle
//! that owns the namespaces it made.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use super::layout::{layout, Layout};
use super::steps::{plan_create, plan_destroy, Step};
use super::{TopologyError, TopologySpec, ETH0, NETNS_PREFIX};
use crate::netns::NETNS_RUN_DIR;

/// Runs one command line and returns its standard output.
pub trait Runner {
    fn run(&mut self, argv: &[String]) -> Result<String, TopologyError>;
}

/// Runs commands as child processes.
#[derive(Debug, Clone, Copy, Default)]
pub struct IpCommand;

impl Runner for IpCommand {
    fn run(&mut self, argv: &[String]) -> Result<String, TopologyError> {
        let command = argv.join(" ");
        let Some((program, args)) = argv.split_first() else {
            return Err(TopologyError::Invalid("an empty command line".into()));
        };
        let output = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| TopologyError::Spawn {
                command: command.clone(),
                source,
            })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(TopologyError::Command {
                command,
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            })
        }
    }
}

/// A built topology. Dropping it deletes every namespace it made, also after a failed build or a
/// panicking test; [`Topology::destroy`] does the same and reports what could not be deleted.
pub struct Topology<R: Runner = IpCommand> {
    layout: Layout,
    /// Namespaces made so far, in creation order.
    created: Vec<String>,
    runner: R,
}

impl Topology<IpCommand> {
    pub fn create(spec: &TopologySpec) -> Result<Self, TopologyError> {
        Topology::create_with(spec, IpCommand)
    }
}

impl<R: Runner> Topology<R> {
    /// Builds `spec` with `runner`. On failure, what was made is deleted before returning.
    pub fn create_with(spec: &TopologySpec, runner: R) -> Result<Self, TopologyError> {
        let layout = layout(spec)?;
        let steps = plan_create(&layout);
        let mut topology = Topology {
            layout,
            created: Vec::new(),
            runner,
        };
        for step in steps {
            topology.runner.run(&step.argv())?;
            if let Step::AddNetns(ns) = step {
                topology.created.push(ns);
            }
        }
        Ok(topology)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The namespace of a node, pod or client, by its name in the spec.
    pub fn netns(&self, name: &str) -> Result<&str, TopologyError> {
        let l = &self.layout;
        l.node(name)
            .map(|n| n.netns.as_str())
            .or_else(|| l.pod(name).map(|(_, p)| p.netns.as_str()))
            .or_else(|| l.client(name).map(|c| c.netns.as_str()))
            .ok_or_else(|| TopologyError::Unknown {
                kind: "node, pod or client",
                name: name.to_string(),
            })
    }

    fn owned(&self, netns: &str) -> Result<(), TopologyError> {
        if self.created.iter().any(|ns| ns == netns) {
            Ok(())
        } else {
            Err(TopologyError::Foreign(netns.to_string()))
        }
    }

    /// Runs a command inside one of this topology's namespaces (`ip netns exec`) and returns its
    /// output; any other namespace is refused.
    pub fn exec(&mut self, netns: &str, argv: &[&str]) -> Result<String, TopologyError> {
        self.owned(netns)?;
        let mut full = vec![
            "ip".to_string(),
            "netns".into(),
            "exec".into(),
            netns.to_string(),
        ];
        full.extend(argv.iter().map(|a| a.to_string()));
        self.runner.run(&full)
    }

    /// Sends a client's traffic for `dst` to `node`, as the node announcing `dst` on the LAN
    /// would attract it.
    pub fn steer(&mut self, client: &str, dst: Ipv4Addr, node: &str) -> Result<(), TopologyError> {
        let via = self
            .layout
            .node(node)
            .ok_or_else(|| TopologyError::Unknown {
                kind: "node",
                name: node.to_string(),
            })?
            .lan_ip
            .to_string();
        let netns = self
            .layout
            .client(client)
            .ok_or_else(|| TopologyError::Unknown {
                kind: "client",
                name: client.to_string(),
            })?
            .netns
            .clone();
        self.owned(&netns)?;
        let step = Step::Ip {
            netns,
            args: [
                "route",
                "replace",
                &format!("{dst}/32"),
                "via",
                &via,
                "dev",
                ETH0,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        };
        self.runner.run(&step.argv()).map(|_| ())
    }

    /// Deletes every namespace now, reporting the ones that could not be deleted.
    pub fn destroy(mut self) -> Result<(), TopologyError> {
        self.delete_all()
    }

    fn delete_all(&mut self) -> Result<(), TopologyError> {
        let created = std::mem::take(&mut self.created);
        let failures: Vec<String> = plan_destroy(created.iter().map(String::as_str))
            .into_iter()
            .filter_map(|step| self.runner.run(&step.argv()).err())
            .map(|err| err.to_string())
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(TopologyError::Cleanup(failures))
        }
    }
}

impl<R: Runner> Drop for Topology<R> {
    fn drop(&mut self) {
        // Nothing to report to from a destructor: a namespace left behind is removed by
        // `remove_leftovers` (`make clean-netns`).
        let _ = self.delete_all();
    }
}

/// Why this process cannot build topologies, if it cannot: it must run as root (effective uid 0)
/// and find every program in `tools` (e.g. `ip`, `sysctl`, `iptables-restore`).
pub fn preflight(tools: &[&str]) -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|err| format!("cannot read /proc/self/status: {err}"))?;
    if effective_uid(&status) != Some(0) {
        return Err("network namespace tests need root".to_string());
    }
    missing_tool(tools)
}

/// The first of `tools` that does not start, named with why.
fn missing_tool(tools: &[&str]) -> Result<(), String> {
    for tool in tools {
        let found = Command::new(tool)
            .arg("-V")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Err(err) = found {
            return Err(format!("`{tool}` is not available: {err}"));
        }
    }
    Ok(())
}

/// The effective uid from the text of `/proc/<pid>/status`.
fn effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
}

/// The names among `names` that a topology with `prefix` made.
pub fn leftovers<'a>(names: impl IntoIterator<Item = &'a str>, prefix: &str) -> Vec<String> {
    let owned = format!("{prefix}-");
    names
        .into_iter()
        .filter(|name| name.starts_with(&owned))
        .map(str::to_string)
        .collect()
}

/// Prefixes `berth-<tag><pid>` among `names` whose process is gone (`alive` says it is not).
pub fn orphan_prefixes<'a>(
    names: impl IntoIterator<Item = &'a str>,
    tag: &str,
    alive: impl Fn(u32) -> bool,
) -> Vec<String> {
    let start = format!("{NETNS_PREFIX}{tag}");
    let mut out: Vec<String> = names
        .into_iter()
        .filter_map(|name| name.strip_prefix(&start))
        .filter_map(|rest| rest.split_once('-'))
        .filter_map(|(pid, _)| pid.parse::<u32>().ok())
        .filter(|pid| !alive(*pid))
        .map(|pid| format!("{start}{pid}"))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn netns_names() -> Result<Vec<String>, TopologyError> {
    match std::fs::read_dir(NETNS_RUN_DIR) {
        Ok(entries) => Ok(entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(TopologyError::List {
            dir: NETNS_RUN_DIR.to_string(),
            source,
        }),
    }
}

/// Deletes the namespaces of topologies named [`TopologySpec::unique_prefix`]`(tag)` whose process
/// has exited (killed before its cleanup ran), and returns their names.
pub fn remove_orphans(tag: &str) -> Result<Vec<String>, TopologyError> {
    let names = netns_names()?;
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let mut removed = Vec::new();
    for prefix in orphan_prefixes(names.iter().map(String::as_str), tag, alive) {
        removed.extend(remove_leftovers(&prefix)?);
    }
    Ok(removed)
}

/// Deletes namespaces a topology with `prefix` left behind (after a crash or a kill), and returns
/// their names. Only berth prefixes are accepted, so this cannot delete anyone else's namespaces.
pub fn remove_leftovers(prefix: &str) -> Result<Vec<String>, TopologyError> {
    if !prefix.starts_with(NETNS_PREFIX) {
        return Err(TopologyError::Invalid(format!(
            "prefix {prefix:?} must start with {NETNS_PREFIX:?}"
        )));
    }
    let names = netns_names()?;
    let stale = leftovers(names.iter().map(String::as_str), prefix);
    let mut runner = IpCommand;
    let failures: Vec<String> = plan_destroy(stale.iter().map(String::as_str))
        .into_iter()
        .filter_map(|step| runner.run(&step.argv()).err())
        .map(|err| err.to_string())
        .collect();
    if failures.is_empty() {
        Ok(stale)
    } else {
        Err(TopologyError::Cleanup(failures))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every command; fails the `fail_at`-th one (0-based) when set.
    #[derive(Default)]
    struct Recorder {
        log: Vec<String>,
        fail_at: Option<usize>,
    }

    impl Runner for &mut Recorder {
        fn run(&mut self, argv: &[String]) -> Result<String, TopologyError> {
            let n = self.log.len();
            self.log.push(argv.join(" "));
            if self.fail_at == Some(n) {
                return Err(TopologyError::Command {
                    command: argv.join(" "),
                    status: "exit status: 2".into(),
                    stderr: "RTNETLINK answers: File exists".into(),
                });
            }
            Ok(String::new())
        }
    }

    fn mk_spec() -> TopologySpec {
        TopologySpec::new("berth-t9")
            .node("node1", ["a1"])
            .node("node2", ["b1"])
            .client("client")
    }

    fn deletes(log: &[String]) -> Vec<&str> {
        log.iter()
            .filter_map(|l| l.strip_prefix("ip netns delete "))
            .collect()
    }

    #[test]
    fn dropping_deletes_every_namespace_it_made() {
        let mut rec = Recorder::default();
        {
            let topo = Topology::create_with(&mk_spec(), &mut rec).unwrap();
            assert_eq!(topo.netns("a1").unwrap(), "berth-t9-a1");
            assert_eq!(topo.netns("node2").unwrap(), "berth-t9-node2");
            assert_eq!(topo.netns("client").unwrap(), "berth-t9-client");
            assert!(topo.netns("nobody").is_err());
        }
        assert_eq!(
            deletes(&rec.log),
            [
                "berth-t9-client",
                "berth-t9-b1",
                "berth-t9-node2",
                "berth-t9-a1",
                "berth-t9-node1",
                "berth-t9-lan"
            ]
        );
    }

    #[test]
    fn a_failed_build_deletes_what_it_made_so_far() {
        // Steps 0-5 add the six namespaces; 6 brings the LAN's loopback up.
        for fail_at in [0, 3, 6, 30] {
            let mut rec = Recorder {
                fail_at: Some(fail_at),
                ..Recorder::default()
            };
            let err = Topology::create_with(&mk_spec(), &mut rec).err().unwrap();
            assert!(matches!(err, TopologyError::Command { .. }), "{err}");
            let added: Vec<&str> = rec.log[..fail_at]
                .iter()
                .filter_map(|l| l.strip_prefix("ip netns add "))
                .collect();
            let mut deleted = deletes(&rec.log);
            deleted.reverse();
            assert_eq!(deleted, added, "failing at step {fail_at}");
        }
    }

    #[test]
    fn exec_and_steer_stay_inside_the_topology() {
        let mut rec = Recorder::default();
        let mut topo = Topology::create_with(&mk_spec(), &mut rec).unwrap();
        topo.exec("berth-t9-node1", &["iptables-save"]).unwrap();
        assert!(matches!(
            topo.exec("berth-other-node1", &["iptables-save"]),
            Err(TopologyError::Foreign(_))
        ));
        topo.steer("client", Ipv4Addr::new(198, 18, 0, 200), "node2")
            .unwrap();
        assert!(topo
            .steer("client", Ipv4Addr::new(198, 18, 0, 200), "node9")
            .is_err());
        assert!(topo
            .steer("node1", Ipv4Addr::new(198, 18, 0, 200), "node2")
            .is_err());
        topo.destroy().unwrap();
        assert!(rec
            .log
            .contains(&"ip netns exec berth-t9-node1 iptables-save".to_string()));
        assert!(rec.log.contains(
            &"ip -n berth-t9-client route replace 198.18.0.200/32 via 198.18.0.12 dev eth0"
                .to_string()
        ));
        assert_eq!(deletes(&rec.log).len(), 6);
    }

    #[test]
    fn leftovers_match_the_prefix_and_a_dash_only() {
        let names = [
            "berth-t1-lan",
            "berth-t12-lan",
            "berth-t1",
            "other",
            "berth-t1-a",
        ];
        assert_eq!(leftovers(names, "berth-t1"), ["berth-t1-lan", "berth-t1-a"]);
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        assert_eq!(effective_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n"), Some(0));
        assert_eq!(effective_uid("Uid:\t0\t1000\t0\t0\n"), Some(1000));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn preflight_names_a_missing_tool() {
        let missing = "berth-no-such-program-anywhere";
        match missing_tool(&["true", missing]) {
            Err(reason) => assert!(reason.contains(missing), "{reason}"),
            Ok(()) => panic!("a missing program passed the preflight"),
        }
    }

    #[test]
    fn orphans_are_prefixes_of_processes_that_are_gone() {
        let names = [
            "berth-tr100-lan",
            "berth-tr100-node1",
            "berth-tr200-lan",
            "berth-tr3x-lan",
            "berth-tt300-lan",
            "berth-tr",
            "other-tr400-lan",
        ];
        assert_eq!(
            orphan_prefixes(names, "tr", |pid| pid == 200),
            ["berth-tr100"]
        );
        assert!(orphan_prefixes(names, "tr", |_| true).is_empty());
    }

    #[test]
    fn leftovers_refuse_foreign_prefixes() {
        assert!(matches!(
            remove_leftovers("cni-"),
            Err(TopologyError::Invalid(_))
        ));
    }
}
