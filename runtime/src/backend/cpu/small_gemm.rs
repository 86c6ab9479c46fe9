//! f32 GEMM for few output rows, giving `matrixmultiply::sgemm`'s bits without its costs there.
//!
//! `matrixmultiply` packs all of B (a transposing copy when B is a transposed weight, as in
//! `x @ W.t()`) and runs an 8x8 register tile: with one output row it copies every element of B
//! once and computes 8 rows to keep 1, so a `[1, 1024] @ [1024, 1024]` took ~7x MKL's time.
//! Here the tile is 1-4 rows by 16-64 columns, B is read in place when its rows are contiguous,
//! and a transposed B is transposed 8x8 in registers into a panel a few KiB long.
//!
//! Bit-identity: the runtime cuts one GEMM into row blocks (threads, epilogue blocks), so one
//! output row may be computed here in one run and by `matrixmultiply` in another. Each element
//! is computed as `matrixmultiply`'s FMA kernel computes an element of a partial ("masked")
//! tile, which is every element of a GEMM with fewer than 8 rows: per block of [`KC`] products
//! along k, in order, `acc = fma(a, b, acc)` from `+0`, then `t = fma(alpha, acc, +0)` and
//! `c = t` (first block, `beta == 0`) or `c = c * beta' + t` (`beta' = beta` on the first
//! block, 1 after). Its full 8x8 tiles compute `c = fma(alpha, acc, c * beta')` instead, which
//! is the same number when `alpha == 1` (`acc` is never -0, starting from +0, so `acc + 0` is
//! `acc`), so 8 or more rows take this path only then. On a CPU without AVX2 and FMA
//! `matrixmultiply` uses another kernel, and this path is not taken.

#[cfg(target_arch = "x86_64")]
use super::columns::avx::transpose8;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `matrixmultiply`'s sgemm k-block (`S_KC`): where its per-element sums restart from zero.
/// The tests compare against `matrixmultiply` for k across several blocks, so a different value
/// there fails them.
pub(super) const KC: usize = 256;

/// Most output rows per call that take this path when B is transposed (`x @ W.t()`, `q @ k^T`),
/// and when it is not: above them `matrixmultiply`'s packed 8x8 kernel is as fast (its packing
/// of B is spread over many rows; a transposed B is slower for it to pack). Measured on
/// `[m, 128] @ [128, 384]` and `[m, 1024] @ [1024, 1024]`: 1.4-2.5x faster at 16 rows with a
/// transposed B, 1.1-1.3x at 8 rows and even at 16 with a plain one. On AVX-512 cores a
/// transposed B of [`WIDE_TILE_MIN_TRANSPOSED_COLS`] or more columns leaves at 5 rows instead.
const MAX_ROWS_TRANSPOSED_B: usize = 32;
const MAX_ROWS: usize = 8;

/// On AVX-512 cores, products of more than this many rows by a plain B take `packed_gemm`'s
/// 16-lane tile (which reads a plain B in place for few rows) instead of this path's 4-row
/// passes over B, whatever B's width. Measured on Zen 4 (one thread, best of 200 runs of 20
/// calls each, hot operands as in a recurrence's steps; this path -> the 16-lane tile):
/// `[8, 512] @ [512, 128]` 19.6 -> 9.9 us (an LSTM's 8-sample half batch per thread, its
/// backward's `dgates @ W_hh` every step), `[8, 128] @ [128, 512]` 21.3 -> 10.9, `[6, 256] @
/// [256, 256]` 18.6 -> 7.5, `[5, 128] @ [128, 384]` 15.2 -> 5.4, `[8, 2048] @ [2048, 64]` 37.0 ->
/// 26.9, `[8, 64] @ [64, 64]` 1.5 -> 1.0, `[8, 100] @ [100, 40]` 1.6 -> 1.4. (Until session 46
/// only B of 512+ columns went there: narrower ones had measured slower on the tile in strict
/// mode, `[7, 512] @ [512, 128]` 19 -> 26 us; measured again by themselves, every width tried
/// is faster there.)
const WIDE_TILE_MAX_SMALL_ROWS: usize = 4;

/// On AVX-512 cores, products of more than [`WIDE_TILE_MAX_SMALL_ROWS`] rows by a transposed B
/// of at least this many columns take `packed_gemm`'s 16-lane tile too (it packs the
/// transposed B once per call) instead of this path's transposing passes. Measured on Zen 4
/// (one thread, hot operands; this path -> the tile): `[16, 128] @ [128, 512]^T` 21.8 ->
/// 14.8 us (an LSTM layer's hidden product every forward step, batch 16), `[32, 128] @ [128,
/// 512]^T` 38.9 -> 24.3, `[16, 1024] @ [1024, 1024]^T` 380 -> 260, `[12, 128] @ [128, 512]^T`
/// 16.6 -> 12.0, `[6, 128] @ [128, 128]^T` 3.1 -> 2.4, `[24, 64] @ [64, 256]^T` 8.7 -> 5.7;
/// narrower B stays here, where the tile's lanes would be mostly empty (`[8, 32] @ [32, 32]^T`
/// 0.30 against 0.42, `[16, 100] @ [100, 40]^T` 1.66 against 1.79).
const WIDE_TILE_MIN_TRANSPOSED_COLS: usize = 64;

/// An f32 GEMM kernel with [`sgemm`]'s arguments: shape `(m, k, n)`, alpha, then each operand
/// as a pointer and its (row, column) strides, beta between B and C. The kernels that give
/// other orders or run on other CPUs share it, so callers can pick one as a value.
pub(super) type SgemmFn = unsafe fn(
    (usize, usize, usize),
    f32,
    (*const f32, isize, isize),
    (*const f32, isize, isize),
    f32,
    (*mut f32, isize, isize),
);

/// `c = alpha * a @ b + beta * c` for `a: [m, k]`, `b: [k, n]`, `c: [m, n]` with element
/// strides `(rs*, cs*)`, bit for bit as `matrixmultiply::sgemm` computes it: `gemv_avx512`'s
/// kernel for 1-4 rows on AVX-512 cores, `gemv_rows_avx2`'s for 1-4 rows by a large plain B
/// on the others, this module's for few rows, `packed_gemm`'s for more
/// when alpha is 1, `matrixmultiply` otherwise (scaled products of 8+ rows, CPUs without AVX2
/// and FMA).
///
/// # Safety
/// As `matrixmultiply::sgemm`: the pointers are valid for every element the strides address,
/// and `c` does not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, csb): (*const f32, isize, isize),
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
) {
    #[cfg(target_arch = "x86_64")]
    {
        let mkn = (m, k, n);
        let (av, bv, cv) = ((a, rsa, csa), (b, rsb, csb), (c, rsc, csc));
        if super::gemv_avx512::takes(mkn, (rsb, csb)) {
            return super::gemv_avx512::sgemm(mkn, alpha, av, bv, beta, cv);
        }
        if super::gemv_rows_avx2::takes(mkn, csb) {
            return super::gemv_rows_avx2::sgemm(mkn, alpha, av, bv, beta, cv);
        }
        if takes_small_path(mkn, rsb, alpha) {
            return small_sgemm(mkn, alpha, av, bv, beta, cv);
        }
        if super::packed_gemm::takes_packed_path(mkn, alpha) {
            return super::packed_gemm::sgemm(mkn, av, bv, beta, cv);
        }
    }
    matrixmultiply::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc);
}

/// Whether [`sgemm`] runs this module's kernel for the shape, B's row stride `rsb` (1: B is
/// transposed) and `alpha`. Either path gives the same bits; this only picks the faster.
pub fn takes_small_path((m, k, n): (usize, usize, usize), rsb: isize, alpha: f32) -> bool {
    let max_rows = match (alpha == 1.0, rsb == 1) {
        // Below 8 rows every `matrixmultiply` tile is partial, as every one here is.
        (false, _) => 7,
        (true, true) if wide_tile_available() && n >= WIDE_TILE_MIN_TRANSPOSED_COLS => {
            WIDE_TILE_MAX_SMALL_ROWS
        }
        (true, true) => MAX_ROWS_TRANSPOSED_B,
        (true, false) if wide_tile_available() => WIDE_TILE_MAX_SMALL_ROWS,
        (true, false) => MAX_ROWS,
    };
    cfg!(target_arch = "x86_64") && (1..=max_rows).contains(&m) && k > 0 && n > 0 && has_fma_avx2()
}

/// Whether `packed_gemm`'s 16-lane tile can run here (an AVX-512 core).
fn wide_tile_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::packed_gemm_avx512::has_avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The CPU features `matrixmultiply` picks its FMA kernel by (it ignores AVX-512 unless built
/// with its `avx512` feature, which this workspace does not enable).
pub(super) fn has_fma_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Most elements of a transposed B that [`tile_transposed`] reads in place (256 KiB: half
/// this machine's L2).
const IN_REGS_MAX_B: usize = 1 << 16;

/// Panel columns per vector register.
pub(super) const LANES: usize = 8;

/// Rows and vectors of one register tile: `rows * vectors` accumulators, at least 8 of them
/// when there are rows enough (an FMA's latency times the two FMA ports).
fn tile_for(rows: usize) -> (usize, usize) {
    match rows {
        1 => (1, 8),
        2 => (2, 4),
        3 => (3, 2),
        _ => (4, 2),
    }
}

/// Vectors per tile row for a panel of `w` valid columns, at most `nv`: the fewest (a power
/// of two) that hold them. A panel narrower than the tile was padded to the tile's width, and
/// the padding packed and multiplied: a depthwise convolution's weight gradient (`[1, 2048]
/// @ [2048, 9]` per channel) ran 64 columns to keep 9, ten times torch's time.
fn vectors_for(w: usize, nv: usize) -> usize {
    w.div_ceil(LANES).next_power_of_two().min(nv)
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The packed B panel, kept between calls (`pack_panel` writes all of the part in use,
    /// padding too): a fresh zeroed one per call was a 64 KiB calloc and memset, a tenth of
    /// what a generated token of a small GPT-2 costs on top of CPU eager's instructions.
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_sgemm(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, csb): (*const f32, isize, isize),
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
) {
    // One tile width per panel: the panel is packed once for all rows; only a last, narrower
    // panel (or a narrow B) takes fewer vectors.
    let (rows, nv_max) = tile_for(m);
    let step = nv_max * LANES;
    // Taken out and put back rather than borrowed in `with`: a closure would not inherit this
    // function's target features.
    let mut buf = PANEL.take();
    let len = KC.min(k) * vectors_for(n, nv_max) * LANES;
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let panel = &mut buf[..len];
    for j0 in (0..n).step_by(step) {
        let nv = vectors_for(n - j0, nv_max);
        let pw = nv * LANES;
        let w = pw.min(n - j0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let b0 = b.offset(k0 as isize * rsb + j0 as isize * csb);
            // B's rows are read in place when contiguous, the panel whole and read by one row
            // tile only: a panel read again for every row tile is packed, since rows a
            // power-of-two stride apart share a few L1 sets and would come from L2 each time.
            // A transposed B read by one row tile is transposed straight into the sums: with
            // one row, storing and reloading a panel cost more than the products. Not when B
            // is larger than L2: the tile reads `pw` columns at once, more streams than the
            // prefetchers follow, and the panel's eight at a time were 2.7x faster.
            let one_tile = rows >= m && w == pw;
            let in_regs = one_tile && rsb == 1 && k * n <= IN_REGS_MAX_B;
            let (bp, bs) = if in_regs {
                (b0, csb)
            } else if one_tile && csb == 1 {
                (b0, rsb)
            } else {
                pack_panel(panel, b0, rsb, csb, kc, w, pw);
                (panel.as_ptr(), pw as isize)
            };
            let fin = Finish {
                alpha,
                beta: if k0 == 0 { beta } else { 1.0 },
                w,
            };
            let mut i0 = 0;
            while i0 < m {
                let (r, _) = tile_for(m - i0);
                let ap = a.offset(i0 as isize * rsa + k0 as isize * csa);
                let cp = c.offset(i0 as isize * rsc + j0 as isize * csc);
                let blk = Block {
                    kc,
                    ap,
                    rsa,
                    csa,
                    bp,
                    bs,
                    brows: std::ptr::null(),
                    cp,
                    rsc,
                    csc,
                };
                run_tile(r, nv, in_regs, &blk, &fin);
                i0 += r;
            }
        }
    }
    PANEL.set(buf);
}

/// Runs the `r` by `nv` vectors tile on `blk`: [`tile_transposed`] when B is read in place by
/// columns (`in_regs`), else [`tile`]. `tile_for` and `vectors_for` give at most 8 vectors in
/// all and never more than `tile_for`'s for the rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn run_tile(r: usize, nv: usize, in_regs: bool, blk: &Block, fin: &Finish) {
    macro_rules! pick {
        ($(($r:literal, $nv:literal)),*) => {
            match (r, nv, in_regs) {
                $(
                    ($r, $nv, true) => tile_transposed::<$r, $nv>(blk, fin),
                    ($r, $nv, false) => tile::<$r, $nv>(blk, fin),
                )*
                _ => unreachable!("no {r} x {nv} tile"),
            }
        };
    }
    pick!(
        (1, 1),
        (1, 2),
        (1, 4),
        (1, 8),
        (2, 1),
        (2, 2),
        (2, 4),
        (3, 1),
        (3, 2),
        (4, 1),
        (4, 2)
    )
}

/// One register tile's operands: `kc` products from A's rows at `ap` and the panel at `bp`
/// (row stride `bs`; for [`tile_transposed`], B itself with column stride `bs`), into C at `cp`.
/// Where `brows` is not null (the 16-lane tile only), B's row `q` is at `bp + brows[q]` instead.
pub(super) struct Block {
    pub(super) kc: usize,
    pub(super) ap: *const f32,
    pub(super) rsa: isize,
    pub(super) csa: isize,
    pub(super) bp: *const f32,
    pub(super) bs: isize,
    pub(super) brows: *const isize,
    pub(super) cp: *mut f32,
    pub(super) rsc: isize,
    pub(super) csc: isize,
}

/// How a tile's sums reach C: `alpha`, this k-block's `beta` and the valid columns `w`.
pub(super) struct Finish {
    pub(super) alpha: f32,
    pub(super) beta: f32,
    pub(super) w: usize,
}

/// `R` rows by `NV * 8` columns: the sums over the block, then C as `matrixmultiply`'s masked
/// tile writes it (see the module doc).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn tile<const R: usize, const NV: usize>(blk: &Block, fin: &Finish) {
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    let mut bp = blk.bp;
    let mut ap = blk.ap;
    for _ in 0..blk.kc {
        let mut bv = [_mm256_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(bp.add(v * LANES));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm256_set1_ps(*ap.offset(r as isize * blk.rsa));
            for (v, x) in row.iter_mut().enumerate() {
                *x = _mm256_fmadd_ps(av, bv[v], *x);
            }
        }
        bp = bp.offset(blk.bs);
        ap = ap.offset(blk.csa);
    }
    finish(&acc, blk, fin);
}

/// As [`tile`], for a B whose columns are contiguous (`blk.bs` is its column stride): each 8x8
/// block of B is transposed in registers and used at once, in the same order along k.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_transposed<const R: usize, const NV: usize>(blk: &Block, fin: &Finish) {
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    let a = |r: usize, p: usize| *blk.ap.offset(r as isize * blk.rsa + p as isize * blk.csa);
    let whole = blk.kc - blk.kc % LANES;
    for p0 in (0..whole).step_by(LANES) {
        for v in 0..NV {
            let col = |j: usize| {
                _mm256_loadu_ps(
                    blk.bp
                        .offset(p0 as isize + (v * LANES + j) as isize * blk.bs),
                )
            };
            let t = transpose8(std::array::from_fn(col));
            for (q, bq) in t.iter().enumerate() {
                for (r, row) in acc.iter_mut().enumerate() {
                    row[v] = _mm256_fmadd_ps(_mm256_set1_ps(a(r, p0 + q)), *bq, row[v]);
                }
            }
        }
    }
    for p in whole..blk.kc {
        for v in 0..NV {
            let e = |j: usize| {
                *blk.bp
                    .offset(p as isize + (v * LANES + j) as isize * blk.bs)
            };
            let bq = _mm256_setr_ps(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7));
            for (r, row) in acc.iter_mut().enumerate() {
                row[v] = _mm256_fmadd_ps(_mm256_set1_ps(a(r, p)), bq, row[v]);
            }
        }
    }
    finish(&acc, blk, fin);
}

/// Writes a tile's sums to C as `matrixmultiply`'s masked tile does (see the module doc).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn finish<const R: usize, const NV: usize>(
    acc: &[[__m256; NV]; R],
    blk: &Block,
    fin: &Finish,
) {
    let alpha = _mm256_set1_ps(fin.alpha);
    let zero = _mm256_setzero_ps();
    for (r, row) in acc.iter().enumerate() {
        let crow = blk.cp.offset(r as isize * blk.rsc);
        for (v, x) in row.iter().enumerate() {
            let t = _mm256_fmadd_ps(alpha, *x, zero);
            let j0 = v * LANES;
            if j0 >= fin.w {
                break;
            }
            let cv = crow.offset(j0 as isize * blk.csc);
            if blk.csc == 1 && j0 + LANES <= fin.w {
                let out = if fin.beta == 0.0 {
                    t
                } else {
                    _mm256_add_ps(
                        _mm256_mul_ps(_mm256_loadu_ps(cv), _mm256_set1_ps(fin.beta)),
                        t,
                    )
                };
                _mm256_storeu_ps(cv, out);
            } else {
                let mut lanes = [0f32; LANES];
                _mm256_storeu_ps(lanes.as_mut_ptr(), t);
                for (l, &tl) in lanes.iter().enumerate().take(fin.w - j0) {
                    let p = cv.offset(l as isize * blk.csc);
                    *p = if fin.beta == 0.0 {
                        tl
                    } else {
                        *p * fin.beta + tl
                    };
                }
            }
        }
    }
}

/// Copies `kc` rows of B's `w` columns at `b` (strides `rsb`, `csb`) into `panel` (row stride
/// `pw`, columns past `w` zero). A transposed B (`rsb == 1`) is transposed 8x8 in registers; a
/// panel narrower than its tile reads its last vector of each row under a mask (or a zero
/// column), so narrow products pack at the speed of wide ones.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn pack_panel(
    panel: &mut [f32],
    b: *const f32,
    rsb: isize,
    csb: isize,
    kc: usize,
    w: usize,
    pw: usize,
) {
    let out = panel.as_mut_ptr();
    let mut p0 = 0;
    if csb == 1 {
        for p in 0..kc {
            let (src, dst) = (b.offset(p as isize * rsb), out.add(p * pw));
            for j in (0..pw).step_by(LANES) {
                let v = if j + LANES <= w {
                    _mm256_loadu_ps(src.add(j))
                } else if j < w {
                    _mm256_maskload_ps(src.add(j), first_lanes(w - j))
                } else {
                    _mm256_setzero_ps()
                };
                _mm256_storeu_ps(dst.add(j), v);
            }
        }
        return;
    }
    if rsb == 1 {
        // Eight columns at a time down the whole block: eight sequential read streams (all
        // `pw` columns at once put `pw` lines a row stride apart in play, which for power-of-two
        // strides share a few L1 sets and evict each other).
        p0 = kc - kc % LANES;
        for g in (0..pw).step_by(LANES) {
            for q in (0..p0).step_by(LANES) {
                // A loop, not `array::from_fn`: its closure does not inherit this function's
                // target features, and its loads became calls (a fifth of a narrow product).
                let mut cols = [_mm256_setzero_ps(); LANES];
                for (j, col) in cols.iter_mut().enumerate().take(w.saturating_sub(g)) {
                    *col = _mm256_loadu_ps(b.offset(q as isize + (g + j) as isize * csb));
                }
                let t = transpose8(cols);
                for (p, v) in t.iter().enumerate() {
                    _mm256_storeu_ps(out.add((q + p) * pw + g), *v);
                }
            }
        }
    }
    for p in p0..kc {
        let row = out.add(p * pw);
        for j in 0..pw {
            *row.add(j) = if j < w {
                *b.offset(p as isize * rsb + j as isize * csb)
            } else {
                0.0
            };
        }
    }
}

/// A `maskload` mask of the first `count` lanes (`count < 8`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn first_lanes(count: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(count as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

#[cfg(test)]
pub(super) mod tests;
