//! The agent against a lab API server, with in-memory iptables per family, a fault switch and a
//! recording conntrack; helpers to create objects and wait for what the agent programmed.

#![allow(clippy::unwrap_used, dead_code)]

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use berth_agent::{Agent, AgentOptions, AgentStatus, Conntrack, ConntrackFlow, SharedIptables};
use berth_core::IpFamily;
use berth_core::Protocol;
use berth_datapath::fake::MemoryIptables;
use berth_datapath::iptables::Iptables;
use berth_datapath::plan::convert::{build_node_view, ProxyMode};
use berth_datapath::plan::names::{service_chain, ServiceChain};
use berth_datapath::{plan, ChainName, Dispatch, ServicePortName, Table};
use berth_lab::LabApiServerHandle;
use berth_telemetry::{MetricsRegistry, Readiness};
use berth_testing::{start_lab, FailSwitch, Hooked};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Default)]
pub struct RecordingConntrack(pub Arc<std::sync::Mutex<Vec<ConntrackFlow>>>);

impl Conntrack for RecordingConntrack {
    fn delete(&mut self, flow: &ConntrackFlow) -> Result<(), berth_agent::Error> {
        self.0.lock().unwrap().push(flow.clone());
        Ok(())
    }
}

pub struct Harness {
    pub server: LabApiServerHandle,
    pub client: Client,
    pub iptables: SharedIptables<MemoryIptables>,
    pub iptables_v6: SharedIptables<MemoryIptables>,
    pub fail: Arc<AtomicBool>,
    pub conntrack: RecordingConntrack,
    pub status: watch::Receiver<AgentStatus>,
    pub admin_port: u16,
    pub stop: CancellationToken,
    pub task: JoinHandle<Result<(), berth_agent::Error>>,
    pub options: AgentOptions,
}

pub fn mk_options(mode: ProxyMode) -> AgentOptions {
    AgentOptions {
        node_name: NODE.into(),
        proxy_mode: mode,
        dispatch: Dispatch::Tree,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        min_sync_interval: Duration::from_millis(50),
        sync_period: Duration::from_secs(30),
        healthz_bind_address: "127.0.0.1".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..AgentOptions::default()
    }
}

pub async fn start_agent(
    server: LabApiServerHandle,
    options: AgentOptions,
    iptables: SharedIptables<MemoryIptables>,
) -> Harness {
    start_agent_with(server, options, iptables, |client| client).await
}

/// [`start_agent`], with the agent's client made by `wrap` from a plain one (the harness's own
/// client stays plain).
pub async fn start_agent_with(
    server: LabApiServerHandle,
    options: AgentOptions,
    iptables: SharedIptables<MemoryIptables>,
    wrap: impl FnOnce(Client) -> Client,
) -> Harness {
    let client = server.client().unwrap();
    let fail = FailSwitch::default();
    let iptables_v6 = SharedIptables::new(MemoryIptables::default());
    // In-memory iptables whose restores fail while `fail` is set.
    let for_family = |family: IpFamily| {
        Hooked::new(
            match family {
                IpFamily::V4 => iptables.clone(),
                IpFamily::V6 => iptables_v6.clone(),
            },
            fail.clone(),
        )
    };
    let conntrack = RecordingConntrack::default();
    let mut registry = MetricsRegistry::new();
    let readiness = Readiness::new();
    let agent = Agent::new(
        options.clone().validate().unwrap(),
        wrap(client.clone()),
        for_family,
        conntrack.clone(),
        &mut registry,
        &readiness,
    )
    .unwrap();
    let status = agent.status();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_port = admin.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let task = tokio::spawn(agent.run(
        admin,
        registry.into_shared(),
        stop.clone().cancelled_owned(),
    ));
    Harness {
        server,
        client,
        iptables,
        iptables_v6,
        fail: fail.0,
        conntrack,
        status,
        admin_port,
        stop,
        task,
        options,
    }
}

pub async fn start(mode: ProxyMode) -> Harness {
    let (server, _) = start_lab().await;
    start_agent(
        server,
        mk_options(mode),
        SharedIptables::new(MemoryIptables::default()),
    )
    .await
}

impl Harness {
    pub async fn create(&self, obj: Value) {
        let kind = obj["kind"].as_str().unwrap().to_string();
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let pp = PostParams::default();
        match kind.as_str() {
            "Service" => {
                Api::<Service>::namespaced(self.client.clone(), &ns)
                    .create(&pp, &serde_json::from_value(obj).unwrap())
                    .await
                    .unwrap();
            }
            "EndpointSlice" => {
                Api::<EndpointSlice>::namespaced(self.client.clone(), &ns)
                    .create(&pp, &serde_json::from_value(obj).unwrap())
                    .await
                    .unwrap();
            }
            "Node" => {
                Api::<Node>::all(self.client.clone())
                    .create(&pp, &serde_json::from_value(obj).unwrap())
                    .await
                    .unwrap();
            }
            "ServiceCIDR" => {
                Api::<k8s_openapi::api::networking::v1::ServiceCIDR>::all(self.client.clone())
                    .create(&pp, &serde_json::from_value(obj).unwrap())
                    .await
                    .unwrap();
            }
            other => panic!("no builder for {other}"),
        }
    }

    pub async fn patch_slice(&self, name: &str, patch: Value) {
        Api::<EndpointSlice>::namespaced(self.client.clone(), "default")
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }

    /// Waits until `check` holds for the status (and what the agent programmed).
    pub async fn wait_for(
        &mut self,
        what: &str,
        check: impl Fn(&AgentStatus, &MemoryIptables) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            {
                let status = self.status.borrow_and_update().clone();
                if check(&status, &self.iptables.lock()) {
                    return;
                }
            }
            let wait = tokio::time::timeout_at(deadline, self.status.changed()).await;
            assert!(
                wait.is_ok(),
                "timed out waiting for {what}; status {:?}",
                *self.status.borrow()
            );
        }
    }

    /// The rules `plan` gives for what the API server holds now.
    pub async fn expected_rules(&self) -> berth_datapath::Ruleset {
        self.expected_rules_for(IpFamily::V4).await
    }

    /// The rules `plan` gives one family for what the API server holds now.
    pub async fn expected_rules_for(&self, family: IpFamily) -> berth_datapath::Ruleset {
        let services = Api::<Service>::all(self.client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let slices = Api::<EndpointSlice>::all(self.client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let node = Api::<Node>::all(self.client.clone())
            .get_opt(NODE)
            .await
            .unwrap()
            .unwrap_or_else(|| {
                serde_json::from_value(json!({"metadata": {"name": NODE}})).unwrap()
            });
        let (view, errors) = build_node_view(&node, &services, &slices, self.options.proxy_mode);
        assert!(errors.is_empty(), "{errors:?}");
        let config = self.options.clone().validate().unwrap();
        plan(&view, &config.plan_options(family))
    }

    pub fn programmed(&self) -> berth_datapath::Ruleset {
        self.iptables.lock().berth_ruleset()
    }

    pub async fn stop(self) -> (LabApiServerHandle, SharedIptables<MemoryIptables>) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        (self.server, self.iptables)
    }
}

pub fn nat(iptables: &MemoryIptables) -> String {
    iptables.clone().save(Table::Nat).unwrap()
}

pub fn web_chain() -> ChainName {
    service_chain(
        ServiceChain::Cluster,
        &ServicePortName {
            namespace: "default".into(),
            name: "web".into(),
            port: "http".into(),
        },
        Protocol::Tcp,
    )
}

pub fn synced(status: &AgentStatus) -> bool {
    status.syncs > 0
}
