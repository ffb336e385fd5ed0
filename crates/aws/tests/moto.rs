//! The provider through the real AWS SDK against `moto_server` (real HTTP, real signing),
//! with the VPC, subnets and instances made in moto's EC2 first. moto accepts more than AWS
//! does, so these tests check berth's own invariants: what exists after each step is exactly
//! the model, nothing else of berth's is left, and nothing of anyone else's is touched.
//!
//! Needs `moto_server` (`make deps` puts it in `.venv`): without it the test says so and
//! passes, except under `CI=true` or `BERTH_REQUIRE_ROOT=1`, where it fails.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use berth_api::names::{annotation as ann, aws_tag};
use berth_aws::elbv2::{Elbv2, LbQuery, TgQuery};
use berth_aws::metrics::{AwsMetrics, SWEPT_LOAD_BALANCER, SWEPT_TARGET_GROUP};
use berth_aws::model::{HcProtocol, Scheme};
use berth_aws::{IpTargets, NlbProvider, NodeFacts, ProviderConfig, SdkElbv2, ServiceFacts};
use berth_core::{Protocol, TrafficPolicy};
use common::moto::{self, Moto};
use common::{mk_port, mk_service, CLUSTER};

fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("BERTH_REQUIRE_ROOT").is_ok_and(|v| v == "1")
}

/// moto with `instances` instances; `None`, and the test skips, when it cannot start here
/// (a strict run fails instead).
fn start_or_skip(instances: usize) -> Option<Moto> {
    match moto::start(instances) {
        Ok(m) => Some(m),
        Err(reason) if !required() => {
            eprintln!("skipping: {reason}");
            None
        }
        Err(reason) => panic!("required under CI: {reason}"),
    }
}

/// The provider through the real SDK client against `moto`, counting into the metrics returned.
fn provider(moto: &Moto) -> (NlbProvider<SdkElbv2>, Arc<AwsMetrics>) {
    let (client, metrics) = moto::client(moto);
    let p = NlbProvider::new(client, config(moto), Duration::ZERO).with_metrics(metrics.clone());
    (p, metrics)
}

fn nodes(moto: &Moto, n: usize) -> Vec<NodeFacts> {
    moto.instances
        .iter()
        .take(n)
        .enumerate()
        .map(|(i, id)| NodeFacts {
            name: format!("node-{i}"),
            provider_id: Some(format!("aws:///us-east-1a/{id}")),
            labels: Default::default(),
        })
        .collect()
}

/// Everything in moto tagged with this cluster, by Service: (load balancers, target groups,
/// listener ports, targets per target group).
/// A target group as the test checks it: name, port, health-check protocol, `id:port` targets.
type SeenTargetGroup = (String, u16, HcProtocol, BTreeSet<String>);

struct Ours {
    lbs: BTreeMap<String, Vec<(String, Scheme)>>,
    tgs: BTreeMap<String, Vec<SeenTargetGroup>>,
    listeners: BTreeMap<String, Vec<u16>>,
}

async fn ours(client: &SdkElbv2) -> Ours {
    let lbs = client
        .describe_load_balancers(LbQuery::All { marker: None })
        .await
        .unwrap()
        .items;
    let tgs = client
        .describe_target_groups(TgQuery::All { marker: None })
        .await
        .unwrap()
        .items;
    let mut arns: Vec<String> = lbs
        .iter()
        .map(|l| l.arn.clone())
        .chain(tgs.iter().map(|t| t.arn.clone()))
        .collect();
    let mut tags = BTreeMap::new();
    while !arns.is_empty() {
        let chunk: Vec<String> = arns.drain(..arns.len().min(20)).collect();
        tags.extend(client.describe_tags(chunk).await.unwrap());
    }
    let service = |arn: &str| -> Option<String> {
        let t = tags.get(arn)?;
        (t.get(aws_tag::CLUSTER).map(String::as_str) == Some(CLUSTER))
            .then(|| t.get(aws_tag::SERVICE).cloned())
            .flatten()
    };
    let mut out = Ours {
        lbs: BTreeMap::new(),
        tgs: BTreeMap::new(),
        listeners: BTreeMap::new(),
    };
    for lb in &lbs {
        if let Some(s) = service(&lb.arn) {
            out.lbs
                .entry(s.clone())
                .or_default()
                .push((lb.name.clone(), lb.scheme));
            let mut ports: Vec<u16> = client
                .describe_listeners(lb.arn.clone())
                .await
                .unwrap()
                .iter()
                .map(|l| l.port)
                .collect();
            ports.sort_unstable();
            out.listeners.insert(s, ports);
        }
    }
    for tg in &tgs {
        if let Some(s) = service(&tg.arn) {
            let targets = client
                .describe_target_health(tg.arn.clone())
                .await
                .unwrap()
                .into_iter()
                .map(|t| format!("{}:{}", t.id, t.port))
                .collect();
            out.tgs.entry(s).or_default().push((
                tg.name.clone(),
                tg.port,
                tg.health_check.protocol,
                targets,
            ));
        }
    }
    out
}

fn config(moto: &Moto) -> ProviderConfig {
    ProviderConfig {
        cluster_name: CLUSTER.to_string(),
        default_subnets: moto.subnets.clone(),
        quotas: Default::default(),
    }
}

#[tokio::test]
async fn the_nlb_follows_the_service_through_its_life_in_moto() {
    let Some(moto) = start_or_skip(4) else {
        return;
    };
    let (p, metrics) = provider(&moto);
    let mut svc: ServiceFacts = mk_service(
        "web",
        "front",
        vec![
            mk_port(80, Protocol::Tcp, 30080),
            mk_port(443, Protocol::Tcp, 30443),
        ],
    );
    let key = svc.key();

    // Create: exactly the model.
    let first = p
        .ensure(&svc, &nodes(&moto, 3), &IpTargets::new(), None)
        .await
        .unwrap();
    assert!(!first.hostname.is_empty());
    let o = ours(p.client()).await;
    assert_eq!(o.lbs[&key].len(), 1);
    assert_eq!(o.listeners[&key], vec![80, 443]);
    let mut tg_ports: Vec<u16> = o.tgs[&key].iter().map(|t| t.1).collect();
    tg_ports.sort_unstable();
    assert_eq!(tg_ports, vec![30080, 30443]);
    for (_, port, hc, targets) in &o.tgs[&key] {
        assert_eq!(*hc, HcProtocol::Tcp);
        let want: BTreeSet<String> = moto.instances[..3]
            .iter()
            .map(|i| format!("{i}:{port}"))
            .collect();
        assert_eq!(targets, &want);
    }

    // A steady state makes no mutating call.
    let before = metrics.mutating();
    let again = p
        .ensure(
            &svc,
            &nodes(&moto, 3),
            &IpTargets::new(),
            Some(&first.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_eq!((again.changes, metrics.mutating() - before), (0, 0));

    // A port removed and one added; a node added; Local changes the health check.
    svc.ports = vec![
        mk_port(80, Protocol::Tcp, 30080),
        mk_port(8080, Protocol::Tcp, 30088),
    ];
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    p.ensure(
        &svc,
        &nodes(&moto, 4),
        &IpTargets::new(),
        Some(&first.load_balancer_arn),
    )
    .await
    .unwrap();
    let o = ours(p.client()).await;
    assert_eq!(o.listeners[&key], vec![80, 8080]);
    assert_eq!(o.tgs[&key].len(), 2);
    assert!(
        o.tgs[&key]
            .iter()
            .all(|t| t.2 == HcProtocol::Http && t.3.len() == 4),
        "{:?}",
        o.tgs[&key]
    );

    // Someone else's load balancer, untagged, is never touched.
    moto.python(&format!(
        "elb.create_load_balancer(Name='someone-elses', Type='network', Subnets=['{}'])",
        moto.subnets[0]
    ))
    .unwrap();

    // A scheme change replaces the NLB; annotations add tags.
    svc.annotations.insert(
        ann::AWS_LOAD_BALANCER_SCHEME.into(),
        "internet-facing".into(),
    );
    svc.annotations
        .insert(ann::AWS_ADDITIONAL_RESOURCE_TAGS.into(), "team=web".into());
    let replaced = p
        .ensure(
            &svc,
            &nodes(&moto, 4),
            &IpTargets::new(),
            Some(&first.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_ne!(replaced.load_balancer_arn, first.load_balancer_arn);
    let o = ours(p.client()).await;
    assert_eq!(o.lbs[&key].len(), 1);
    assert_eq!(o.lbs[&key][0].1, Scheme::InternetFacing);
    assert_eq!(o.listeners[&key], vec![80, 8080]);

    // A listener deleted behind berth's back comes back on the next read.
    let listener = p
        .client()
        .describe_listeners(replaced.load_balancer_arn.clone())
        .await
        .unwrap()[0]
        .arn
        .clone();
    p.client().delete_listener(listener).await.unwrap();
    p.ensure(
        &svc,
        &nodes(&moto, 4),
        &IpTargets::new(),
        Some(&replaced.load_balancer_arn),
    )
    .await
    .unwrap();
    assert_eq!(ours(p.client()).await.listeners[&key], vec![80, 8080]);

    // A second Service, deleted while "the controller was down": the sweep removes it.
    let gone = mk_service("web", "gone", vec![mk_port(53, Protocol::Udp, 30053)]);
    p.ensure(&gone, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap();
    let swept = p.sweep(&BTreeSet::from([key.clone()])).await.unwrap();
    assert_eq!(
        (swept.load_balancers.len(), swept.target_groups.len()),
        (1, 1)
    );
    assert_eq!(
        (
            metrics.swept_count(SWEPT_LOAD_BALANCER),
            metrics.swept_count(SWEPT_TARGET_GROUP)
        ),
        (1, 1)
    );

    // Deleting the Service leaves nothing of berth's, and the stranger's NLB is still there.
    p.delete(&svc, Some(&replaced.load_balancer_arn))
        .await
        .unwrap();
    let o = ours(p.client()).await;
    assert!(
        o.lbs.is_empty() && o.tgs.is_empty(),
        "left behind: {:?} {:?}",
        o.lbs,
        o.tgs
    );
    let names = moto.python("print(sorted(l['LoadBalancerName'] for l in elb.describe_load_balancers()['LoadBalancers']))").unwrap();
    assert_eq!(names.trim(), "['someone-elses']");
}

/// A real account is not empty: an ALB with its HTTP target group and listener, a Lambda
/// target group, TLS, HTTPS and GENEVE target groups, another cluster's NLB with berth's tags,
/// and a TLS listener someone added by hand to a berth NLB. The sweep still removes a berth
/// orphan, a reconcile still converges, and nothing of anyone else's is touched.
#[tokio::test]
async fn strangers_resources_neither_stop_the_sweep_nor_are_touched() {
    let Some(moto) = start_or_skip(2) else {
        return;
    };
    let (p, metrics) = provider(&moto);
    let live = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let orphan = mk_service("web", "gone", vec![mk_port(53, Protocol::Udp, 30053)]);
    let ensured = p
        .ensure(&live, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap();
    p.ensure(&orphan, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap();

    let strangers = format!(
        r#"
ec2 = boto3.client('ec2', endpoint_url=elb.meta.endpoint_url, region_name='us-east-1', aws_access_key_id='testing', aws_secret_access_key='testing')
acm = boto3.client('acm', endpoint_url=elb.meta.endpoint_url, region_name='us-east-1', aws_access_key_id='testing', aws_secret_access_key='testing')
subnets = ['{s0}', '{s1}']
vpc = ec2.describe_subnets(SubnetIds=subnets)['Subnets'][0]['VpcId']
alb = elb.create_load_balancer(Name='shop-alb', Subnets=subnets, Type='application')['LoadBalancers'][0]['LoadBalancerArn']
http = elb.create_target_group(Name='shop-http', Protocol='HTTP', Port=80, VpcId=vpc)['TargetGroups'][0]['TargetGroupArn']
elb.create_listener(LoadBalancerArn=alb, Protocol='HTTP', Port=80, DefaultActions=[{{'Type': 'forward', 'TargetGroupArn': http}}])
elb.create_target_group(Name='shop-lambda', TargetType='lambda')
elb.create_target_group(Name='shop-tls', Protocol='TLS', Port=443, VpcId=vpc)
elb.create_target_group(Name='shop-https', Protocol='HTTPS', Port=443, VpcId=vpc)
elb.create_target_group(Name='shop-geneve', Protocol='GENEVE', Port=6081, VpcId=vpc)
other = [{{'Key': '{cluster}', 'Value': 'other'}}, {{'Key': '{service}', 'Value': 'web/gone'}}, {{'Key': '{resource}', 'Value': 'LoadBalancer'}}]
elb.create_load_balancer(Name='other-cluster', Subnets=subnets, Type='network', Tags=other)
elb.create_target_group(Name='other-cluster-tg', Protocol='TCP', Port=30999, VpcId=vpc, Tags=other)
cert = acm.request_certificate(DomainName='front.example.com')['CertificateArn']
tcp = [t for t in elb.describe_target_groups(LoadBalancerArn='{lb}')['TargetGroups']][0]['TargetGroupArn']
elb.create_listener(LoadBalancerArn='{lb}', Protocol='TLS', Port=8443, Certificates=[{{'CertificateArn': cert}}], DefaultActions=[{{'Type': 'forward', 'TargetGroupArn': tcp}}])
"#,
        s0 = moto.subnets[0],
        s1 = moto.subnets[1],
        cluster = aws_tag::CLUSTER,
        service = aws_tag::SERVICE,
        resource = aws_tag::RESOURCE,
        lb = ensured.load_balancer_arn,
    );
    moto.python(&strangers).unwrap();
    let everything = "print(sorted([l['LoadBalancerName'] for l in elb.describe_load_balancers()['LoadBalancers']] + [t['TargetGroupName'] for t in elb.describe_target_groups()['TargetGroups']]))";
    let before = moto.python(everything).unwrap();

    // The orphan goes; the strangers stay.
    let swept = p.sweep(&BTreeSet::from([live.key()])).await.unwrap();
    assert_eq!(
        (swept.load_balancers.len(), swept.target_groups.len()),
        (1, 1),
        "{swept:?}"
    );
    let o = ours(p.client()).await;
    assert_eq!(o.lbs.keys().collect::<Vec<_>>(), [&live.key()]);
    let after = moto.python(everything).unwrap();
    let strangers_left = |listing: &str| -> Vec<String> {
        listing
            .trim_matches(|c| "[]\n ".contains(c))
            .split(", ")
            .map(|s| s.trim_matches('\'').to_string())
            .filter(|n| !n.starts_with("berth-"))
            .collect()
    };
    assert_eq!(strangers_left(&before), strangers_left(&after));
    assert_eq!(strangers_left(&after).len(), 8, "{after}");

    // The Service with a hand-made TLS listener converges: berth's NLB serves the Service's
    // ports, so the listener on a port it does not declare is removed, not failed on.
    let again = p
        .ensure(
            &live,
            &nodes(&moto, 2),
            &IpTargets::new(),
            Some(&ensured.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_eq!(again.load_balancer_arn, ensured.load_balancer_arn);
    assert_eq!(ours(p.client()).await.listeners[&live.key()], vec![80]);
    let quiet = metrics.mutating();
    let steady = p
        .ensure(
            &live,
            &nodes(&moto, 2),
            &IpTargets::new(),
            Some(&ensured.load_balancer_arn),
        )
        .await
        .unwrap();
    assert_eq!((steady.changes, metrics.mutating() - quiet), (0, 0));
    // The listing counted every target group of the region, the strangers' included.
    assert_eq!(metrics.region_target_groups(), 8);
    assert_eq!(metrics.owned(SWEPT_TARGET_GROUP), 2);
}

/// A server that accepts connections and never answers, as `--aws-endpoint-url`: every call
/// of the client the controller builds ends in an error, and so does the sweep's listing.
#[tokio::test]
async fn a_hung_endpoint_ends_in_an_error_not_a_stall() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Holds every connection open without a byte of answer, until the test ends.
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            open.push(conn);
        }
    });
    let loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_credential_types::Credentials::new(
            "testing", "testing", None, None, "test",
        ));
    let timeouts = berth_aws::CallTimeouts {
        connect: Duration::from_millis(500),
        attempt: Duration::from_millis(300),
        operation: Duration::from_secs(2),
    };
    let metrics = std::sync::Arc::new(berth_aws::metrics::AwsMetrics::default());
    let client = SdkElbv2::from_loader(
        loader,
        Some(&url),
        timeouts,
        berth_aws::RateLimits::default(),
        metrics,
    )
    .await;
    let p = NlbProvider::new(
        client,
        ProviderConfig {
            cluster_name: CLUSTER.to_string(),
            default_subnets: vec!["subnet-0000000a".into()],
            quotas: Default::default(),
        },
        Duration::ZERO,
    );
    // The bound is the test's guard against hanging for ever, not a timing assertion.
    let listed = tokio::time::timeout(Duration::from_secs(120), p.list_for_sweep())
        .await
        .expect("the sweep's listing hung on an endpoint that never answers");
    let err = listed.expect_err("a listing from a server that never answers");
    assert!(err.is_retryable(), "{err}");
    let svc = mk_service("web", "front", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let ensured = tokio::time::timeout(
        Duration::from_secs(120),
        p.ensure(&svc, &[], &IpTargets::new(), None),
    )
    .await
    .expect("a reconcile hung on an endpoint that never answers");
    assert!(ensured.is_err());
    held.abort();
}

/// `aws-load-balancer-ssl-cert`, `-ssl-ports` and `-ssl-negotiation-policy`: a TLS listener
/// on the port named, with the certificate and policy, changed in place; a steady state calls
/// nothing.
#[tokio::test]
async fn tls_listeners_terminate_on_the_ports_named() {
    let Some(moto) = start_or_skip(1) else {
        return;
    };
    let cert = moto
        .python("acm = boto3.client('acm', endpoint_url=elb.meta.endpoint_url, region_name='us-east-1', aws_access_key_id='testing', aws_secret_access_key='testing')\nprint(acm.request_certificate(DomainName='front.example.com')['CertificateArn'])")
        .unwrap()
        .trim()
        .to_string();
    let (p, metrics) = provider(&moto);
    let mut http = mk_port(80, Protocol::Tcp, 30080);
    http.name = Some("http".into());
    let mut https = mk_port(443, Protocol::Tcp, 30443);
    https.name = Some("https".into());
    let mut svc = mk_service("web", "front", vec![http, https]);
    svc.annotations
        .insert(ann::AWS_SSL_CERT.into(), cert.clone());
    svc.annotations
        .insert(ann::AWS_SSL_PORTS.into(), "https".into());
    // (moto reports a policy on TCP listeners too; only a TLS listener's is read.)
    let listeners = |arn: &str| -> String {
        moto.python(&format!(
            "print(sorted((l['Port'], l['Protocol'], [c['CertificateArn'] for c in l.get('Certificates', [])], l.get('SslPolicy') if l['Protocol'] == 'TLS' else None) for l in elb.describe_listeners(LoadBalancerArn='{arn}')['Listeners']))"
        ))
        .unwrap()
        .trim()
        .to_string()
    };
    let first = p
        .ensure(&svc, &nodes(&moto, 1), &IpTargets::new(), None)
        .await
        .unwrap();
    let arn = first.load_balancer_arn.clone();
    assert_eq!(
        listeners(&arn),
        format!("[(80, 'TCP', [], None), (443, 'TLS', ['{cert}'], 'ELBSecurityPolicy-2016-08')]")
    );
    let quiet = metrics.mutating();
    let steady = p
        .ensure(&svc, &nodes(&moto, 1), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    assert_eq!((steady.changes, metrics.mutating() - quiet), (0, 0));

    // Another policy: the TLS listener changes in place, nothing else does. (A listener that
    // switches between TCP and TLS is ModifyListener with a new protocol, which moto refuses
    // for TLS; the in-memory ELBv2 covers it.)
    svc.annotations.insert(
        ann::AWS_SSL_NEGOTIATION_POLICY.into(),
        "ELBSecurityPolicy-TLS-1-2-2017-01".into(),
    );
    let changed = p
        .ensure(&svc, &nodes(&moto, 1), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    assert_eq!(
        (changed.load_balancer_arn.as_str(), changed.changes),
        (arn.as_str(), 1)
    );
    assert_eq!(
        listeners(&arn),
        format!("[(80, 'TCP', [], None), (443, 'TLS', ['{cert}'], 'ELBSecurityPolicy-TLS-1-2-2017-01')]")
    );
    let quiet = metrics.mutating();
    let steady = p
        .ensure(&svc, &nodes(&moto, 1), &IpTargets::new(), Some(&arn))
        .await
        .unwrap();
    assert_eq!((steady.changes, metrics.mutating() - quiet), (0, 0));
}

/// Subnets made in moto's EC2 with tags, beside the two untagged ones `moto::start` makes;
/// returns their IDs by label.
fn tagged_subnets(moto: &Moto) -> BTreeMap<String, String> {
    let code = r#"
ec2 = boto3.client('ec2', endpoint_url=elb.meta.endpoint_url, region_name='us-east-1', aws_access_key_id='testing', aws_secret_access_key='testing')
vpc = ec2.describe_subnets(SubnetIds=[SUBNET0])['Subnets'][0]['VpcId']
def mk(label, cidr, zone, tags):
    sid = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)['Subnet']['SubnetId']
    ec2.create_tags(Resources=[sid], Tags=[{'Key': k, 'Value': v} for k, v in tags])
    return label, sid
out = dict([
    mk('ours-a', '10.0.10.0/24', 'us-east-1a', [('kubernetes.io/role/internal-elb', '1'), ('kubernetes.io/cluster/lab', 'owned')]),
    mk('untagged-a', '10.0.9.0/24', 'us-east-1a', [('kubernetes.io/role/internal-elb', '1')]),
    mk('shared-b', '10.0.12.0/24', 'us-east-1b', [('kubernetes.io/role/internal-elb', ''), ('kubernetes.io/cluster/lab', 'shared')]),
    mk('stranger-c', '10.0.13.0/24', 'us-east-1c', [('kubernetes.io/role/internal-elb', '1'), ('kubernetes.io/cluster/other', 'owned')]),
    mk('stranger-public-b', '10.0.15.0/24', 'us-east-1b', [('kubernetes.io/role/elb', '1'), ('kubernetes.io/cluster/other', 'owned')]),
    mk('public-a', '10.0.14.0/24', 'us-east-1a', [('kubernetes.io/role/elb', '1'), ('kubernetes.io/cluster/lab', 'owned')]),
])
print(json.dumps(out))
"#
    .replace("SUBNET0", &format!("{:?}", moto.subnets[0]));
    serde_json::from_str(&moto.python(&code).unwrap()).unwrap()
}

async fn subnets_of(p: &NlbProvider<SdkElbv2>, arn: String) -> BTreeSet<String> {
    p.client()
        .describe_load_balancers(LbQuery::Arns(vec![arn]))
        .await
        .unwrap()
        .items[0]
        .subnets
        .clone()
}

#[tokio::test]
async fn subnets_are_found_by_their_tags_one_per_zone_never_a_strangers() {
    let Some(moto) = start_or_skip(2) else {
        return;
    };
    let ids = tagged_subnets(&moto);
    let (client, metrics) = moto::client(&moto);
    let ec2 = moto::ec2(&moto, metrics.clone());
    // No --aws-subnets: every Service without the annotation is discovered.
    let config = ProviderConfig {
        default_subnets: Vec::new(),
        ..config(&moto)
    };
    let p = NlbProvider::new(client, config, Duration::from_secs(600))
        .with_metrics(metrics.clone())
        .with_subnet_source(std::sync::Arc::new(ec2));

    let internal = mk_service("web", "internal", vec![mk_port(80, Protocol::Tcp, 30080)]);
    let ensured = p
        .ensure(&internal, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap();
    assert_eq!(
        subnets_of(&p, ensured.load_balancer_arn.clone()).await,
        BTreeSet::from([ids["ours-a"].clone(), ids["shared-b"].clone()])
    );
    let why = ensured.discovered_subnets.unwrap();
    assert!(
        why.contains("tagged kubernetes.io/cluster/lab=owned"),
        "{why}"
    );
    assert!(
        why.contains(&format!(
            "{} (tagged for another cluster: other)",
            ids["stranger-c"]
        )),
        "{why}"
    );
    assert!(
        why.contains(&format!(
            "{} ({} already chosen in us-east-1a)",
            ids["untagged-a"], ids["ours-a"]
        )),
        "{why}"
    );

    // Internet-facing reads the other role tag.
    let mut public = mk_service("web", "public", vec![mk_port(80, Protocol::Tcp, 30081)]);
    public.annotations.insert(
        ann::AWS_LOAD_BALANCER_SCHEME.into(),
        "internet-facing".into(),
    );
    let ensured = p
        .ensure(&public, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap();
    assert_eq!(
        subnets_of(&p, ensured.load_balancer_arn).await,
        BTreeSet::from([ids["public-a"].clone()])
    );

    // One DescribeSubnets per scheme: the next ensure reuses the choice.
    let calls = metrics.count("DescribeSubnets", "success");
    p.forget(&internal.key());
    p.ensure(&internal, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap();
    assert_eq!(metrics.count("DescribeSubnets", "success"), calls);

    // The annotation still wins over discovery.
    let mut named = mk_service("web", "named", vec![mk_port(80, Protocol::Tcp, 30082)]);
    named.annotations.insert(
        ann::AWS_LOAD_BALANCER_SUBNETS.into(),
        moto.subnets[1].clone(),
    );
    let ensured = p
        .ensure(&named, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap();
    assert_eq!(ensured.discovered_subnets, None);
    assert_eq!(
        subnets_of(&p, ensured.load_balancer_arn).await,
        BTreeSet::from([moto.subnets[1].clone()])
    );

    // Another cluster in the same account finds only what is its own or nobody's.
    let (client, metrics) = moto::client(&moto);
    let theirs = NlbProvider::new(
        client,
        ProviderConfig {
            cluster_name: "elsewhere".into(),
            default_subnets: Vec::new(),
            quotas: Default::default(),
        },
        Duration::ZERO,
    )
    .with_subnet_source(std::sync::Arc::new(moto::ec2(&moto, metrics)));
    let err = theirs
        .ensure(&public, &nodes(&moto, 2), &IpTargets::new(), None)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("no subnet is tagged kubernetes.io/role/elb (1 or empty) for an internet-facing load balancer"),
        "{text}"
    );
    assert!(err.is_retryable());
}
