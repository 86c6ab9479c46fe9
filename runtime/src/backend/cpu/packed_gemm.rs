//! f32 GEMM of many rows, giving `matrixmultiply::sgemm`'s bits faster than it on AVX2+FMA cores.
//!
//! `matrixmultiply`'s 8x8 register tile issues 9 loads (8 broadcasts of A, one vector of B) per
//! 8 FMAs; a core with two FMA ports and two vector loads per cycle is then load-bound. Here the
//! tile is 6 rows by 16 columns: 6 broadcasts and 2 loads per 12 FMAs, so the FMAs bound it.
//! B is packed once per call into 16-wide panels ([`NC`] columns by one k-block at a time, a
//! block that stays in L2 while every row of A passes over it), or read in place when A has few
//! rows (`pack_b::reads_in_place`); A is read in place, or copied
//! into row tiles where reading it in place is slow (`pack_a`: a transposed A with a long
//! stride, a plain one whose rows are a multiple of 4 KiB apart). The
//! tile's C lines are prefetched before its products ([`prefetch_c`]).
//!
//! On AVX-512 cores the same loops run a 12x32 tile of 16-lane vectors instead
//! (`packed_gemm_avx512`): 1.35-1.45x this kernel's speed on a core that runs 512-bit
//! operations at full width, the same bits; `choose_tile` says which tile runs a product.
//!
//! Bit-identity: every element is summed as `small_gemm`'s module doc says `matrixmultiply`
//! sums it (per [`KC`]-long k-block in k order, `acc = fma(a, b, acc)` from +0, then C updated
//! once per block with `small_gemm`'s write-back), so the bits do not depend on the tile shape,
//! the blocking or which of the three kernels a row block reaches. Only for `alpha == 1`, where
//! `matrixmultiply`'s full and partial tiles agree. The tile's edges (the last rows, the last
//! columns of a panel padded with zeros) keep that order per element, so they need no care.

#[cfg(target_arch = "x86_64")]
use super::small_gemm::{finish, tile, Block, Finish, LANES};
use super::small_gemm::{has_fma_avx2, KC};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
use super::packed_gemm_avx512 as avx512;
use pack_a::packs_rows;

#[cfg(target_arch = "x86_64")]
mod choose_tile;
pub(super) mod pack_a;
mod pack_b;

/// Rows of one register tile (with two vectors of columns: 12 accumulators of the 16 registers).
const MR: usize = 6;

/// Columns of one packed panel: two vectors.
#[cfg(target_arch = "x86_64")]
const NR: usize = 2 * LANES;

/// Columns of B packed at once: `KC * NC` floats is 256 KiB, half this machine's L2, so the
/// packed block stays there while every row tile reads it.
const NC: usize = 256;

/// Rows of A that pass over the packed block before the next panel: `MC * KC` floats of A
/// (72 KiB) stay in L2 while each 16-column panel (16 KiB) sits in L1.
const MC: usize = 72;

/// Fewest rows this kernel takes: below them a row tile would be mostly partial. `small_gemm`
/// takes most products of up to 8 rows; on AVX-512 cores it leaves those of 5-8 rows by a plain
/// B here (`small_gemm::WIDE_TILE_MAX_SMALL_ROWS`).
const MIN_ROWS: usize = 5;

thread_local! {
    /// The packed B block, kept between calls: a fresh 256 KiB buffer is a fresh mapping per
    /// call (page faults on every batch of a `bmm`).
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Whether [`sgemm`] takes the shape: `alpha == 1` (see the module doc), enough rows, and a CPU
/// with the FMA kernel `matrixmultiply` would run.
pub fn takes_packed_path((m, k, n): (usize, usize, usize), alpha: f32) -> bool {
    cfg!(target_arch = "x86_64")
        && alpha == 1.0
        && m >= MIN_ROWS
        && k > 0
        && n > 0
        && has_fma_avx2()
}

/// `c = a @ b + beta * c` for `a: [m, k]`, `b: [k, n]`, `c: [m, n]` with element strides
/// `(rs*, cs*)`, bit for bit as `matrixmultiply::sgemm` computes it with `alpha == 1`.
///
/// On AVX-512 cores `choose_tile` says which register tile runs it.
///
/// # Safety
/// As `matrixmultiply::sgemm`: the pointers are valid for every element the strides address,
/// and `c` does not overlap `a` or `b`; [`takes_packed_path`] holds for the shape.
#[cfg(target_arch = "x86_64")]
pub unsafe fn sgemm(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, csb): (*const f32, isize, isize),
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
) {
    sgemm_on(
        avx512::has_avx512()
            && choose_tile::runs_wide((m, k, n), (rsa, csa), csb, <avx512::Wide as Tile>::MC),
        (m, k, n),
        (a, rsa, csa),
        (b, rsb, csb),
        beta,
        (c, rsc, csc),
    )
}

/// [`sgemm`] on the 16-lane kernel (`wide`, which needs AVX-512) or the 8-lane one; the tests
/// run both on the same operands.
#[cfg(target_arch = "x86_64")]
unsafe fn sgemm_on(
    wide: bool,
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, csb): (*const f32, isize, isize),
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
) {
    let b = (b, rsb, csb);
    if wide {
        with_buffers::<avx512::Wide>((m, k, n), (a, rsa, csa), b, None, beta, (c, rsc, csc))
    } else {
        with_buffers::<Narrow>((m, k, n), (a, rsa, csa), b, None, beta, (c, rsc, csc))
    }
}

/// [`sgemm`] for a B whose row `q` starts at `b.offset(b_rows[q])` (each row's `n` columns
/// contiguous): a convolution's columns read where they lie in its padded input instead of
/// copied into a matrix first. Returns `false`, having done nothing, where the 16-lane tile
/// cannot run it (no AVX-512); otherwise the same bits as [`sgemm`] on those rows copied into
/// a plain B. Above one row block (`MC` rows) every row block reads B in place again, which
/// saves the convolution its copy of every block of columns (one thread, 3x3 stride-1
/// convolutions, block copies -> in place: `[4, 64, 32, 32]` by 128 output channels 5.9-6.3 ->
/// 4.6 ms, `[4, 32, 64, 64]` by 128 11.8 -> 9.9-10.3, `[2, 128, 16, 16]` by 256 2.8-3.0 -> 2.55;
/// torch's CPU eager 4.6, 8.7, 1.9).
///
/// # Safety
/// As [`sgemm`]; every `b.offset(b_rows[q])` is valid for `n` floats; `b_rows.len() == k`.
#[cfg(target_arch = "x86_64")]
pub unsafe fn sgemm_b_rows(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const f32, isize, isize),
    (b, b_rows): (*const f32, &[isize]),
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
) -> bool {
    if !takes_packed_path((m, k, n), 1.0) || !avx512::has_avx512() {
        return false;
    }
    assert_eq!(b_rows.len(), k, "one offset per row of B");
    with_buffers::<avx512::Wide>(
        (m, k, n),
        (a, rsa, csa),
        (b, 0, 1),
        Some(b_rows),
        beta,
        (c, rsc, csc),
    );
    true
}

/// Runs [`Tile::sgemm`] for tile `T` on this thread's packing buffers, sized for its panels
/// and, when A's rows are packed, its row tiles.
#[cfg(target_arch = "x86_64")]
unsafe fn with_buffers<T: Tile>(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, csb): (*const f32, isize, isize),
    b_rows: Option<&[isize]>,
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
) {
    PANELS.with(|cell| {
        let mut buf = cell.borrow_mut();
        let panels = KC.min(k) * NC.min(n.next_multiple_of(T::NR));
        let rows = if packs_rows(rsa, csa) {
            T::MC.next_multiple_of(T::MR) * KC.min(k) + T::ROWS_SLACK
        } else {
            0
        };
        if buf.len() < panels + rows {
            buf.resize(panels + rows, 0.0);
        }
        let (panels, rows) = buf.split_at_mut(panels);
        T::sgemm(
            (m, k, n),
            (a, rsa, csa),
            (b, rsb, csb, b_rows),
            beta,
            (c, rsc, csc),
            (panels, rows),
        );
    });
}

/// A register tile the blocked loops ([`blocked`]) run: its shape, how A's row tiles are
/// packed for it, and how one tile of up to `MR` rows is summed and written. The 8-lane tile
/// is [`Narrow`]; the 16-lane one is `packed_gemm_avx512::Wide`.
#[cfg(target_arch = "x86_64")]
pub(super) trait Tile {
    /// Rows of a whole tile.
    const MR: usize;
    /// Columns of one packed panel of B.
    const NR: usize;
    /// Rows of A that pass over the packed block per panel (a multiple of `MR`).
    const MC: usize;
    /// Floats [`Tile::pack_rows`] may store past its last tile.
    const ROWS_SLACK: usize;

    /// The blocked loops with this tile, compiled for its CPU features (each implementation
    /// is [`blocked`] under its own `target_feature`).
    ///
    /// # Safety
    /// As [`sgemm`], on a CPU with the tile's features; `panels` and `a_rows` sized as
    /// [`with_buffers`] sizes them; B's row offsets (`b`'s last part) only where the tile's
    /// [`Tile::tile`] follows [`Block::brows`].
    unsafe fn sgemm(
        mkn: (usize, usize, usize),
        a: (*const f32, isize, isize),
        b: (*const f32, isize, isize, Option<&[isize]>),
        beta: f32,
        c: (*mut f32, isize, isize),
        buffers: (&mut [f32], &mut [f32]),
    );

    /// Copies `mc` rows of A's `kc` columns at `a` (`strides`: row and column, for which
    /// `pack_a::packs_rows` holds) into `out` as row tiles of `MR`: tile `t` at
    /// `t * kc * MR`, its rows' elements of each k together.
    unsafe fn pack_rows(
        out: &mut [f32],
        a: *const f32,
        strides: (isize, isize),
        mc: usize,
        kc: usize,
    );

    /// The tile of `rows` rows (at most `MR`) at `blk`: its sums over the k-block, then C's
    /// first `w` columns written with this block's `beta`.
    unsafe fn tile(blk: &Block, rows: usize, beta: f32, w: usize);
}

/// [`sgemm`]'s loops for tile `T`: column blocks of [`NC`], k-blocks in order (each packed
/// once), row blocks of `T::MC`, `T::NR`-column panels, then row tiles of `T::MR`. Inlined into
/// each tile's [`Tile::sgemm`], so it runs with that tile's CPU features. With `b_rows` (see
/// [`sgemm_b_rows`], which keeps to one row block) B's row `q` is at `b + b_rows[q]`, read in
/// place.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn blocked<T: Tile>(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, csb, b_rows): (*const f32, isize, isize, Option<&[isize]>),
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
    (panels, a_rows): (&mut [f32], &mut [f32]),
) {
    let packed = packs_rows(rsa, csa);
    let in_place = b_rows.is_some() || pack_b::reads_in_place(m, csb, T::MC);
    for jc in (0..n).step_by(NC) {
        let count = NC.min(n - jc).div_ceil(T::NR);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let width = NC.min(n - jc);
            if !in_place {
                pack_b::pack_block(
                    panels,
                    b.offset(k0 as isize * rsb + jc as isize * csb),
                    (rsb, csb),
                    kc,
                    width,
                    T::NR,
                );
            } else if width % T::NR != 0 {
                // Only the last, partial panel (see `pack_b::reads_in_place`).
                let p = width / T::NR;
                let (panel, j) = (&mut panels[p * kc * T::NR..], jc + p * T::NR);
                match b_rows {
                    Some(rows) => {
                        let rows = &rows[k0..k0 + kc];
                        pack_b::pack_rows_at(panel, b.add(j), rows, width % T::NR, T::NR)
                    }
                    None => pack_b::pack_block(
                        panel,
                        b.offset(k0 as isize * rsb + j as isize * csb),
                        (rsb, csb),
                        kc,
                        width % T::NR,
                        T::NR,
                    ),
                }
            }
            // `matrixmultiply` scales C by beta on the first k-block only.
            let beta = if k0 == 0 { beta } else { 1.0 };
            for ic in (0..m).step_by(T::MC) {
                let rows_end = (ic + T::MC).min(m);
                let a_ic = a.offset(ic as isize * rsa + k0 as isize * csa);
                if packed {
                    T::pack_rows(a_rows, a_ic, (rsa, csa), rows_end - ic, kc);
                }
                // Row `i`'s tile of A and its strides: in place, or its packed tile.
                let a_tile = |i: usize| {
                    if packed {
                        (a_rows.as_ptr().add((i - ic) * kc), 1, T::MR as isize)
                    } else {
                        (a_ic.offset((i - ic) as isize * rsa), rsa, csa)
                    }
                };
                for p in 0..count {
                    let j0 = jc + p * T::NR;
                    let (bp, bs, brows) = match b_rows {
                        _ if !in_place || j0 + T::NR > n => (
                            panels.as_ptr().add(p * kc * T::NR),
                            T::NR as isize,
                            std::ptr::null(),
                        ),
                        Some(rows) => (b.add(j0), 0, rows[k0..].as_ptr()),
                        None => (
                            b.offset(k0 as isize * rsb + j0 as isize),
                            rsb,
                            std::ptr::null(),
                        ),
                    };
                    let mut i = ic;
                    while i < rows_end {
                        let rows = T::MR.min(rows_end - i);
                        let (ap, rsa, csa) = a_tile(i);
                        let blk = Block {
                            kc,
                            ap,
                            rsa,
                            csa,
                            bp,
                            bs,
                            brows,
                            cp: c.offset(i as isize * rsc + j0 as isize * csc),
                            rsc,
                            csc,
                        };
                        T::tile(&blk, rows, beta, T::NR.min(n - j0));
                        i += rows;
                    }
                }
            }
        }
    }
}

/// The 8-lane tile: 6 rows by 16 columns (see the module doc).
#[cfg(target_arch = "x86_64")]
struct Narrow;

#[cfg(target_arch = "x86_64")]
impl Tile for Narrow {
    const MR: usize = MR;
    const NR: usize = NR;
    const MC: usize = MC;
    const ROWS_SLACK: usize = pack_a::slack(MR);

    #[target_feature(enable = "avx2,fma")]
    unsafe fn sgemm(
        mkn: (usize, usize, usize),
        a: (*const f32, isize, isize),
        b: (*const f32, isize, isize, Option<&[isize]>),
        beta: f32,
        c: (*mut f32, isize, isize),
        buffers: (&mut [f32], &mut [f32]),
    ) {
        blocked::<Narrow>(mkn, a, b, beta, c, buffers)
    }

    #[inline(always)]
    unsafe fn pack_rows(
        out: &mut [f32],
        a: *const f32,
        (rsa, csa): (isize, isize),
        mc: usize,
        kc: usize,
    ) {
        pack_a::pack_rows(out, a, (rsa, csa), mc, kc)
    }

    #[inline(always)]
    unsafe fn tile(blk: &Block, rows: usize, beta: f32, w: usize) {
        debug_assert!(blk.brows.is_null(), "B row offsets are the 16-lane tile's");
        prefetch_c(blk, rows);
        let fin = Finish {
            alpha: 1.0,
            beta,
            w,
        };
        match rows {
            6 if w == NR && blk.csc == 1 => store_full(&kernel(blk), blk, beta),
            6 => finish(&kernel(blk), blk, &fin),
            5 => tile::<5, 2>(blk, &fin),
            4 => tile::<4, 2>(blk, &fin),
            3 => tile::<3, 2>(blk, &fin),
            2 => tile::<2, 2>(blk, &fin),
            _ => tile::<1, 2>(blk, &fin),
        }
    }
}

/// `small_gemm::finish` for a whole 6x16 tile of a row-major C with `alpha == 1`: the same
/// operations per element less its `fma(alpha, acc, 0)`, which is `acc` itself for alpha 1 (a
/// sum from +0 is never -0). On attention's k = 32 products that write-back is a tenth of a
/// tile's time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_full(acc: &[[__m256; 2]; MR], blk: &Block, beta: f32) {
    for (r, row) in acc.iter().enumerate() {
        let crow = blk.cp.offset(r as isize * blk.rsc);
        for (v, &x) in row.iter().enumerate() {
            let cv = crow.add(v * LANES);
            let out = if beta == 0.0 {
                x
            } else {
                _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(cv), _mm256_set1_ps(beta)), x)
            };
            _mm256_storeu_ps(cv, out);
        }
    }
}

/// Asks for the tile's C lines before its products: its rows are far apart, so no hardware
/// prefetcher fetches them, and the write-back otherwise waits on each miss (products with
/// k = 128 and n = 512 ran 10-15% slower than `matrixmultiply` without this, 0-5% faster with).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_c(blk: &Block, rows: usize) {
    for r in 0..rows {
        // Prefetches never fault, so an address past C's end is harmless (hence wrapping).
        let first = blk.cp.wrapping_offset(r as isize * blk.rsc);
        let last = first.wrapping_offset((NR - 1) as isize * blk.csc);
        _mm_prefetch::<_MM_HINT_T0>(first as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(last as *const i8);
    }
}

/// The 6x16 register tile: `blk.kc` products of A's six rows with B's panel (packed, or B
/// itself read in place: rows `blk.bs` apart), each element's sum in k order from +0. Its own
/// function, so that the twelve accumulators stay in registers whatever the caller's loops
/// keep live.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
unsafe fn kernel(blk: &Block) -> [[__m256; 2]; MR] {
    let (rsa, csa) = (blk.rsa, blk.csa);
    let z = _mm256_setzero_ps();
    let (mut c00, mut c01, mut c10, mut c11, mut c20, mut c21) = (z, z, z, z, z, z);
    let (mut c30, mut c31, mut c40, mut c41, mut c50, mut c51) = (z, z, z, z, z, z);
    // Rows 0-2 from `a`, rows 3-5 from `a3`: both reach their rows with one stride register.
    let (mut a0, mut a3, mut b) = (blk.ap, blk.ap.offset(3 * rsa), blk.bp);
    for _ in 0..blk.kc {
        let b0 = _mm256_loadu_ps(b);
        let b1 = _mm256_loadu_ps(b.add(LANES));
        let x = _mm256_broadcast_ss(&*a0);
        c00 = _mm256_fmadd_ps(x, b0, c00);
        c01 = _mm256_fmadd_ps(x, b1, c01);
        let x = _mm256_broadcast_ss(&*a0.offset(rsa));
        c10 = _mm256_fmadd_ps(x, b0, c10);
        c11 = _mm256_fmadd_ps(x, b1, c11);
        let x = _mm256_broadcast_ss(&*a0.offset(2 * rsa));
        c20 = _mm256_fmadd_ps(x, b0, c20);
        c21 = _mm256_fmadd_ps(x, b1, c21);
        let x = _mm256_broadcast_ss(&*a3);
        c30 = _mm256_fmadd_ps(x, b0, c30);
        c31 = _mm256_fmadd_ps(x, b1, c31);
        let x = _mm256_broadcast_ss(&*a3.offset(rsa));
        c40 = _mm256_fmadd_ps(x, b0, c40);
        c41 = _mm256_fmadd_ps(x, b1, c41);
        let x = _mm256_broadcast_ss(&*a3.offset(2 * rsa));
        c50 = _mm256_fmadd_ps(x, b0, c50);
        c51 = _mm256_fmadd_ps(x, b1, c51);
        // Wrapping: after the last product the row pointers may pass A's end unread.
        a0 = a0.wrapping_offset(csa);
        a3 = a3.wrapping_offset(csa);
        b = b.wrapping_offset(blk.bs);
    }
    [
        [c00, c01],
        [c10, c11],
        [c20, c21],
        [c30, c31],
        [c40, c41],
        [c50, c51],
    ]
}

#[cfg(test)]
mod tests;
