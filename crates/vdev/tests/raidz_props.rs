//! Property and exhaustive tests of the RAID-Z layout and parity code.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tank_vdev::codec::{encode_map, reconstruct_verified, ParityCodec};
use tank_vdev::raidz::{RaidzError, RaidzGeometry, RaidzMap};
use tank_vdev::scalar;

/// Every `k`-subset of `0..n`, lexicographically.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    fn rec(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            if n - i < k - cur.len() {
                break;
            }
            cur.push(i);
            rec(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    rec(0, n, k, &mut Vec::new(), &mut out);
    out
}

fn random_bytes(rng: &mut impl RngCore, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

fn hash_of(data: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    data.hash(&mut h);
    h.finish()
}

fn col_sizes(map: &RaidzMap) -> Vec<usize> {
    map.cols.iter().map(|c| c.size as usize).collect()
}

/// Psizes (in sectors) exercising the interesting map shapes for a data width `dw`:
/// a single sector (fewest columns), a block one sector short of a full row (fewer
/// columns than children), exactly one full row, and several rows with a partial last
/// row.
fn interesting_psizes(dw: u64) -> Vec<u64> {
    let mut v = vec![1, dw.saturating_sub(1).max(1), dw, 2 * dw + dw.div_ceil(2)];
    if dw == 1 {
        v.push(3);
    }
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn exhaustive_erasures_every_width_and_parity() {
    let start = Instant::now();
    let codec = ParityCodec::new();
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0001);
    let mut patterns = 0usize;
    let mut full_width_patterns = HashMap::new();
    for width in 2..=24usize {
        for parity in 1..=3usize {
            if width < parity + 1 {
                continue;
            }
            let geo = RaidzGeometry::new(width, parity, 9).unwrap();
            let sector = geo.sector();
            for s in interesting_psizes((width - parity) as u64) {
                let psize = s * sector;
                let offset = rng.gen_range(0..10_000u64) * sector;
                let map = geo.map(offset, psize);
                let data = random_bytes(&mut rng, psize as usize);
                let cols = encode_map(&codec, &map, &data);
                let full: Vec<Option<Vec<u8>>> = cols.iter().cloned().map(Some).collect();
                let sizes = col_sizes(&map);
                let n = map.cols.len();
                let mut map_patterns = 0;
                for k in 1..=parity {
                    for erased in combinations(n, k) {
                        let mut shards = full.clone();
                        for &i in &erased {
                            shards[i] = None;
                        }
                        // Plain erasure decoding rebuilds every column.
                        let mut rebuilt = shards.clone();
                        codec.reconstruct(&mut rebuilt, &sizes, parity).unwrap();
                        assert_eq!(
                            rebuilt, full,
                            "width {width} raidz{parity} s={s} erased {erased:?}"
                        );
                        // The checksum-guided path agrees and reports exactly the erasures.
                        let r = reconstruct_verified(&codec, &map, shards, &|d| d == data)
                            .unwrap_or_else(|e| panic!("{e}: {width} {parity} {erased:?}"));
                        assert_eq!(r.data, data);
                        assert_eq!(r.bad_cols, erased);
                        map_patterns += 1;
                    }
                }
                // One erasure too many is refused.
                let mut shards = full.clone();
                for shard in shards.iter_mut().take(parity + 1) {
                    *shard = None;
                }
                assert_eq!(
                    codec.reconstruct(&mut shards, &sizes, parity),
                    Err(RaidzError::TooManyMissing {
                        missing: parity + 1,
                        parity
                    })
                );
                if n == width {
                    full_width_patterns.insert((width, parity), map_patterns);
                }
                patterns += map_patterns;
            }
        }
    }
    // Every (width, parity) was exercised with a map spanning all children.
    assert_eq!(full_width_patterns.len(), 23 * 3 - 3);
    assert_eq!(full_width_patterns[&(24, 3)], 2324);
    eprintln!(
        "exhaustive erasures: {patterns} patterns in {:.2?}",
        start.elapsed()
    );
}

#[test]
fn exhaustive_silent_corruption_small_widths() {
    let start = Instant::now();
    let codec = ParityCodec::new();
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0002);
    let mut cases = 0usize;
    for width in 2..=10usize {
        for parity in 1..=3usize {
            if width < parity + 1 {
                continue;
            }
            let geo = RaidzGeometry::new(width, parity, 9).unwrap();
            for s in interesting_psizes((width - parity) as u64) {
                let psize = s * geo.sector();
                let map = geo.map(rng.gen_range(0..1000u64) * geo.sector(), psize);
                let data = random_bytes(&mut rng, psize as usize);
                let want = hash_of(&data);
                let cols = encode_map(&codec, &map, &data);
                let n = map.cols.len();
                for k in 1..=parity + 1 {
                    for bad in combinations(n, k) {
                        let mut read: Vec<Option<Vec<u8>>> =
                            cols.iter().cloned().map(Some).collect();
                        for &i in &bad {
                            let col = read[i].as_mut().unwrap();
                            // Beyond the budget, corrupt the first sector, which every
                            // column stores: an error in the tail of a parity column can
                            // fall only on zero padding of short data columns, in which
                            // case the data is (correctly) recoverable after all.
                            let limit = if k > parity { 512 } else { col.len() };
                            let at = rng.gen_range(0..limit);
                            col[at] ^= rng.gen_range(1..=255u8);
                        }
                        let result =
                            reconstruct_verified(&codec, &map, read, &|d| hash_of(d) == want);
                        if k <= parity {
                            let r = result.unwrap_or_else(|e| {
                                panic!("{e}: width {width} raidz{parity} s={s} bad {bad:?}")
                            });
                            assert_eq!(r.data, data);
                            assert_eq!(r.bad_cols, bad);
                        } else {
                            assert_eq!(result, Err(RaidzError::Unrecoverable), "bad {bad:?}");
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    eprintln!(
        "exhaustive silent corruption: {cases} cases in {:.2?}",
        start.elapsed()
    );
}

/// Geometry strategy: (children, parity) with children >= parity + 1.
fn geometry(max_children: usize) -> impl Strategy<Value = (usize, usize)> {
    (1..=3usize).prop_flat_map(move |p| (p + 1..=max_children, Just(p)))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/raidz_props.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    /// Blocks allocated back to back never share a (child, sector), every column lies
    /// inside its block's asize range, and the map's sizes are consistent.
    #[test]
    fn consecutive_blocks_never_overlap(
        (children, parity) in geometry(24),
        ashift in 9u32..=13,
        start in 0u64..64,
        psizes in prop::collection::vec(1u64..=300, 1..24),
    ) {
        let geo = RaidzGeometry::new(children, parity, ashift).unwrap();
        let sector = geo.sector();
        let mut owner: HashMap<(usize, u64), usize> = HashMap::new();
        let mut offset = start * sector;
        for (block, &s) in psizes.iter().enumerate() {
            let psize = s * sector;
            let asize = geo.asize(psize);
            prop_assert_eq!(asize % ((parity as u64 + 1) * sector), 0);
            let map = geo.map(offset, psize);
            prop_assert_eq!(map.psize(), psize);
            prop_assert!(!map.data_cols().is_empty());
            prop_assert!(map.cols.len() + map.skip.len() <= children);
            let biggest = map.cols.iter().map(|c| c.size).max().unwrap();
            prop_assert_eq!(map.cols[0].size, biggest);
            prop_assert!(map.parity_cols().iter().all(|c| c.size == biggest));
            // Allocated sectors (data + parity) == tot; skip fits inside the padding.
            let used: u64 = map.cols.iter().map(|c| c.size).sum();
            prop_assert!(used + map.skip.len() as u64 * sector <= asize);
            let parity_sectors = parity as u64 * s.div_ceil((children - parity) as u64);
            prop_assert_eq!(used, (s + parity_sectors) * sector);
            let mut children_seen = std::collections::HashSet::new();
            for c in map.cols.iter().chain(&map.skip) {
                prop_assert!(children_seen.insert(c.child), "two columns on child {}", c.child);
                prop_assert_eq!(c.size % sector, 0);
                prop_assert_eq!(c.offset % sector, 0);
                for k in 0..c.size / sector {
                    let child_sector = c.offset / sector + k;
                    // The linear vdev sector of this child sector lies within the block.
                    let linear = child_sector * children as u64 + c.child as u64;
                    prop_assert!(linear >= offset / sector && linear < (offset + asize) / sector);
                    if let Some(prev) = owner.insert((c.child, child_sector), block) {
                        prop_assert!(false, "block {} and {} share child {} sector {}",
                            prev, block, c.child, child_sector);
                    }
                }
            }
            offset += asize;
        }
    }

    /// `split` hands out the block's bytes column-major.
    #[test]
    fn split_concatenates_back(
        (children, parity) in geometry(16),
        s in 1u64..=64,
        seed in any::<u64>(),
    ) {
        let geo = RaidzGeometry::new(children, parity, 9).unwrap();
        let map = geo.map(0, s * 512);
        let data = random_bytes(&mut ChaCha8Rng::seed_from_u64(seed), (s * 512) as usize);
        let parts = map.split(&data);
        prop_assert_eq!(parts.len(), map.data_cols().len());
        for (part, col) in parts.iter().zip(map.data_cols()) {
            prop_assert_eq!(part.len() as u64, col.size);
        }
        prop_assert_eq!(parts.concat(), data);
    }

    /// The SIMD codec and the scalar reference agree byte for byte, on encode and on
    /// reconstruct, for arbitrary shard lengths (SIMD tails included).
    #[test]
    fn simd_matches_scalar(
        d in 1usize..=40,
        parity in 1usize..=3,
        len in 1usize..=2100,
        short_by in prop::collection::vec(0usize..=100, 40),
        seed in any::<u64>(),
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let data: Vec<Vec<u8>> = (0..d)
            .map(|j| {
                let l = if j == 0 { len } else { len.saturating_sub(short_by[j]) };
                random_bytes(&mut rng, l)
            })
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let codec = ParityCodec::new();
        let mut simd = vec![Vec::new(); parity];
        codec.encode(&refs, &mut simd);
        let golden = scalar::encode(&refs, parity);
        prop_assert_eq!(&simd, &golden);

        let full: Vec<Option<Vec<u8>>> = simd.iter().chain(&data).cloned().map(Some).collect();
        let sizes: Vec<usize> = full.iter().map(|s| s.as_ref().unwrap().len()).collect();
        let mut erase: Vec<usize> = (0..d + parity).collect();
        erase.shuffle(&mut rng);
        erase.truncate(rng.gen_range(1..=parity));
        let mut a = full.clone();
        for &i in &erase {
            a[i] = None;
        }
        let mut b = a.clone();
        codec.reconstruct(&mut a, &sizes, parity).unwrap();
        scalar::reconstruct(&mut b, &sizes, parity).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&a, &full);
    }

    /// On inconsistent (corrupted) input both implementations still compute the same
    /// thing: they pick the same surviving shards and the same matrix.
    #[test]
    fn simd_matches_scalar_on_garbage(
        d in 1usize..=20,
        parity in 1usize..=3,
        len in 1usize..=300,
        seed in any::<u64>(),
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut shards: Vec<Option<Vec<u8>>> =
            (0..d + parity).map(|_| Some(random_bytes(&mut rng, len))).collect();
        let sizes = vec![len; d + parity];
        let mut erase: Vec<usize> = (0..d + parity).collect();
        erase.shuffle(&mut rng);
        for &i in erase.iter().take(rng.gen_range(1..=parity)) {
            shards[i] = None;
        }
        let mut b = shards.clone();
        ParityCodec::new().reconstruct(&mut shards, &sizes, parity).unwrap();
        scalar::reconstruct(&mut b, &sizes, parity).unwrap();
        prop_assert_eq!(shards, b);
    }

    /// Silent corruption of up to `parity` columns (some possibly also missing) is
    /// repaired and reported exactly; one more bad column is never "repaired".
    #[test]
    fn verified_reconstruction_is_exact(
        (children, parity) in geometry(24),
        s in 1u64..=80,
        missing in 0usize..=3,
        extra in 0usize..=1,
        seed in any::<u64>(),
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let geo = RaidzGeometry::new(children, parity, 9).unwrap();
        let map = geo.map(rng.gen_range(0..1000u64) * 512, s * 512);
        let data = random_bytes(&mut rng, (s * 512) as usize);
        let want = hash_of(&data);
        let codec = ParityCodec::new();
        let cols = encode_map(&codec, &map, &data);
        let n = map.cols.len();
        let missing = missing.min(parity);
        let bad_total = (parity + extra).min(n);
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng);
        let mut bad: Vec<usize> = order[..bad_total].to_vec();
        bad.sort_unstable();
        let mut read: Vec<Option<Vec<u8>>> = cols.iter().cloned().map(Some).collect();
        for (k, &i) in order[..bad_total].iter().enumerate() {
            if k < missing {
                read[i] = None;
            } else {
                let col = read[i].as_mut().unwrap();
                // Corrupt a random run of bytes (always changing at least one).
                // Beyond the budget stay in the first sector (see the exhaustive test).
                let limit = if bad_total > parity { 512 } else { col.len() };
                let at = rng.gen_range(0..limit);
                let end = (at + rng.gen_range(1..64)).min(limit);
                for b in &mut col[at..end] {
                    *b ^= rng.gen_range(1..=255u8);
                }
            }
        }
        let result = reconstruct_verified(&codec, &map, read, &|d| hash_of(d) == want);
        if bad_total <= parity {
            let r = result.unwrap();
            prop_assert_eq!(r.data, data);
            prop_assert_eq!(r.bad_cols, bad);
        } else {
            prop_assert_eq!(result, Err(RaidzError::Unrecoverable));
        }
    }
}

#[test]
fn verified_reconstruction_rejects_mismatched_columns() {
    let codec = ParityCodec::new();
    let geo = RaidzGeometry::new(5, 1, 9).unwrap();
    let map = geo.map(0, 4096);
    let data = vec![7u8; 4096];
    let cols: Vec<Option<Vec<u8>>> = encode_map(&codec, &map, &data)
        .into_iter()
        .map(Some)
        .collect();
    let mut short = cols.clone();
    short[2].as_mut().unwrap().pop();
    assert!(matches!(
        reconstruct_verified(&codec, &map, short, &|_| true),
        Err(RaidzError::InvalidShards(_))
    ));
    assert!(matches!(
        reconstruct_verified(&codec, &map, cols[1..].to_vec(), &|_| true),
        Err(RaidzError::InvalidShards(_))
    ));
    // Too many missing columns: nothing to verify.
    let mut gone = cols.clone();
    gone[1] = None;
    gone[2] = None;
    assert_eq!(
        reconstruct_verified(&codec, &map, gone, &|_| true),
        Err(RaidzError::Unrecoverable)
    );
}
