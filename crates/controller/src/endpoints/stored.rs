//! berth's own Endpoints and EndpointSlices as the cache keeps them. There is one of each per
//! Service, so the whole objects would be most of the controller's memory; the cache keeps only
//! what planning a sync reads, in compact form, and rebuilds a slice for the planner on demand.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use berth_endpoints::{comparable_subsets, ANNOTATION_OVER_CAPACITY};
use k8s_openapi::api::core::v1::{EndpointSubset, Endpoints, ObjectReference};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::intern::{Interner, Pair};

type Pairs = Box<[(Box<str>, Box<str>)]>;

fn pairs(map: Option<BTreeMap<String, String>>) -> Pairs {
    map.into_iter()
        .flatten()
        .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
        .collect()
}

fn map(pairs: &Pairs) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

/// The metadata a replace sends back. The fields the API server keeps from the stored object on
/// an update (uid, creationTimestamp, generation, deletion and managed fields) are left out, and
/// labels and annotations are flat pairs: a map's first node has room for eleven.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredMeta {
    name: Option<Box<str>>,
    namespace: Option<Box<str>>,
    generate_name: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    /// Sorted by key, as they came from a map.
    labels: Pairs,
    annotations: Pairs,
    owner_references: Box<[OwnerReference]>,
    finalizers: Box<[Box<str>]>,
}

impl From<ObjectMeta> for StoredMeta {
    fn from(meta: ObjectMeta) -> Self {
        StoredMeta {
            name: boxed(meta.name),
            namespace: boxed(meta.namespace),
            generate_name: boxed(meta.generate_name),
            resource_version: boxed(meta.resource_version),
            labels: pairs(meta.labels),
            annotations: pairs(meta.annotations),
            owner_references: meta.owner_references.unwrap_or_default().into(),
            finalizers: meta
                .finalizers
                .into_iter()
                .flatten()
                .map(String::into_boxed_str)
                .collect(),
        }
    }
}

impl StoredMeta {
    pub(crate) fn to_meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: unboxed(self.name.as_deref()),
            namespace: unboxed(self.namespace.as_deref()),
            generate_name: unboxed(self.generate_name.as_deref()),
            resource_version: unboxed(self.resource_version.as_deref()),
            labels: map(&self.labels),
            annotations: map(&self.annotations),
            owner_references: (!self.owner_references.is_empty())
                .then(|| self.owner_references.to_vec()),
            finalizers: (!self.finalizers.is_empty())
                .then(|| self.finalizers.iter().map(|f| f.to_string()).collect()),
            ..ObjectMeta::default()
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    fn labels_equal(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let labels = labels.into_iter().flatten();
        self.labels.len() == labels.clone().count()
            && self
                .labels
                .iter()
                .zip(labels)
                .all(|((k, v), (k2, v2))| **k == **k2 && **v == **v2)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations
            .iter()
            .find(|(k, _)| **k == *key)
            .map(|(_, v)| &**v)
    }
}

/// Feeds serialized JSON straight into a hasher, so a fingerprint needs no text buffer.
struct HashWriter<'h>(&'h mut dyn Hasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Subsets as `berth-endpoints` compares them, so that a fingerprint match means no update.
fn subsets_fingerprint(keys: &RandomState, subsets: Option<&[EndpointSubset]>) -> u64 {
    let subsets = comparable_subsets(subsets);
    let mut hasher = keys.build_hasher();
    // Serializing plain data into a sink that cannot fail does not fail.
    let _ = serde_json::to_writer(HashWriter(&mut hasher), &subsets);
    hasher.finish()
}

/// An Endpoints object: its metadata (a replace sends it back) and a fingerprint of its subsets.
/// The hash keys are random per object, so no one can craft content that looks unchanged.
#[derive(Debug, Clone)]
pub(crate) struct StoredEndpoints {
    pub(crate) metadata: StoredMeta,
    keys: RandomState,
    subsets: u64,
}

impl From<Endpoints> for StoredEndpoints {
    fn from(endpoints: Endpoints) -> Self {
        let metadata = StoredMeta::from(endpoints.metadata);
        let keys = RandomState::new();
        let subsets = subsets_fingerprint(&keys, endpoints.subsets.as_deref());
        StoredEndpoints {
            metadata,
            keys,
            subsets,
        }
    }
}

impl StoredEndpoints {
    /// Whether `desired` differs from this object in what berth owns: the answer of
    /// `berth_endpoints::endpoints_need_update` for the whole object.
    pub(crate) fn needs_update(&self, desired: &Endpoints) -> bool {
        let over_capacity = desired
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_OVER_CAPACITY));
        !self.metadata.labels_equal(desired.metadata.labels.as_ref())
            || self.metadata.annotation(ANNOTATION_OVER_CAPACITY)
                != over_capacity.map(String::as_str)
            || self.subsets != subsets_fingerprint(&self.keys, desired.subsets.as_deref())
    }
}

/// An address as written: IPs in their canonical text take no allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Address {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Text(Box<str>),
}

impl Address {
    pub(crate) fn new(text: &str) -> Self {
        match text.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) if ip.to_string() == text => Address::V4(ip),
            Ok(IpAddr::V6(ip)) if ip.to_string() == text => Address::V6(ip),
            _ => Address::Text(Box::from(text)),
        }
    }

    pub(crate) fn text(&self) -> String {
        match self {
            Address::V4(ip) => ip.to_string(),
            Address::V6(ip) => ip.to_string(),
            Address::Text(t) => t.to_string(),
        }
    }
}

fn boxed(s: Option<String>) -> Option<Box<str>> {
    s.map(String::into_boxed_str)
}

fn unboxed(s: Option<&str>) -> Option<String> {
    s.map(|s| s.to_string())
}

/// A uid: a UUID as its 16 bytes, anything else as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Uid {
    Uuid([u8; 16]),
    Text(Box<str>),
}

const UUID_DASHES: [usize; 4] = [8, 13, 18, 23];

impl Uid {
    pub(crate) fn new(text: &str) -> Self {
        let hex: String = text.chars().filter(|c| *c != '-').collect();
        let mut bytes = [0u8; 16];
        let parsed = hex.len() == 32
            && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && bytes.iter_mut().enumerate().all(|(i, b)| {
                hex.get(2 * i..2 * i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .map(|v| *b = v)
                    .is_some()
            });
        let uid = Uid::Uuid(bytes);
        if parsed && uid.text() == text {
            uid
        } else {
            Uid::Text(Box::from(text))
        }
    }

    pub(crate) fn text(&self) -> String {
        match self {
            Uid::Uuid(bytes) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut out = String::with_capacity(36);
                for b in bytes {
                    if UUID_DASHES.contains(&out.len()) {
                        out.push('-');
                    }
                    out.push(char::from(HEX[usize::from(b >> 4)]));
                    out.push(char::from(HEX[usize::from(b & 15)]));
                }
                out
            }
            Uid::Text(t) => t.to_string(),
        }
    }
}

/// An endpoint's reference to its pod. Its resourceVersion is left out: the planner ignores it,
/// and a slice rebuilt for rewriting drops it anyway. Kind and namespace are the same for most
/// of a slice's endpoints, so they are one shared pair.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    kind_namespace: Arc<Pair>,
    name: Option<Box<str>>,
    uid: Option<Uid>,
}

/// Fields berth does not write, or writes for few pods: one pointer when unset.
#[derive(Debug, Clone, Default, PartialEq)]
struct Rare {
    /// Addresses after the first: an endpoint has one per family, and nearly always one family.
    more_addresses: Box<[Address]>,
    hostname: Option<String>,
    ref_api_version: Option<String>,
    ref_field_path: Option<String>,
    deprecated_topology: Option<BTreeMap<String, String>>,
    hints: Option<EndpointHints>,
}

/// 96 bytes: a slice lists up to 100 of them, and there is one per pod behind a Service.
#[derive(Debug, Clone, PartialEq)]
struct StoredEndpoint {
    address: Option<Address>,
    conditions: Option<EndpointConditions>,
    /// Node name and zone, shared with the node's other endpoints.
    node_zone: Arc<Pair>,
    target_ref: Option<Reference>,
    rare: Option<Box<Rare>>,
}

impl StoredEndpoint {
    fn new(endpoint: Endpoint, interner: &mut Interner) -> Self {
        // Destructured so that a new Endpoint field cannot be forgotten here.
        let Endpoint {
            addresses,
            conditions,
            deprecated_topology,
            hints,
            hostname,
            node_name,
            target_ref,
            zone,
        } = endpoint;
        let mut addresses = addresses.iter().map(|a| Address::new(a));
        let address = addresses.next();
        let mut rare = Rare {
            more_addresses: addresses.collect(),
            hostname,
            deprecated_topology,
            hints,
            ..Rare::default()
        };
        let target_ref = target_ref.map(|r| {
            rare.ref_api_version = r.api_version;
            rare.ref_field_path = r.field_path;
            Reference {
                kind_namespace: interner.intern_pair(r.kind.as_deref(), r.namespace.as_deref()),
                name: boxed(r.name),
                uid: r.uid.as_deref().map(Uid::new),
            }
        });
        StoredEndpoint {
            address,
            conditions,
            node_zone: interner.intern_pair(node_name.as_deref(), zone.as_deref()),
            target_ref,
            rare: Some(Box::new(rare)).filter(|r| **r != Rare::default()),
        }
    }

    fn to_endpoint(&self) -> Endpoint {
        let rare = self.rare.as_deref().cloned().unwrap_or_default();
        let shared = |s: Option<&Arc<str>>| s.map(|s| s.to_string());
        let (node_name, zone) = &*self.node_zone;
        Endpoint {
            addresses: self
                .address
                .iter()
                .chain(rare.more_addresses.iter())
                .map(Address::text)
                .collect(),
            conditions: self.conditions.clone(),
            deprecated_topology: rare.deprecated_topology,
            hints: rare.hints,
            hostname: rare.hostname,
            node_name: shared(node_name.as_ref()),
            target_ref: self.target_ref.as_ref().map(|r| ObjectReference {
                api_version: rare.ref_api_version,
                field_path: rare.ref_field_path,
                kind: shared(r.kind_namespace.0.as_ref()),
                name: unboxed(r.name.as_deref()),
                namespace: shared(r.kind_namespace.1.as_ref()),
                resource_version: None,
                uid: r.uid.as_ref().map(Uid::text),
            }),
            zone: shared(zone.as_ref()),
        }
    }
}

/// An EndpointSlice berth manages, with its endpoints in compact form.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredSlice {
    pub(crate) metadata: StoredMeta,
    address_type: Box<str>,
    ports: Option<Vec<EndpointPort>>,
    endpoints: Box<[StoredEndpoint]>,
}

impl StoredSlice {
    pub(crate) fn new(slice: EndpointSlice, interner: &mut Interner) -> Self {
        let EndpointSlice {
            address_type,
            endpoints,
            metadata,
            ports,
        } = slice;
        StoredSlice {
            metadata: StoredMeta::from(metadata),
            address_type: address_type.into_boxed_str(),
            ports,
            endpoints: endpoints
                .into_iter()
                .map(|e| StoredEndpoint::new(e, interner))
                .collect(),
        }
    }
}

impl StoredSlice {
    /// The slice as the planner reads it; pod resourceVersions are absent.
    pub(crate) fn to_slice(&self) -> EndpointSlice {
        EndpointSlice {
            address_type: self.address_type.to_string(),
            endpoints: self
                .endpoints
                .iter()
                .map(StoredEndpoint::to_endpoint)
                .collect(),
            metadata: self.metadata.to_meta(),
            ports: self.ports.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_endpoints::endpoints_need_update;
    use serde_json::json;

    fn mk_endpoints(value: serde_json::Value) -> Endpoints {
        serde_json::from_value(value).unwrap()
    }

    fn base() -> serde_json::Value {
        json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "5",
                         "labels": {"app": "web"},
                         "annotations": {"someone/else": "x"},
                         "managedFields": [{"manager": "berth"}]},
            "subsets": [{
                "addresses": [{"ip": "10.244.1.5", "nodeName": "n1",
                               "targetRef": {"kind": "Pod", "name": "a", "namespace": "shop",
                                             "uid": "u-a", "resourceVersion": "3"}}],
                "notReadyAddresses": [{"ip": "10.244.1.6"}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
            }]
        })
    }

    #[test]
    fn an_endpoint_stays_small() {
        // One per pod behind a Service: 100,000 pods keep this many of them.
        assert!(std::mem::size_of::<StoredEndpoint>() <= 96);
    }

    #[test]
    fn endpoints_need_an_update_exactly_when_the_pure_check_says_so() {
        let existing = mk_endpoints(base());
        let stored = StoredEndpoints::from(existing.clone());
        let variants = [
            base(),
            {
                let mut v = base();
                v["subsets"][0]["addresses"][0]["targetRef"]["resourceVersion"] = json!("9");
                v
            },
            {
                let mut v = base();
                v["metadata"]["annotations"] = json!({"other": "y"});
                v["metadata"]["resourceVersion"] = json!("77");
                v
            },
            {
                let mut v = base();
                v["subsets"][0]["addresses"][0]["ip"] = json!("10.244.1.7");
                v
            },
            {
                let mut v = base();
                v["subsets"][0]["notReadyAddresses"] = json!([]);
                v
            },
            {
                let mut v = base();
                v["subsets"][0]["ports"][0]["port"] = json!(8081);
                v
            },
            {
                let mut v = base();
                v["metadata"]["labels"] = json!({"app": "api"});
                v
            },
            {
                let mut v = base();
                v["metadata"]["labels"] = serde_json::Value::Null;
                v
            },
            {
                let mut v = base();
                v["metadata"]["annotations"] = json!({ANNOTATION_OVER_CAPACITY: "truncated"});
                v
            },
            {
                let mut v = base();
                v["subsets"] = serde_json::Value::Null;
                v
            },
        ];
        for variant in variants {
            let desired = mk_endpoints(variant);
            assert_eq!(
                stored.needs_update(&desired),
                endpoints_need_update(&existing, &desired),
                "{desired:?}"
            );
        }
        // No subsets and empty subsets are the same, as the pure check has them.
        let empty = mk_endpoints(json!({"metadata": {"name": "web"}}));
        let mut with_empty = empty.clone();
        with_empty.subsets = Some(Vec::new());
        assert!(!StoredEndpoints::from(empty).needs_update(&with_empty));
    }

    #[test]
    fn a_slice_comes_back_as_it_was_less_pod_versions_and_managed_fields() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "resourceVersion": "12",
                         "generateName": "web-", "uid": "x", "generation": 3,
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "finalizers": ["someone/else"],
                         "labels": {"kubernetes.io/service-name": "web"},
                         "annotations": {"a": "b"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service",
                                              "name": "web", "uid": "s-1"}],
                         "managedFields": [{"manager": "berth"}]},
            "addressType": "IPv6",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["fd00::5"], "conditions": {"ready": true, "serving": true,
                                                          "terminating": false},
                 "hostname": "a", "nodeName": "n1", "zone": "z1",
                 "targetRef": {"kind": "Pod", "name": "a", "namespace": "shop", "uid": "u-a",
                               "resourceVersion": "4", "apiVersion": "v1",
                               "fieldPath": "spec"}},
                {"addresses": ["FD00:0:0::6", "not an address"],
                 "deprecatedTopology": {"k": "v"},
                 "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": []}
            ]
        }))
        .unwrap();
        let mut want = slice.clone();
        want.metadata.managed_fields = None;
        want.metadata.uid = None;
        want.metadata.creation_timestamp = None;
        want.metadata.generation = None;
        if let Some(r) = want.endpoints[0].target_ref.as_mut() {
            r.resource_version = None;
        }
        assert_eq!(
            StoredSlice::new(slice, &mut Interner::default()).to_slice(),
            want
        );
    }

    #[test]
    fn uids_come_back_as_they_were() {
        let uuid = "0f8e2c1a-9b3d-4e5f-a617-28394a5b6c7d";
        assert!(matches!(Uid::new(uuid), Uid::Uuid(_)));
        for text in [
            uuid,
            "0F8E2C1A-9B3D-4E5F-A617-28394A5B6C7D",
            "u-a",
            "",
            "0f8e2c1a9b3d4e5fa61728394a5b6c7d",
        ] {
            assert_eq!(Uid::new(text).text(), text);
        }
    }

    #[test]
    fn canonical_addresses_are_stored_without_text() {
        assert_eq!(
            Address::new("10.0.0.1"),
            Address::V4(Ipv4Addr::new(10, 0, 0, 1))
        );
        assert!(matches!(Address::new("fd00::1"), Address::V6(_)));
        for text in ["010.0.0.1", "FD00::1", "fd00:0::1", "x"] {
            assert_eq!(Address::new(text).text(), text);
        }
    }
}
