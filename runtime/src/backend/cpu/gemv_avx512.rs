//! Products of one to four rows, on AVX-512 cores: B read once, in its own memory order.
//!
//! A batch-1 `x @ W.t()` (a Linear in token-by-token generation) and its input gradient `g @ W`
//! touch every element of the weight once, so their time is the weight's trip from memory.
//! `small_gemm`'s 8-lane path made two trips for a transposed B larger than L2 (it transposes
//! it into panels, then reads the panels: 2.2x torch's time on a 1024x1024 weight) and walked a
//! plain B 64 columns at a time, four lines a row stride apart per k. Here:
//! - a transposed B (`x @ W.t()`: B's columns, W's rows, are contiguous) is read 16 columns at
//!   a time down their whole length, each 16x16 block transposed in registers and used at once;
//! - a plain B (`g @ W`: rows contiguous) is read row after row, up to [`NC`] columns of one row
//!   at a time, the sums of those columns kept in an L1-sized buffer between rows.
//!
//! Bit-identity is `small_gemm`'s (see its module doc): every element is summed per
//! `small_gemm::KC`-long k-block in k order, `acc = fma(a, b, acc)` from +0, then
//! `t = fma(alpha, acc, +0)` and `c = t` (first block, `beta == 0`) or `c = c * beta' + t`.
//! Lanes are output columns, so each element's operations are the same as there.
//!
//! That order is what keeps a transposed B below torch's speed at one row (MKL sums each
//! output's dot product 16 k at a time, without transposing): the 16x16 transposes, 64
//! shuffles per 256 elements at about one a cycle, bound it (a 1024x1024 weight ~85 us against
//! MKL's ~65-90). Two groups of 16 columns, prefetched or not, were slower: 32 read streams.
//! Since session 20 a product of at most four rows *in all* by a transposed B (batch-1
//! generation) takes `gemv_dot`'s dot-product order instead, on every AVX2+FMA core; the
//! transposed path here serves blocks of few rows cut from larger products (an epilogue's last
//! block) and A operands whose rows are not contiguous.

use super::small_gemm::KC;
use std::arch::x86_64::*;

/// Lanes of one vector.
const VL: usize = 16;

/// Most rows this module takes: each 16x16 block's transpose is shared by the rows, and past a
/// few rows `small_gemm`'s packed panel pays for itself.
pub(super) const MAX_ROWS: usize = 4;

/// Columns of a plain B per pass down its rows: the rows' sums (`MAX_ROWS * NC` floats, 16 KiB)
/// stay in L1 while B streams past them.
const NC: usize = 1024;

/// Whether [`sgemm`] takes the shape: few rows, and B transposed or, when it is large enough
/// that its rows' trips from memory outweigh the sums' round trips through L1, with contiguous
/// rows. Measured against `small_gemm`'s 8-lane path (best of 300 calls, alternating): a
/// transposed B 1.1-1.4x faster from `[1, 64] @ [64, 64]` up, a plain one 0.9-1.06x at 16K
/// elements (so left to `small_gemm` below 32K) and 1.3-2x faster from 64K.
pub(super) fn takes((m, k, n): (usize, usize, usize), (rsb, csb): (isize, isize)) -> bool {
    (1..=MAX_ROWS).contains(&m)
        && k > 0
        && n > 0
        && (rsb == 1 || (csb == 1 && k * n >= MIN_PLAIN_B))
        && super::packed_gemm_avx512::has_avx512()
}

/// Fewest elements of a plain (row-contiguous) B for [`takes`].
const MIN_PLAIN_B: usize = 1 << 15;

/// `c = alpha * a @ b + beta * c` for `m <= MAX_ROWS` rows and a B whose columns (`rsb == 1`)
/// or rows (`csb == 1`) are contiguous, bit for bit as `matrixmultiply::sgemm`.
///
/// # Safety
/// As `matrixmultiply::sgemm`; [`takes`] holds.
pub(super) unsafe fn sgemm(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: (*const f32, isize, isize),
    b: (*const f32, isize, isize),
    beta: f32,
    c: (*mut f32, isize, isize),
) {
    let mkn = (m, k, n);
    match (m, b.1 == 1) {
        (1, true) => transposed::<1>(mkn, alpha, a, b, beta, c),
        (2, true) => transposed::<2>(mkn, alpha, a, b, beta, c),
        (3, true) => transposed::<3>(mkn, alpha, a, b, beta, c),
        (_, true) => transposed::<4>(mkn, alpha, a, b, beta, c),
        (1, false) => rows::<1>(mkn, alpha, a, b, beta, c),
        (2, false) => rows::<2>(mkn, alpha, a, b, beta, c),
        (3, false) => rows::<3>(mkn, alpha, a, b, beta, c),
        (_, false) => rows::<4>(mkn, alpha, a, b, beta, c),
    }
}

/// `R` rows by a transposed B (column stride `csb`), 16 columns at a time: 16 read streams,
/// each down one column's whole length. (32 columns, two independent chains of FMAs for one row,
/// ran 1.5x slower on a 1024x1024 weight: more streams than the prefetchers follow.)
#[target_feature(enable = "avx512f")]
unsafe fn transposed<const R: usize>(
    (_, k, n): (usize, usize, usize),
    alpha: f32,
    (a, rsa, csa): (*const f32, isize, isize),
    (b, _, csb): (*const f32, isize, isize),
    beta: f32,
    c: (*mut f32, isize, isize),
) {
    for j0 in (0..n).step_by(VL) {
        let w = VL.min(n - j0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let mut acc = [_mm512_setzero_ps(); R];
            let a_at = |r: usize, p: usize| {
                _mm512_set1_ps(*a.offset(r as isize * rsa + (k0 + p) as isize * csa))
            };
            let mut p0 = 0;
            while p0 < kc {
                let len = VL.min(kc - p0);
                // Masked-off lanes are neither read nor faulted; they load as zero.
                let mask = ((1u32 << len) - 1) as __mmask16;
                let col = |j: usize| {
                    if j < w {
                        let p = b.offset((k0 + p0) as isize + (j0 + j) as isize * csb);
                        _mm512_maskz_loadu_ps(mask, p)
                    } else {
                        _mm512_setzero_ps()
                    }
                };
                let t = transpose16(std::array::from_fn(col));
                if len == VL {
                    for (q, bq) in t.iter().enumerate() {
                        for (r, x) in acc.iter_mut().enumerate() {
                            *x = _mm512_fmadd_ps(a_at(r, p0 + q), *bq, *x);
                        }
                    }
                } else {
                    for (q, bq) in t.iter().enumerate().take(len) {
                        for (r, x) in acc.iter_mut().enumerate() {
                            *x = _mm512_fmadd_ps(a_at(r, p0 + q), *bq, *x);
                        }
                    }
                }
                p0 += len;
            }
            let beta = if k0 == 0 { beta } else { 1.0 };
            for (r, &x) in acc.iter().enumerate() {
                finish(x, alpha, beta, at(c, r, j0), c.2, w);
            }
        }
    }
}

/// `R` rows by a B with contiguous rows (row stride `rsb`): per k-block and [`NC`] columns, the
/// block's rows of B streamed in order into sums kept in memory (L1), two rows of B per pass
/// over the sums (`fma(a1, b1, fma(a0, b0, acc))`: the same order, half the sums' traffic).
/// The sums are kept column group by column group, each group's `R` rows side by side. Kept
/// row by row, each row's sums 4 KiB after the previous row's, 3 and 4 rows ran at 23-29
/// GFLOP/s on Zen 4 where 2 rows ran at 60 (now 70-79; `[4, 1024] @ [1024, 1024]` 362 -> 115
/// us): a store and the next row's load with the same low 12 address bits, which cores can
/// take for a dependency ("4K aliasing"; the 8-lane twin was not slowed there).
// Indexed loops: each vector of B is loaded once and used by every row's sums.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f")]
unsafe fn rows<const R: usize>(
    (_, k, n): (usize, usize, usize),
    alpha: f32,
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, _): (*const f32, isize, isize),
    beta: f32,
    c: (*mut f32, isize, isize),
) {
    let mut acc = [[_mm512_setzero_ps(); R]; NC / VL];
    for j0 in (0..n).step_by(NC) {
        let w = NC.min(n - j0);
        let nv = w.div_ceil(VL);
        let tail = w - (nv - 1) * VL;
        let last = if tail == VL {
            0xffff
        } else {
            ((1u32 << tail) - 1) as __mmask16
        };
        let load = |p: *const f32, v: usize| {
            let mask = if v + 1 == nv { last } else { 0xffff };
            _mm512_maskz_loadu_ps(mask, p.add(v * VL))
        };
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for sums in acc[..nv].iter_mut() {
                sums.fill(_mm512_setzero_ps());
            }
            let a_at = |r: usize, p: usize| {
                _mm512_set1_ps(*a.offset(r as isize * rsa + (k0 + p) as isize * csa))
            };
            let b_row = |p: usize| b.offset((k0 + p) as isize * rsb + j0 as isize);
            let mut p = 0;
            while p + 2 <= kc {
                let (b0, b1) = (b_row(p), b_row(p + 1));
                let x0: [__m512; R] = std::array::from_fn(|r| a_at(r, p));
                let x1: [__m512; R] = std::array::from_fn(|r| a_at(r, p + 1));
                for v in 0..nv {
                    let (y0, y1) = (load(b0, v), load(b1, v));
                    for r in 0..R {
                        acc[v][r] =
                            _mm512_fmadd_ps(x1[r], y1, _mm512_fmadd_ps(x0[r], y0, acc[v][r]));
                    }
                }
                p += 2;
            }
            if p < kc {
                let b0 = b_row(p);
                let x0: [__m512; R] = std::array::from_fn(|r| a_at(r, p));
                for v in 0..nv {
                    let y0 = load(b0, v);
                    for r in 0..R {
                        acc[v][r] = _mm512_fmadd_ps(x0[r], y0, acc[v][r]);
                    }
                }
            }
            let beta = if k0 == 0 { beta } else { 1.0 };
            for (v, sums) in acc.iter().enumerate().take(nv) {
                for (r, &x) in sums.iter().enumerate() {
                    let first = j0 + v * VL;
                    finish(x, alpha, beta, at(c, r, first), c.2, w - v * VL);
                }
            }
        }
    }
}

/// C's element (r, j).
#[inline(always)]
unsafe fn at((c, rsc, csc): (*mut f32, isize, isize), r: usize, j: usize) -> *mut f32 {
    c.offset(r as isize * rsc + j as isize * csc)
}

/// Writes one vector of sums to the `min(valid, 16)` elements of C from `cp` (stride `csc`):
/// `t = fma(alpha, acc, +0)`, then `c = t` (`beta == 0`: C is not read) or `c * beta + t`.
#[inline(always)]
unsafe fn finish(acc: __m512, alpha: f32, beta: f32, cp: *mut f32, csc: isize, valid: usize) {
    let t = _mm512_fmadd_ps(_mm512_set1_ps(alpha), acc, _mm512_setzero_ps());
    if csc == 1 && valid >= VL {
        let out = if beta == 0.0 {
            t
        } else {
            _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(cp), _mm512_set1_ps(beta)), t)
        };
        _mm512_storeu_ps(cp, out);
        return;
    }
    let mut lanes = [0f32; VL];
    _mm512_storeu_ps(lanes.as_mut_ptr(), t);
    for (l, &x) in lanes.iter().enumerate().take(valid) {
        let p = cp.offset(l as isize * csc);
        *p = if beta == 0.0 { x } else { *p * beta + x };
    }
}

/// The 16x16 transpose of `r`: row `q` of the result is lane `q` of every input vector.
#[inline(always)]
pub(super) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved, then pairs of pairs, then 128-bit quarters twice.
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        let (x, y) = (4 * i, 4 * i + 2);
        u[x] = _mm512_shuffle_ps::<0x44>(t[x], t[y]);
        u[x + 1] = _mm512_shuffle_ps::<0xEE>(t[x], t[y]);
        u[x + 2] = _mm512_shuffle_ps::<0x44>(t[x + 1], t[y + 1]);
        u[x + 3] = _mm512_shuffle_ps::<0xEE>(t[x + 1], t[y + 1]);
    }
    for h in 0..2 {
        let o = 8 * h;
        for i in 0..4 {
            t[o + i] = _mm512_shuffle_f32x4::<0x88>(u[o + i], u[o + 4 + i]);
            t[o + 4 + i] = _mm512_shuffle_f32x4::<0xDD>(u[o + i], u[o + 4 + i]);
        }
    }
    let mut out = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        out[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[8 + i]);
        out[8 + i] = _mm512_shuffle_f32x4::<0xDD>(t[i], t[8 + i]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::small_gemm::tests::{assert_same_bits, both, matrix};

    #[test]
    fn transpose16_swaps_rows_and_columns() {
        if !super::super::packed_gemm_avx512::has_avx512() {
            return;
        }
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut out = vec![0f32; 256];
        unsafe {
            let rows = std::array::from_fn(|i| _mm512_loadu_ps(m.as_ptr().add(16 * i)));
            for (q, v) in transpose16(rows).iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * q), *v);
            }
        }
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(out[16 * i + j], m[16 * j + i], "({i}, {j})");
            }
        }
    }

    #[test]
    fn few_rows_by_a_large_b_match_matrixmultiply_bit_for_bit() {
        if !super::super::packed_gemm_avx512::has_avx512() {
            return;
        }
        // k across blocks and with a partial last 16; n with partial groups and chunks; B
        // transposed and plain; C row-major and with a column stride.
        for m in 1..=MAX_ROWS {
            for (k, n) in [(256, 256), (600, 113), (97, 1030), (1024, 70), (20, 3300)] {
                for b_kind in ["cols", "rows"] {
                    for (alpha, beta) in [(1.0, 0.0), (1.0, 1.0), (1.0, 0.5), (0.5, 2.0)] {
                        for csc in [1usize, 2] {
                            let b = matrix(k, n, b_kind, 0);
                            assert!(takes((m, k, n), (b.rs, b.cs)), "{m}x{k}x{n} {b_kind}");
                            let layout = ("rows", b_kind);
                            let (ours, theirs) = both((m, k, n), layout, (alpha, beta), csc);
                            let what = format!(
                                "{m}x{k}x{n} B {b_kind} alpha {alpha} beta {beta} csc {csc}"
                            );
                            assert_same_bits(&ours, &theirs, &what);
                        }
                    }
                }
            }
        }
    }
}
