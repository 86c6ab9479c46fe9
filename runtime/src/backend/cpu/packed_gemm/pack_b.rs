//! How `packed_gemm` copies one block of B (`KC` rows of k by up to `NC` columns) into the
//! panels its register tile reads: panel `p` holds columns `p * nr ..`, row after row of k.
//!
//! The panels' contents do not depend on the order they are written in, so neither does any
//! sum; only the order B is read in changes:
//! - a plain B (rows contiguous) is read row by row across the whole block, each row's up to
//!   `NC` columns in one sequential run. Read panel by panel, each k's `nr` columns came from a
//!   line a row stride away from the previous k's, a strided walk per panel. Few-row products,
//!   where packing B is a large share of the time (a convolution's `[Cout, Cin * 9] @ [Cin *
//!   9, pixels]` with few output channels), run 3-6% faster (Zen 4, best of 7, two interleaved
//!   runs: `[32, 288] @ [288, 4096]` 960 -> 900 us, `[48, 288] @ [288, 4096]` 1,320 -> 1,262,
//!   `[32, 576] @ [576, 1024]` 469 -> 442, `[96, 576] @ [576, 1024]` 1,175 -> 1,146); products
//!   of many rows as fast (`[1024, 1024] @ [1024, 1024]` 20.6 ms either way);
//! - a transposed B (columns contiguous) is read panel by panel, eight columns at a time down
//!   the block (`small_gemm::pack_panel`'s 8x8 transposes);
//! - a plain B of a product with few rows is not copied at all ([`reads_in_place`]).

#[cfg(target_arch = "x86_64")]
use super::super::small_gemm::pack_panel;

/// Whether `packed_gemm` reads a plain B's (`csb == 1`) whole panels where they lie instead
/// of copying them, for a product of `m` rows with row blocks of `mc` rows. A panel is read by
/// each row tile of a row block in turn, right after one another; when all of A fits in one
/// row block, the copy buys nothing but those few reads from a contiguous panel, and for few
/// rows the copy was most of the product's time (a convolution's `[Cout, Cin * 9] @ [Cin * 9,
/// pixels]`). The last panel of a block, when narrower than a panel, is still copied (the tile
/// reads a whole panel's columns). Above one row block a panel serves every row block, so it
/// is copied once. The values read are the same either way, so are the sums.
///
/// Measured on Zen 4 (the 16-lane tile, one thread, median of 30 calls, two interleaved runs;
/// copied -> in place): `[12, 144] @ [144, 4096]` 227-232 -> 171-181 us, `[16, 144] @ ..`
/// 276 -> 220, `[24, 144] @ ..` 366 -> 307, `[32, 144] @ ..` 456 -> 402, `[16, 288] @ [288,
/// 1024]` 167-190 -> 118-125, `[32, 288] @ ..` 254-286 -> 214, `[64, 288] @ ..` 440-492 ->
/// 399-402, `[64, 1024] @ [1024, 1024]` 1,464-1,479 -> 1,383 (B rows 4 KiB apart: no worse).
/// Products of 96 to 512 rows ran as fast in place as copied; the 8-lane tile takes the same
/// rule unmeasured (no AVX2-only core here).
pub(super) fn reads_in_place(m: usize, csb: isize, mc: usize) -> bool {
    csb == 1 && m <= mc
}

/// Copies the `kc` rows of B's `width` columns at `b` (strides `rsb`, `csb`) into `panels` as
/// panels of `nr` columns (the last one's columns past `width` zero).
///
/// # Safety
/// `b` is valid for every element the strides address; `panels` holds `kc * nr` floats per
/// panel, `width.div_ceil(nr)` panels.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn pack_block(
    panels: &mut [f32],
    b: *const f32,
    (rsb, csb): (isize, isize),
    kc: usize,
    width: usize,
    nr: usize,
) {
    let count = width.div_ceil(nr);
    assert!(panels.len() >= count * kc * nr);
    if csb == 1 {
        for q in 0..kc {
            let row = b.offset(q as isize * rsb);
            for p in 0..count {
                let (j0, at) = (p * nr, (p * kc + q) * nr);
                pack_panel(
                    &mut panels[at..at + nr],
                    row.add(j0),
                    rsb,
                    1,
                    1,
                    nr.min(width - j0),
                    nr,
                );
            }
        }
        return;
    }
    for p in 0..count {
        let j0 = p * nr;
        pack_panel(
            &mut panels[p * kc * nr..(p + 1) * kc * nr],
            b.offset(j0 as isize * csb),
            rsb,
            csb,
            kc,
            nr.min(width - j0),
            nr,
        );
    }
}

/// Copies the last, partial panel's `width` columns of B's rows found at `b + rows[q]` (see
/// `sgemm_b_rows`) into `panel` (`rows.len()` rows of `nr`, the columns past `width` zero), as
/// [`pack_block`] copies a plain B's.
///
/// # Safety
/// Every `b.offset(rows[q])` is valid for `width` floats; `panel` holds `rows.len() * nr`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn pack_rows_at(
    panel: &mut [f32],
    b: *const f32,
    rows: &[isize],
    width: usize,
    nr: usize,
) {
    for (q, &off) in rows.iter().enumerate() {
        let dst = &mut panel[q * nr..(q + 1) * nr];
        dst[..width].copy_from_slice(std::slice::from_raw_parts(b.offset(off), width));
        dst[width..].fill(0.0);
    }
}
