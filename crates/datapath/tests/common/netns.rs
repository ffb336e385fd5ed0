//! A named network namespace with no interfaces, only tables, for the tests that write berth's
//! rulesets into a real kernel; deleted when dropped. Its `nft -j` listings read back normalised,
//! so two tables written different ways can be compared.

use std::process::Command;

use berth_core::IpFamily;
use serde_json::Value;

/// `berth-<code><pid>-<tag>`: `code` keeps each test binary's namespaces apart.
pub struct Netns(pub String);

impl Netns {
    pub fn new(code: &str, tag: &str) -> Netns {
        let name = format!("berth-{code}{}-{tag}", std::process::id());
        let status = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(status.success(), "ip netns add {name}");
        Netns(name)
    }

    /// `nft args` in the namespace, which must succeed; its output.
    pub fn nft(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "nft"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `nft -j list table <family> berth`, normalised (see [`normalise`]); `None` when there is
    /// no table.
    pub fn table(&self, family: IpFamily, handles: bool) -> Option<Value> {
        let fam = match family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.0, "nft", "-j", "list", "table", fam, "berth",
            ])
            .output()
            .unwrap();
        if !out.status.success() {
            return None;
        }
        let mut json: Value = serde_json::from_slice(&out.stdout).unwrap();
        normalise(&mut json, handles);
        Some(json)
    }
}

impl Netns {
    /// Every table of `family` in the namespace (`nft -j list ruleset <family>`), normalised as
    /// [`Netns::table`]; `None` when nft fails.
    pub fn ruleset(&self, family: IpFamily) -> Option<Value> {
        let fam = match family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.0, "nft", "-j", "list", "ruleset", fam,
            ])
            .output()
            .unwrap();
        if !out.status.success() {
            return None;
        }
        let mut json: Value = serde_json::from_slice(&out.stdout).unwrap();
        normalise(&mut json, false);
        Some(json)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// No metainfo, no expiry times, set elements sorted; rule handles kept when `handles` is set.
pub fn normalise(value: &mut Value, handles: bool) {
    match value {
        Value::Object(map) => {
            map.remove("metainfo");
            map.remove("expires");
            if !handles {
                map.remove("handle");
            }
            for (key, inner) in map.iter_mut() {
                normalise(inner, handles);
                if key == "elem" {
                    if let Value::Array(elems) = inner {
                        elems.sort_by_key(|e| e.to_string());
                    }
                }
            }
        }
        Value::Array(items) => {
            items.iter_mut().for_each(|i| normalise(i, handles));
            items.retain(|item| item.as_object().is_none_or(|o| !o.is_empty()));
        }
        _ => {}
    }
}
