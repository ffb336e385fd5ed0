//! The opening the namespace labs share (`tests/l2_lab`, `tests/bgp_lab`): the lab API server
//! answering inside the control-plane namespace, where the agents reach it, and on the host's
//! loopback, where the test's client does; and the echo servers of the pods.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use berth_lab::echo::{EchoHandle, EchoServer};
use berth_lab::netns::bind_tcp_in_netns;
use berth_lab::topology::Topology;
use berth_lab::{LabApiServerBuilder, LabApiServerHandle, Listener};
use kube::Client;

/// Starts the server `builder` describes on 127.0.0.1 and at `api` inside `netns`, writes a
/// kubeconfig for `api` to `kubeconfig` (for the agents) and installs berth's CRDs; returns the
/// server and a client on the host's side.
pub async fn start_api_in_netns(
    builder: LabApiServerBuilder,
    netns: &str,
    api: SocketAddr,
    kubeconfig: &Path,
) -> (LabApiServerHandle, Client) {
    let inside = bind_tcp_in_netns(netns, api).unwrap();
    inside.set_nonblocking(true).unwrap();
    let server = builder
        .listen("127.0.0.1:0".parse().unwrap())
        .listener(Listener::Bound(inside))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    berth_lab::apiserver::write_kubeconfig(kubeconfig, &format!("http://{api}")).unwrap();
    berth_testing::install_crds(&client).await;
    (server, client)
}

/// An echo server (TCP on `port`) in each of `pods`, at the pod's address.
pub fn start_echo(topo: &Topology, pods: &[&str], port: u16) -> Vec<EchoHandle> {
    pods.iter()
        .map(|pod| {
            let (_, p) = topo.layout().pod(pod).unwrap();
            let addr = SocketAddr::new(IpAddr::V4(p.ip), port);
            EchoServer::bind(topo.netns(pod).unwrap(), pod, Some(addr), None)
                .unwrap()
                .start()
                .unwrap()
        })
        .collect()
}
