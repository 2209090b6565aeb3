//! RAID-Z layout: where the columns of one block live on the children.
//!
//! # Theory of operation
//!
//! A RAID-Z vdev of `N` children presents one linear *vdev address space*, striped
//! sector by sector across the children: vdev sector `b` is sector `b / N` of child
//! `b % N` (in the child's data area).  The allocator hands every block of `psize`
//! bytes a contiguous range of [`RaidzGeometry::asize`] bytes of that space, and
//! [`RaidzGeometry::map`] turns `(offset, psize)` into a [`RaidzMap`]: the columns of
//! the block, exactly as OpenZFS's `vdev_raidz_map_alloc` lays them out.
//!
//! Unlike RAID-5, every block is its own stripe ("variable width"): its `s` data
//! sectors are spread over the `N - p` data columns of as many rows as needed, and
//! every row carries `p` parity sectors.  A block smaller than a row simply uses fewer
//! columns (always `p` parity + at least one data column).  Because blocks are never
//! overwritten in place, a block's parity is always written together with its data:
//! there is no read-modify-write and no write hole.
//!
//! With `s = psize / sector`, `q = s / (N - p)`, `r = s % (N - p)`:
//!
//! ```text
//!   map column c (0..scols) = vdev sector b + c  ->  child (b + c) % N,
//!                              child sector (b + c) / N, continuing down that child
//!   columns 0..p           parity, q + (r != 0) sectors each (= the largest column)
//!   columns p..acols       data, the first `bc = r + p` columns get q + 1 sectors,
//!                          the rest q; the block's bytes are laid column-major
//!   columns acols..scols   skip (padding) sectors, only when the block is < 1 row
//! ```
//!
//! # On-disk invariants
//!
//! * The columns of a block tile exactly the vdev sectors `[b, b + tot)`, with
//!   `tot = s + p * ceil(s / (N - p))`; skip columns lie in `[b + tot, b + asize)`.
//!   Hence blocks at disjoint `asize` ranges never share a child sector.
//! * `asize` is `tot` rounded up to a multiple of `p + 1` sectors, so the free space
//!   left between blocks can always hold a minimal block (`p + 1` sectors).  The padding
//!   sectors are never read or written; those that fall in the block's first row are
//!   listed in [`RaidzMap::skip`], the others (when the padding wraps to the next row)
//!   are not described at all.
//! * A block has at most `N` columns, each on a distinct child: losing a child loses at
//!   most one column of any block, so any `p` children can fail.
//! * Data column sizes sum to `psize`; every parity column is as long as the largest
//!   column (`cols[0]`), shorter data columns count as zero-padded for parity.
//! * The map is pure arithmetic on `(geometry, offset, psize)`; nothing about it is
//!   stored, so a vdev's geometry can never change (no RAID-Z expansion here).
//!
//! # Failure model
//!
//! A child may fail entirely or return an I/O error for a column (an *erasure*: the
//! location is known), or silently return wrong bytes (only the block checksum can tell).
//! This module only computes placement; recovery lives in [`crate::codec`].
//!
//! Deliberate differences from ZFS: no raidz1 "swap parity every 1 MiB" quirk
//! (ZFS swaps columns 0 and 1 of raidz1 maps when bit 20 of the offset is set, an
//! on-disk-format wart we need not carry), and the parity is Reed-Solomon, not ZFS's
//! P/Q/R, so we are not on-disk compatible anyway.

use thiserror::Error;

/// Smallest supported parity level (raidz1).
pub const MIN_PARITY: usize = 1;
/// Largest supported parity level (raidz3).
pub const MAX_PARITY: usize = 3;
/// Largest supported number of children.
pub const MAX_CHILDREN: usize = 255;
/// Smallest supported sector shift (512-byte sectors).
pub const MIN_ASHIFT: u32 = 9;
/// Largest supported sector shift (64 KiB sectors).
pub const MAX_ASHIFT: u32 = 16;

/// Errors of the RAID-Z layout and parity code.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RaidzError {
    /// The `(children, parity, ashift)` triple is not a valid RAID-Z geometry.
    #[error("invalid RAID-Z geometry: {0}")]
    InvalidGeometry(String),
    /// The shards or columns handed to the codec are inconsistent (caller bug).
    #[error("invalid shard set: {0}")]
    InvalidShards(String),
    /// More shards are missing than there are parity shards.
    #[error("{missing} shards missing but only {parity} parity shards")]
    TooManyMissing {
        /// Number of missing shards.
        missing: usize,
        /// Number of parity shards.
        parity: usize,
    },
    /// No reconstruction within the parity budget passes the block checksum.
    #[error("block unrecoverable: no combination of at most `parity` bad columns verifies")]
    Unrecoverable,
}

/// Shape of a RAID-Z vdev: number of children, parity level and sector size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RaidzGeometry {
    children: usize,
    parity: usize,
    ashift: u32,
}

/// One column of a [`RaidzMap`]: a contiguous byte range on one child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RaidzCol {
    /// Index of the child holding the column.
    pub child: usize,
    /// Byte offset within the child's data area.
    pub offset: u64,
    /// Length in bytes (a whole number of sectors).
    pub size: u64,
}

/// The columns of one block: `cols[..parity]` parity, `cols[parity..]` data, `skip`
/// padding sectors (never read or written).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RaidzMap {
    /// Number of parity columns at the front of `cols`.
    pub parity: usize,
    /// Parity columns then data columns, in map order.
    pub cols: Vec<RaidzCol>,
    /// Padding columns of one sector each, in map order.
    pub skip: Vec<RaidzCol>,
}

impl RaidzGeometry {
    /// Validates and builds a geometry: `parity` in 1..=3, `parity + 1 <= children <= 255`,
    /// `ashift` in 9..=16.
    pub fn new(children: usize, parity: usize, ashift: u32) -> Result<Self, RaidzError> {
        if !(MIN_PARITY..=MAX_PARITY).contains(&parity) {
            return Err(RaidzError::InvalidGeometry(format!(
                "parity {parity} not in {MIN_PARITY}..={MAX_PARITY}"
            )));
        }
        if children < parity + 1 || children > MAX_CHILDREN {
            return Err(RaidzError::InvalidGeometry(format!(
                "{children} children not in {}..={MAX_CHILDREN} for raidz{parity}",
                parity + 1
            )));
        }
        if !(MIN_ASHIFT..=MAX_ASHIFT).contains(&ashift) {
            return Err(RaidzError::InvalidGeometry(format!(
                "ashift {ashift} not in {MIN_ASHIFT}..={MAX_ASHIFT}"
            )));
        }
        Ok(Self {
            children,
            parity,
            ashift,
        })
    }

    /// Number of children.
    pub fn children(&self) -> usize {
        self.children
    }

    /// Parity level (number of parity columns per row).
    pub fn parity(&self) -> usize {
        self.parity
    }

    /// log2 of the sector size.
    pub fn ashift(&self) -> u32 {
        self.ashift
    }

    /// Sector size in bytes.
    pub fn sector(&self) -> u64 {
        1 << self.ashift
    }

    fn check_psize(&self, psize: u64) {
        assert!(
            psize > 0 && psize.is_multiple_of(self.sector()),
            "psize {psize} must be a non-zero multiple of the {}-byte sector",
            self.sector()
        );
    }

    /// Bytes of vdev address space a block of `psize` bytes occupies:
    /// `tot = s + parity * ceil(s / (children - parity))` sectors, rounded up to a
    /// multiple of `parity + 1` sectors (`vdev_raidz_asize`).
    ///
    /// # Panics
    /// If `psize` is zero or not a multiple of the sector size.
    pub fn asize(&self, psize: u64) -> u64 {
        self.check_psize(psize);
        let s = psize >> self.ashift;
        let p = self.parity as u64;
        let tot = s + p * s.div_ceil((self.children - self.parity) as u64);
        tot.next_multiple_of(p + 1) << self.ashift
    }

    /// Column map for a block at vdev-space byte `offset` of `psize` bytes
    /// (`vdev_raidz_map_alloc`).
    ///
    /// # Panics
    /// If `offset` is not sector-aligned, or `psize` is zero or not a multiple of the
    /// sector size.
    pub fn map(&self, offset: u64, psize: u64) -> RaidzMap {
        self.check_psize(psize);
        assert!(
            offset.is_multiple_of(self.sector()),
            "offset {offset} is not aligned to the {}-byte sector",
            self.sector()
        );
        let sector = self.sector();
        let dcols = self.children as u64;
        let p = self.parity as u64;
        let b = offset >> self.ashift;
        let s = psize >> self.ashift;
        let f = b % dcols;
        let o = (b / dcols) << self.ashift;
        let q = s / (dcols - p);
        let r = s - q * (dcols - p);
        let bc = if r == 0 { 0 } else { r + p };
        let (acols, scols) = if q == 0 {
            (bc, dcols.min(bc.next_multiple_of(p + 1)))
        } else {
            (dcols, dcols)
        };

        let mut cols = Vec::with_capacity(acols as usize);
        let mut skip = Vec::with_capacity((scols - acols) as usize);
        for c in 0..scols {
            let mut child = f + c;
            let mut coff = o;
            if child >= dcols {
                child -= dcols;
                coff += sector;
            }
            let (list, sectors) = if c >= acols {
                (&mut skip, 1)
            } else if c < bc {
                (&mut cols, q + 1)
            } else {
                (&mut cols, q)
            };
            list.push(RaidzCol {
                child: child as usize,
                offset: coff,
                size: sectors << self.ashift,
            });
        }
        RaidzMap {
            parity: self.parity,
            cols,
            skip,
        }
    }

    /// The padding sectors of a block at vdev-space byte `offset` of `psize` bytes: the
    /// vdev sectors `[b + tot, b + asize)` its allocation holds beyond its columns, one
    /// sector each on consecutive children. They belong to no other block, so zeros may be
    /// written there; a leaf writes them only where they join the writes on either side
    /// into one run (ZFS's optional skip-sector I/Os), so that a stream of blocks reaches
    /// every disk as one ascending write instead of a run broken at each padding sector.
    pub fn padding(&self, offset: u64, psize: u64) -> Vec<RaidzCol> {
        self.check_psize(psize);
        let dcols = self.children as u64;
        let p = self.parity as u64;
        let b = offset >> self.ashift;
        let s = psize >> self.ashift;
        let tot = s + p * s.div_ceil(dcols - p);
        let asize = self.asize(psize) >> self.ashift;
        (b + tot..b + asize)
            .map(|k| RaidzCol {
                child: (k % dcols) as usize,
                offset: (k / dcols) << self.ashift,
                size: self.sector(),
            })
            .collect()
    }

    /// Size of the vdev address space given the usable size of the smallest child
    /// (rounded down to whole sectors): `child_sectors * children * sector`.
    pub fn vdev_space(&self, child_usable: u64) -> u64 {
        (child_usable >> self.ashift) * self.children as u64 * self.sector()
    }
}

impl RaidzMap {
    /// The parity columns (`cols[..parity]`).
    pub fn parity_cols(&self) -> &[RaidzCol] {
        &self.cols[..self.parity]
    }

    /// The data columns (`cols[parity..]`), in the order the block's bytes fill them.
    pub fn data_cols(&self) -> &[RaidzCol] {
        &self.cols[self.parity..]
    }

    /// Total size of the data columns: the block's `psize`.
    pub fn psize(&self) -> u64 {
        self.data_cols().iter().map(|c| c.size).sum()
    }

    /// Length of every parity column (the largest column).
    pub fn parity_size(&self) -> u64 {
        self.cols[0].size
    }

    /// Splits the block's bytes into the data columns' slices (column-major).
    ///
    /// # Panics
    /// If `data.len()` differs from [`RaidzMap::psize`].
    pub fn split<'a>(&self, data: &'a [u8]) -> Vec<&'a [u8]> {
        assert_eq!(
            data.len() as u64,
            self.psize(),
            "block length does not match the map"
        );
        let mut rest = data;
        self.data_cols()
            .iter()
            .map(|c| {
                let (col, tail) = rest.split_at(c.size as usize);
                rest = tail;
                col
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    fn g(children: usize, parity: usize, ashift: u32) -> RaidzGeometry {
        RaidzGeometry::new(children, parity, ashift).unwrap()
    }

    fn col(child: usize, offset: u64, size: u64) -> RaidzCol {
        RaidzCol {
            child,
            offset,
            size,
        }
    }

    #[test]
    fn geometry_validation() {
        assert!(RaidzGeometry::new(2, 1, 9).is_ok());
        assert!(RaidzGeometry::new(4, 3, 16).is_ok());
        assert!(RaidzGeometry::new(255, 3, 12).is_ok());
        assert!(RaidzGeometry::new(1, 1, 12).is_err());
        assert!(RaidzGeometry::new(3, 3, 12).is_err());
        assert!(RaidzGeometry::new(5, 0, 12).is_err());
        assert!(RaidzGeometry::new(5, 4, 12).is_err());
        assert!(RaidzGeometry::new(256, 1, 12).is_err());
        assert!(RaidzGeometry::new(5, 1, 8).is_err());
        assert!(RaidzGeometry::new(5, 1, 17).is_err());
        let geo = g(6, 2, 12);
        assert_eq!(
            (geo.children(), geo.parity(), geo.ashift(), geo.sector()),
            (6, 2, 12, 4096)
        );
    }

    #[test]
    fn asize_hand_computed() {
        // raidz1, 5 children, 4K sectors.
        let z1 = g(5, 1, 12);
        // s=1: 1 + 1*ceil(1/4) = 2 -> roundup(2, 2) = 2 sectors.
        assert_eq!(z1.asize(4 * K), 8 * K);
        // s=32: 32 + 1*8 = 40 -> roundup(40, 2) = 40 sectors.
        assert_eq!(z1.asize(128 * K), 160 * K);
        // s=3: 3 + 1 = 4 -> 4 sectors.
        assert_eq!(z1.asize(12 * K), 16 * K);
        // s=5: 5 + 2 = 7 -> roundup(7, 2) = 8 sectors.
        assert_eq!(z1.asize(20 * K), 32 * K);
        // raidz2, 6 children: s=1: 1 + 2 = 3 -> roundup(3, 3) = 3 sectors.
        let z2 = g(6, 2, 12);
        assert_eq!(z2.asize(4 * K), 12 * K);
        // s=5: 5 + 2*2 = 9 -> 9 sectors.
        assert_eq!(z2.asize(20 * K), 36 * K);
        // s=4: 4 + 2 = 6 -> 6 sectors.
        assert_eq!(z2.asize(16 * K), 24 * K);
        // raidz3, 7 children: s=2: 2 + 3 = 5 -> roundup(5, 4) = 8 sectors.
        let z3 = g(7, 3, 12);
        assert_eq!(z3.asize(8 * K), 32 * K);
        // s=32: 32 + 3*8 = 56 -> 56 sectors.
        assert_eq!(z3.asize(128 * K), 224 * K);
        // 512-byte sectors: raidz2 of 10, s=17: 17 + 2*3 = 23 -> 24 sectors.
        assert_eq!(g(10, 2, 9).asize(17 * 512), 24 * 512);
    }

    #[test]
    fn map_raidz1_single_sector() {
        // b = 7: f = 2, o = 1 sector. q=0, r=1, bc=2, acols=2, scols=min(5, 2)=2.
        let m = g(5, 1, 12).map(7 * 4 * K, 4 * K);
        assert_eq!(m.cols, vec![col(2, 4 * K, 4 * K), col(3, 4 * K, 4 * K)]);
        assert!(m.skip.is_empty());
    }

    #[test]
    fn map_raidz1_wrapping_columns() {
        // s=3 at b=3: f=3, o=0, q=0, r=3, bc=4, acols=scols=4; columns wrap to the next row.
        let m = g(5, 1, 12).map(3 * 4 * K, 12 * K);
        assert_eq!(
            m.cols,
            vec![
                col(3, 0, 4 * K),
                col(4, 0, 4 * K),
                col(0, 4 * K, 4 * K),
                col(1, 4 * K, 4 * K),
            ]
        );
        assert!(m.skip.is_empty());
    }

    #[test]
    fn map_raidz1_full_rows() {
        // 128K at offset 0: q=8, r=0, bc=0: every column 8 sectors.
        let m = g(5, 1, 12).map(0, 128 * K);
        assert_eq!(m.cols.len(), 5);
        for (c, column) in m.cols.iter().enumerate() {
            assert_eq!(*column, col(c, 0, 32 * K));
        }
        assert_eq!(m.psize(), 128 * K);
    }

    #[test]
    fn map_raidz2_partial_last_row() {
        // raidz2 of 6, 20K (s=5) at offset 0: q=1, r=1, bc=3; sizes 2,2,2,1,1,1 sectors.
        let m = g(6, 2, 12).map(0, 20 * K);
        let sizes: Vec<u64> = m.cols.iter().map(|c| c.size / (4 * K)).collect();
        assert_eq!(sizes, vec![2, 2, 2, 1, 1, 1]);
        assert_eq!(m.parity_size(), 8 * K);
        assert_eq!(m.psize(), 20 * K);
        assert!(m.skip.is_empty());
    }

    #[test]
    fn padding_and_columns_tile_the_allocation_exactly() {
        for (children, parity, ashift) in
            [(7, 2, 12), (6, 2, 12), (5, 1, 9), (8, 3, 12), (4, 3, 16)]
        {
            let g = RaidzGeometry::new(children, parity, ashift).unwrap();
            let sector = 1u64 << ashift;
            for sectors in [1u64, 2, 3, 5, 7, 8, 31, 32, 33, 64, 255, 256] {
                let psize = sectors * sector;
                for b in [0u64, 1, 2, 3, children as u64 - 1, 97] {
                    let offset = b * sector;
                    let map = g.map(offset, psize);
                    let pads = g.padding(offset, psize);
                    assert!(pads.len() <= parity, "fewer padding sectors than p + 1");
                    // Every child sector of the allocation, from the columns and the
                    // padding, once: vdev sector k is child k % N, child sector k / N.
                    let mut got: Vec<(usize, u64)> = Vec::new();
                    for c in map.cols.iter().chain(&pads) {
                        for i in 0..c.size / sector {
                            got.push((c.child, c.offset / sector + i));
                        }
                    }
                    got.sort_unstable();
                    let asize = g.asize(psize) / sector;
                    let mut want: Vec<(usize, u64)> = (b..b + asize)
                        .map(|k| ((k % children as u64) as usize, k / children as u64))
                        .collect();
                    want.sort_unstable();
                    assert_eq!(got, want, "N={children} p={parity} s={sectors} b={b}");
                }
            }
        }
    }

    #[test]
    fn map_raidz3_skip_columns() {
        // raidz3 of 7, 8K (s=2) at offset 0: q=0, r=2, bc=5, acols=5,
        // scols=min(7, roundup(5, 4)=8)=7 -> 2 skip columns (the 3rd padding sector
        // wraps to the next row and is not described).
        let z3 = g(7, 3, 12);
        let m = z3.map(0, 8 * K);
        assert_eq!(m.cols.len(), 5);
        assert_eq!(m.parity_cols().len(), 3);
        assert_eq!(m.data_cols().len(), 2);
        assert!(m.cols.iter().all(|c| c.size == 4 * K));
        assert_eq!(m.skip, vec![col(5, 0, 4 * K), col(6, 0, 4 * K)]);
        // Same block at b = 9: f = 2, o = 1 sector; skip columns wrap to child 0.
        let m = z3.map(9 * 4 * K, 8 * K);
        assert_eq!(
            m.cols.iter().map(|c| c.child).collect::<Vec<_>>(),
            vec![2, 3, 4, 5, 6]
        );
        assert_eq!(m.skip, vec![col(0, 8 * K, 4 * K), col(1, 8 * K, 4 * K)]);
    }

    #[test]
    fn map_raidz2_small_block_fewer_columns() {
        // raidz2 of 6, s=1: q=0, bc=3, scols=min(6, 3)=3: no skip.
        let m = g(6, 2, 12).map(0, 4 * K);
        assert_eq!(m.cols.len(), 3);
        assert!(m.skip.is_empty());
        // raidz2 of 6, s=2: bc=4, scols=min(6, 6)=6 -> 2 skip columns, asize 6 sectors.
        let m = g(6, 2, 12).map(0, 8 * K);
        assert_eq!(m.cols.len(), 4);
        assert_eq!(m.skip.len(), 2);
        assert_eq!(g(6, 2, 12).asize(8 * K), 24 * K);
    }

    #[test]
    fn split_is_column_major() {
        let m = g(6, 2, 9).map(0, 5 * 512);
        let data: Vec<u8> = (0..5 * 512).map(|i| (i / 512) as u8).collect();
        let parts = m.split(&data);
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0].len(), 1024);
        assert!(parts[0][..512].iter().all(|&b| b == 0));
        assert!(parts[0][512..].iter().all(|&b| b == 1));
        assert!(parts[1].iter().all(|&b| b == 2));
        assert!(parts[3].iter().all(|&b| b == 4));
    }

    #[test]
    fn vdev_space_rounds_down() {
        let geo = g(5, 1, 12);
        assert_eq!(geo.vdev_space(10 * 4 * K + 100), 10 * 5 * 4 * K);
        assert_eq!(geo.vdev_space(4 * K - 1), 0);
    }

    #[test]
    #[should_panic(expected = "offset 512 is not aligned to the 4096-byte sector")]
    fn map_rejects_unaligned_offset() {
        g(5, 1, 12).map(512, 4 * K);
    }

    #[test]
    #[should_panic(expected = "psize 4097 must be a non-zero multiple of the 4096-byte sector")]
    fn asize_rejects_partial_sector() {
        g(5, 1, 12).asize(4 * K + 1);
    }
}
