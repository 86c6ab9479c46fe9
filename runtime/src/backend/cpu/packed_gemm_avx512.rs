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
        b: (*const f32, isize, isize),
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
        match rows {
            12 => finish(&kernel(blk), blk, beta, w),
            11 => finish(&tile::<11>(blk), blk, beta, w),
            10 => finish(&tile::<10>(blk), blk, beta, w),
            9 => finish(&tile::<9>(blk), blk, beta, w),
            8 => finish(&tile::<8>(blk), blk, beta, w),
            7 => finish(&tile::<7>(blk), blk, beta, w),
            6 => finish(&tile::<6>(blk), blk, beta, w),
            5 => finish(&tile::<5>(blk), blk, beta, w),
            4 => finish(&tile::<4>(blk), blk, beta, w),
            3 => finish(&tile::<3>(blk), blk, beta, w),
            2 => finish(&tile::<2>(blk), blk, beta, w),
            _ => finish(&tile::<1>(blk), blk, beta, w),
        }
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
/// itself read in place: rows `blk.bs` apart), each element's sum in k order from +0. Its own
/// function, so that the 24 accumulators stay in registers whatever the caller's loops keep
/// live. Rows are reached from four base pointers three rows apart, each with `0`, `rsa` and
/// `2 * rsa` (x86 addressing scales 4 and 8).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline(never)]
unsafe fn kernel(blk: &Block) -> [[__m512; 2]; MR] {
    let (rsa, csa) = (blk.rsa, blk.csa);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let mut base = [
        blk.ap,
        blk.ap.offset(3 * rsa),
        blk.ap.offset(6 * rsa),
        blk.ap.offset(9 * rsa),
    ];
    let mut b = blk.bp;
    // One k step: B's two vectors, then each row's broadcast into its two sums.
    let mut step = |base: &mut [*const f32; 4], b: &mut *const f32| {
        let b0 = _mm512_loadu_ps(*b);
        let b1 = _mm512_loadu_ps(b.add(VL));
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
        step(&mut base, &mut b);
        step(&mut base, &mut b);
    }
    if blk.kc % 2 == 1 {
        step(&mut base, &mut b);
    }
    acc
}

/// `R` rows (fewer than a whole tile) by 32 columns: the sums over the block, in the same order
/// per element as [`kernel`].
#[inline(always)]
unsafe fn tile<const R: usize>(blk: &Block) -> [[__m512; 2]; R] {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (mut ap, mut bp) = (blk.ap, blk.bp);
    for _ in 0..blk.kc {
        let b0 = _mm512_loadu_ps(bp);
        let b1 = _mm512_loadu_ps(bp.add(VL));
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
