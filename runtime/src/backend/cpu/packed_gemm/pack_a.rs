//! When and how `packed_gemm` copies A's row tiles together instead of reading A in place.
//!
//! A register tile (6 rows on AVX2, 12 on AVX-512) broadcasts one element of each of its rows
//! per k. Read in place, those rows are A's row stride apart; two cases make that slow, and
//! both are fixed by copying the tile's rows into a buffer where each k's elements are adjacent
//! (tile `t` at `t * kc * rows`), which leaves every element's sum as it was (only where the
//! operands are read from changes):
//! - a transposed A with a long stride between its k ([`PACK_ROWS_MIN_STRIDE`]): each k of
//!   a tile lies on another page;
//! - a plain A whose row stride is a multiple of 4 KiB ([`PLAIN_ROWS_ALIAS_STRIDE`]): all the
//!   tile's rows fall in the same L1 sets, which also hold the packed B panel, so they evict
//!   each other.

#[cfg(target_arch = "x86_64")]
use super::super::columns::avx::transpose8;
#[cfg(target_arch = "x86_64")]
use super::super::small_gemm::LANES;
#[cfg(target_arch = "x86_64")]
use super::MR;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Fewest floats between one k and the next in a transposed A for `sgemm` to copy A's row
/// tiles together: from 128 KiB apart, each k of a tile read in place misses the TLB, and
/// GPT-2's tied-embedding gradient `[50257, 1024] @ [1024, 128]` ran 6-8% faster packed (Xeon;
/// on Zen 4 `[50257, 128] @ [128, 128]` 74 -> 79 GFLOP/s on the 16-lane tile). Below that the
/// copy cost more than it saved on Zen 4 (the 16-lane tile, one thread, best of 7, packed -> in
/// place): `[4608, 512] @ [512, 32]` (resnet18's last layers' input gradient, `W^T @ g`) 76 ->
/// 106 GFLOP/s, `[4096, 256] @ [256, 32]` 63 -> 108, `[4608, 512] @ [512, 128]` 96 -> 107,
/// `[8192, 256] @ [256, 128]` 91 -> 106, `[16384, 128] @ [128, 128]` 87 -> 96, `[1024, 1024] @
/// [1024, 128]` 92 -> 103; the copy pays only across many panels of B (`[2048, 64] @ [64,
/// 512]` 92 packed on the 8-lane tile against 87). The Xeon measured strides of 384-512 as
/// fast either way and attention's `p^T @ dO` (a stride of 64) slower packed.
pub(super) const PACK_ROWS_MIN_STRIDE: isize = 32768;

/// Row strides (in floats) of a plain A whose row tiles are copied together: multiples of
/// 4 KiB, the distance at which addresses share an L1 set (64 sets of 64-byte lines). Measured
/// on an AVX-512 core (the 12-row tile; one thread, best of 5, read in place -> copied, in two
/// interleaved runs): `[1024, 1024] @ [1024, 1024]` (a 1024-wide Linear on 1024 tokens, either
/// B layout) 93-95 -> 99-101 GFLOP/s, near the 100-103 of the same product with A's rows padded
/// to a stride of 1040; `[256, 1024] @ [1024, 1024]` 93-94 -> 100-101, `[64, 1024] @ [1024,
/// 1024]` 85-88 -> 92-93, `[1024, 2048] @ [2048, 512]` 94 -> 99-100, `[1024, 4096] @ [4096,
/// 1024]` 93 -> 96-97. The copy costs 3-5% of such a product (padded rows copied ran that much
/// slower than read in place), so a stride that does not alias is read in place: 2 KiB (three
/// rows per set) gained 2% at most, within the noise. The 6-row AVX2 tile takes the same rule
/// unmeasured (no AVX2-only core here); its copy is tested bit for bit.
pub(super) const PLAIN_ROWS_ALIAS_STRIDE: isize = 1024;

/// Whether `sgemm` copies A's row tiles together for A's strides `(rsa, csa)` (see the
/// module doc).
pub(super) fn packs_rows(rsa: isize, csa: isize) -> bool {
    let transposed = rsa == 1 && csa >= PACK_ROWS_MIN_STRIDE;
    let plain = csa == 1 && rsa > 0 && rsa % PLAIN_ROWS_ALIAS_STRIDE == 0;
    transposed || plain
}

/// Floats past its last tile that [`pack_rows`] and [`pack_plain_rows`] may store for tiles of
/// `mr` rows: their stores are 8 wide.
pub(super) const fn slack(mr: usize) -> usize {
    mr.div_ceil(8) * 8 - mr
}

/// The 6-row tile's copy: `mc` rows of A's `kc` columns at `a` (strides `rsa`, `csa`: a
/// transposed A, or a plain one) into `out` as row tiles of [`MR`]: tile `t` at `t * kc * MR`,
/// its rows' elements of each k together.
///
/// # Safety
/// `a` is valid for every element the strides address; [`packs_rows`] holds for them; `out`
/// holds the tiles and [`slack`] more.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn pack_rows(
    out: &mut [f32],
    a: *const f32,
    (rsa, csa): (isize, isize),
    mc: usize,
    kc: usize,
) {
    if rsa == 1 {
        pack_transposed_rows(out, a, csa, mc, kc)
    } else {
        pack_plain_rows::<MR>(out, a, rsa, mc, kc)
    }
}

/// [`pack_rows`] for a transposed A (`rsa == 1`, column stride `csa`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pack_transposed_rows(out: &mut [f32], a: *const f32, csa: isize, mc: usize, kc: usize) {
    assert!(out.len() >= mc.next_multiple_of(MR) * kc + slack(MR));
    for t in (0..mc).step_by(MR) {
        let rows = MR.min(mc - t);
        let (src, dst) = (a.add(t), out.as_mut_ptr().add(t * kc));
        // A tile's elements of one k are contiguous: one masked load (it reads nothing past the
        // tile's rows) and an 8-wide store whose last lanes the next k overwrites (the buffer
        // has room for the last one's).
        let lanes: [i32; LANES] = std::array::from_fn(|l| if l < rows { -1 } else { 0 });
        let mask = _mm256_loadu_si256(lanes.as_ptr() as *const __m256i);
        for p in 0..kc {
            let v = _mm256_maskload_ps(src.offset(p as isize * csa), mask);
            _mm256_storeu_ps(dst.add(p * MR), v);
        }
    }
}

/// Copies `mc` rows of a plain A's `kc` columns at `a` (`csa == 1`, row stride `rsa`) into
/// `out` as row tiles of `TILE_ROWS` (layout as [`pack_rows`]'s), for either tile: eight k of
/// eight of a whole tile's rows at a time (rows past the tile's are zeros), transposed 8x8 in
/// registers and stored 8 wide, each store's lanes past the tile's rows overwritten by the next
/// k's first store; the k past the last eight, and a last tile of fewer rows, element by
/// element. `out` holds the tiles and [`slack`] more.
///
/// # Safety
/// As [`pack_rows`], on a core with AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn pack_plain_rows<const TILE_ROWS: usize>(
    out: &mut [f32],
    a: *const f32,
    rsa: isize,
    mc: usize,
    kc: usize,
) {
    const MAX_GROUPS: usize = 2;
    let groups_of_eight_rows = TILE_ROWS.div_ceil(LANES);
    assert!(
        groups_of_eight_rows <= MAX_GROUPS,
        "a tile of {TILE_ROWS} rows"
    );
    assert!(out.len() >= mc.next_multiple_of(TILE_ROWS) * kc + slack(TILE_ROWS));
    let whole = kc - kc % LANES;
    for t in (0..mc).step_by(TILE_ROWS) {
        let rows = TILE_ROWS.min(mc - t);
        let (src, dst) = (a.offset(t as isize * rsa), out.as_mut_ptr().add(t * kc));
        let by_element_from = if rows == TILE_ROWS { whole } else { 0 };
        for p0 in (0..by_element_from).step_by(LANES) {
            // Each group of eight rows transposed first: a k's stores go in row order, so
            // the spill past its last row lands where the next k's first store then writes.
            let mut groups = [[_mm256_setzero_ps(); LANES]; MAX_GROUPS];
            for (g, ks) in groups.iter_mut().enumerate().take(groups_of_eight_rows) {
                let row = |i: usize| match g * LANES + i < TILE_ROWS {
                    true => {
                        _mm256_loadu_ps(src.offset((g * LANES + i) as isize * rsa + p0 as isize))
                    }
                    false => _mm256_setzero_ps(),
                };
                *ks = transpose8(std::array::from_fn(row));
            }
            for q in 0..LANES {
                for (g, ks) in groups.iter().enumerate().take(groups_of_eight_rows) {
                    _mm256_storeu_ps(dst.add((p0 + q) * TILE_ROWS + g * LANES), ks[q]);
                }
            }
        }
        for p in by_element_from..kc {
            for i in 0..rows {
                *dst.add(p * TILE_ROWS + i) = *src.offset(i as isize * rsa + p as isize);
            }
        }
    }
}
