//! Split dispatch trees in the kernel: with a small leaf size, the destination and node-port
//! trees are several levels deep, and packets to the first, middle and last Service of every
//! leaf must reach that Service's endpoint. With the default leaf size the traffic cluster's
//! trees are single leaves, so only this scenario sends packets through the prefix and range
//! chains.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use berth_datapath::{Dispatch, PlanOptions, ServicePort};

use crate::cluster::*;
use crate::family::dual_stack;

/// Extra Services: `split-<i>` at 10.96.1.<1 + 3i>, node port 30100 + 5i, one endpoint each.
const EXTRA: u8 = 24;
const POD_CYCLE: [&str; 4] = ["a1", "b1", "a2", "b2"];
/// Leaves of at most two rules: 24 Services split at least three levels deep.
const LEAF_SIZE: usize = 2;

fn extra_ip(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96, 1, 1 + 3 * i))
}

fn extra_port(i: u8) -> u16 {
    30100 + 5 * u16::from(i)
}

fn mk_extras(c: &Cluster) -> Vec<ServicePort> {
    (0..EXTRA)
        .map(|i| {
            let pod = POD_CYCLE[usize::from(i) % POD_CYCLE.len()];
            let ep = berth_testing::mk_endpoint(
                pod_ip(&c.topo, pod),
                TCP_PORT,
                &c.topo.layout().pod(pod).unwrap().0.name,
            );
            let mut port = mk_port(&format!("split-{i}"), extra_ip(i), vec![ep]);
            port.node_port = Some(extra_port(i));
            dual_stack(port)
        })
        .collect()
}

/// A dispatch tree read from `iptables-save -t nat`: each tree chain's child chains and the
/// Service keys (destination address or node port) its rules name, in rule order.
#[derive(Debug, Default)]
pub struct Tree {
    children: BTreeMap<String, Vec<String>>,
    keys: BTreeMap<String, Vec<String>>,
}

fn is_tree_chain(name: &str) -> bool {
    name.starts_with("BERTH-DST-") || name.starts_with("BERTH-NP-")
}

fn option<'a>(words: &[&'a str], name: &str) -> Option<&'a str> {
    words
        .iter()
        .position(|w| *w == name)
        .and_then(|i| words.get(i + 1).copied())
}

impl Tree {
    pub fn parse(dump: &str) -> Tree {
        let mut tree = Tree::default();
        for line in dump.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (Some(chain), Some(target)) = (option(&words, "-A"), option(&words, "-j")) else {
                continue;
            };
            if is_tree_chain(target) {
                tree.children
                    .entry(chain.to_string())
                    .or_default()
                    .push(target.to_string());
            } else if is_tree_chain(chain) {
                let key = if chain.starts_with("BERTH-DST-") {
                    option(&words, "-d").map(|d| {
                        d.trim_end_matches("/32")
                            .trim_end_matches("/128")
                            .to_string()
                    })
                } else {
                    option(&words, "--dport").map(str::to_string)
                };
                if let Some(key) = key {
                    let keys = tree.keys.entry(chain.to_string()).or_default();
                    if !keys.contains(&key) {
                        keys.push(key);
                    }
                }
            }
        }
        tree
    }

    /// Levels of tree chains below `root` (0: the root holds the rules itself).
    pub fn depth(&self, root: &str) -> usize {
        self.children
            .get(root)
            .map(|kids| kids.iter().map(|k| 1 + self.depth(k)).max().unwrap_or(0))
            .unwrap_or(0)
    }

    /// The leaves under `root` (chains with no child chain), each with its keys.
    pub fn leaves(&self, root: &str) -> Vec<(String, Vec<String>)> {
        let Some(kids) = self.children.get(root) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for kid in kids {
            if self.children.contains_key(kid) {
                out.extend(self.leaves(kid));
            } else {
                out.push((kid.clone(), self.keys.get(kid).cloned().unwrap_or_default()));
            }
        }
        out
    }
}

/// The first, middle and last of `keys`, each once.
fn first_middle_last(keys: &[String]) -> BTreeSet<String> {
    [keys.first(), keys.get(keys.len() / 2), keys.last()]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
}

fn sync_with_leaf_size(c: &mut Cluster, leaf_size: usize) {
    let dispatch = c.dispatch;
    c.sync_with(|family| PlanOptions {
        leaf_size,
        ..Cluster::options(dispatch, family)
    });
}

pub fn split_trees_reach_every_leaf(c: &mut Cluster) {
    let base = c.services.clone();
    let extras = mk_extras(c);
    c.services.extend(extras);
    sync_with_leaf_size(c, LEAF_SIZE);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| probe(c)));
    c.services = base;
    sync_with_leaf_size(c, PlanOptions::default().leaf_size);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn expected_pod(i: u8) -> &'static str {
    POD_CYCLE[usize::from(i) % POD_CYCLE.len()]
}

fn probe(c: &mut Cluster) {
    let by_ip: BTreeMap<String, u8> = (0..EXTRA)
        .map(|i| (c.ip(extra_ip(i)).to_string(), i))
        .collect();
    let by_port: BTreeMap<String, u8> =
        (0..EXTRA).map(|i| (extra_port(i).to_string(), i)).collect();
    let (dst, np): (BTreeSet<u8>, BTreeSet<u8>) = if c.dispatch == Dispatch::Tree {
        let ns = c.netns("node1");
        let save = c.iptables_save_cmd();
        let dump = c.topo.exec(&ns, &[save, "-t", "nat"]).unwrap();
        let tree = Tree::parse(&dump);
        for root in ["BERTH-SERVICES", "BERTH-NODEPORTS"] {
            assert!(tree.depth(root) >= 2, "{root} is not split twice: {tree:?}");
        }
        let pick = |root: &str, index: &BTreeMap<String, u8>| -> BTreeSet<u8> {
            let leaves = tree.leaves(root);
            assert!(leaves.len() >= 4, "{root}: {leaves:?}");
            leaves
                .iter()
                .filter(|(_, keys)| keys.iter().any(|k| index.contains_key(k)))
                .flat_map(|(_, keys)| {
                    let ours: Vec<String> = keys
                        .iter()
                        .filter(|k| index.contains_key(*k))
                        .cloned()
                        .collect();
                    first_middle_last(&ours)
                })
                .map(|k| index[&k])
                .collect()
        };
        (
            pick("BERTH-SERVICES", &by_ip),
            pick("BERTH-NODEPORTS", &by_port),
        )
    } else {
        // Linear dispatch has no tree: every Service is asked.
        let all: BTreeSet<u8> = (0..EXTRA).collect();
        (all.clone(), all)
    };
    // Every leaf holding one of these Services was probed at its ends and middle; with two
    // rules a leaf, that is most of the Services.
    assert!(dst.len() >= usize::from(EXTRA) / 2, "{dst:?}");
    assert!(np.len() >= usize::from(EXTRA) / 2, "{np:?}");
    for i in dst {
        let reply = ask(c, "c1", sa(extra_ip(i), 80));
        assert_eq!(reply.pod, expected_pod(i), "split-{i} at {}", extra_ip(i));
    }
    let node1 = node_ip(c, "node1");
    for i in np {
        let reply = ask(c, "client", sa(node1, extra_port(i)));
        assert_eq!(
            reply.pod,
            expected_pod(i),
            "split-{i} at node port {}",
            extra_port(i)
        );
    }
}
