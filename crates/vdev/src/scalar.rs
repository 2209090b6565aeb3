//! Scalar golden reference of the RAID-Z parity code.
//!
//! # Theory of operation
//!
//! A deliberately naive, hand-written implementation of exactly the code
//! [`crate::codec::ParityCodec`] computes with `reed-solomon-erasure`'s SIMD kernels:
//!
//! * GF(2^8) with the reducing polynomial `x^8 + x^4 + x^3 + x^2 + 1` (0x11d) and
//!   generator 2, multiplication through log/exp tables built at compile time;
//! * the systematic matrix `M = V * inv(V[0..d])`, where `V` is the `(d + p) x d`
//!   Vandermonde matrix `V[r][c] = r^c` (with `0^0 = 1`): the top `d` rows of `M` are
//!   the identity (data stored verbatim), the bottom `p` rows produce the parity;
//! * encode: parity byte `k` of row `i` is `sum_j M[d + i][j] * data_j[k]`, short data
//!   columns read as zero;
//! * reconstruct: take the first `d` surviving shards in the library's order (data
//!   shards, then parity shards), invert the corresponding rows of `M` (Gauss-Jordan),
//!   multiply to get the data back, then re-encode any missing parity.
//!
//! # Why hand-written
//!
//! It exists only to check the SIMD codec byte for byte, the way OpenZFS's
//! `raidz_test` checks every accelerated implementation against its scalar "golden"
//! map.  It shares no code with the library (own tables, own matrix algebra), so a bug
//! or an ABI/kernel problem in the SIMD path (or a change of the matrix construction
//! in a future version of the crate, which would be an on-disk format change) shows up
//! as a mismatch.  It is byte-at-a-time and allocates freely: it is never used on the
//! data path.
//!
//! # Failure model
//!
//! Same contract as [`crate::codec::ParityCodec::reconstruct`]: up to `p` missing
//! shards are rebuilt, more is [`RaidzError::TooManyMissing`]; inconsistent arguments
//! are [`RaidzError::InvalidShards`].

use crate::raidz::RaidzError;

/// The reducing polynomial of the field, x^8 + x^4 + x^3 + x^2 + 1.
pub const POLYNOMIAL: u16 = 0x11d;

struct Tables {
    /// log[a] for a != 0 (log[0] unused).
    log: [u8; 256],
    /// exp[i] = 2^i, doubled in length so exp[log a + log b] needs no reduction.
    exp: [u8; 510],
}

const fn build_tables() -> Tables {
    let mut log = [0u8; 256];
    let mut exp = [0u8; 510];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLYNOMIAL;
        }
        i += 1;
    }
    Tables { log, exp }
}

const TABLES: Tables = build_tables();

/// Field multiplication.
pub fn gf_mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        TABLES.exp[TABLES.log[a as usize] as usize + TABLES.log[b as usize] as usize]
    }
}

/// Multiplicative inverse.
///
/// # Panics
/// If `a == 0`.
pub fn gf_inv(a: u8) -> u8 {
    assert!(a != 0, "0 has no inverse in GF(2^8)");
    TABLES.exp[255 - TABLES.log[a as usize] as usize]
}

/// Field division `a / b`.
///
/// # Panics
/// If `b == 0`.
pub fn gf_div(a: u8, b: u8) -> u8 {
    gf_mul(a, gf_inv(b))
}

/// `a^n`, with `0^0 = 1`.
pub fn gf_pow(a: u8, n: usize) -> u8 {
    if n == 0 {
        1
    } else if a == 0 {
        0
    } else {
        TABLES.exp[(TABLES.log[a as usize] as usize * n) % 255]
    }
}

/// A dense matrix over GF(2^8), row-major.
type Matrix = Vec<Vec<u8>>;

fn mat_mul(a: &Matrix, b: &Matrix) -> Matrix {
    let inner = b.len();
    let cols = b[0].len();
    a.iter()
        .map(|row| {
            (0..cols)
                .map(|c| (0..inner).fold(0u8, |acc, k| acc ^ gf_mul(row[k], b[k][c])))
                .collect()
        })
        .collect()
}

/// Inverse of a square matrix by Gauss-Jordan elimination, `None` if singular.
pub fn invert(m: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    let n = m.len();
    let mut a: Matrix = m.to_vec();
    let mut inv: Matrix = (0..n)
        .map(|r| (0..n).map(|c| u8::from(r == c)).collect())
        .collect();
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r][col] != 0)?;
        a.swap(col, pivot);
        inv.swap(col, pivot);
        let scale = gf_inv(a[col][col]);
        for c in 0..n {
            a[col][c] = gf_mul(a[col][c], scale);
            inv[col][c] = gf_mul(inv[col][c], scale);
        }
        for r in 0..n {
            let factor = a[r][col];
            if r != col && factor != 0 {
                for c in 0..n {
                    a[r][c] ^= gf_mul(factor, a[col][c]);
                    inv[r][c] ^= gf_mul(factor, inv[col][c]);
                }
            }
        }
    }
    Some(inv)
}

/// The `(data + parity) x data` systematic encoding matrix `V * inv(V[0..data])`.
///
/// # Panics
/// If `data == 0` or `data + parity > 256`.
pub fn systematic_matrix(data: usize, parity: usize) -> Vec<Vec<u8>> {
    assert!(data > 0 && data + parity <= 256, "unsupported code shape");
    let vandermonde: Matrix = (0..data + parity)
        .map(|r| (0..data).map(|c| gf_pow(r as u8, c)).collect())
        .collect();
    let top_inv = invert(&vandermonde[..data]).expect("Vandermonde top is invertible");
    mat_mul(&vandermonde, &top_inv)
}

/// Parity columns (each as long as the longest data column) for `data_cols`, short
/// columns read as zero-padded.
///
/// # Panics
/// If `data_cols` is empty, `parity == 0`, or there are more than 256 shards.
pub fn encode(data_cols: &[&[u8]], parity: usize) -> Vec<Vec<u8>> {
    assert!(parity > 0, "need at least one parity column");
    let d = data_cols.len();
    let m = systematic_matrix(d, parity);
    let len = data_cols.iter().map(|c| c.len()).max().unwrap_or(0);
    (0..parity)
        .map(|i| {
            let row = &m[d + i];
            (0..len)
                .map(|k| {
                    data_cols.iter().zip(row).fold(0u8, |acc, (col, &coef)| {
                        acc ^ gf_mul(coef, col.get(k).copied().unwrap_or(0))
                    })
                })
                .collect()
        })
        .collect()
}

/// Rebuilds every `None` shard; same contract as
/// [`crate::codec::ParityCodec::reconstruct`] (parity shards first, then data; `sizes`
/// are the real sizes; rebuilt shards are truncated to them).
pub fn reconstruct(
    shards: &mut [Option<Vec<u8>>],
    sizes: &[usize],
    parity: usize,
) -> Result<(), RaidzError> {
    let n = shards.len();
    if sizes.len() != n || parity == 0 || parity >= n || n > 256 {
        return Err(RaidzError::InvalidShards(format!(
            "{n} shards, {} sizes, {parity} parity",
            sizes.len()
        )));
    }
    let len = sizes.iter().copied().max().unwrap_or(0);
    if sizes[..parity].iter().any(|&s| s != len) {
        return Err(RaidzError::InvalidShards(
            "parity shards must be the largest".into(),
        ));
    }
    if shards
        .iter()
        .zip(sizes)
        .any(|(s, &size)| s.as_ref().is_some_and(|s| s.len() != size))
    {
        return Err(RaidzError::InvalidShards("shard length mismatch".into()));
    }
    let missing = shards.iter().filter(|s| s.is_none()).count();
    if missing > parity {
        return Err(RaidzError::TooManyMissing { missing, parity });
    }
    if missing == 0 {
        return Ok(());
    }

    let d = n - parity;
    let m = systematic_matrix(d, parity);
    // Library order: matrix row j is data shard j (our index parity + j) for j < d,
    // parity shard j - d (our index j - d) otherwise.
    let shard_index = |row: usize| if row < d { parity + row } else { row - d };
    let survivors: Vec<usize> = (0..n)
        .filter(|&row| shards[shard_index(row)].is_some())
        .take(d)
        .collect();
    let sub: Matrix = survivors.iter().map(|&row| m[row].clone()).collect();
    let decode = invert(&sub).expect("any d rows of an MDS code are independent");
    let padded = |i: usize, k: usize| -> u8 {
        shards[i]
            .as_ref()
            .and_then(|s| s.get(k).copied())
            .unwrap_or(0)
    };

    // Data = decode * survivors, byte position by byte position.
    let data: Vec<Vec<u8>> = (0..d)
        .map(|j| {
            (0..len)
                .map(|k| {
                    survivors
                        .iter()
                        .zip(&decode[j])
                        .fold(0u8, |acc, (&row, &coef)| {
                            acc ^ gf_mul(coef, padded(shard_index(row), k))
                        })
                })
                .collect()
        })
        .collect();
    for (j, column) in data.iter().enumerate() {
        let i = parity + j;
        if shards[i].is_none() {
            shards[i] = Some(column[..sizes[i]].to_vec());
        }
    }
    if shards[..parity].iter().any(Option::is_none) {
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let regenerated = encode(&refs, parity);
        for (shard, p) in shards[..parity].iter_mut().zip(regenerated) {
            if shard.is_none() {
                *shard = Some(p);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less "Russian peasant" multiplication reduced by the polynomial.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut product = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                product ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= (POLYNOMIAL & 0xff) as u8;
            }
            b >>= 1;
        }
        product
    }

    #[test]
    fn tables_match_bitwise_multiplication() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(gf_mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
            if a != 0 {
                assert_eq!(gf_mul(a, gf_inv(a)), 1);
                assert_eq!(gf_div(gf_mul(a, 77), 77), a);
            }
        }
        // 2 generates the whole multiplicative group.
        let mut seen = [false; 256];
        for n in 0..255 {
            seen[gf_pow(2, n) as usize] = true;
        }
        assert_eq!(seen.iter().filter(|&&s| s).count(), 255);
        assert_eq!(gf_pow(0, 0), 1);
        assert_eq!(gf_pow(0, 3), 0);
    }

    #[test]
    fn matrix_is_systematic() {
        for d in 1..=20 {
            let m = systematic_matrix(d, 3);
            for (r, row) in m.iter().take(d).enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    assert_eq!(v, u8::from(r == c));
                }
            }
            // MDS: replacing any one identity row by a parity row stays invertible,
            // i.e. every parity coefficient is non-zero.
            assert!(m[d..].iter().flatten().all(|&v| v != 0));
        }
    }

    #[test]
    fn invert_roundtrip() {
        let m: Matrix = vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 10]];
        let inv = invert(&m).unwrap();
        let id = mat_mul(&m, &inv);
        for (r, row) in id.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                assert_eq!(v, u8::from(r == c));
            }
        }
        assert!(invert(&[vec![1, 1], vec![1, 1]]).is_none());
    }

    #[test]
    fn encode_and_reconstruct_roundtrip() {
        let data: Vec<Vec<u8>> = (0..5u8)
            .map(|j| {
                (0..(10 - usize::from(j % 2)))
                    .map(|k| j * 31 + k as u8)
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = encode(&refs, 3);
        let full: Vec<Option<Vec<u8>>> = parity.iter().chain(&data).cloned().map(Some).collect();
        let sizes: Vec<usize> = full.iter().map(|s| s.as_ref().unwrap().len()).collect();
        for erase in [[0, 4, 7], [3, 4, 5], [0, 1, 2], [1, 5, 6]] {
            let mut shards = full.clone();
            for i in erase {
                shards[i] = None;
            }
            reconstruct(&mut shards, &sizes, 3).unwrap();
            assert_eq!(shards, full);
        }
    }
}
