//! The LoadBalancer-IP allocator as it was before owners were interned and pools got their
//! own free-address indexes: plain maps keyed by address and owner. Kept for tests only,
//! as the model the production allocator must agree with on every operation.

use std::collections::hash_map::Entry;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use super::{Orphan, ServiceView};
use crate::error::Error;
use crate::hash::FxHashMap;
use crate::pool::{Pool, PoolSpec, PoolStatus};
use crate::runset::RunSet;
use crate::sharing::Holder;
use crate::types::{u128_to_ip, OwnerKey};
use berth_core::{to_u128, IpFamily};

fn service_holder(svc: &ServiceView) -> Holder {
    let mut ports = svc.ports.clone();
    ports.sort_unstable();
    ports.dedup();
    Holder {
        sharing_key: svc.sharing_key.clone(),
        namespace: svc.namespace.clone(),
        shares_with: svc.sharing_namespaces.clone(),
        policy: svc.external_traffic_policy,
        selector: svc.selector.clone(),
        ports,
    }
}

fn wanted_families(svc: &ServiceView) -> Vec<IpFamily> {
    if !svc.families.is_empty() {
        return svc.families.clone();
    }
    let mut fams: Vec<IpFamily> = Vec::new();
    for ip in &svc.requested_ips {
        if !fams.contains(&IpFamily::of(*ip)) {
            fams.push(IpFamily::of(*ip));
        }
    }
    if fams.is_empty() {
        fams.push(IpFamily::V4);
    }
    fams
}

fn check_sharing<K: OwnerKey>(
    ip: IpAddr,
    new: &Holder,
    others: &[Holding<K>],
) -> Result<(), Error> {
    let others: Vec<(&K, &Holder)> = others.iter().map(|(k, h)| (&**k, &**h)).collect();
    crate::sharing::check_sharing(ip, new, &others)
}

/// One holder of an address: the owner and its sharing data, both shared (`Arc`) with
/// the allocator's other maps so recording a holder never deep-copies them.
type Holding<K> = (Arc<K>, Arc<Holder>);

/// The holders of one address, sorted by owner.
#[derive(Debug, Clone)]
enum Holdings<K> {
    One(Holding<K>),
    Many(Vec<Holding<K>>),
}

impl<K: Ord> Holdings<K> {
    fn as_slice(&self) -> &[Holding<K>] {
        match self {
            Self::One(h) => std::slice::from_ref(h),
            Self::Many(v) => v,
        }
    }

    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    fn insert(&mut self, h: Holding<K>) {
        let mut all = match std::mem::replace(self, Self::Many(Vec::new())) {
            Self::One(first) => vec![first],
            Self::Many(v) => v,
        };
        let pos = all.partition_point(|(k, _)| *k < h.0);
        all.insert(pos, h);
        *self = match all.len() {
            1 => Self::One(all.remove(0)),
            _ => Self::Many(all),
        };
    }

    /// Removes `owner` (found by pointer); returns its sharing data.
    fn remove(&mut self, owner: &Arc<K>) -> Option<Arc<Holder>> {
        match self {
            Self::One((k, _)) if Arc::ptr_eq(k, owner) => {
                match std::mem::replace(self, Self::Many(Vec::new())) {
                    Self::One((_, h)) => Some(h),
                    Self::Many(_) => None,
                }
            }
            Self::One(_) => None,
            Self::Many(v) => {
                let pos = v.iter().position(|(k, _)| Arc::ptr_eq(k, owner))?;
                Some(v.remove(pos).1)
            }
        }
    }
}

/// The reference allocator.
#[derive(Debug, Clone)]
pub(crate) struct Reference<K: OwnerKey> {
    /// In choice order.
    pools: Vec<Pool>,
    /// Addresses with at least one holder, per family.
    used: [RunSet; 2],
    /// Holders of each address.
    holders: FxHashMap<IpAddr, Holdings<K>>,
    by_owner: FxHashMap<Arc<K>, [Option<IpAddr>; 2]>,
    /// Addresses in use per sharing key, so a sharing Service finds the lowest shareable
    /// address without scanning the pool.
    shared: FxHashMap<String, [BTreeSet<u128>; 2]>,
    /// Per pool (same index as `pools`) and family: in-use addresses the pool contains.
    assigned: Vec<[u128; 2]>,
}

impl<K: OwnerKey> Default for Reference<K> {
    fn default() -> Self {
        Self {
            pools: Vec::new(),
            used: [RunSet::new(), RunSet::new()],
            holders: FxHashMap::default(),
            by_owner: FxHashMap::default(),
            shared: FxHashMap::default(),
            assigned: Vec::new(),
        }
    }
}

impl<K: OwnerKey> Reference<K> {
    /// An allocator with no pools.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Replaces the pools. Every spec must be valid and names unique, else nothing
    /// changes. Addresses held outside every new pool are kept and reported.
    pub(crate) fn set_pools(&mut self, specs: Vec<PoolSpec>) -> Result<Vec<Orphan<K>>, Error> {
        let mut pools = specs
            .into_iter()
            .map(Pool::compile)
            .collect::<Result<Vec<_>, _>>()?;
        pools.sort_by(Pool::choice_order);
        if let Some(w) = pools.windows(2).find(|w| w[0].name() == w[1].name()) {
            return Err(Error::InvalidPool {
                pool: w[0].name().to_string(),
                reason: "duplicate pool name".into(),
            });
        }
        self.pools = pools;
        self.assigned = vec![[0, 0]; self.pools.len()];
        let mut orphans = Vec::new();
        for (ip, holders) in &self.holders {
            let mut in_any = false;
            for (i, pool) in self.pools.iter().enumerate() {
                if pool.contains(*ip) {
                    self.assigned[i][IpFamily::of(*ip).index()] += 1;
                    in_any = true;
                }
            }
            if !in_any {
                orphans.extend(holders.as_slice().iter().map(|(k, _)| Orphan {
                    owner: K::clone(k),
                    ip: *ip,
                }));
            }
        }
        orphans.sort();
        Ok(orphans)
    }

    /// Pool names in choice order.
    pub(crate) fn pool_names(&self) -> Vec<&str> {
        self.pools.iter().map(Pool::name).collect()
    }

    /// Pairs of pools whose addresses overlap (for the pool's overlap condition).
    pub(crate) fn overlapping_pools(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, a) in self.pools.iter().enumerate() {
            for b in &self.pools[i + 1..] {
                if a.overlaps(b) {
                    let (x, y) = if a.name() <= b.name() { (a, b) } else { (b, a) };
                    out.push((x.name().to_string(), y.name().to_string()));
                }
            }
        }
        out.sort();
        out
    }

    /// Assigned and available counts of a pool.
    pub(crate) fn pool_status(&self, name: &str) -> Option<PoolStatus> {
        let i = self.pools.iter().position(|p| p.name() == name)?;
        let (pool, assigned) = (&self.pools[i], self.assigned[i]);
        Some(PoolStatus {
            assigned_ipv4: assigned[0],
            available_ipv4: pool.capacity[0].saturating_sub(assigned[0]),
            assigned_ipv6: assigned[1],
            available_ipv6: pool.capacity[1].saturating_sub(assigned[1]),
        })
    }

    /// The first pool, in choice order, that contains `ip`.
    pub(crate) fn pool_of(&self, ip: IpAddr) -> Option<&str> {
        self.pools.iter().find(|p| p.contains(ip)).map(Pool::name)
    }

    /// Gives `owner` one address per family of `svc` (see the module docs for the order),
    /// keeping addresses it already holds while they remain allowed and releasing those it
    /// no longer needs. All or nothing: on error the owner keeps what it held.
    pub(crate) fn assign(&mut self, owner: &K, svc: &ServiceView) -> Result<Vec<IpAddr>, Error> {
        let holder = Arc::new(service_holder(svc));
        let held = self.by_owner.get(owner).copied();
        let chosen = if !svc.requested_ips.is_empty() {
            self.choose_requested(owner, svc, &holder)?
        } else if let Some(name) = &svc.requested_pool {
            let i = self
                .pools
                .iter()
                .position(|p| p.name() == name)
                .ok_or_else(|| Error::UnknownPool { pool: name.clone() })?;
            if !self.admits(i, svc) {
                return Err(Error::PoolNotCompatible { pool: name.clone() });
            }
            wanted_families(svc)
                .into_iter()
                .map(|fam| {
                    self.keep_or_pick(owner, held, &holder, fam, |_, idx| idx == i)
                        .ok_or_else(|| Error::PoolExhausted {
                            pool: name.clone(),
                            family: fam,
                        })
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            wanted_families(svc)
                .into_iter()
                .map(|fam| {
                    self.keep_or_pick(owner, held, &holder, fam, |me, idx| {
                        me.pools[idx].spec.auto_assign && me.admits(idx, svc)
                    })
                    .ok_or(Error::NoAvailableIps { family: fam })
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        self.install(owner, held.is_some(), &holder, &chosen);
        Ok(chosen)
    }

    fn choose_requested(
        &self,
        owner: &K,
        svc: &ServiceView,
        holder: &Holder,
    ) -> Result<Vec<IpAddr>, Error> {
        let families = wanted_families(svc);
        let mut seen: Vec<IpFamily> = Vec::new();
        for ip in &svc.requested_ips {
            let fam = IpFamily::of(*ip);
            if !families.contains(&fam) || seen.contains(&fam) {
                return Err(Error::RequestedFamilyMismatch { ip: *ip });
            }
            seen.push(fam);
            let containing: Vec<usize> = (0..self.pools.len())
                .filter(|&i| self.pools[i].contains(*ip))
                .collect();
            let Some(&first) = containing.first() else {
                return Err(Error::NotAllowedByConfig { ip: *ip });
            };
            if !containing.iter().any(|&i| self.admits(i, svc)) {
                return Err(Error::PoolNotCompatible {
                    pool: self.pools[first].name().to_string(),
                });
            }
            if let Some(name) = &svc.requested_pool {
                if !containing.iter().any(|&i| self.pools[i].name() == name) {
                    return Err(Error::IpNotInPool {
                        ip: *ip,
                        pool: name.clone(),
                    });
                }
            }
            check_sharing(*ip, holder, &self.others(*ip, owner))?;
        }
        Ok(svc.requested_ips.clone())
    }

    /// The owner's current address of `fam` if an eligible pool still contains it and the
    /// sharing rules still hold; else the lowest usable address of the first eligible pool.
    fn keep_or_pick(
        &self,
        owner: &K,
        held: Option<[Option<IpAddr>; 2]>,
        holder: &Holder,
        fam: IpFamily,
        eligible: impl Fn(&Self, usize) -> bool,
    ) -> Option<IpAddr> {
        if let Some(ip) = held.and_then(|h| h[fam.index()]) {
            let allowed =
                (0..self.pools.len()).any(|i| eligible(self, i) && self.pools[i].contains(ip));
            if allowed && check_sharing(ip, holder, &self.others(ip, owner)).is_ok() {
                return Some(ip);
            }
        }
        (0..self.pools.len())
            .filter(|&i| eligible(self, i))
            .find_map(|i| self.lowest_usable(i, fam, owner, holder))
    }

    /// The lowest address of pool `i` that is free, or in use by Services this one may
    /// share with.
    fn lowest_usable(&self, i: usize, fam: IpFamily, owner: &K, holder: &Holder) -> Option<IpAddr> {
        let pool = &self.pools[i];
        let used = &self.used[fam.index()];
        let free = pool.ranges[fam.index()].iter().find_map(|&(lo, hi)| {
            let mut from = lo;
            loop {
                let x = used.first_free_in(from, hi)?;
                if !pool.skips(fam, x) {
                    return Some(x);
                }
                from = x.checked_add(1)?;
            }
        });
        let shared = holder.sharing_key.as_ref().and_then(|key| {
            let candidates = &self.shared.get(key)?[fam.index()];
            let below = match free {
                Some(f) => candidates.range(..f),
                None => candidates.range(..),
            };
            below.copied().find(|&v| {
                let ip = u128_to_ip(fam, v);
                pool.contains_value(fam, v)
                    && check_sharing(ip, holder, &self.others(ip, owner)).is_ok()
            })
        });
        shared.or(free).map(|v| u128_to_ip(fam, v))
    }

    fn admits(&self, i: usize, svc: &ServiceView) -> bool {
        self.pools[i]
            .spec
            .admits(&svc.namespace, &svc.namespace_labels, &svc.labels)
    }

    /// The holders of `ip` other than `owner`.
    fn others(&self, ip: IpAddr, owner: &K) -> Vec<Holding<K>> {
        self.holders
            .get(&ip)
            .map(|hs| {
                hs.as_slice()
                    .iter()
                    .filter(|(k, _)| **k != *owner)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Records addresses found in existing Services' status while rebuilding state. Call
    /// it oldest Service first: an address a younger Service cannot share with its older
    /// holders is refused (the older keeps it). Pool admission is not re-checked here; a
    /// later [`Self::assign`] moves the Service if its pools no longer admit it.
    pub(crate) fn adopt(
        &mut self,
        owner: &K,
        svc: &ServiceView,
        ips: &[IpAddr],
    ) -> Result<(), Error> {
        let holder = Arc::new(service_holder(svc));
        let mut seen: Vec<IpFamily> = Vec::new();
        for ip in ips {
            if seen.contains(&IpFamily::of(*ip)) {
                return Err(Error::RequestedFamilyMismatch { ip: *ip });
            }
            seen.push(IpFamily::of(*ip));
            if !self.pools.iter().any(|p| p.contains(*ip)) {
                return Err(Error::NotAllowedByConfig { ip: *ip });
            }
            check_sharing(*ip, &holder, &self.others(*ip, owner))?;
        }
        let known = self.by_owner.contains_key(owner);
        self.install(owner, known, &holder, ips);
        Ok(())
    }

    /// Frees every address `owner` holds, at once; returns them. Idempotent.
    pub(crate) fn release_owner(&mut self, owner: &K) -> Vec<IpAddr> {
        let Some((key, held)) = self.by_owner.remove_entry(owner) else {
            return Vec::new();
        };
        let held: Vec<IpAddr> = held.into_iter().flatten().collect();
        for ip in &held {
            self.remove_holder(&key, *ip);
        }
        held
    }

    /// Frees `ip` for `owner` alone; returns whether `owner` held it.
    pub(crate) fn release(&mut self, owner: &K, ip: IpAddr) -> bool {
        let Some((key, mut held)) = self.by_owner.remove_entry(owner) else {
            return false;
        };
        let slot = IpFamily::of(ip).index();
        let had = held[slot] == Some(ip);
        if had {
            self.remove_holder(&key, ip);
            held[slot] = None;
        }
        if held.iter().any(Option::is_some) {
            self.by_owner.insert(key, held);
        }
        had
    }

    /// The addresses `owner` holds, IPv4 first.
    pub(crate) fn ips_of(&self, owner: &K) -> Vec<IpAddr> {
        self.by_owner
            .get(owner)
            .map(|h| h.iter().flatten().copied().collect())
            .unwrap_or_default()
    }

    /// Everyone holding `ip`, sorted.
    pub(crate) fn holders_of(&self, ip: IpAddr) -> Vec<K> {
        self.holders
            .get(&ip)
            .map(|hs| hs.as_slice().iter().map(|(k, _)| K::clone(k)).collect())
            .unwrap_or_default()
    }

    /// Distinct addresses in use of `family`.
    pub(crate) fn used(&self, family: IpFamily) -> u128 {
        self.used[family.index()].len()
    }

    /// Makes `owner` hold exactly `ips` with `holder`'s sharing data. Callers have checked
    /// the rules.
    /// `known`: whether `owner` holds anything now (saves a lookup for new owners).
    fn install(&mut self, owner: &K, known: bool, holder: &Arc<Holder>, ips: &[IpAddr]) {
        // Reuse the shared key of an owner we already know rather than copy it again.
        let previous = if known {
            self.by_owner.remove_entry(owner)
        } else {
            None
        };
        let key = match previous {
            Some((key, held)) => {
                for ip in held.into_iter().flatten() {
                    self.remove_holder(&key, ip);
                }
                key
            }
            None => Arc::new(owner.clone()),
        };
        if ips.is_empty() {
            return;
        }
        let mut held = [None, None];
        for ip in ips {
            held[IpFamily::of(*ip).index()] = Some(*ip);
            self.add_holder(&key, holder, *ip);
        }
        self.by_owner.insert(key, held);
    }

    fn add_holder(&mut self, owner: &Arc<K>, holder: &Arc<Holder>, ip: IpAddr) {
        let fam = IpFamily::of(ip);
        let value = to_u128(ip);
        let holding = (owner.clone(), holder.clone());
        match self.holders.entry(ip) {
            Entry::Occupied(mut e) => e.get_mut().insert(holding),
            Entry::Vacant(e) => {
                e.insert(Holdings::One(holding));
            }
        }
        if let Some(key) = &holder.sharing_key {
            match self.shared.get_mut(key) {
                Some(sets) => {
                    sets[fam.index()].insert(value);
                }
                None => {
                    let mut sets = [BTreeSet::new(), BTreeSet::new()];
                    sets[fam.index()].insert(value);
                    self.shared.insert(key.clone(), sets);
                }
            }
        }
        if self.used[fam.index()].insert(value) {
            self.count(ip, true);
        }
    }

    /// `owner` is the key `by_owner` shares with the holdings, so it is found by pointer
    /// without comparing names.
    fn remove_holder(&mut self, owner: &Arc<K>, ip: IpAddr) {
        let fam = IpFamily::of(ip);
        let value = to_u128(ip);
        let Entry::Occupied(mut entry) = self.holders.entry(ip) else {
            return;
        };
        let Some(removed) = entry.get_mut().remove(owner) else {
            return;
        };
        let now_empty = entry.get().is_empty();
        let key_still_used = removed.sharing_key.as_ref().is_some_and(|key| {
            entry
                .get()
                .as_slice()
                .iter()
                .any(|(_, h)| h.sharing_key.as_ref() == Some(key))
        });
        if now_empty {
            entry.remove();
        }
        if let Some(key) = &removed.sharing_key {
            if !key_still_used {
                if let Some(sets) = self.shared.get_mut(key) {
                    sets[fam.index()].remove(&value);
                    if sets.iter().all(BTreeSet::is_empty) {
                        self.shared.remove(key);
                    }
                }
            }
        }
        if now_empty && self.used[fam.index()].remove(value) {
            self.count(ip, false);
        }
    }

    /// Keeps the per-pool assigned counts in step when an address starts or stops being used.
    fn count(&mut self, ip: IpAddr, up: bool) {
        let fam = IpFamily::of(ip).index();
        for (i, pool) in self.pools.iter().enumerate() {
            if pool.contains(ip) {
                let n = &mut self.assigned[i][fam];
                *n = if up { *n + 1 } else { n.saturating_sub(1) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::TrafficPolicy;

    fn mk_holder(key: Option<&str>) -> Holder {
        Holder {
            sharing_key: key.map(String::from),
            policy: TrafficPolicy::Cluster,
            ..Default::default()
        }
    }

    #[test]
    fn holdings_stay_sorted_and_find_owners_by_pointer() {
        let h = Arc::new(mk_holder(Some("k")));
        let (a, b, c) = (Arc::new("a"), Arc::new("b"), Arc::new("c"));
        let mut hs = Holdings::One((b.clone(), h.clone()));
        hs.insert((c.clone(), h.clone()));
        hs.insert((a.clone(), h.clone()));
        let names: Vec<&str> = hs.as_slice().iter().map(|(k, _)| **k).collect();
        assert_eq!(names, vec!["a", "b", "c"]);
        assert!(
            hs.remove(&Arc::new("b")).is_none(),
            "an equal name is not the same owner"
        );
        assert!(hs.remove(&b).is_some());
        assert!(hs.remove(&a).is_some());
        assert!(hs.remove(&c).is_some());
        assert!(hs.is_empty());
        let mut one = Holdings::One((a.clone(), h));
        assert!(one.remove(&c).is_none());
        assert!(one.remove(&a).is_some());
        assert!(one.is_empty());
    }
}
