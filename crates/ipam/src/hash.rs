//! A fast, deterministic hasher for the allocators' internal maps.
//!
//! The maps are keyed by addresses and Service keys and sit on the hot path of every
//! assignment; SipHash dominated the profile. This is the multiply-rotate scheme rustc uses
//! (FxHash) plus a final avalanche. It offers no protection against chosen collisions, which is acceptable here:
//! keys are Service names that only cluster users with create rights choose, and a
//! collision flood only slows the allocator down.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        // The tail (Service names are mostly shorter than a word) is read with at most
        // three fixed-size loads that may overlap; a variable-length copy would be a call
        // into memcpy per string. Overlapping bytes land on their own positions, so the
        // word is exactly the tail in little-endian order.
        let rest = chunks.remainder();
        let n = rest.len();
        if n >= 4 {
            let mut lo = [0u8; 4];
            let mut hi = [0u8; 4];
            lo.copy_from_slice(&rest[..4]);
            hi.copy_from_slice(&rest[n - 4..]);
            let word = u64::from(u32::from_le_bytes(lo))
                | u64::from(u32::from_le_bytes(hi)) << (8 * (n - 4));
            self.add(word);
        } else if n > 0 {
            let word = u64::from(rest[0])
                | u64::from(rest[n / 2]) << (8 * (n / 2))
                | u64::from(rest[n - 1]) << (8 * (n - 1));
            self.add(word);
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.add(i as u64);
        self.add((i >> 64) as u64);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    /// The multiply-rotate steps leave differences in the high bytes of a word (the
    /// digits of `svc-1234`) in the high bits of the hash, while the table indexes by the
    /// low bits; a final avalanche (MurmurHash3's fmix64) spreads them.
    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
pub(crate) type FxHashMap<K, V> = HashMap<K, V, FxBuild>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn h<T: Hash>(t: &T) -> u64 {
        FxBuild::default().hash_one(t)
    }

    #[test]
    fn tails_are_read_exactly() {
        for n in 0..=23usize {
            let bytes: Vec<u8> = (1..=n as u8).collect();
            let mut fast = FxHasher::default();
            fast.write(&bytes);
            // The same words, padded with zeros, through the word path.
            let mut slow = FxHasher::default();
            for chunk in bytes.chunks(8) {
                let mut w = [0u8; 8];
                w[..chunk.len()].copy_from_slice(chunk);
                slow.add(u64::from_le_bytes(w));
            }
            assert_eq!(fast.hash, slow.hash, "length {n}");
        }
    }

    #[test]
    fn distinguishes_nearby_keys_and_is_deterministic() {
        assert_eq!(h(&"default/web"), h(&"default/web"));
        assert_ne!(h(&"default/web"), h(&"default/weba"));
        assert_ne!(h(&("a", "bc")), h(&("ab", "c")));
        assert_ne!(h(&1u128), h(&(1u128 << 64)));
        let ips: std::collections::BTreeSet<u64> = (0u32..1000).map(|i| h(&i)).collect();
        assert_eq!(ips.len(), 1000);
    }
}
