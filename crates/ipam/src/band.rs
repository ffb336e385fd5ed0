//! The API server's dynamic allocation strategy, shared by ClusterIPs and NodePorts: a lower
//! *static band* is left for Services that ask for a specific value, and dynamic picks are
//! random in the upper band first, then in the lower band.

use rand::Rng;

use crate::offsets::OffsetSet;

/// `min(max(min, size/step), max)`, or 0 when the range has `min` or fewer values.
pub(crate) fn static_band(range_size: u128, min: u128, max: u128, step: u128) -> u128 {
    if range_size <= min {
        return 0;
    }
    (range_size / step).clamp(min, max)
}

/// A free offset in `0..size`, random in `band..size` first and in `0..band` after; `None`
/// when every offset is used. A random start followed by the next free offset (wrapping
/// within the band) keeps this O(log n) however full the range is.
pub(crate) fn pick_random<R: Rng>(
    used: &OffsetSet,
    size: u128,
    band: u128,
    rng: &mut R,
) -> Option<u128> {
    if size == 0 || used.len() >= size {
        return None;
    }
    let band = band.min(size);
    pick_in(used, band, size - 1, rng).or_else(|| {
        band.checked_sub(1)
            .and_then(|last| pick_in(used, 0, last, rng))
    })
}

/// A free offset in `lo..=hi`, starting from a random point and wrapping once.
fn pick_in<R: Rng>(used: &OffsetSet, lo: u128, hi: u128, rng: &mut R) -> Option<u128> {
    if lo > hi {
        return None;
    }
    let start = rng.random_range(lo..=hi);
    used.first_free_in(start, hi).or_else(|| {
        start
            .checked_sub(1)
            .and_then(|before| used.first_free_in(lo, before))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn band_formula_matches_the_api_server() {
        // ClusterIPs: min(max(16, size/16), 256).
        assert_eq!(static_band(16, 16, 256, 16), 0);
        assert_eq!(static_band(32, 16, 256, 16), 16);
        assert_eq!(static_band(1024, 16, 256, 16), 64);
        assert_eq!(static_band(65536, 16, 256, 16), 256);
        assert_eq!(static_band(1 << 64, 16, 256, 16), 256);
        // NodePorts: min(max(16, size/32), 128).
        assert_eq!(static_band(2768, 16, 128, 32), 86);
        assert_eq!(static_band(100, 16, 128, 32), 16);
        assert_eq!(static_band(10000, 16, 128, 32), 128);
    }

    #[test]
    fn upper_band_fills_before_lower_band() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut used = OffsetSet::for_size(64);
        let (size, band) = (64u128, 16u128);
        for i in 0..size {
            let x = pick_random(&used, size, band, &mut rng).unwrap();
            assert!(used.insert(x));
            if i < size - band {
                assert!(
                    x >= band,
                    "{x} picked from the static band while the upper band had room"
                );
            } else {
                assert!(x < band);
            }
        }
        assert_eq!(pick_random(&used, size, band, &mut rng), None);
    }

    #[test]
    fn zero_band_and_empty_range() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(pick_random(&OffsetSet::for_size(0), 0, 0, &mut rng), None);
        assert!(pick_random(&OffsetSet::for_size(5), 5, 0, &mut rng).unwrap() < 5);
        // A huge range works without memory proportional to it.
        let huge = OffsetSet::for_size(u128::MAX);
        assert!(pick_random(&huge, u128::MAX, 256, &mut rng).unwrap() >= 256);
    }
}
