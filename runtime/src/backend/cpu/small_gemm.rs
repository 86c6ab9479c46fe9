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
/// transposed B, 1.1-1.3x at 8 rows and even at 16 with a plain one.
const MAX_ROWS_TRANSPOSED_B: usize = 32;
const MAX_ROWS: usize = 8;

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
        (true, true) => MAX_ROWS_TRANSPOSED_B,
        (true, false) => MAX_ROWS,
    };
    cfg!(target_arch = "x86_64") && (1..=max_rows).contains(&m) && k > 0 && n > 0 && has_fma_avx2()
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
    // One tile width for the whole call: the panel is packed once for all rows.
    let (rows, nv) = tile_for(m);
    let pw = nv * LANES;
    let mut panel = vec![0f32; KC.min(k) * pw];
    for j0 in (0..n).step_by(pw) {
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
                pack_panel(&mut panel, b0, rsb, csb, kc, w, pw);
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
                    cp,
                    rsc,
                    csc,
                };
                match (r, nv) {
                    (1, 8) if in_regs => tile_transposed::<1, 8>(&blk, &fin),
                    (2, 4) if in_regs => tile_transposed::<2, 4>(&blk, &fin),
                    (3, 2) if in_regs => tile_transposed::<3, 2>(&blk, &fin),
                    (4, 2) if in_regs => tile_transposed::<4, 2>(&blk, &fin),
                    (1, 8) => tile::<1, 8>(&blk, &fin),
                    (2, 4) => tile::<2, 4>(&blk, &fin),
                    (1, 2) => tile::<1, 2>(&blk, &fin),
                    (2, 2) => tile::<2, 2>(&blk, &fin),
                    (3, 2) => tile::<3, 2>(&blk, &fin),
                    (4, 2) => tile::<4, 2>(&blk, &fin),
                    _ => unreachable!("tile_for gives {r} rows for a call of {m} rows"),
                }
                i0 += r;
            }
        }
    }
}

/// One register tile's operands: `kc` products from A's rows at `ap` and the panel at `bp`
/// (row stride `bs`; for [`tile_transposed`], B itself with column stride `bs`), into C at `cp`.
pub(super) struct Block {
    pub(super) kc: usize,
    pub(super) ap: *const f32,
    pub(super) rsa: isize,
    pub(super) csa: isize,
    pub(super) bp: *const f32,
    pub(super) bs: isize,
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
/// `pw`, columns past `w` zero). A transposed B (`rsb == 1`) is transposed 8x8 in registers.
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
    if csb == 1 && w == pw {
        for p in 0..kc {
            let (src, dst) = (b.offset(p as isize * rsb), out.add(p * pw));
            for j in (0..pw).step_by(LANES) {
                _mm256_storeu_ps(dst.add(j), _mm256_loadu_ps(src.add(j)));
            }
        }
        return;
    }
    if rsb == 1 && w == pw {
        // Eight columns at a time down the whole block: eight sequential read streams (all
        // `pw` columns at once put `pw` lines a row stride apart in play, which for power-of-two
        // strides share a few L1 sets and evict each other).
        p0 = kc - kc % LANES;
        for g in (0..pw).step_by(LANES) {
            for q in (0..p0).step_by(LANES) {
                let col = |j: usize| _mm256_loadu_ps(b.offset(q as isize + (g + j) as isize * csb));
                let t = transpose8(std::array::from_fn(col));
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A deterministic f32 sequence in [-1, 1), with some exact zeros.
    pub(in crate::backend::cpu) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if i % 11 == 3 {
                    0.0
                } else {
                    (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                }
            })
            .collect()
    }

    /// A matrix of `rows x cols` in a buffer, addressed with the strides given.
    pub(in crate::backend::cpu) struct Strided {
        pub(in crate::backend::cpu) data: Vec<f32>,
        pub(in crate::backend::cpu) rs: isize,
        pub(in crate::backend::cpu) cs: isize,
    }

    /// `rows x cols`: row-major, column-major, or every other element of a row-major buffer.
    pub(in crate::backend::cpu) fn matrix(
        rows: usize,
        cols: usize,
        kind: &str,
        seed: u64,
    ) -> Strided {
        let (rs, cs, len) = match kind {
            "rows" => (cols as isize, 1, rows * cols),
            "cols" => (1, rows as isize, rows * cols),
            _ => (2 * cols as isize, 2, 2 * rows * cols),
        };
        Strided {
            data: values(len, seed),
            rs,
            cs,
        }
    }

    /// C from this module's `sgemm` and from `matrixmultiply::sgemm` on the same operands; C
    /// row-major with column stride `csc` (the elements between its columns hold their start
    /// values, which a kernel writing them would change).
    pub(in crate::backend::cpu) fn both(
        mkn: (usize, usize, usize),
        layout: (&str, &str),
        alpha_beta: (f32, f32),
        csc: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        both_with(sgemm, mkn, layout, alpha_beta, csc)
    }

    /// As [`both`], with `kernel` in place of this module's `sgemm` (a kernel's own tests).
    pub(in crate::backend::cpu) fn both_with(
        kernel: SgemmFn,
        (m, k, n): (usize, usize, usize),
        (a_kind, b_kind): (&str, &str),
        (alpha, beta): (f32, f32),
        csc: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let a = matrix(m, k, a_kind, 1 + (m * 31 + k) as u64);
        let b = matrix(k, n, b_kind, 2 + (k * 17 + n) as u64);
        let c0 = values(m * n * csc, 3);
        let (mut ours, mut theirs) = (c0.clone(), c0);
        let c = |p: *mut f32| (p, (n * csc) as isize, csc as isize);
        unsafe {
            kernel(
                (m, k, n),
                alpha,
                (a.data.as_ptr(), a.rs, a.cs),
                (b.data.as_ptr(), b.rs, b.cs),
                beta,
                c(ours.as_mut_ptr()),
            );
        }
        reference((m, k, n), alpha, (&a, &b), beta, c(theirs.as_mut_ptr()));
        (ours, theirs)
    }

    /// `c = alpha * a @ b + beta * c` by `matrixmultiply::sgemm`, the bits every kernel here
    /// must give; `c` holds every element its strides address.
    pub(in crate::backend::cpu) fn reference(
        (m, k, n): (usize, usize, usize),
        alpha: f32,
        (a, b): (&Strided, &Strided),
        beta: f32,
        (c, rsc, csc): (*mut f32, isize, isize),
    ) {
        // SAFETY: `matrix` made `a` and `b` hold every element their strides address; the
        // caller vouches for `c`.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                alpha,
                a.data.as_ptr(),
                a.rs,
                a.cs,
                b.data.as_ptr(),
                b.rs,
                b.cs,
                beta,
                c,
                rsc,
                csc,
            );
        }
    }

    pub(in crate::backend::cpu) fn assert_same_bits(ours: &[f32], theirs: &[f32], what: &str) {
        for (i, (x, y)) in ours.iter().zip(theirs).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "{what}: element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn few_rows_match_matrixmultiply_bit_for_bit_on_every_layout() {
        let layouts = [
            ("rows", "rows"),
            ("rows", "cols"),
            ("cols", "rows"),
            ("gap", "gap"),
        ];
        for m in [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32] {
            for k in [1, 9, 256, 257, 600] {
                for n in [1, 7, 16, 70] {
                    for layout in layouts {
                        for (alpha, beta) in [(1.0, 0.0), (1.0, 1.0), (1.0, 0.5), (0.5, 2.0)] {
                            let (ours, theirs) = both((m, k, n), layout, (alpha, beta), 1);
                            let what = format!("{m}x{k}x{n} {layout:?} alpha {alpha} beta {beta}");
                            assert_same_bits(&ours, &theirs, &what);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_block_here_matches_the_same_rows_of_the_whole_product() {
        // The runtime computes rows 40..45 of a 45-row GEMM on their own (a last block); the
        // whole GEMM's rows 40..45 sit in matrixmultiply's full and partial tiles.
        let (m, k, n) = (45, 600, 70);
        let a = matrix(m, k, "rows", 5);
        let b = matrix(k, n, "cols", 6);
        let mut whole = vec![0f32; m * n];
        let mut block = vec![0f32; 5 * n];
        unsafe {
            reference(
                (m, k, n),
                1.0,
                (&a, &b),
                0.0,
                (whole.as_mut_ptr(), n as isize, 1),
            );
            assert!(takes_small_path((5, k, n), b.rs, 1.0) || !has_fma_avx2());
            sgemm(
                (5, k, n),
                1.0,
                (a.data.as_ptr().add(40 * k), a.rs, a.cs),
                (b.data.as_ptr(), b.rs, b.cs),
                0.0,
                (block.as_mut_ptr(), n as isize, 1),
            );
        }
        assert_same_bits(&block, &whole[40 * n..], "rows 40..45 of 45");
    }

    #[test]
    fn beta_zero_ignores_what_c_held() {
        // On an AVX-512 core 3 rows take `gemv_avx512`'s transposed kernel (elsewhere this
        // module's), as 2 rows of a large plain B take its row kernel (`gemv_rows_avx2`'s on
        // AVX2 cores); 5 rows take this
        // module's kernel, 13 the packed one (`packed_gemm`).
        for (m, (k, n), b_kind) in [
            (3, (20, 24), "cols"),
            (2, (300, 300), "rows"),
            (5, (20, 24), "cols"),
            (13, (20, 24), "cols"),
        ] {
            let a = matrix(m, k, "rows", 7);
            let b = matrix(k, n, b_kind, 8);
            let mut c = vec![f32::NAN; m * n];
            unsafe {
                sgemm(
                    (m, k, n),
                    1.0,
                    (a.data.as_ptr(), a.rs, a.cs),
                    (b.data.as_ptr(), b.rs, b.cs),
                    0.0,
                    (c.as_mut_ptr(), n as isize, 1),
                );
            }
            assert!(c.iter().all(|x| x.is_finite()), "{m} rows: {c:?}");
        }
    }

    #[test]
    fn scaled_products_of_eight_or_more_rows_stay_with_matrixmultiply() {
        // Its full tiles round alpha * acc + c once, a partial tile twice: only alpha == 1
        // makes them agree, so a scaled product of a full tile's rows is left to it.
        assert!(!takes_small_path((8, 64, 64), 1, 0.5));
        assert!(!takes_small_path((8, 64, 64), 64, 2.0));
    }
}
