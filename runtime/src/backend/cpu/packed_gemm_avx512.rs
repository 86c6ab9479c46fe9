//! The 16-lane register tile for `packed_gemm`'s blocked loops, on cores with AVX-512.
//!
//! On an AVX-512 core MKL runs its f32 GEMM with 16-lane FMAs (190-230 GFLOP/s on one core of
//! the Xeon these benches ran on, against ~100-110 for the 8-lane tile), so the 8-lane tile left
//! the layers' products at about half of MKL's speed there. Here the tile is 12 rows by 32
//! columns (24 accumulators of the 32 vector registers; 12 broadcasts and 2 loads per 24 FMAs)
//! on B packed into 32-wide panels.
//!
//! Bit-identity is `packed_gemm`'s: every element is summed per `small_gemm::KC`-long k-block
//! in k order, `acc = fma(a, b, acc)` from +0, and C is updated once per block (`c = acc`, or
//! `c * beta + acc`), whatever the vector width. Lanes are output columns, so the width changes
//! which elements are computed together, never an element's own operations.

use super::packed_gemm::pack_a::pack_plain_rows;
use super::packed_gemm::{blocked, Tile};
use super::small_gemm::Block;
use std::arch::x86_64::*;

/// Lanes of one vector.
const VL: usize = 16;

/// Rows of one register tile: 24 accumulators (two vectors per row) of the 32 registers.
const MR: usize = 12;

/// Columns of one packed panel: two vectors.
const NR: usize = 2 * VL;

/// Whether this core runs the 16-lane kernel (AVX-512F beside the AVX2 and FMA that
/// `packed_gemm` needs).
pub(super) fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
}

/// The 16-lane tile: 12 rows by 32 columns, for `packed_gemm`'s blocked loops.
pub(super) struct Wide;

impl Tile for Wide {
    const MR: usize = MR;
    const NR: usize = NR;
    /// A multiple of [`MR`] near the 8-lane tile's 72 rows (A's block, 96 KiB, stays in L2
    /// beside B's).
    const MC: usize = 96;
    /// [`pack_rows`] stores 16 lanes for a tile of 12.
    const ROWS_SLACK: usize = VL - MR;

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn sgemm(
        mkn: (usize, usize, usize),
        a: (*const f32, isize, isize),
        b: (*const f32, isize, isize, Option<&[isize]>),
        beta: f32,
        c: (*mut f32, isize, isize),
        buffers: (&mut [f32], &mut [f32]),
    ) {
        blocked::<Wide>(mkn, a, b, beta, c, buffers)
    }

    #[inline(always)]
    unsafe fn pack_rows(
        out: &mut [f32],
        a: *const f32,
        (rsa, csa): (isize, isize),
        mc: usize,
        kc: usize,
    ) {
        if rsa == 1 {
            pack_rows(out, a, csa, mc, kc)
        } else {
            pack_plain_rows::<MR>(out, a, rsa, mc, kc)
        }
    }

    #[inline(always)]
    unsafe fn tile(blk: &Block, rows: usize, beta: f32, w: usize) {
        prefetch_c(blk, rows, w);
        if blk.brows.is_null() {
            sums_to_c::<false>(blk, rows, beta, w)
        } else {
            sums_to_c::<true>(blk, rows, beta, w)
        }
    }
}

/// The tile of `rows` rows at `blk` summed and written to C; `INDIRECT`: B's rows at
/// `blk.brows`' offsets (see [`Block`]).
#[inline(always)]
unsafe fn sums_to_c<const INDIRECT: bool>(blk: &Block, rows: usize, beta: f32, w: usize) {
    match rows {
        12 => whole_tile::<INDIRECT>(blk, beta, w),
        11 => finish(&tile::<11, INDIRECT>(blk), blk, beta, w),
        10 => finish(&tile::<10, INDIRECT>(blk), blk, beta, w),
        9 => finish(&tile::<9, INDIRECT>(blk), blk, beta, w),
        8 => finish(&tile::<8, INDIRECT>(blk), blk, beta, w),
        7 => finish(&tile::<7, INDIRECT>(blk), blk, beta, w),
        6 => finish(&tile::<6, INDIRECT>(blk), blk, beta, w),
        5 => finish(&tile::<5, INDIRECT>(blk), blk, beta, w),
        4 => finish(&tile::<4, INDIRECT>(blk), blk, beta, w),
        3 => finish(&tile::<3, INDIRECT>(blk), blk, beta, w),
        2 => finish(&tile::<2, INDIRECT>(blk), blk, beta, w),
        _ => finish(&tile::<1, INDIRECT>(blk), blk, beta, w),
    }
}

/// Where row `q` of the tile's B starts: `bp + q * bs`, or (`INDIRECT`) `bp + brows[q]`.
#[inline(always)]
unsafe fn b_row<const INDIRECT: bool>(blk: &Block, q: usize) -> *const f32 {
    if INDIRECT {
        blk.bp.offset(*blk.brows.add(q))
    } else {
        blk.bp.wrapping_offset(q as isize * blk.bs)
    }
}

/// Asks for the tile's C lines before its products, as `packed_gemm::prefetch_c` does: a
/// row's 32 columns span up to three lines.
#[inline(always)]
unsafe fn prefetch_c(blk: &Block, rows: usize, w: usize) {
    for r in 0..rows {
        // Prefetches never fault, so an address past C's end is harmless (hence wrapping).
        let first = blk.cp.wrapping_offset(r as isize * blk.rsc);
        for j in [0, VL, w - 1] {
            _mm_prefetch::<_MM_HINT_T0>(first.wrapping_offset(j as isize * blk.csc) as *const i8);
        }
    }
}

/// Copies `mc` rows of a transposed A's `kc` columns at `a` (column stride `csa`) into `out`
/// as row tiles of [`MR`]: tile `t` at `t * kc * MR`, its rows' elements of each k together
/// (a plain A's: `pack_a::pack_plain_rows`).
#[inline(always)]
unsafe fn pack_rows(out: &mut [f32], a: *const f32, csa: isize, mc: usize, kc: usize) {
    assert!(out.len() >= mc.next_multiple_of(MR) * kc + (VL - MR));
    for t in (0..mc).step_by(MR) {
        let rows = MR.min(mc - t);
        let (src, dst) = (a.add(t), out.as_mut_ptr().add(t * kc));
        // One masked load (masked lanes are neither read nor faulted) and a 16-wide store whose
        // last lanes the next k overwrites (the buffer has room for the last one's).
        let mask: __mmask16 = ((1u32 << rows) - 1) as __mmask16;
        for p in 0..kc {
            let v = _mm512_maskz_loadu_ps(mask, src.offset(p as isize * csa));
            _mm512_storeu_ps(dst.add(p * MR), v);
        }
    }
}

/// The 12x32 register tile: `blk.kc` products of A's twelve rows with B's panel (packed, or B
/// itself read in place: rows `blk.bs` apart), each element's sum in k order from +0. Inlined
/// only into [`whole_tile`], so that the 24 accumulators stay in registers whatever the
/// blocked loops keep live. Rows are reached from four base pointers three rows apart, each with `0`, `rsa` and
/// `2 * rsa` (x86 addressing scales 4 and 8).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn kernel<const INDIRECT: bool>(blk: &Block) -> [[__m512; 2]; MR] {
    let (rsa, csa) = (blk.rsa, blk.csa);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let mut base = [
        blk.ap,
        blk.ap.offset(3 * rsa),
        blk.ap.offset(6 * rsa),
        blk.ap.offset(9 * rsa),
    ];
    let mut b = blk.bp;
    let mut q = 0;
    // One k step: B's two vectors, then each row's broadcast into its two sums.
    let mut step = |base: &mut [*const f32; 4], b: &mut *const f32, q: &mut usize| {
        let row = if INDIRECT { b_row::<true>(blk, *q) } else { *b };
        *q += 1;
        let b0 = _mm512_loadu_ps(row);
        let b1 = _mm512_loadu_ps(row.add(VL));
        for (g, &p) in base.iter().enumerate() {
            for j in 0..3 {
                let x = _mm512_set1_ps(*p.offset(j as isize * rsa));
                let row = &mut acc[3 * g + j];
                row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                row[1] = _mm512_fmadd_ps(x, b1, row[1]);
            }
        }
        // Wrapping: after the last product the row pointers may pass A's end unread.
        for p in base.iter_mut() {
            *p = p.wrapping_offset(csa);
        }
        *b = b.wrapping_offset(blk.bs);
    };
    for _ in 0..blk.kc / 2 {
        step(&mut base, &mut b, &mut q);
        step(&mut base, &mut b, &mut q);
    }
    if blk.kc % 2 == 1 {
        step(&mut base, &mut b, &mut q);
    }
    acc
}

/// A whole 12-row tile: [`kernel`]'s sums written to C ([`finish`]) in one function of its
/// own, so they go from the 24 registers to C. With the kernel a function apart, its sums
/// were returned through the stack (24 stores and 24 loads per tile), a cost that matters
/// when k is short: on a Xeon core, best of 15 runs, `[1024, 128] @ [128, 128]` 237 -> 222
/// us, `[1024, 256] @ [256, 128]` 452 -> 417, attention's `[64, 64, 32] @ [64, 32, 64]`
/// 219 -> 178.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline(never)]
unsafe fn whole_tile<const INDIRECT: bool>(blk: &Block, beta: f32, w: usize) {
    finish(&kernel::<INDIRECT>(blk), blk, beta, w)
}

/// `R` rows (fewer than a whole tile) by 32 columns: the sums over the block, in the same order
/// per element as [`kernel`].
#[inline(always)]
unsafe fn tile<const R: usize, const INDIRECT: bool>(blk: &Block) -> [[__m512; 2]; R] {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (mut ap, mut bp) = (blk.ap, blk.bp);
    for q in 0..blk.kc {
        let row = if INDIRECT { b_row::<true>(blk, q) } else { bp };
        let b0 = _mm512_loadu_ps(row);
        let b1 = _mm512_loadu_ps(row.add(VL));
        for (r, row) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*ap.offset(r as isize * blk.rsa));
            row[0] = _mm512_fmadd_ps(x, b0, row[0]);
            row[1] = _mm512_fmadd_ps(x, b1, row[1]);
        }
        ap = ap.wrapping_offset(blk.csa);
        bp = bp.wrapping_offset(blk.bs);
    }
    acc
}

/// Writes a tile's sums to C's first `w` columns as `small_gemm::finish` does with
/// `alpha == 1`: `c = acc` (`beta == 0`) or `c * beta + acc`, per element. The `fma(1, acc, 0)`
/// there is `acc` itself (a sum from +0 is never -0), as `packed_gemm`'s whole-tile store uses.
#[inline(always)]
unsafe fn finish<const R: usize>(acc: &[[__m512; 2]; R], blk: &Block, beta: f32, w: usize) {
    for (r, row) in acc.iter().enumerate() {
        let crow = blk.cp.offset(r as isize * blk.rsc);
        for (v, &x) in row.iter().enumerate() {
            let j0 = v * VL;
            if j0 >= w {
                break;
            }
            let cv = crow.offset(j0 as isize * blk.csc);
            if blk.csc == 1 && j0 + VL <= w {
                let out = if beta == 0.0 {
                    x
                } else {
                    _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(cv), _mm512_set1_ps(beta)), x)
                };
                _mm512_storeu_ps(cv, out);
            } else {
                let mut lanes = [0f32; VL];
                _mm512_storeu_ps(lanes.as_mut_ptr(), x);
                for (l, &t) in lanes.iter().enumerate().take(w - j0) {
                    let p = cv.offset(l as isize * blk.csc);
                    *p = if beta == 0.0 { t } else { *p * beta + t };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::packed_gemm;
    use super::super::small_gemm::tests::{assert_same_bits, matrix, reference, values, Strided};

    /// `packed_gemm::sgemm_b_rows` with B's rows at scattered, overlapping offsets of one
    /// buffer (as a convolution's rows lie in its padded input), against `matrixmultiply` on
    /// those rows copied into a plain B: bit for bit, or `false` on a core without AVX-512.
    fn check(m: usize, k: usize, n: usize, a_kind: &str) {
        let pool = values(4 * k + n + 64, 21);
        // Row q starts 3q + (q % 5) floats in: neighbours overlap, as taps of one grid do.
        let offsets: Vec<isize> = (0..k).map(|q| (3 * q + q % 5) as isize).collect();
        let gathered = Strided {
            data: offsets
                .iter()
                .flat_map(|&o| pool[o as usize..o as usize + n].iter().copied())
                .collect(),
            rs: n as isize,
            cs: 1,
        };
        let a = matrix(m, k, a_kind, 5 + m as u64);
        for beta in [0.0, 1.0, 0.5] {
            let c0 = values(m * n, 7);
            let (mut ours, mut theirs) = (c0.clone(), c0);
            let ran = unsafe {
                packed_gemm::sgemm_b_rows(
                    (m, k, n),
                    (a.data.as_ptr(), a.rs, a.cs),
                    (pool.as_ptr(), &offsets),
                    beta,
                    (ours.as_mut_ptr(), n as isize, 1),
                )
            };
            if !ran {
                assert!(!super::has_avx512(), "{m}x{k}x{n} not run");
                return;
            }
            let c = (theirs.as_mut_ptr(), n as isize, 1);
            reference((m, k, n), 1.0, (&a, &gathered), beta, c);
            let what = format!("{m}x{k}x{n} A {a_kind} beta {beta}");
            assert_same_bits(&ours, &theirs, &what);
        }
    }

    #[test]
    fn a_b_given_by_row_offsets_matches_matrixmultiply_bit_for_bit() {
        // Rows: partial tiles only, one whole tile and a partial one, a whole row block, more
        // than one (B read in place by each). k: a partial k-block, two k-blocks. Columns: a
        // partial panel only, whole panels, more than one column block ending in a partial
        // panel.
        for m in [8, 16, 96, 97, 200] {
            for k in [9, 300] {
                for n in [17, 64, 300] {
                    for a_kind in ["rows", "cols"] {
                        check(m, k, n, a_kind);
                    }
                }
            }
        }
    }
}
