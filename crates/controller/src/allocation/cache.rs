//! The cached objects of one watched kind, and what the loop keeps of a Service.

use std::collections::BTreeMap;

use berth_ipam::ServiceKey;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher;

/// A watched kind's objects and its relist buffer.
pub(crate) struct Cache<K> {
    pub(crate) objects: BTreeMap<String, K>,
    buffer: Option<BTreeMap<String, K>>,
    pub(crate) synced: bool,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            buffer: None,
            synced: false,
        }
    }
}

pub(crate) fn name_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

impl<K: kube::Resource> Cache<K> {
    /// Applies a watch event; true when the set of objects changed.
    pub(crate) fn observe(&mut self, event: watcher::Event<K>) -> bool {
        match event {
            watcher::Event::Apply(o) => {
                self.objects.insert(name_of(&o), o);
                true
            }
            watcher::Event::Delete(o) => self.objects.remove(&name_of(&o)).is_some(),
            watcher::Event::Init => {
                self.buffer = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(o) => {
                self.buffer
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name_of(&o), o);
                false
            }
            watcher::Event::InitDone => {
                self.objects = self.buffer.take().unwrap_or_default();
                self.synced = true;
                true
            }
        }
    }

    /// [`Cache::observe`], where an update counts as a change only when `differs(old, new)`: the
    /// loop's own status writes come back as updates, and must not set every Service deciding
    /// again.
    pub(crate) fn observe_with(
        &mut self,
        event: watcher::Event<K>,
        differs: impl Fn(&K, &K) -> bool,
    ) -> bool {
        match event {
            watcher::Event::Apply(o) => {
                let name = name_of(&o);
                let changed = self.objects.get(&name).is_none_or(|old| differs(old, &o));
                self.objects.insert(name, o);
                changed
            }
            other => self.observe(other),
        }
    }
}

/// What the loop keeps of a Service: managedFields are most of a written object's size and
/// nothing here reads them. Lists are decoded by doubling from four slots, so a one-port
/// Service would keep room for four: each is cut to its length.
pub(crate) fn trim(mut svc: Service) -> Service {
    fn fit<T>(v: &mut Option<Vec<T>>) {
        if let Some(v) = v {
            v.shrink_to_fit();
        }
    }
    svc.metadata.managed_fields = None;
    fit(&mut svc.metadata.finalizers);
    fit(&mut svc.metadata.owner_references);
    if let Some(spec) = &mut svc.spec {
        fit(&mut spec.ports);
        fit(&mut spec.cluster_ips);
        fit(&mut spec.external_ips);
        fit(&mut spec.ip_families);
        fit(&mut spec.load_balancer_source_ranges);
    }
    if let Some(status) = &mut svc.status {
        fit(&mut status.conditions);
        if let Some(lb) = &mut status.load_balancer {
            fit(&mut lb.ingress);
            for ingress in lb.ingress.iter_mut().flatten() {
                fit(&mut ingress.ports);
            }
        }
    }
    svc
}

pub(crate) fn key_of(s: &Service) -> ServiceKey {
    ServiceKey::new(
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::IPPool;
    use serde_json::json;

    fn mk_pool(addresses: &str, assigned: u64) -> IPPool {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "p"},
            "spec": {"addresses": [addresses]},
            "status": {"assignedIPv4": assigned}
        }))
        .unwrap()
    }

    #[test]
    fn trim_drops_managed_fields_and_spare_room_only() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "finalizers": ["a"],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.10"],
                "ipFamilies": ["IPv4"], "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP",
                "ports": [{"port": 80, "protocol": "TCP"}]}]},
                "conditions": [{"type": "a", "status": "True", "reason": "R", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        let mut want = svc.clone();
        want.metadata.managed_fields = None;
        let trimmed = trim(svc);
        assert_eq!(trimmed, want);
        let spec = trimmed.spec.as_ref().unwrap();
        let status = trimmed.status.as_ref().unwrap();
        let ingress = status
            .load_balancer
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap();
        let fitted = [
            spec.ports.as_ref().map(|v| (v.len(), v.capacity())),
            spec.cluster_ips.as_ref().map(|v| (v.len(), v.capacity())),
            spec.ip_families.as_ref().map(|v| (v.len(), v.capacity())),
            status.conditions.as_ref().map(|v| (v.len(), v.capacity())),
            Some((ingress.len(), ingress.capacity())),
            ingress[0].ports.as_ref().map(|v| (v.len(), v.capacity())),
        ];
        assert!(
            fitted.iter().all(|f| matches!(f, Some((1, 1)))),
            "{fitted:?}"
        );
    }

    #[test]
    fn only_relevant_updates_count_as_changes() {
        let mut cache = Cache::<IPPool>::default();
        let spec_differs = |a: &IPPool, b: &IPPool| a.spec != b.spec;
        assert!(!cache.observe_with(watcher::Event::Init, spec_differs));
        assert!(!cache.observe_with(
            watcher::Event::InitApply(mk_pool("198.18.0.0/24", 0)),
            spec_differs
        ));
        assert!(cache.observe_with(watcher::Event::InitDone, spec_differs));
        // A status update is stored, but is no change.
        assert!(!cache.observe_with(
            watcher::Event::Apply(mk_pool("198.18.0.0/24", 5)),
            spec_differs
        ));
        let stored = cache.objects["p"].status.clone().unwrap();
        assert_eq!(stored.assigned_ipv4, 5);
        assert!(cache.observe_with(
            watcher::Event::Apply(mk_pool("198.18.1.0/24", 5)),
            spec_differs
        ));
        assert!(cache.observe_with(
            watcher::Event::Delete(mk_pool("198.18.1.0/24", 5)),
            spec_differs
        ));
        assert!(cache.objects.is_empty());
        // A new object is a change.
        assert!(cache.observe_with(
            watcher::Event::Apply(mk_pool("198.18.1.0/24", 0)),
            spec_differs
        ));
    }
}
