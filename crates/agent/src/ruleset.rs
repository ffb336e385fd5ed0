//! `GET /debug/ruleset?family=ipv4|ipv6`: the node's current ruleset as the kernel holds it,
//! read back with the backend's own tool (`iptables-save -t nat` and `-t filter`, or
//! `nft list table <family> berth`), for `berth explain` to trace packets through. It reads and
//! changes nothing else.

use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_core::IpFamily;
use berth_datapath::iptables::CommandIptables;
use berth_datapath::iptables::Iptables;
use berth_datapath::Table;
use serde_json::json;

use crate::config::Backend;

#[derive(Debug, serde::Deserialize)]
pub struct RulesetQuery {
    family: Option<String>,
}

/// The family a query names (`ipv4` when none), or the reason it names none.
pub fn parse_family(family: Option<&str>) -> Result<IpFamily, String> {
    match family.unwrap_or("ipv4") {
        "ipv4" | "IPv4" | "4" => Ok(IpFamily::V4),
        "ipv6" | "IPv6" | "6" => Ok(IpFamily::V6),
        other => Err(format!("family {other:?}: use ipv4 or ipv6")),
    }
}

fn dump(backend: Backend, family: IpFamily) -> Result<String, String> {
    match backend {
        Backend::Nftables => {
            let table_family = match family {
                IpFamily::V4 => "ip",
                IpFamily::V6 => "ip6",
            };
            let out = std::process::Command::new("nft")
                .args(["list", "table", table_family, "berth"])
                .output()
                .map_err(|e| format!("running nft: {e}"))?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        Backend::Iptables | Backend::Auto => {
            let mut iptables = CommandIptables::new(family);
            let mut text = String::new();
            for table in [Table::Nat, Table::Filter] {
                text.push_str(&iptables.save(table).map_err(|e| e.to_string())?);
            }
            Ok(text)
        }
    }
}

pub async fn serve(backend: Backend, node: String, query: Query<RulesetQuery>) -> Response {
    let family = match parse_family(query.family.as_deref()) {
        Ok(f) => f,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let read = tokio::task::spawn_blocking(move || dump(backend, family)).await;
    match read {
        Ok(Ok(text)) => Json(json!({
            "node": node,
            "backend": backend.as_str(),
            "family": match family { IpFamily::V4 => "ipv4", IpFamily::V6 => "ipv6" },
            "text": text,
        }))
        .into_response(),
        Ok(Err(why)) => (StatusCode::INTERNAL_SERVER_ERROR, why).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_named_plainly() {
        assert_eq!(parse_family(None), Ok(IpFamily::V4));
        assert_eq!(parse_family(Some("ipv6")), Ok(IpFamily::V6));
        assert!(parse_family(Some("ipx"))
            .unwrap_err()
            .contains("ipv4 or ipv6"));
    }
}
