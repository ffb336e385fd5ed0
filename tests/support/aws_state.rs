//! The `aws-nlb` class's process tests' shared ground: the Nodes they start from, and the final
//! state: what moto holds (read with boto3, not through berth's own client) against what the
//! live Services in the API server call for.

use std::collections::{BTreeMap, BTreeSet};

use berth_api::names::{annotation as ann, aws_tag, finalizer};
use berth_testing::moto::Moto;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::json;

#[derive(Debug, Deserialize)]
pub struct MotoState {
    lbs: Vec<MotoLb>,
    tgs: Vec<MotoTg>,
}

#[derive(Debug, Deserialize)]
pub struct MotoLb {
    name: String,
    scheme: String,
    tags: BTreeMap<String, String>,
    listeners: Vec<MotoListener>,
}

#[derive(Debug, Deserialize)]
pub struct MotoListener {
    port: u16,
    protocol: String,
    tg: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct MotoTg {
    arn: String,
    name: String,
    port: u16,
    protocol: String,
    hc_protocol: String,
    hc_port: String,
    tags: BTreeMap<String, String>,
    targets: BTreeSet<String>,
}

/// Every load balancer and target group with its tags, listeners and targets. A resource
/// deleted while the dump runs is left out (it is gone); any other error fails the dump.
const DUMP: &str = r#"
import botocore
def every(op, key, **kw):
    out = []
    for page in elb.get_paginator(op).paginate(**kw):
        out += page[key]
    return out
def unless_gone(call, **kw):
    try:
        return call(**kw)
    except botocore.exceptions.ClientError as e:
        if e.response['Error']['Code'] in ('LoadBalancerNotFound', 'TargetGroupNotFound'):
            return None
        raise
lbs = every('describe_load_balancers', 'LoadBalancers')
tgs = every('describe_target_groups', 'TargetGroups')
arns = [l['LoadBalancerArn'] for l in lbs] + [t['TargetGroupArn'] for t in tgs]
tags = {}
for i in range(0, len(arns), 20):
    for d in elb.describe_tags(ResourceArns=arns[i:i + 20])['TagDescriptions']:
        tags[d['ResourceArn']] = {t['Key']: t['Value'] for t in d.get('Tags', [])}
out = {'lbs': [], 'tgs': []}
for l in lbs:
    ls = unless_gone(elb.describe_listeners, LoadBalancerArn=l['LoadBalancerArn'])
    if ls is None:
        continue
    out['lbs'].append({
        'name': l['LoadBalancerName'], 'scheme': l['Scheme'],
        'tags': tags.get(l['LoadBalancerArn'], {}),
        'listeners': [{'port': x['Port'], 'protocol': x['Protocol'],
                       'tg': (x.get('DefaultActions') or [{}])[0].get('TargetGroupArn')}
                      for x in ls['Listeners']]})
for t in tgs:
    th = unless_gone(elb.describe_target_health, TargetGroupArn=t['TargetGroupArn'])
    if th is None:
        continue
    out['tgs'].append({
        'arn': t['TargetGroupArn'], 'name': t['TargetGroupName'], 'port': t['Port'],
        'protocol': t['Protocol'], 'hc_protocol': t.get('HealthCheckProtocol', ''),
        'hc_port': str(t.get('HealthCheckPort', '')), 'tags': tags.get(t['TargetGroupArn'], {}),
        'targets': ['%s:%s' % (d['Target']['Id'], d['Target']['Port'])
                    for d in th['TargetHealthDescriptions']]})
print(json.dumps(out))
"#;

pub fn moto_state(moto: &Moto) -> Result<MotoState, String> {
    // The last line of a Python traceback says what failed.
    let text = moto
        .python(DUMP)
        .map_err(|e| e.trim().lines().last().unwrap_or_default().to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))
}

/// What a live Service must have in AWS, from the Service as the API server holds it.
#[derive(Debug)]
pub struct Expected {
    scheme: &'static str,
    team: Option<String>,
    /// Per listener port: (protocol, node port).
    ports: BTreeMap<u16, (String, u16)>,
    /// `None`: TCP on the traffic port; `Some(p)`: HTTP on the health-check node port.
    health_check_node_port: Option<u16>,
}

fn expected(svc: &Service) -> Result<Expected, String> {
    let spec = svc.spec.clone().unwrap_or_default();
    let mut ports = BTreeMap::new();
    for p in spec.ports.unwrap_or_default() {
        let node_port = p
            .node_port
            .ok_or_else(|| format!("{}: port {} has no node port yet", svc.name_any(), p.port))?;
        ports.insert(
            p.port as u16,
            (p.protocol.unwrap_or_else(|| "TCP".into()), node_port as u16),
        );
    }
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = if local {
        Some(spec.health_check_node_port.ok_or_else(|| {
            format!(
                "{}: Local without a healthCheckNodePort yet",
                svc.name_any()
            )
        })? as u16)
    } else {
        None
    };
    let scheme = match svc
        .annotations()
        .get(ann::AWS_LOAD_BALANCER_SCHEME)
        .map(String::as_str)
    {
        Some("internet-facing") => "internet-facing",
        _ => "internal",
    };
    let team = svc
        .annotations()
        .get(ann::AWS_ADDITIONAL_RESOURCE_TAGS)
        .and_then(|t| t.strip_prefix("team="))
        .map(str::to_string);
    Ok(Expected {
        scheme,
        team,
        ports,
        health_check_node_port,
    })
}

/// Counts of what moto holds once it is right.
#[derive(Debug, Default)]
pub struct Found {
    pub load_balancers: usize,
    pub target_groups: usize,
    pub listeners: usize,
    pub targets: usize,
}

/// Every rule of the final state, or the first one broken. `gone` are the names of deleted
/// Services (namespace `default`); `instances` the targets every port must have.
pub fn check_final(
    cluster: &str,
    services: &[Service],
    gone: &BTreeSet<String>,
    state: &MotoState,
    instances: &[String],
) -> Result<Found, String> {
    let mut live = BTreeMap::new();
    for svc in services {
        let key = format!("default/{}", svc.name_any());
        let short = svc.name_any();
        if gone.contains(&short) {
            return Err(format!(
                "{key} was deleted but is still in the API ({:?} finalizers)",
                svc.finalizers()
            ));
        }
        if !svc
            .finalizers()
            .iter()
            .any(|f| f == finalizer::LOAD_BALANCER)
        {
            return Err(format!("{key} lacks the finalizer"));
        }
        let hostname = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.hostname.clone());
        live.insert(key, (expected(svc)?, hostname));
    }
    // No duplicate names (moto would take them; AWS would not).
    let mut names = BTreeSet::new();
    for n in state.lbs.iter().map(|l| &l.name) {
        if !names.insert(n) {
            return Err(format!("two load balancers named {n}"));
        }
    }
    let mut names = BTreeSet::new();
    for n in state.tgs.iter().map(|t| &t.name) {
        if !names.insert(n) {
            return Err(format!("two target groups named {n}"));
        }
    }
    let owner = |tags: &BTreeMap<String, String>| -> Result<String, String> {
        if tags.get(aws_tag::CLUSTER).map(String::as_str) != Some(cluster) {
            return Err(format!("a resource without this cluster's tag: {tags:?}"));
        }
        let service = tags
            .get(aws_tag::SERVICE)
            .cloned()
            .ok_or_else(|| format!("a resource without a Service tag: {tags:?}"))?;
        if !live.contains_key(&service) {
            return Err(format!("a resource of {service}, which is gone: {tags:?}"));
        }
        Ok(service)
    };
    let mut found = Found::default();
    let mut lb_of: BTreeMap<String, &MotoLb> = BTreeMap::new();
    for lb in &state.lbs {
        let service = owner(&lb.tags).map_err(|e| format!("load balancer {}: {e}", lb.name))?;
        if let Some(other) = lb_of.insert(service.clone(), lb) {
            return Err(format!(
                "{service} has two load balancers: {} and {}",
                other.name, lb.name
            ));
        }
    }
    let mut tgs_of: BTreeMap<String, Vec<&MotoTg>> = BTreeMap::new();
    for tg in &state.tgs {
        let service = owner(&tg.tags).map_err(|e| format!("target group {}: {e}", tg.name))?;
        tgs_of.entry(service).or_default().push(tg);
    }
    for (key, (want, hostname)) in &live {
        let lb = lb_of
            .get(key)
            .ok_or_else(|| format!("{key} has no load balancer"))?;
        if lb.scheme != want.scheme {
            return Err(format!(
                "{key}: scheme {} instead of {}",
                lb.scheme, want.scheme
            ));
        }
        if lb.tags.get("team") != want.team.as_ref() {
            return Err(format!(
                "{key}: team tag {:?} instead of {:?}",
                lb.tags.get("team"),
                want.team
            ));
        }
        if hostname.is_none() {
            return Err(format!("{key} has no hostname in its status"));
        }
        let tgs = tgs_of.get(key).cloned().unwrap_or_default();
        if tgs.len() != want.ports.len() {
            let names: Vec<_> = tgs.iter().map(|t| (&t.name, t.port)).collect();
            return Err(format!(
                "{key}: target groups {names:?} for ports {:?}",
                want.ports
            ));
        }
        let listeners: BTreeMap<u16, &MotoListener> =
            lb.listeners.iter().map(|l| (l.port, l)).collect();
        if listeners.len() != lb.listeners.len()
            || listeners.keys().collect::<Vec<_>>() != want.ports.keys().collect::<Vec<_>>()
        {
            let ports: Vec<u16> = lb.listeners.iter().map(|l| l.port).collect();
            return Err(format!(
                "{key}: listeners on {ports:?} for ports {:?}",
                want.ports
            ));
        }
        for (port, (protocol, node_port)) in &want.ports {
            let listener = listeners[port];
            if &listener.protocol != protocol {
                return Err(format!("{key}: listener {port} is {}", listener.protocol));
            }
            let tg = tgs
                .iter()
                .find(|t| Some(&t.arn) == listener.tg.as_ref())
                .ok_or_else(|| {
                    format!("{key}: listener {port} forwards to no target group of its own")
                })?;
            if tg.port != *node_port || &tg.protocol != protocol {
                return Err(format!(
                    "{key}: listener {port} forwards to {} {}:{} instead of {protocol}:{node_port}",
                    tg.name, tg.protocol, tg.port
                ));
            }
            let (hc_protocol, hc_port) = match want.health_check_node_port {
                Some(p) => ("HTTP", p.to_string()),
                None => ("TCP", "traffic-port".to_string()),
            };
            if tg.hc_protocol != hc_protocol || tg.hc_port != hc_port {
                return Err(format!(
                    "{key}: target group {} checks {} on {} instead of {hc_protocol} on {hc_port}",
                    tg.name, tg.hc_protocol, tg.hc_port
                ));
            }
            let targets: BTreeSet<String> = instances
                .iter()
                .map(|i| format!("{i}:{node_port}"))
                .collect();
            if tg.targets != targets {
                return Err(format!(
                    "{key}: target group {} has targets {:?}",
                    tg.name, tg.targets
                ));
            }
            found.targets += tg.targets.len();
        }
        found.load_balancers += 1;
        found.target_groups += tgs.len();
        found.listeners += lb.listeners.len();
    }
    Ok(found)
}

/// A Ready Node `node-<i>` for each of moto's instances, its `providerID` naming the instance.
pub async fn create_nodes(client: &Client, moto: &Moto) {
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, id) in moto.instances.iter().enumerate() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{i}")},
            "spec": {"providerID": format!("aws:///us-east-1a/{id}")},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        nodes
            .patch_status(
                &format!("node-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .unwrap();
    }
}
