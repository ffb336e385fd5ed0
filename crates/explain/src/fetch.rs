//! What `berth explain` reads: the Service and what its report needs from the API, and a node's
//! ruleset from that node's agent (`GET /debug/ruleset` on its admin port, which listens on the
//! node's address in the lab and on every address by default in the chart).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use berth_api::{IPPool, L2Advertisement};
use berth_l2::election::Pool;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::Client;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::report::Inputs;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("reading {what} from the API")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("asking the agent at {addr} for its ruleset: {why}")]
    Agent { addr: SocketAddr, why: String },
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> FetchError {
    let what = what.into();
    move |source| FetchError::Api { what, source }
}

fn pool_of(pool: &IPPool) -> Pool {
    Pool {
        name: pool.metadata.name.clone().unwrap_or_default(),
        labels: pool.metadata.labels.clone().unwrap_or_default(),
        // A malformed entry was refused by the controller already; it holds no address here.
        ranges: pool
            .spec
            .addresses
            .iter()
            .filter_map(|a| berth_core::parse_address(a).ok())
            .collect(),
    }
}

pub async fn fetch_inputs(client: &Client, ns: &str, name: &str) -> Result<Inputs, FetchError> {
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(api(format!("Service {ns}/{name}")))?;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
        .await
        .map_err(api("its EndpointSlices"))?
        .items;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api("the Nodes"))?
        .items;
    let leases = Api::<Lease>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api("the agents' Leases"))?
        .items
        .into_iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| berth_api::names::lease::node_of_agent_lease(n).is_some())
        })
        .collect();
    // A cluster without berth's CRDs (announcing left to another program) has no pools.
    let pools = Api::<IPPool>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(pool_of).collect())
        .unwrap_or_default();
    let advertisements = Api::<L2Advertisement>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .map(|a| (a.metadata.name.clone().unwrap_or_default(), a.spec))
                .collect()
        })
        .unwrap_or_default();
    let records = Api::<berth_api::ServiceL2Status>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    Ok(Inputs {
        service,
        slices,
        nodes,
        leases,
        pools,
        advertisements,
        records,
    })
}

/// A node's InternalIP addresses, from its Node object.
pub fn node_addresses(node: &Node) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// The agent's answer: the backend it runs and what the kernel gave back: `iptables-save`
/// text, or (nftables) the netlink dump of berth's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRuleset {
    pub backend: String,
    pub text: String,
    pub netlink: Option<Vec<u8>>,
}

/// `GET /debug/ruleset?family=…` from the agent at `addr` (plain HTTP/1.1, closed after the answer, 10 s at most).
pub async fn fetch_ruleset(addr: SocketAddr, family: &str) -> Result<AgentRuleset, FetchError> {
    let fail = |why: String| FetchError::Agent { addr, why };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let request = format!(
            "GET /debug/ruleset?family={family} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok::<Vec<u8>, FetchError>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| fail("no answer within 10 s".to_owned()))??;
    parse_answer(&answer).map_err(fail)
}

/// An HTTP answer's body as the agent's JSON, or why it is not one.
pub fn parse_answer(answer: &[u8]) -> Result<AgentRuleset, String> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "the answer is not HTTP".to_owned())?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(format!(
            "{status}: {} (an agent without /debug/ruleset is older than this berth)",
            body.trim()
        ));
    }
    let v: Value = serde_json::from_str(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let netlink = match v["netlink"].as_str() {
        Some(b64) => Some(
            data_encoding::BASE64
                .decode(b64.as_bytes())
                .map_err(|e| format!("the netlink dump is not base64: {e}"))?,
        ),
        None => None,
    };
    Ok(AgentRuleset {
        backend: v["backend"].as_str().unwrap_or_default().to_owned(),
        text: v["text"].as_str().unwrap_or_default().to_owned(),
        netlink,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_answers_are_read_or_explained() {
        let ok = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"backend\":\"iptables\",\"text\":\"*nat\\nCOMMIT\\n\"}";
        assert_eq!(
            parse_answer(ok).unwrap(),
            AgentRuleset {
                backend: "iptables".into(),
                text: "*nat\nCOMMIT\n".into(),
                netlink: None,
            }
        );
        let nft = b"HTTP/1.0 200 OK\r\n\r\n{\"backend\":\"nftables\",\"netlink\":\"AQAAAAE=\"}";
        assert_eq!(
            parse_answer(nft).unwrap().netlink,
            Some(vec![1, 0, 0, 0, 1])
        );
        let bad = b"HTTP/1.0 200 OK\r\n\r\n{\"backend\":\"nftables\",\"netlink\":\"*\"}";
        assert!(parse_answer(bad).unwrap_err().contains("not base64"));
        let missing = b"HTTP/1.0 404 Not Found\r\n\r\n";
        assert!(parse_answer(missing)
            .unwrap_err()
            .contains("older than this berth"));
        assert!(parse_answer(b"garbage").unwrap_err().contains("not HTTP"));
    }
}
