//! RAID-Z parity: a Reed-Solomon code over the columns of a [`RaidzMap`].
//!
//! # Theory of operation
//!
//! Each block (one [`RaidzMap`]) is one Reed-Solomon codeword over GF(2^8), taken
//! byte-position-wise across the columns: byte `k` of each parity column is a linear
//! combination of byte `k` of every data column, where data columns shorter than the
//! parity column (the last row of a block may be partial) read as zeros past their end.
//! The code is maximum-distance-separable: any `p` of the `d + p` columns can be lost
//! and rebuilt from the others.
//!
//! The matrix is the systematic Vandermonde matrix of `reed-solomon-erasure`
//! (`V * inv(V_top)`; data columns are stored verbatim, the parity rows are the bottom
//! `p` rows), whose GF kernels are SIMD (`simd-accel`).  This is *not* ZFS's P/Q/R
//! parity, so pools are not on-disk compatible with ZFS.  [`crate::scalar`] holds an
//! independent scalar implementation of the same code that the tests compare against.
//!
//! # On-disk invariants
//!
//! * Parity columns are exactly `cols[0].size` long; padding bytes of short data
//!   columns are never stored, they are implicitly zero.
//! * The matrix depends only on `(d, p)`, so parity written today must be decodable by
//!   any later version: the matrix construction is part of the format (pinned by the
//!   scalar reference tests).
//!
//! # Failure model
//!
//! * *Erasures* (a child is missing or reported an I/O error: the location is known):
//!   [`ParityCodec::reconstruct`] rebuilds up to `p` of them.
//! * *Silent corruption* (a child returned wrong bytes): only the block checksum can
//!   tell.  [`reconstruct_verified`] does what ZFS's `vdev_raidz_combrec` does: it
//!   assumes successively larger sets of columns bad (erasures count against the
//!   parity budget), rebuilds them and asks the checksum, smallest sets first.  The
//!   checksum is the only arbiter: with more than `p` bad columns nothing verifies and
//!   the result is [`RaidzError::Unrecoverable`], never unverified data (a checksum
//!   collision could still be accepted, exactly as in ZFS).  Once good data is found,
//!   the full codeword is recomputed and compared against every column read, so the
//!   caller learns the exact set of columns to rewrite (self-healing), including a
//!   corrupt parity column that was never needed for the reconstruction.
//!
//! `ReedSolomon` instances (which own their decode-matrix caches) are built once per
//! `(d, p)` and shared; [`ParityCodec`] is `Send + Sync`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;
use reed_solomon_erasure::galois_8::ReedSolomon;

use tank_device::{IoBuf, IoRef};

use crate::raidz::{RaidzError, RaidzMap};

/// Reed-Solomon parity for RAID-Z maps, with `ReedSolomon` instances cached per
/// `(data_shards, parity_shards)`.
#[derive(Default)]
pub struct ParityCodec {
    cache: RwLock<HashMap<(usize, usize), Arc<ReedSolomon>>>,
}

impl fmt::Debug for ParityCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shapes: Vec<(usize, usize)> = self.cache.read().keys().copied().collect();
        shapes.sort_unstable();
        f.debug_struct("ParityCodec")
            .field("cached_shapes", &shapes)
            .finish()
    }
}

/// Result of [`reconstruct_verified`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconstructed {
    /// The block's bytes, verified by the caller's checksum.
    pub data: Vec<u8>,
    /// Indices into the map's columns (parity first) whose content as read differs from
    /// the good content, including missing columns; ascending.
    pub bad_cols: Vec<usize>,
    /// Number of candidate reconstructions checked against the checksum (0 when the
    /// data columns verified as read).
    pub combinations_tried: usize,
}

impl ParityCodec {
    /// A codec with an empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn rs(&self, data: usize, parity: usize) -> Result<Arc<ReedSolomon>, RaidzError> {
        if let Some(rs) = self.cache.read().get(&(data, parity)) {
            return Ok(Arc::clone(rs));
        }
        let rs = ReedSolomon::new(data, parity).map_err(|e| {
            RaidzError::InvalidShards(format!("{data} data + {parity} parity shards: {e}"))
        })?;
        Ok(Arc::clone(
            self.cache
                .write()
                .entry((data, parity))
                .or_insert_with(|| Arc::new(rs)),
        ))
    }

    /// Parity for one RAID-Z map: data columns shorter than the parity column are
    /// zero-padded to its length for the computation only.  Every vector of `parity` is
    /// resized to the parity column length (the longest data column) and overwritten.
    ///
    /// # Panics
    /// If `data_cols` or `parity` is empty, or there are more than 256 shards in all.
    pub fn encode(&self, data_cols: &[&[u8]], parity: &mut [Vec<u8>]) {
        assert!(
            !data_cols.is_empty(),
            "encode needs at least one data column"
        );
        assert!(
            !parity.is_empty(),
            "encode needs at least one parity column"
        );
        let len = data_cols.iter().map(|c| c.len()).max().unwrap_or(0);
        for p in parity.iter_mut() {
            p.resize(len, 0);
        }
        let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
        self.encode_into(data_cols, &mut outputs);
    }

    /// [`ParityCodec::encode`] into parity buffers the caller sized: each as long as the
    /// longest data column.
    ///
    /// # Panics
    /// As `encode`, and if a parity buffer has another length.
    pub fn encode_into(&self, data_cols: &[&[u8]], parity: &mut [&mut [u8]]) {
        assert!(
            !data_cols.is_empty() && !parity.is_empty(),
            "encode needs data and parity columns"
        );
        let rs = self
            .rs(data_cols.len(), parity.len())
            .unwrap_or_else(|e| panic!("{e}"));
        let len = data_cols.iter().map(|c| c.len()).max().unwrap_or(0);
        assert!(
            parity.iter().all(|p| p.len() == len),
            "parity columns must be {len} bytes"
        );
        // Encode segment by segment between the distinct column lengths: inside a
        // segment a column is either fully present or fully padding (a shared zero
        // buffer), so nothing is copied.  A RAID-Z map has at most two segments.
        let mut bounds: Vec<usize> = data_cols.iter().map(|c| c.len()).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let zeros = vec![0u8; bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)];
        let mut start = 0;
        for end in bounds.into_iter().filter(|&end| end > 0) {
            let inputs: Vec<&[u8]> = data_cols
                .iter()
                .map(|c| {
                    if c.len() >= end {
                        &c[start..end]
                    } else {
                        &zeros[..end - start]
                    }
                })
                .collect();
            let mut outputs: Vec<&mut [u8]> =
                parity.iter_mut().map(|p| &mut p[start..end]).collect();
            rs.encode_sep(&inputs, &mut outputs)
                .expect("shard count and lengths checked");
            start = end;
        }
    }

    /// Rebuilds every `None` shard.  `shards` holds the parity shards first (`parity` of
    /// them), then the data shards; `sizes[i]` is the real size of shard `i` (parity
    /// shards must be the largest).  Shorter shards count as zero-padded; rebuilt shards
    /// are truncated back to their real size.  Present shards are left as they are.
    ///
    /// Errors with [`RaidzError::TooManyMissing`] if more than `parity` shards are
    /// missing, and [`RaidzError::InvalidShards`] on inconsistent arguments; on error no
    /// shard is modified.
    pub fn reconstruct(
        &self,
        shards: &mut [Option<Vec<u8>>],
        sizes: &[usize],
        parity: usize,
    ) -> Result<(), RaidzError> {
        self.reconstruct_shards(shards, sizes, parity, false)
    }

    /// [`ParityCodec::reconstruct`], optionally leaving missing parity shards `None`.
    fn reconstruct_shards(
        &self,
        shards: &mut [Option<Vec<u8>>],
        sizes: &[usize],
        parity: usize,
        data_only: bool,
    ) -> Result<(), RaidzError> {
        let n = shards.len();
        if sizes.len() != n {
            return Err(RaidzError::InvalidShards(format!(
                "{n} shards but {} sizes",
                sizes.len()
            )));
        }
        if parity == 0 || parity >= n {
            return Err(RaidzError::InvalidShards(format!(
                "{parity} parity shards out of {n}"
            )));
        }
        let len = sizes.iter().copied().max().unwrap_or(0);
        if let Some(i) = (0..parity).find(|&i| sizes[i] != len) {
            return Err(RaidzError::InvalidShards(format!(
                "parity shard {i} has size {} but the largest shard is {len}",
                sizes[i]
            )));
        }
        let mut missing = 0;
        for (i, shard) in shards.iter().enumerate() {
            match shard {
                None => missing += 1,
                Some(s) if s.len() != sizes[i] => {
                    return Err(RaidzError::InvalidShards(format!(
                        "shard {i} has {} bytes, expected {}",
                        s.len(),
                        sizes[i]
                    )))
                }
                Some(_) => {}
            }
        }
        if missing > parity {
            return Err(RaidzError::TooManyMissing { missing, parity });
        }
        if missing == 0 {
            return Ok(());
        }
        if len == 0 {
            for (i, shard) in shards.iter_mut().enumerate() {
                if shard.is_none() && (i >= parity || !data_only) {
                    *shard = Some(Vec::new());
                }
            }
            return Ok(());
        }
        let rs = self.rs(n - parity, parity)?;
        // reed-solomon-erasure orders data shards first; move (not copy) the vectors
        // over, zero-padding the short ones in place.
        let order: Vec<usize> = (parity..n).chain(0..parity).collect();
        let mut work: Vec<Option<Vec<u8>>> = order
            .iter()
            .map(|&i| {
                shards[i].take().map(|mut s| {
                    s.resize(len, 0);
                    s
                })
            })
            .collect();
        let result = if data_only {
            rs.reconstruct_data(&mut work)
        } else {
            rs.reconstruct(&mut work)
        };
        for (&i, shard) in order.iter().zip(work) {
            shards[i] = shard.map(|mut s| {
                s.truncate(sizes[i]);
                s
            });
        }
        result.map_err(|e| RaidzError::InvalidShards(e.to_string()))
    }
}

/// Encodes a block for `map`: returns every column buffer of `map.cols` in map order
/// (parity then data), ready to write.
///
/// # Panics
/// If `data.len()` differs from the map's psize.
pub fn encode_map(codec: &ParityCodec, map: &RaidzMap, data: &[u8]) -> Vec<Vec<u8>> {
    let data_cols = map.split(data);
    let mut cols = vec![Vec::new(); map.parity];
    codec.encode(&data_cols, &mut cols);
    debug_assert!(cols.iter().all(|c| c.len() as u64 == map.parity_size()));
    cols.extend(data_cols.iter().map(|c| c.to_vec()));
    cols
}

/// [`encode_map`] for a write: the data columns are ranges of `data` (no copy), the parity
/// columns aligned buffers of their own.
///
/// # Panics
/// If `data.len()` differs from the map's psize.
pub fn encode_map_shared(codec: &ParityCodec, map: &RaidzMap, data: &IoRef) -> Vec<IoRef> {
    let data_cols = map.split(data);
    let psize = map.parity_size() as usize;
    // Every parity byte is written by the encoder, so recycled bytes need no zeroing.
    let mut parity: Vec<IoBuf> = (0..map.parity).map(|_| IoBuf::scratch(psize)).collect();
    {
        let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
        codec.encode_into(&data_cols, &mut outputs);
    }
    let mut cols: Vec<IoRef> = parity.into_iter().map(IoRef::whole).collect();
    let mut start = 0;
    for c in &data_cols {
        cols.push(data.slice(start..start + c.len()));
        start += c.len();
    }
    cols
}

/// Checksum-guided reconstruction (ZFS `vdev_raidz_combrec`).
///
/// `cols` are the map's columns as read (parity first, then data; `None` where the
/// child reported an error or is missing); `verify` checks the block checksum.
///
/// 1. If every data column is present and verifies as read, done.
/// 2. Else, if data columns are missing, rebuild them from parity and verify.
/// 3. Else try every set of `1..=(parity - missing)` additional columns (data or
///    parity) assumed bad, smallest sets first, rebuild, verify.
///
/// On success returns the data and the exact set of columns whose content differs
/// from the good content (recomputed from the good data).  Errors with
/// [`RaidzError::Unrecoverable`] when nothing verifies (including when more than
/// `parity` columns are missing), and [`RaidzError::InvalidShards`] if `cols` does not
/// match the map.
pub fn reconstruct_verified(
    codec: &ParityCodec,
    map: &RaidzMap,
    cols: Vec<Option<Vec<u8>>>,
    verify: &dyn Fn(&[u8]) -> bool,
) -> Result<Reconstructed, RaidzError> {
    let n = map.cols.len();
    let parity = map.parity;
    if cols.len() != n {
        return Err(RaidzError::InvalidShards(format!(
            "{} columns for a map of {n}",
            cols.len()
        )));
    }
    let sizes: Vec<usize> = map.cols.iter().map(|c| c.size as usize).collect();
    for (i, c) in cols.iter().enumerate() {
        if let Some(c) = c {
            if c.len() != sizes[i] {
                return Err(RaidzError::InvalidShards(format!(
                    "column {i} has {} bytes, expected {}",
                    c.len(),
                    sizes[i]
                )));
            }
        }
    }

    let (good, combinations_tried) = search(codec, &cols, &sizes, parity, verify);
    let data = good.ok_or(RaidzError::Unrecoverable)?;
    let expected = encode_map(codec, map, &data);
    let bad_cols = (0..n)
        .filter(|&i| cols[i].as_deref() != Some(expected[i].as_slice()))
        .collect();
    Ok(Reconstructed {
        data,
        bad_cols,
        combinations_tried,
    })
}

/// The combinatorial search of [`reconstruct_verified`]: the verified data (if any) and
/// the number of candidates checked.
fn search(
    codec: &ParityCodec,
    cols: &[Option<Vec<u8>>],
    sizes: &[usize],
    parity: usize,
    verify: &dyn Fn(&[u8]) -> bool,
) -> (Option<Vec<u8>>, usize) {
    let missing: Vec<usize> = (0..cols.len()).filter(|&i| cols[i].is_none()).collect();
    let present: Vec<usize> = (0..cols.len()).filter(|&i| cols[i].is_some()).collect();
    let data_missing = missing.iter().any(|&i| i >= parity);

    // 1. The data columns as read.
    if !data_missing {
        let data = concat(cols[parity..].iter().map(|c| c.as_deref().unwrap_or(&[])));
        if verify(&data) {
            return (Some(data), 0);
        }
    }
    if missing.len() > parity {
        return (None, 0);
    }

    let mut tried = 0;
    // 2. and 3.: erase the missing columns plus `extra` more, smallest sets first.  Sets
    // that erase no data column would just reproduce the data of step 1.
    for extra in 0..=(parity - missing.len()) {
        let mut combo: Vec<usize> = (0..extra).collect();
        loop {
            let mut erased = missing.clone();
            erased.extend(combo.iter().map(|&k| present[k]));
            if erased.iter().any(|&i| i >= parity) {
                tried += 1;
                if let Some(data) = rebuild_data(codec, cols, sizes, parity, &erased) {
                    if verify(&data) {
                        return (Some(data), tried);
                    }
                }
            }
            if !next_combination(&mut combo, present.len()) {
                break;
            }
        }
    }
    (None, tried)
}

/// Rebuilds the data assuming the columns in `erased` are bad.
fn rebuild_data(
    codec: &ParityCodec,
    cols: &[Option<Vec<u8>>],
    sizes: &[usize],
    parity: usize,
    erased: &[usize],
) -> Option<Vec<u8>> {
    let mut shards: Vec<Option<Vec<u8>>> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| if erased.contains(&i) { None } else { c.clone() })
        .collect();
    codec
        .reconstruct_shards(&mut shards, sizes, parity, true)
        .ok()?;
    Some(concat(
        shards[parity..].iter().map(|c| c.as_deref().unwrap_or(&[])),
    ))
}

fn concat<'a>(parts: impl Iterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.clone().map(<[u8]>::len).sum());
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

/// Advances `combo` (strictly increasing indices below `n`) to the next combination of
/// the same size in lexicographic order; false when it was the last one.
fn next_combination(combo: &mut [usize], n: usize) -> bool {
    let k = combo.len();
    for i in (0..k).rev() {
        if combo[i] < n - k + i {
            combo[i] += 1;
            for j in i + 1..k {
                combo[j] = combo[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raidz::RaidzGeometry;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn codec_is_send_sync() {
        assert_send_sync::<ParityCodec>();
    }

    #[test]
    fn shared_encoding_overwrites_every_parity_byte_and_shares_the_data() {
        let codec = ParityCodec::new();
        for (children, parity, psize) in [(7, 2, 128 * 1024), (5, 1, 9 * 512), (6, 3, 3 * 4096)] {
            let g = RaidzGeometry::new(children, parity, 9).unwrap();
            let map = g.map(0, psize);
            let data: Vec<u8> = (0..psize).map(|i| (i * 7 % 251) as u8).collect();
            let expected = encode_map(&codec, &map, &data);
            // Recycled buffers of the parity's size hold garbage before the encoding.
            let plen = map.parity_size() as usize;
            let dirty: Vec<IoBuf> = (0..4).map(|_| IoBuf::copy_of(&vec![0xEE; plen])).collect();
            drop(dirty);
            let shared = IoRef::copy_of(&data);
            let cols = encode_map_shared(&codec, &map, &shared);
            assert_eq!(cols.len(), expected.len());
            for (got, want) in cols.iter().zip(&expected) {
                assert_eq!(&got[..], &want[..]);
            }
            // Data columns are ranges of the block's own buffer.
            let first_data = &cols[map.parity];
            assert_eq!(first_data.as_ptr(), shared.as_ptr());
        }
    }

    #[test]
    fn combinations_enumerate_in_order() {
        let mut combo = vec![0, 1];
        let mut all = vec![combo.clone()];
        while next_combination(&mut combo, 4) {
            all.push(combo.clone());
        }
        assert_eq!(
            all,
            vec![
                vec![0, 1],
                vec![0, 2],
                vec![0, 3],
                vec![1, 2],
                vec![1, 3],
                vec![2, 3]
            ]
        );
        let mut empty: Vec<usize> = vec![];
        assert!(!next_combination(&mut empty, 3));
    }

    #[test]
    fn encode_pads_short_columns() {
        let codec = ParityCodec::new();
        let a = [1u8, 2, 3, 4];
        let b = [5u8, 6];
        let mut parity = vec![Vec::new(); 2];
        codec.encode(&[&a, &b], &mut parity);
        let b_padded = [5u8, 6, 0, 0];
        let mut expected = vec![Vec::new(); 2];
        codec.encode(&[&a, &b_padded], &mut expected);
        assert_eq!(parity, expected);
        assert!(parity.iter().all(|p| p.len() == 4));
    }

    #[test]
    fn reconstruct_rebuilds_and_truncates() {
        let codec = ParityCodec::new();
        let data: Vec<Vec<u8>> = vec![vec![9; 6], vec![7; 6], vec![3; 4]];
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut parity = vec![Vec::new(); 2];
        codec.encode(&refs, &mut parity);
        let mut shards: Vec<Option<Vec<u8>>> =
            parity.iter().chain(&data).cloned().map(Some).collect();
        let sizes = [6, 6, 6, 6, 4];
        let full = shards.clone();
        shards[0] = None;
        shards[4] = None;
        codec.reconstruct(&mut shards, &sizes, 2).unwrap();
        assert_eq!(shards, full);
        shards[1] = None;
        shards[2] = None;
        shards[3] = None;
        assert_eq!(
            codec.reconstruct(&mut shards, &sizes, 2),
            Err(RaidzError::TooManyMissing {
                missing: 3,
                parity: 2
            })
        );
        assert!(shards[0].is_some() && shards[4].is_some());
    }

    #[test]
    fn verified_reports_unneeded_bad_parity() {
        let codec = ParityCodec::new();
        let geo = RaidzGeometry::new(6, 2, 9).unwrap();
        let map = geo.map(0, 9 * 512);
        let data: Vec<u8> = (0..9 * 512).map(|i| (i * 7 + 3) as u8).collect();
        let mut cols: Vec<Option<Vec<u8>>> = encode_map(&codec, &map, &data)
            .into_iter()
            .map(Some)
            .collect();
        cols[1].as_mut().unwrap()[17] ^= 0x40;
        let want = data.clone();
        let r = reconstruct_verified(&codec, &map, cols, &|d| d == want.as_slice()).unwrap();
        assert_eq!(r.data, data);
        assert_eq!(r.bad_cols, vec![1]);
        assert_eq!(r.combinations_tried, 0);
    }
}
