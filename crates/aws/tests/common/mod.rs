//! Builders shared by the provider's tests: a Service, nodes and a fake with the subnets and
//! instances they name.
#![allow(dead_code, clippy::unwrap_used)]

pub mod moto;

use std::collections::BTreeMap;

use berth_aws::{MemoryElbv2, NodeFacts, PortFacts, ProviderConfig, ServiceFacts};
use berth_core::{Protocol, TrafficPolicy};

pub const CLUSTER: &str = "lab";
pub const SUBNETS: [&str; 2] = ["subnet-0000000a", "subnet-0000000b"];

pub fn mk_config() -> ProviderConfig {
    ProviderConfig {
        cluster_name: CLUSTER.to_string(),
        default_subnets: SUBNETS.iter().map(|s| s.to_string()).collect(),
        quotas: Default::default(),
    }
}

pub fn mk_port(port: u16, protocol: Protocol, node_port: u16) -> PortFacts {
    PortFacts {
        name: None,
        port,
        protocol,
        node_port: Some(node_port),
    }
}

pub fn mk_service(ns: &str, name: &str, ports: Vec<PortFacts>) -> ServiceFacts {
    ServiceFacts {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid: format!("uid-{ns}-{name}"),
        ports,
        annotations: BTreeMap::new(),
        external_traffic_policy: TrafficPolicy::Cluster,
        health_check_node_port: None,
    }
}

pub fn instance(i: usize) -> String {
    format!("i-{i:017x}")
}

pub fn mk_nodes(n: usize) -> Vec<NodeFacts> {
    (0..n)
        .map(|i| NodeFacts {
            name: format!("node-{i}"),
            provider_id: Some(format!("aws:///us-east-1a/{}", instance(i))),
            labels: Default::default(),
        })
        .collect()
}

pub fn mk_fake(instances: usize) -> MemoryElbv2 {
    let fake = MemoryElbv2::new();
    for s in SUBNETS {
        fake.add_subnet(s, "vpc-00000001");
    }
    fake.add_subnet("subnet-0000000c", "vpc-00000001");
    for i in 0..instances {
        fake.add_instance(&instance(i));
    }
    fake
}
