//! ELBv2 calls berth makes, counted through the real SDK against `moto_server`: to converge one
//! new Service, per steady-state resync of 1, 10 and 100 Services (answered from memory, and
//! read again as after `verify_after`), for the periodic sweep, and to register 100 nodes.
//! Ends with `aws: converge_calls=<n> resync_mutating_calls=<n> resync_read_calls_100=<n>
//! register_100_nodes_calls=<n>`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use berth_aws::{IpTargets, NlbProvider, NodeFacts, ProviderConfig, ServiceFacts};
use berth_core::Protocol;
use common::{mk_port, mk_service, CLUSTER};

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(run());
}

async fn run() {
    let moto = match common::moto::start(100) {
        Ok(m) => m,
        Err(reason) => {
            eprintln!("aws bench needs moto_server: {reason}");
            std::process::exit(1);
        }
    };
    let nodes: Vec<NodeFacts> = moto
        .instances
        .iter()
        .enumerate()
        .map(|(i, id)| NodeFacts {
            name: format!("node-{i}"),
            provider_id: Some(format!("aws:///us-east-1a/{id}")),
            labels: Default::default(),
        })
        .collect();
    let config = ProviderConfig {
        cluster_name: CLUSTER.to_string(),
        default_subnets: moto.subnets.clone(),
        quotas: Default::default(),
    };
    let (client, metrics) = common::moto::client(&moto);
    let cached = NlbProvider::new(client, config.clone(), Duration::from_secs(3600));
    let svc = |i: usize| -> ServiceFacts {
        let base = 30000 + (i as u16) * 2;
        mk_service(
            "bench",
            &format!("svc-{i}"),
            vec![
                mk_port(80, Protocol::Tcp, base),
                mk_port(443, Protocol::Tcp, base + 1),
            ],
        )
    };
    let three = &nodes[..3];

    println!("| measure | reads | mutating | total |");
    println!("|---|---|---|---|");
    let row = |name: &str, reads: u64, mutating: u64| {
        println!("| {name} | {reads} | {mutating} | {} |", reads + mutating)
    };

    let (t0, m0) = (metrics.total(), metrics.mutating());
    let mut arns = Vec::new();
    arns.push(
        cached
            .ensure(&svc(0), three, &IpTargets::new(), None)
            .await
            .expect("converge")
            .load_balancer_arn,
    );
    let converge = metrics.total() - t0;
    row(
        "converge one new Service (2 ports, 3 nodes)",
        converge - (metrics.mutating() - m0),
        metrics.mutating() - m0,
    );

    for i in 1..100 {
        arns.push(
            cached
                .ensure(&svc(i), three, &IpTargets::new(), None)
                .await
                .expect("ensure")
                .load_balancer_arn,
        );
    }
    let mut resync_mutating = 0;
    let mut resync_reads_100 = 0;
    for n in [1usize, 10, 100] {
        let (t, m) = (metrics.total(), metrics.mutating());
        for (i, arn) in arns.iter().enumerate().take(n) {
            cached
                .ensure(&svc(i), three, &IpTargets::new(), Some(arn))
                .await
                .expect("resync");
        }
        let (mutating, reads) = (
            metrics.mutating() - m,
            (metrics.total() - t) - (metrics.mutating() - m),
        );
        resync_mutating += mutating;
        if n == 100 {
            resync_reads_100 = reads;
        }
        row(
            &format!("steady-state resync, {n} Services"),
            reads,
            mutating,
        );
    }
    // The same resync when every Service is read again (what happens once verify_after passes).
    let (client, verify_metrics) = common::moto::client(&moto);
    let verifying = NlbProvider::new(client, config.clone(), Duration::ZERO);
    for n in [1usize, 10, 100] {
        let (t, m) = (verify_metrics.total(), verify_metrics.mutating());
        for (i, arn) in arns.iter().enumerate().take(n) {
            verifying
                .ensure(&svc(i), three, &IpTargets::new(), Some(arn))
                .await
                .expect("verify");
        }
        let mutating = verify_metrics.mutating() - m;
        resync_mutating += mutating;
        row(
            &format!("resync reading AWS again, {n} Services"),
            verify_metrics.total() - t - mutating,
            mutating,
        );
    }
    let live: BTreeSet<String> = (0..100).map(|i| svc(i).key()).collect();
    let t = metrics.total();
    cached.sweep(&live).await.expect("sweep");
    row("sweep over 100 Services (no leak)", metrics.total() - t, 0);

    let big = mk_service(
        "bench",
        "many-nodes",
        vec![mk_port(80, Protocol::Tcp, 32500)],
    );
    let arn = cached
        .ensure(&big, &[], &IpTargets::new(), None)
        .await
        .expect("no nodes")
        .load_balancer_arn;
    let (t, m) = (metrics.total(), metrics.mutating());
    let register_before = metrics.count("RegisterTargets", "success");
    cached
        .ensure(&big, &nodes, &IpTargets::new(), Some(&arn))
        .await
        .expect("100 nodes");
    let register = metrics.count("RegisterTargets", "success") - register_before;
    row(
        "register 100 nodes",
        metrics.total() - t - (metrics.mutating() - m),
        metrics.mutating() - m,
    );
    println!(
        "aws: converge_calls={converge} resync_mutating_calls={resync_mutating} resync_read_calls_100={resync_reads_100} register_100_nodes_calls={register}"
    );
}
