//! ClusterIPs from the cluster's Service CIDRs: `--service-cidr` (one CIDR per family), or the
//! cluster's ServiceCIDR objects where it has them (any number per family, as an API server's
//! allocator serves them). Never the network address nor the IPv4 broadcast; random dynamic
//! allocation above each range's static band.

use std::net::IpAddr;

use ipnet::IpNet;
use rand::rngs::SmallRng;

use crate::band::{pick_random, static_band};
use crate::cluster_ip_plan::{ClusterIpPlan, ClusterIpSlot};
use crate::error::Error;
use crate::offsets::{OffsetSet, OwnerIndex};
use crate::owners::Owners;
use crate::types::{adopt_in_order, u128_to_ip, OwnerKey};
use berth_core::{to_u128, IpFamily};

/// One Service CIDR the allocator serves. A range that is not `ready` (its ServiceCIDR is being
/// deleted, or its `Ready` condition is `False`) hands out no new address, requested or not, but
/// the addresses Services hold in it stay theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceRange {
    pub cidr: IpNet,
    pub ready: bool,
}

/// One service CIDR and the offsets (from the first usable address) in use.
#[derive(Debug, Clone)]
struct CidrRange {
    cidr: IpNet,
    family: IpFamily,
    ready: bool,
    /// The first usable address (network + 1) as a number.
    first: u128,
    /// Number of usable addresses.
    size: u128,
    band: u128,
    used: OffsetSet,
    owners: OwnerIndex,
}

impl CidrRange {
    fn new(cidr: IpNet) -> Result<Self, Error> {
        let cidr = cidr.trunc();
        let invalid = |reason: &str| Error::InvalidServiceCidr {
            cidr: cidr.to_string(),
            reason: reason.into(),
        };
        let family = IpFamily::of(cidr.network());
        let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
        // 2^host_bits, saturated: only an IPv6 /0 reaches 2^128.
        let total = 1u128.checked_shl(host_bits).unwrap_or(u128::MAX);
        let size = match family {
            // The network and broadcast addresses are never handed out.
            IpFamily::V4 => total.saturating_sub(2),
            // IPv6 has no broadcast; only the network (subnet-router anycast) address is kept.
            IpFamily::V6 => total.saturating_sub(1),
        };
        if size == 0 {
            return Err(invalid("the range has no usable address"));
        }
        Ok(Self {
            cidr,
            family,
            ready: true,
            first: to_u128(cidr.network()) + 1,
            size,
            band: static_band(total, 16, 256, 16),
            used: OffsetSet::for_size(size),
            owners: OwnerIndex::for_size(size),
        })
    }

    fn offset_of(&self, ip: IpAddr) -> Option<u128> {
        let value = to_u128(ip);
        let offset = value.checked_sub(self.first)?;
        (IpFamily::of(ip) == self.family && offset < self.size).then_some(offset)
    }

    fn ip_at(&self, offset: u128) -> IpAddr {
        u128_to_ip(self.family, self.first + offset)
    }
}

/// ClusterIP allocator over the cluster's Service CIDRs.
///
/// Each owner holds at most one address per family. Requests are idempotent: asking again
/// for what an owner already holds succeeds without change, so a controller may retry a
/// reconcile whose write failed without leaking addresses. Ranges may nest (a larger
/// ServiceCIDR around the default one): an address in use is marked in every range that
/// contains it, so no range hands it out again.
#[derive(Debug, Clone)]
pub struct ClusterIpAllocator<K: OwnerKey> {
    /// Indexed by `IpFamily::index`; dynamic allocation tries them in order.
    ranges: [Vec<CidrRange>; 2],
    /// Family order of `--service-cidr`; the first is the cluster's default family.
    order: Vec<IpFamily>,
    /// Each owner's addresses, indexed by `IpFamily::index`. The ranges' owner indexes
    /// hold ids, so releasing an address never hashes or compares a key.
    owners: Owners<K, [Option<IpAddr>; 2]>,
    /// Addresses held per family (inside a range or not).
    held_count: [u128; 2],
    rng: SmallRng,
}

impl<K: OwnerKey> ClusterIpAllocator<K> {
    /// An allocator over `cidrs` (in `--service-cidr` order), drawing random picks from
    /// `rng` (seed it for reproducible runs).
    pub fn new(cidrs: &[IpNet], rng: SmallRng) -> Result<Self, Error> {
        let shape = || Error::InvalidServiceCidr {
            cidr: join(cidrs),
            reason: "expected one CIDR, or two of different IP families".into(),
        };
        if cidrs.is_empty() || cidrs.len() > 2 {
            return Err(shape());
        }
        let mut ranges: [Vec<CidrRange>; 2] = [Vec::new(), Vec::new()];
        let mut order = Vec::new();
        for cidr in cidrs {
            let range = CidrRange::new(*cidr)?;
            let slot = &mut ranges[range.family.index()];
            if !slot.is_empty() {
                return Err(shape());
            }
            order.push(range.family);
            slot.push(range);
        }
        Ok(Self {
            ranges,
            order,
            owners: Owners::default(),
            held_count: [0, 0],
            rng,
        })
    }

    /// Serves `ranges` from now on (the cluster's ServiceCIDRs, in the order dynamic
    /// allocation is to try them) in place of the current ones. What owners hold stays
    /// theirs: an address in a new range is marked used there, and one in no range any more
    /// stays held (nothing hands it out) until its owner lets it go. The same CIDR given
    /// twice is one range, ready if either says so (as an API server reads two ServiceCIDRs
    /// naming it). A CIDR without a usable address is left out and returned with the reason.
    /// The cluster's families (see [`Self::families`]) do not change.
    pub fn set_ranges(&mut self, ranges: &[ServiceRange]) -> Vec<Error> {
        let mut next: [Vec<CidrRange>; 2] = [Vec::new(), Vec::new()];
        let mut refused = Vec::new();
        for r in ranges {
            let cidr = r.cidr.trunc();
            let family = IpFamily::of(cidr.network());
            if let Some(existing) = next[family.index()].iter_mut().find(|x| x.cidr == cidr) {
                existing.ready |= r.ready;
                continue;
            }
            match CidrRange::new(cidr) {
                Ok(mut range) => {
                    range.ready = r.ready;
                    next[family.index()].push(range);
                }
                Err(e) => refused.push(e),
            }
        }
        self.ranges = next;
        let ids: Vec<u32> = self.owners.ids().collect();
        for id in ids {
            for ip in self.owners.get(id).iter().flatten().copied() {
                for range in &mut self.ranges[IpFamily::of(ip).index()] {
                    if let Some(offset) = range.offset_of(ip) {
                        range.used.insert(offset);
                        range.owners.set(offset, id);
                    }
                }
            }
        }
        refused
    }

    /// The ranges served now, in order.
    pub fn ranges(&self) -> Vec<ServiceRange> {
        self.ranges
            .iter()
            .flatten()
            .map(|r| ServiceRange {
                cidr: r.cidr,
                ready: r.ready,
            })
            .collect()
    }

    /// The configured families; the first is the default (input to
    /// [`crate::plan_cluster_ips`]).
    pub fn families(&self) -> &[IpFamily] {
        &self.order
    }

    /// The first service CIDR of a family.
    pub fn cidr(&self, family: IpFamily) -> Option<IpNet> {
        self.ranges[family.index()].first().map(|r| r.cidr)
    }

    /// A free address of `family` for `owner`, or the one it already holds: from the first
    /// ready range with room.
    pub fn allocate(&mut self, owner: &K, family: IpFamily) -> Result<IpAddr, Error> {
        let f = family.index();
        // One owner lookup serves both the idempotency check and the recording.
        let id = self.owners.lookup(owner);
        if let Some(ip) = id.ok().and_then(|id| self.owners.get(id)[f]) {
            return Ok(ip);
        }
        if self.ranges[f].is_empty() {
            return Err(Error::FamilyNotConfigured { family });
        }
        let rng = &mut self.rng;
        let ip = self.ranges[f]
            .iter()
            .filter(|r| r.ready)
            .find_map(|r| pick_random(&r.used, r.size, r.band, rng).map(|o| r.ip_at(o)))
            .ok_or(Error::IpRangeFull { family })?;
        let id = match id {
            Ok(id) => id,
            Err(absent) => self.owners.insert(owner, absent),
        };
        self.mark(id, ip);
        Ok(ip)
    }

    /// Reserves `ip` for `owner` (a requested `spec.clusterIPs` value): it must lie in a
    /// ready range.
    pub fn allocate_specific(&mut self, owner: &K, ip: IpAddr) -> Result<(), Error> {
        self.claim(owner, ip, false)
    }

    /// Records an address found on an existing Service while rebuilding state: a range
    /// being deleted still holds it. Call it oldest Service first: the first claimant keeps
    /// the address and a younger one gets [`Error::IpAlreadyAllocated`].
    pub fn adopt(&mut self, owner: &K, ip: IpAddr) -> Result<(), Error> {
        self.claim(owner, ip, true)
    }

    fn claim(&mut self, owner: &K, ip: IpAddr, adopting: bool) -> Result<(), Error> {
        let family = IpFamily::of(ip);
        let held = self.held(owner, family);
        if held == Some(ip) {
            return Ok(());
        }
        let ranges = &self.ranges[family.index()];
        if ranges.is_empty() {
            return Err(Error::IpFamilyNotConfigured { ip, family });
        }
        let mut containing = ranges.iter().filter(|r| r.offset_of(ip).is_some());
        let Some(range) = containing.clone().next() else {
            return Err(Error::IpNotInRange {
                ip,
                range: join(&ranges.iter().map(|r| r.cidr).collect::<Vec<_>>()),
            });
        };
        if !adopting && !containing.any(|r| r.ready) {
            return Err(Error::IpRangeNotReady { ip });
        }
        if let Some(held) = held {
            return Err(Error::ClusterIpImmutable { ip, held });
        }
        if range
            .offset_of(ip)
            .is_some_and(|o| range.owners.get(o).is_some())
        {
            return Err(Error::IpAlreadyAllocated { ip });
        }
        let id = self.owners.intern(owner);
        self.mark(id, ip);
        Ok(())
    }

    /// Adopts `(owner, address)` pairs in the order given (oldest Service first); returns
    /// the refused ones with the reason, for Warning Events on the younger Services.
    pub fn adopt_all<I>(&mut self, existing: I) -> Vec<(K, IpAddr, Error)>
    where
        I: IntoIterator<Item = (K, IpAddr)>,
    {
        adopt_in_order(existing, |owner, ip| self.adopt(owner, ip))
    }

    /// Makes `owner` hold exactly the plan's addresses: reserves requested ones, allocates
    /// the rest, and releases held addresses of families the plan no longer has. All or
    /// nothing: on error the owner keeps what it held before.
    pub fn allocate_plan(&mut self, owner: &K, plan: &ClusterIpPlan) -> Result<Vec<IpAddr>, Error> {
        let before = self
            .owners
            .find(owner)
            .map(|id| *self.owners.get(id))
            .unwrap_or_default();
        let mut out = Vec::with_capacity(plan.slots.len());
        for slot in &plan.slots {
            let result = match *slot {
                ClusterIpSlot::Requested(ip) => self.allocate_specific(owner, ip).map(|()| ip),
                ClusterIpSlot::Allocate(family) => self.allocate(owner, family),
            };
            match result {
                Ok(ip) => out.push(ip),
                Err(e) => {
                    for ip in out {
                        if !before.contains(&Some(ip)) {
                            self.release_held(owner, ip);
                        }
                    }
                    return Err(e);
                }
            }
        }
        for ip in before.into_iter().flatten() {
            if !out.contains(&ip) {
                self.release_held(owner, ip);
            }
        }
        Ok(out)
    }

    /// Frees `ip`; returns whether it was held. Releasing a free address does nothing.
    /// The owner stays known (cheaply) until [`Self::release_owner`].
    pub fn release(&mut self, ip: IpAddr) -> bool {
        let family = IpFamily::of(ip);
        let id = self.ranges[family.index()]
            .iter()
            .find_map(|r| r.owners.get(r.offset_of(ip)?));
        match id {
            Some(id) => {
                self.unmark(id, ip);
                true
            }
            None => false,
        }
    }

    /// Frees `ip` when `owner` holds it (also outside every range).
    fn release_held(&mut self, owner: &K, ip: IpAddr) {
        if let Some(id) = self.owners.find(owner) {
            if self.owners.get(id)[IpFamily::of(ip).index()] == Some(ip) {
                self.unmark(id, ip);
            }
        }
    }

    /// Frees every address `owner` holds, at once, and forgets the owner; returns them.
    pub fn release_owner(&mut self, owner: &K) -> Vec<IpAddr> {
        let Some(id) = self.owners.find(owner) else {
            return Vec::new();
        };
        let ips: Vec<IpAddr> = self.owners.get(id).iter().flatten().copied().collect();
        for ip in &ips {
            self.unmark(id, *ip);
        }
        self.owners.remove(id);
        ips
    }

    /// Who holds `ip`.
    pub fn owner_of(&self, ip: IpAddr) -> Option<&K> {
        let id = self.ranges[IpFamily::of(ip).index()]
            .iter()
            .find_map(|r| r.owners.get(r.offset_of(ip)?))?;
        Some(self.owners.key(id))
    }

    /// The addresses `owner` holds, IPv4 first.
    pub fn ips_of(&self, owner: &K) -> Vec<IpAddr> {
        self.owners
            .find(owner)
            .map(|id| self.owners.get(id).iter().flatten().copied().collect())
            .unwrap_or_default()
    }

    fn held(&self, owner: &K, family: IpFamily) -> Option<IpAddr> {
        self.owners
            .find(owner)
            .and_then(|id| self.owners.get(id)[family.index()])
    }

    /// Addresses of `family` held.
    pub fn used(&self, family: IpFamily) -> u128 {
        self.held_count[family.index()]
    }

    /// Usable addresses of `family`: every range's (less network and IPv4 broadcast), a
    /// range inside another counted once.
    pub fn size(&self, family: IpFamily) -> u128 {
        let ranges = &self.ranges[family.index()];
        ranges
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                !ranges.iter().enumerate().any(|(j, o)| {
                    j != *i && o.cidr.contains(&r.cidr) && (o.cidr != r.cidr || j < *i)
                })
            })
            .map(|(_, r)| r.size)
            .fold(0u128, u128::saturating_add)
    }

    /// Addresses of `family` still free.
    pub fn free(&self, family: IpFamily) -> u128 {
        self.size(family).saturating_sub(self.used(family))
    }

    /// Records `ip` as `id`'s, in every range that contains it.
    fn mark(&mut self, id: u32, ip: IpAddr) {
        let f = IpFamily::of(ip).index();
        for range in &mut self.ranges[f] {
            if let Some(offset) = range.offset_of(ip) {
                range.used.insert(offset);
                range.owners.set(offset, id);
            }
        }
        let slot = &mut self.owners.get_mut(id)[f];
        if slot.is_none() {
            self.held_count[f] += 1;
        }
        *slot = Some(ip);
    }

    /// Forgets `ip` as `id`'s, in every range that contains it.
    fn unmark(&mut self, id: u32, ip: IpAddr) {
        let f = IpFamily::of(ip).index();
        for range in &mut self.ranges[f] {
            if let Some(offset) = range.offset_of(ip) {
                if range.owners.get(offset) == Some(id) {
                    range.owners.take(offset);
                    range.used.remove(offset);
                }
            }
        }
        let slot = &mut self.owners.get_mut(id)[f];
        if *slot == Some(ip) {
            *slot = None;
            self.held_count[f] -= 1;
        }
    }
}

fn join(cidrs: &[IpNet]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_ip_plan::{plan_cluster_ips, ClusterIpRequest};
    use berth_core::IpFamilyPolicy;
    use rand::SeedableRng;

    fn mk_alloc(cidrs: &[&str]) -> ClusterIpAllocator<String> {
        let cidrs: Vec<IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        ClusterIpAllocator::new(&cidrs, SmallRng::seed_from_u64(42)).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn o(s: &str) -> String {
        s.to_string()
    }

    #[test]
    fn apiserver_wording_for_specific_requests() {
        let mut a = mk_alloc(&["10.96.0.0/16"]);
        a.allocate_specific(&o("a"), ip("10.96.0.5")).unwrap();
        assert_eq!(
            a.allocate_specific(&o("b"), ip("10.96.0.5"))
                .unwrap_err()
                .to_string(),
            "failed to allocate IP 10.96.0.5: provided IP is already allocated"
        );
        for bad in ["10.97.0.1", "10.96.0.0", "10.96.255.255"] {
            assert_eq!(
                a.allocate_specific(&o("b"), ip(bad)).unwrap_err().to_string(),
                format!("failed to allocate IP {bad}: provided IP is not in the valid range. The range of valid IPs is 10.96.0.0/16")
            );
        }
        assert_eq!(
            a.allocate_specific(&o("b"), ip("fd00::1"))
                .unwrap_err()
                .to_string(),
            "failed to allocate IP fd00::1: IPv6 is not configured on this cluster"
        );
        // Same owner, same address: idempotent. Another address of the family: immutable.
        a.allocate_specific(&o("a"), ip("10.96.0.5")).unwrap();
        assert!(matches!(
            a.allocate_specific(&o("a"), ip("10.96.0.6")),
            Err(Error::ClusterIpImmutable { .. })
        ));
    }

    #[test]
    fn tiny_range_fills_and_reports_range_is_full() {
        let mut a = mk_alloc(&["192.168.0.0/30"]);
        let mut got = vec![
            a.allocate(&o("a"), IpFamily::V4).unwrap(),
            a.allocate(&o("b"), IpFamily::V4).unwrap(),
        ];
        got.sort();
        assert_eq!(got, vec![ip("192.168.0.1"), ip("192.168.0.2")]);
        let err = a.allocate(&o("c"), IpFamily::V4).unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to allocate a serviceIP: range is full"
        );
        assert_eq!((a.used(IpFamily::V4), a.free(IpFamily::V4)), (2, 0));
        assert_eq!(a.owner_of(ip("192.168.0.1")), Some(&o("a")));
        assert!(a.release(ip("192.168.0.1")));
        assert!(!a.release(ip("192.168.0.1")));
        assert_eq!(
            a.allocate(&o("c"), IpFamily::V4).unwrap(),
            ip("192.168.0.1")
        );
    }

    #[test]
    fn dynamic_allocation_avoids_the_static_band_while_it_can() {
        let mut a = mk_alloc(&["10.96.0.0/24"]);
        // /24: band = max(16, 256/16) = 16 addresses: 10.96.0.1 ..= 10.96.0.16.
        for i in 0..(254 - 16) {
            let got = a.allocate(&format!("s{i}"), IpFamily::V4).unwrap();
            assert!(to_u128(got) > to_u128(ip("10.96.0.16")), "{got}");
        }
        let got = a.allocate(&o("late"), IpFamily::V4).unwrap();
        assert!(to_u128(got) <= to_u128(ip("10.96.0.16")));
    }

    #[test]
    fn ipv6_slash_64_and_slash_48_work_sparsely() {
        let mut a = mk_alloc(&["10.96.0.0/16", "fd00:10:96::/48"]);
        assert_eq!(a.families(), &[IpFamily::V4, IpFamily::V6]);
        assert_eq!(a.size(IpFamily::V6), (1u128 << 80) - 1);
        let v6 = a.allocate(&o("a"), IpFamily::V6).unwrap();
        assert!(a.cidr(IpFamily::V6).unwrap().contains(&v6));
        // The last address of an IPv6 range is usable; the network address is not.
        a.allocate_specific(&o("b"), ip("fd00:10:96:ffff:ffff:ffff:ffff:ffff"))
            .unwrap();
        assert!(a.allocate_specific(&o("c"), ip("fd00:10:96::")).is_err());
        assert_eq!(
            a.allocate(&o("a"), IpFamily::V6).unwrap(),
            v6,
            "idempotent per family"
        );
        let v4 = a.allocate(&o("a"), IpFamily::V4).unwrap();
        assert_eq!(a.ips_of(&o("a")), vec![v4, v6]);
        assert_eq!(a.release_owner(&o("a")), vec![v4, v6]);
        assert_eq!(a.release_owner(&o("a")), Vec::<IpAddr>::new());
        assert_eq!(a.used(IpFamily::V6), 1);
    }

    #[test]
    fn adopt_all_keeps_the_oldest_claimant() {
        let mut a = mk_alloc(&["10.96.0.0/16"]);
        let refused = a.adopt_all(vec![
            (o("old"), ip("10.96.0.10")),
            (o("young"), ip("10.96.0.10")),
            (o("stray"), ip("192.168.1.1")),
        ]);
        assert_eq!(a.owner_of(ip("10.96.0.10")), Some(&o("old")));
        let reasons: Vec<(String, String)> = refused
            .into_iter()
            .map(|(k, _, e)| (k, e.to_string()))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (o("young"), "failed to allocate IP 10.96.0.10: provided IP is already allocated".to_string()),
                (
                    o("stray"),
                    "failed to allocate IP 192.168.1.1: provided IP is not in the valid range. The range of valid IPs is 10.96.0.0/16"
                        .to_string()
                ),
            ]
        );
        // Assigning afterwards never hands out an adopted address.
        for i in 0..1000 {
            assert_ne!(
                a.allocate(&format!("n{i}"), IpFamily::V4).unwrap(),
                ip("10.96.0.10")
            );
        }
    }

    fn r(cidr: &str, ready: bool) -> ServiceRange {
        ServiceRange {
            cidr: cidr.parse().unwrap(),
            ready,
        }
    }

    /// Histories over ServiceCIDR changes, as an API server's allocator behaves.
    #[test]
    fn service_cidr_histories() {
        // A second ServiceCIDR adds room when the first is full.
        let mut a = mk_alloc(&["192.168.0.0/30"]);
        a.allocate(&o("a"), IpFamily::V4).unwrap();
        a.allocate(&o("b"), IpFamily::V4).unwrap();
        assert!(matches!(
            a.allocate(&o("c"), IpFamily::V4),
            Err(Error::IpRangeFull { .. })
        ));
        assert!(a
            .set_ranges(&[r("192.168.0.0/30", true), r("192.168.1.0/30", true)])
            .is_empty());
        let c = a.allocate(&o("c"), IpFamily::V4).unwrap();
        assert!(a.cidr(IpFamily::V4).is_some());
        assert!(
            "192.168.1.0/30".parse::<IpNet>().unwrap().contains(&c),
            "{c}"
        );
        assert!(a.owner_of(ip("192.168.0.1")).is_some(), "kept");
        assert_eq!((a.used(IpFamily::V4), a.size(IpFamily::V4)), (3, 4));

        // A requested ClusterIP inside the second CIDR is accepted; outside both is not, and
        // the error names every range.
        let other = if c == ip("192.168.1.1") {
            ip("192.168.1.2")
        } else {
            ip("192.168.1.1")
        };
        a.allocate_specific(&o("d"), other).unwrap();
        assert_eq!(
            a.allocate_specific(&o("e"), ip("10.0.0.1")).unwrap_err().to_string(),
            "failed to allocate IP 10.0.0.1: provided IP is not in the valid range. The range of valid IPs is 192.168.0.0/30,192.168.1.0/30"
        );

        // The first ServiceCIDR is being deleted: no new address from it, requested or not;
        // its addresses stay with their Services and are not handed out again.
        a.set_ranges(&[r("192.168.0.0/30", false), r("192.168.1.0/30", true)]);
        assert!(a.owner_of(ip("192.168.0.1")).is_some());
        let freed = a.ips_of(&o("a"))[0];
        assert!(a.release(freed));
        assert!(matches!(
            a.allocate_specific(&o("f"), freed),
            Err(Error::IpRangeNotReady { .. })
        ));
        assert!(matches!(
            a.allocate(&o("f"), IpFamily::V4),
            Err(Error::IpRangeFull { .. })
        ));
        // Adoption (a restart) still takes what Services hold in it.
        a.adopt(&o("a"), freed).unwrap();
        assert_eq!(a.owner_of(freed), Some(&o("a")));

        // The object is gone: what its Services hold stays theirs, and a new range over
        // those addresses does not hand them out again.
        a.set_ranges(&[r("192.168.1.0/30", true)]);
        assert_eq!(a.ips_of(&o("a")), vec![freed]);
        assert_eq!(a.owner_of(freed), None, "in no range");
        a.allocate_plan(
            &o("a"),
            &ClusterIpPlan {
                policy: IpFamilyPolicy::SingleStack,
                families: vec![IpFamily::V4],
                slots: vec![ClusterIpSlot::Requested(freed)],
            },
        )
        .unwrap();
        a.set_ranges(&[r("192.168.0.0/24", true), r("192.168.1.0/30", true)]);
        assert_eq!(a.owner_of(freed), Some(&o("a")));
        for i in 0..200 {
            let got = a.allocate(&format!("n{i}"), IpFamily::V4);
            assert_ne!(got.ok(), Some(freed));
        }
        // Releasing the owner frees it in every range.
        assert_eq!(a.release_owner(&o("a")), vec![freed]);
        assert_eq!(a.owner_of(freed), None);
    }

    #[test]
    fn nested_ranges_mark_an_address_once_for_all() {
        let mut a = mk_alloc(&["10.96.0.0/30"]);
        a.allocate_specific(&o("a"), ip("10.96.0.1")).unwrap();
        // A larger ServiceCIDR around the default one, named twice, one of them not ready.
        let refused = a.set_ranges(&[
            r("10.96.0.0/30", true),
            r("10.96.0.0/29", false),
            r("10.96.0.0/29", true),
            r("10.97.0.0/32", true),
        ]);
        assert_eq!(refused.len(), 1, "a /32 has no usable address");
        assert_eq!(
            a.ranges(),
            vec![r("10.96.0.0/30", true), r("10.96.0.0/29", true)]
        );
        assert_eq!(a.size(IpFamily::V4), 6);
        assert!(matches!(
            a.allocate_specific(&o("b"), ip("10.96.0.1")),
            Err(Error::IpAlreadyAllocated { .. })
        ));
        let mut got: Vec<IpAddr> = (0..5)
            .map(|i| a.allocate(&format!("s{i}"), IpFamily::V4).unwrap())
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                "10.96.0.2",
                "10.96.0.3",
                "10.96.0.4",
                "10.96.0.5",
                "10.96.0.6"
            ]
            .map(ip)
            .to_vec()
        );
        assert_eq!(a.free(IpFamily::V4), 0);
        assert!(a.release(ip("10.96.0.2")));
        assert_eq!(a.owner_of(ip("10.96.0.2")), None);
        assert_eq!(a.allocate(&o("t"), IpFamily::V4).unwrap(), ip("10.96.0.2"));
    }

    #[test]
    fn a_family_without_ranges_is_not_configured() {
        let mut a = mk_alloc(&["10.96.0.0/16"]);
        a.set_ranges(&[]);
        assert!(matches!(
            a.allocate(&o("a"), IpFamily::V4),
            Err(Error::FamilyNotConfigured { .. })
        ));
        assert!(matches!(
            a.allocate_specific(&o("a"), ip("10.96.0.1")),
            Err(Error::IpFamilyNotConfigured { .. })
        ));
        assert_eq!(a.families(), &[IpFamily::V4]);
    }

    #[test]
    fn rejects_bad_cidr_sets() {
        let bad = |cidrs: &[&str]| {
            let cidrs: Vec<IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
            ClusterIpAllocator::<String>::new(&cidrs, SmallRng::seed_from_u64(1)).is_err()
        };
        assert!(bad(&[]));
        assert!(bad(&["10.0.0.0/16", "10.1.0.0/16"]));
        assert!(bad(&["10.0.0.0/31"]));
        assert!(bad(&["10.0.0.0/16", "fd00::/64", "10.1.0.0/16"]));
    }

    #[test]
    fn plans_apply_all_or_nothing() {
        let mut a = mk_alloc(&["10.96.0.0/16", "fd00::/108"]);
        a.allocate_specific(&o("old"), ip("fd00::9")).unwrap();
        let req = ClusterIpRequest {
            policy: Some(IpFamilyPolicy::RequireDualStack),
            cluster_ips: vec![ip("10.96.0.9"), ip("fd00::9")],
            has_selector: true,
            ..Default::default()
        };
        let plan = plan_cluster_ips(&req, a.families()).unwrap();
        assert!(matches!(
            a.allocate_plan(&o("new"), &plan),
            Err(Error::IpAlreadyAllocated { .. })
        ));
        assert_eq!(a.owner_of(ip("10.96.0.9")), None, "rolled back");
        // Downgrading to single stack releases the secondary family.
        let dual = ClusterIpRequest {
            policy: Some(IpFamilyPolicy::PreferDualStack),
            has_selector: true,
            ..Default::default()
        };
        let plan = plan_cluster_ips(&dual, a.families()).unwrap();
        let got = a.allocate_plan(&o("svc"), &plan).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            a.allocate_plan(&o("svc"), &plan).unwrap(),
            got,
            "idempotent"
        );
        let single = ClusterIpRequest {
            policy: Some(IpFamilyPolicy::SingleStack),
            cluster_ips: vec![got[0]],
            has_selector: true,
            ..Default::default()
        };
        let plan = plan_cluster_ips(&single, a.families()).unwrap();
        assert_eq!(a.allocate_plan(&o("svc"), &plan).unwrap(), vec![got[0]]);
        assert_eq!(a.owner_of(got[1]), None);
    }
}
