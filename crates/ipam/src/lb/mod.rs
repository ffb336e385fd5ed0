//! LoadBalancer IPs from IPPools.
//!
//! Choice, in order: requested addresses must lie in a pool that admits the Service; else
//! the named pool; else the admitting `autoAssign` pools in choice order (priority, lower
//! first, unset last, then name). Within a pool the lowest usable address is taken, so
//! results are reproducible. An address a Service already holds is kept while it is
//! still allowed, so reconciling never churns.
//!
//! Owners are interned to dense ids at the API boundary; holders of an address, and the
//! sharing data the rules need, are reached by id. Each pool keeps its own index of the
//! addresses in use ([`index::FreeIndex`]), so finding its lowest free address never
//! looks at another pool.

mod holders;
mod index;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::net::IpAddr;

use holders::HolderMap;
use index::FreeIndex;

use crate::error::Error;
use crate::hash::FxHashMap;
use crate::owners::{Absent, Owners, Reset};
use crate::pool::{Pool, PoolSpec, PoolStatus};
use crate::sharing::{check_sharing, Holder, LbPort};
use crate::types::{u128_to_ip, OwnerKey};
use berth_core::{to_u128, IpFamily, Labels, TrafficPolicy};

/// What the LoadBalancer allocator needs to know about a Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceView {
    pub namespace: String,
    pub namespace_labels: Labels,
    pub labels: Labels,
    /// From `berth.dev/load-balancer-ips`, else `spec.loadBalancerIP`, else the MetalLB
    /// annotations; at most one per family.
    pub requested_ips: Vec<IpAddr>,
    /// From `berth.dev/ip-pool` or MetalLB's `address-pool`.
    pub requested_pool: Option<String>,
    /// From `berth.dev/sharing-key` or MetalLB's `allow-shared-ip`.
    pub sharing_key: Option<String>,
    /// From `berth.dev/sharing-cross-namespace`: the other namespaces whose Services may share
    /// this one's address (`*`: any); empty: none.
    pub sharing_namespaces: Vec<String>,
    pub ports: Vec<LbPort>,
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.selector`.
    pub selector: Labels,
    /// `spec.ipFamilies`: one address per family, in this order. Empty means the families
    /// of the requested addresses, or IPv4.
    pub families: Vec<IpFamily>,
}

impl ServiceView {
    /// Writes this Service's sharing data into `out`, reusing its buffers, so a steady
    /// stream of assignments does not allocate. Without a sharing key the rest is left
    /// as it was: the sharing rules refuse such a Service before they look at anything
    /// else (see [`check_sharing`]).
    fn holder_into(&self, out: &mut Holder) {
        out.sharing_key.clone_from(&self.sharing_key);
        if self.sharing_key.is_none() {
            return;
        }
        if out.namespace != self.namespace {
            out.namespace.clone_from(&self.namespace);
        }
        if out.shares_with != self.sharing_namespaces {
            out.shares_with.clone_from(&self.sharing_namespaces);
        }
        out.policy = self.external_traffic_policy;
        if out.selector != self.selector {
            out.selector.clone_from(&self.selector);
        }
        out.ports.clear();
        out.ports.extend_from_slice(&self.ports);
        out.ports.sort_unstable();
        out.ports.dedup();
    }

    fn wanted_families(&self) -> Cow<'_, [IpFamily]> {
        if !self.families.is_empty() {
            return Cow::Borrowed(&self.families);
        }
        let mut fams: Vec<IpFamily> = Vec::new();
        for ip in &self.requested_ips {
            if !fams.contains(&IpFamily::of(*ip)) {
                fams.push(IpFamily::of(*ip));
            }
        }
        if fams.is_empty() {
            fams.push(IpFamily::V4);
        }
        Cow::Owned(fams)
    }
}

/// An address still held by `owner` that lies in no pool after a pool change. The
/// allocator keeps it held (nobody else can get it); the controller decides whether to
/// release and reassign.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Orphan<K> {
    pub owner: K,
    pub ip: IpAddr,
}

/// What the allocator keeps per owner.
#[derive(Debug, Clone, Default)]
struct OwnerState {
    /// Indexed by `IpFamily::index`.
    held: [Option<IpAddr>; 2],
    /// Whether the owner was granted with a sharing key; its sharing data is then in
    /// `LbIpAllocator::sharing`.
    shares: bool,
}

impl Reset for OwnerState {
    fn reset(&mut self) {
        *self = Self::default();
    }
}

/// LoadBalancer-IP allocator over IPPools.
#[derive(Debug, Clone)]
pub struct LbIpAllocator<K: OwnerKey> {
    /// In choice order.
    pools: Vec<Pool>,
    /// Per pool (same index as `pools`) and family: the pool's addresses in use.
    index: Vec<[FreeIndex; 2]>,
    /// Per pool and family: in-use addresses the pool contains.
    assigned: Vec<[u128; 2]>,
    owners: Owners<K, OwnerState>,
    /// Sharing data by owner id, for owners with a sharing key (others are refused by
    /// the sharing rules on their key alone, so nothing else about them is kept). Stale
    /// entries keep their buffers for reuse.
    sharing: Vec<Holder>,
    /// The sharing data of every owner without a sharing key.
    no_sharing: Holder,
    /// Per family: holders of each address in use (as a number).
    holders: [HolderMap; 2],
    /// Addresses in use per sharing key, so a sharing Service finds the lowest shareable
    /// address without scanning the pool.
    shared: FxHashMap<String, [BTreeSet<u128>; 2]>,
    /// Sharing data of the request in progress; swapped with the owner's on success, so
    /// both buffers are reused.
    scratch: Holder,
}

impl<K: OwnerKey> Default for LbIpAllocator<K> {
    fn default() -> Self {
        Self {
            pools: Vec::new(),
            index: Vec::new(),
            assigned: Vec::new(),
            owners: Owners::default(),
            sharing: Vec::new(),
            no_sharing: Holder::default(),
            holders: [HolderMap::default(), HolderMap::default()],
            shared: FxHashMap::default(),
            scratch: Holder::default(),
        }
    }
}

impl<K: OwnerKey> LbIpAllocator<K> {
    /// An allocator with no pools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the pools. Every spec must be valid and names unique, else nothing
    /// changes. Addresses held outside every new pool are kept and reported.
    pub fn set_pools(&mut self, specs: Vec<PoolSpec>) -> Result<Vec<Orphan<K>>, Error> {
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
        self.index = pools
            .iter()
            .map(|p| [IpFamily::V4, IpFamily::V6].map(|f| FreeIndex::new(p, f)))
            .collect();
        self.assigned = vec![[0, 0]; pools.len()];
        self.pools = pools;
        let mut orphans = Vec::new();
        for fam in [IpFamily::V4, IpFamily::V6] {
            let f = fam.index();
            for (value, holders) in self.holders[f].iter() {
                let mut in_any = false;
                for (i, pool) in self.pools.iter().enumerate() {
                    if let Some(offset) = self.index[i][f].offset_of(pool, fam, value) {
                        self.index[i][f].mark(offset, true);
                        self.assigned[i][f] += 1;
                        in_any = true;
                    }
                }
                if !in_any {
                    orphans.extend(holders.iter().map(|&id| Orphan {
                        owner: self.owners.key(id).clone(),
                        ip: u128_to_ip(fam, value),
                    }));
                }
            }
        }
        orphans.sort();
        Ok(orphans)
    }

    /// Pool names in choice order.
    pub fn pool_names(&self) -> Vec<&str> {
        self.pools.iter().map(Pool::name).collect()
    }

    /// Pairs of pools whose addresses overlap (for the pool's overlap condition).
    pub fn overlapping_pools(&self) -> Vec<(String, String)> {
        let by_pool = berth_core::overlapping_pools(
            self.pools
                .iter()
                .map(|p| (p.name(), p.spec.addresses.as_slice())),
        );
        // Each pair is listed under both pools; keep it once, the lesser name first.
        let mut out: Vec<(String, String)> = by_pool
            .iter()
            .flat_map(|(a, others)| {
                others
                    .iter()
                    .filter(move |b| a < *b)
                    .map(move |b| (a.to_string(), b.to_string()))
            })
            .collect();
        out.sort();
        out
    }

    /// Assigned and available counts of a pool.
    pub fn pool_status(&self, name: &str) -> Option<PoolStatus> {
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
    pub fn pool_of(&self, ip: IpAddr) -> Option<&str> {
        self.pools.iter().find(|p| p.contains(ip)).map(Pool::name)
    }

    /// Gives `owner` one address per family of `svc` (see the module docs for the order),
    /// keeping addresses it already holds while they remain allowed and releasing those it
    /// no longer needs. All or nothing: on error the owner keeps what it held.
    pub fn assign(&mut self, owner: &K, svc: &ServiceView) -> Result<Vec<IpAddr>, Error> {
        self.decide_then_install(
            owner,
            svc,
            |this, me, holder| this.choose(me, svc, holder),
            Vec::as_slice,
        )
    }

    /// What assigning and adopting share: `decide` sees the Service's holder (built in the
    /// reused scratch buffer, so a call allocates nothing for it) and, when it agrees, the
    /// addresses `installed` names become `owner`'s. On an error nothing changes.
    fn decide_then_install<T>(
        &mut self,
        owner: &K,
        svc: &ServiceView,
        decide: impl FnOnce(&Self, Option<u32>, &Holder) -> Result<T, Error>,
        installed: impl FnOnce(&T) -> &[IpAddr],
    ) -> Result<T, Error> {
        let mut holder = std::mem::take(&mut self.scratch);
        svc.holder_into(&mut holder);
        let me = self.owners.lookup(owner);
        let decided = decide(self, me.ok(), &holder);
        if let Ok(value) = &decided {
            self.install(owner, me, &mut holder, installed(value));
        }
        self.scratch = holder;
        decided
    }

    fn choose(
        &self,
        me: Option<u32>,
        svc: &ServiceView,
        holder: &Holder,
    ) -> Result<Vec<IpAddr>, Error> {
        let held = me.map(|id| self.owners.get(id).held);
        if !svc.requested_ips.is_empty() {
            return self.choose_requested(me, svc, holder);
        }
        if let Some(name) = &svc.requested_pool {
            let i = self
                .pools
                .iter()
                .position(|p| p.name() == name)
                .ok_or_else(|| Error::UnknownPool { pool: name.clone() })?;
            if !self.admits(i, svc) {
                return Err(Error::PoolNotCompatible { pool: name.clone() });
            }
            return svc
                .wanted_families()
                .iter()
                .map(|&fam| {
                    self.keep_or_pick(me, held, holder, fam, |_, idx| idx == i)
                        .ok_or_else(|| Error::PoolExhausted {
                            pool: name.clone(),
                            family: fam,
                        })
                })
                .collect();
        }
        svc.wanted_families()
            .iter()
            .map(|&fam| {
                self.keep_or_pick(me, held, holder, fam, |this, idx| {
                    this.pools[idx].spec.auto_assign && this.admits(idx, svc)
                })
                .ok_or(Error::NoAvailableIps { family: fam })
            })
            .collect()
    }

    fn choose_requested(
        &self,
        me: Option<u32>,
        svc: &ServiceView,
        holder: &Holder,
    ) -> Result<Vec<IpAddr>, Error> {
        let families = svc.wanted_families();
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
            check_sharing(*ip, holder, &self.others(*ip, me))?;
        }
        Ok(svc.requested_ips.clone())
    }

    /// The owner's current address of `fam` if an eligible pool still contains it and the
    /// sharing rules still hold; else the lowest usable address of the first eligible pool.
    fn keep_or_pick(
        &self,
        me: Option<u32>,
        held: Option<[Option<IpAddr>; 2]>,
        holder: &Holder,
        fam: IpFamily,
        eligible: impl Fn(&Self, usize) -> bool,
    ) -> Option<IpAddr> {
        if let Some(ip) = held.and_then(|h| h[fam.index()]) {
            let allowed =
                (0..self.pools.len()).any(|i| eligible(self, i) && self.pools[i].contains(ip));
            if allowed && check_sharing(ip, holder, &self.others(ip, me)).is_ok() {
                return Some(ip);
            }
        }
        (0..self.pools.len())
            .filter(|&i| eligible(self, i))
            .find_map(|i| self.lowest_usable(i, fam, me, holder))
    }

    /// The lowest address of pool `i` that is free, or in use by Services this one may
    /// share with.
    fn lowest_usable(
        &self,
        i: usize,
        fam: IpFamily,
        me: Option<u32>,
        holder: &Holder,
    ) -> Option<IpAddr> {
        let pool = &self.pools[i];
        let free = self.index[i][fam.index()].lowest_free(pool, fam);
        let shared = holder.sharing_key.as_ref().and_then(|key| {
            let candidates = &self.shared.get(key)?[fam.index()];
            let below = match free {
                Some(f) => candidates.range(..f),
                None => candidates.range(..),
            };
            below.copied().find(|&v| {
                let ip = u128_to_ip(fam, v);
                pool.contains_value(fam, v)
                    && check_sharing(ip, holder, &self.others(ip, me)).is_ok()
            })
        });
        shared.or(free).map(|v| u128_to_ip(fam, v))
    }

    fn admits(&self, i: usize, svc: &ServiceView) -> bool {
        self.pools[i]
            .spec
            .admits(&svc.namespace, &svc.namespace_labels, &svc.labels)
    }

    /// The holders of `ip` other than `me`, with their sharing data. Allocates only when
    /// the address is shared with someone else.
    fn others(&self, ip: IpAddr, me: Option<u32>) -> Vec<(&K, &Holder)> {
        let fam = IpFamily::of(ip).index();
        self.holders[fam]
            .get(to_u128(ip))
            .iter()
            .filter(|&&id| Some(id) != me)
            .map(|&id| (self.owners.key(id), self.holder_of(id)))
            .collect()
    }

    /// Records addresses found in existing Services' status while rebuilding state. Call
    /// it oldest Service first: an address a younger Service cannot share with its older
    /// holders is refused (the older keeps it). Pool admission is not re-checked here; a
    /// later [`Self::assign`] moves the Service if its pools no longer admit it.
    pub fn adopt(&mut self, owner: &K, svc: &ServiceView, ips: &[IpAddr]) -> Result<(), Error> {
        self.decide_then_install(
            owner,
            svc,
            |this, me, holder| this.check_adoption(me, holder, ips).map(|()| ips),
            |adopted| adopted,
        )
        .map(|_| ())
    }

    /// Records addresses a Service holds that may lie in no pool: kept after their pool went
    /// away, so that nobody else is given them and a pool re-created with them counts them
    /// again. Refused only as [`Self::adopt`] refuses a claim for any other reason (two
    /// addresses of one family, or sharing rules).
    pub fn keep(&mut self, owner: &K, svc: &ServiceView, ips: &[IpAddr]) -> Result<(), Error> {
        self.decide_then_install(
            owner,
            svc,
            |this, me, holder| this.check_claim(me, holder, ips, false).map(|()| ips),
            |kept| kept,
        )
        .map(|_| ())
    }

    /// What [`Self::assign`] would give `owner` now, without giving it.
    pub fn check(&mut self, owner: &K, svc: &ServiceView) -> Result<Vec<IpAddr>, Error> {
        let mut holder = std::mem::take(&mut self.scratch);
        svc.holder_into(&mut holder);
        let me = self.owners.find(owner);
        let decided = self.choose(me, svc, &holder);
        self.scratch = holder;
        decided
    }

    fn check_adoption(
        &self,
        me: Option<u32>,
        holder: &Holder,
        ips: &[IpAddr],
    ) -> Result<(), Error> {
        self.check_claim(me, holder, ips, true)
    }

    fn check_claim(
        &self,
        me: Option<u32>,
        holder: &Holder,
        ips: &[IpAddr],
        in_a_pool: bool,
    ) -> Result<(), Error> {
        let mut seen: Vec<IpFamily> = Vec::new();
        for ip in ips {
            if seen.contains(&IpFamily::of(*ip)) {
                return Err(Error::RequestedFamilyMismatch { ip: *ip });
            }
            seen.push(IpFamily::of(*ip));
            if in_a_pool && !self.pools.iter().any(|p| p.contains(*ip)) {
                return Err(Error::NotAllowedByConfig { ip: *ip });
            }
            check_sharing(*ip, holder, &self.others(*ip, me))?;
        }
        Ok(())
    }

    /// Frees every address `owner` holds, at once; returns them. Idempotent.
    pub fn release_owner(&mut self, owner: &K) -> Vec<IpAddr> {
        let Some(id) = self.owners.find(owner) else {
            return Vec::new();
        };
        let held = self.owners.get(id).held;
        for ip in held.into_iter().flatten() {
            self.remove_holder(id, ip);
        }
        self.owners.remove(id);
        held.into_iter().flatten().collect()
    }

    /// Frees `ip` for `owner` alone (others sharing it keep it); returns whether `owner` held
    /// it. Idempotent. An owner left holding nothing is forgotten, as by
    /// [`Self::release_owner`].
    pub fn release(&mut self, owner: &K, ip: IpAddr) -> bool {
        let Some(id) = self.owners.find(owner) else {
            return false;
        };
        let slot = IpFamily::of(ip).index();
        if self.owners.get(id).held[slot] != Some(ip) {
            return false;
        }
        self.remove_holder(id, ip);
        let held = &mut self.owners.get_mut(id).held;
        held[slot] = None;
        if held.iter().all(Option::is_none) {
            self.owners.remove(id);
        }
        true
    }

    /// The addresses `owner` holds, IPv4 first.
    pub fn ips_of(&self, owner: &K) -> Vec<IpAddr> {
        self.owners
            .find(owner)
            .map(|id| self.owners.get(id).held.iter().flatten().copied().collect())
            .unwrap_or_default()
    }

    /// Everyone holding `ip`, sorted.
    pub fn holders_of(&self, ip: IpAddr) -> Vec<K> {
        self.holders[IpFamily::of(ip).index()]
            .get(to_u128(ip))
            .iter()
            .map(|&id| self.owners.key(id).clone())
            .collect()
    }

    /// The sharing data owner `id` holds its addresses with.
    fn holder_of(&self, id: u32) -> &Holder {
        if self.owners.get(id).shares {
            if let Some(h) = self.sharing.get(id as usize) {
                return h;
            }
        }
        &self.no_sharing
    }

    /// Distinct addresses in use of `family`.
    pub fn used(&self, family: IpFamily) -> u128 {
        self.holders[family.index()].len()
    }

    /// Makes `owner` (`me`: its id, or proof it has none) hold exactly `ips` with
    /// `holder`'s sharing data; `holder` gets the owner's previous data back, for reuse.
    /// Callers have checked the rules. An owner left holding nothing is forgotten.
    fn install(&mut self, owner: &K, me: Result<u32, Absent>, holder: &mut Holder, ips: &[IpAddr]) {
        if let Ok(id) = me {
            let held = std::mem::take(&mut self.owners.get_mut(id).held);
            for ip in held.into_iter().flatten() {
                self.remove_holder(id, ip);
            }
            if ips.is_empty() {
                self.owners.remove(id);
                return;
            }
        }
        if ips.is_empty() {
            return;
        }
        let id = match me {
            Ok(id) => id,
            Err(absent) => self.owners.insert(owner, absent),
        };
        let shares = holder.sharing_key.is_some();
        self.owners.get_mut(id).shares = shares;
        if shares {
            let i = id as usize;
            if self.sharing.len() <= i {
                self.sharing.resize_with(i + 1, Holder::default);
            }
            std::mem::swap(&mut self.sharing[i], holder);
        }
        for ip in ips {
            let slot = &mut self.owners.get_mut(id).held[IpFamily::of(*ip).index()];
            // A family listed twice yields the same address twice; it is held once.
            if *slot == Some(*ip) {
                continue;
            }
            *slot = Some(*ip);
            self.add_holder(id, *ip);
        }
    }

    fn add_holder(&mut self, id: u32, ip: IpAddr) {
        let fam = IpFamily::of(ip);
        let value = to_u128(ip);
        let owners = &self.owners;
        let newly_used =
            self.holders[fam.index()].insert(value, id, |a, b| owners.key(a) < owners.key(b));
        let shares = owners.get(id).shares;
        if let Some(key) = shares
            .then(|| self.sharing.get(id as usize))
            .flatten()
            .and_then(|h| h.sharing_key.as_ref())
        {
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
        if newly_used {
            self.count(fam, value, true);
        }
    }

    /// Removes owner `id` from the holders of `ip`, using the sharing data it holds `ip`
    /// with (its current entry in `sharing`).
    fn remove_holder(&mut self, id: u32, ip: IpAddr) {
        let fam = IpFamily::of(ip);
        let value = to_u128(ip);
        let Some(now_empty) = self.holders[fam.index()].remove(value, id) else {
            return;
        };
        let (owners, sharing, none) = (&self.owners, &self.sharing, &self.no_sharing);
        let holder_of = |x: u32| match owners.get(x).shares {
            true => sharing.get(x as usize).unwrap_or(none),
            false => none,
        };
        let removed_key = holder_of(id).sharing_key.as_ref();
        let key_still_used = removed_key.is_some_and(|key| {
            self.holders[fam.index()]
                .get(value)
                .iter()
                .any(|&x| holder_of(x).sharing_key.as_ref() == Some(key))
        });
        if let Some(key) = removed_key {
            if !key_still_used {
                if let Some(sets) = self.shared.get_mut(key) {
                    sets[fam.index()].remove(&value);
                    if sets.iter().all(BTreeSet::is_empty) {
                        self.shared.remove(key);
                    }
                }
            }
        }
        if now_empty {
            self.count(fam, value, false);
        }
    }

    /// Keeps the per-pool counts and free indexes in step when an address starts or stops
    /// being used.
    fn count(&mut self, fam: IpFamily, value: u128, up: bool) {
        let f = fam.index();
        for (i, pool) in self.pools.iter().enumerate() {
            if let Some(offset) = self.index[i][f].offset_of(pool, fam, value) {
                self.index[i][f].mark(offset, up);
                let n = &mut self.assigned[i][f];
                *n = if up { *n + 1 } else { n.saturating_sub(1) };
            }
        }
    }
}
