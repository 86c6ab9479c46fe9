//! bf16 products on cores with AVX512-BF16 (Zen 4, Sapphire Rapids and later): `vdpbf16ps`
//! multiplies 16 pairs of bf16 values and adds both products to 16 f32 sums in one
//! instruction, twice the multiply-adds of an f32 FMA. Under `torch.autocast("tpu",
//! dtype=torch.bfloat16)` every Linear and convolution is such a product; widened to f32 they
//! ran at the f32 kernels' speed while CPU eager's oneDNN runs them on this instruction, so
//! autocast made a tpu model slower where it makes a CPU eager one faster.
//!
//! Numbers: each product of two bf16 values is exact in f32, and each output element is one
//! f32 sum over k, added pair by pair in the instruction's order (per pair of k, the odd k's
//! product first, then the even one's; each addition rounded to nearest even), with bf16 and
//! f32 subnormals read and written as zero (the instruction's DAZ and FTZ). That order is fixed
//! by k alone, so an element's bits do not depend on how the rows or columns of the product are
//! split over threads; `alpha * sum + beta * c` is then rounded once to bf16, as the widening
//! path does. CPU eager's oneDNN runs the same instruction, in its own k order.
//!
//! Layout: A's rows are read in place when they are contiguous and k is even (each pair of k
//! is then already one u32); otherwise A is packed into panels of [`MR`] rows, one u32 per row
//! per pair of k (the pair's two bf16 values). B is packed into panels of [`NR`] columns,
//! [`NR`] u32 per pair of k. A pair past k's end holds zero in both packed operands, so it adds
//! `0 * 0` and never `inf * 0`. The kernel keeps an
//! `MR x NR` tile of sums in 16 registers over the whole of k (no k blocking: a panel of B for
//! k = 4608 is 288 KiB, L2-resident), then rounds it out.

mod given_b;

pub(super) use given_b::{matmul_f32_b_rows, matmul_f32_packed, PackedB};

use super::half_gemm::{bf16_to_f32, f32_to_bf16, HalfMat};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Rows of A per kernel tile (8 broadcasts per pair of k).
const MR: usize = 8;
/// Columns of B per kernel tile: two 16-lane vectors.
const NR: usize = 32;
/// Bytes of packed A the kernel sweeps per panel of B: a block of A panels this size stays in
/// L2 while the panels of B pass over it.
const A_BLOCK_BYTES: usize = 256 << 10;
/// Packing buffers a thread keeps between products (larger ones are freed after use).
const KEEP_BYTES: usize = 16 << 20;

/// Whether this core runs the kernel.
pub(super) fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        // Every core with AVX512-BF16 has AVX512BW too ([`pack_rows_panel`]'s permutes).
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
    })
}

/// Whether a product of `whole_rows` rows in all goes through [`matmul`] (a few rows leave
/// most of a tile empty, and the widening path's few-row kernels read B once without packing
/// it). It never looks at a block's own rows or columns: every block a product is cut into (by
/// threads, by an epilogue's row blocks) takes the same path, so no element's bits depend on
/// the cut.
pub(super) fn takes(whole_rows: usize, k: usize) -> bool {
    whole_rows >= 5 && k >= 2 && available()
}

thread_local! {
    /// Packed A and B, kept between products (a fresh buffer page-faults on every use).
    static PACKED: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `c = alpha * a @ b + beta * c` for bf16 matrices `a` `[m, k]`, `b` `[k, n]`, `c` `[m, n]`.
///
/// # Safety
/// [`available`]; the pointers are valid for every element their strides address; `c`
/// overlaps neither operand.
pub(super) unsafe fn matmul(alpha: f32, a: HalfMat, b: HalfMat, beta: f32, c: HalfMat) {
    run(alpha, a, b, beta, Out::Bf16(&c))
}

/// `c = a @ b` for bf16 `a` `[m, k]` and `b` `[k, n]` into an f32 `c` (first element, row and
/// column strides): each element the same f32 sum as [`matmul`]'s, not rounded to bf16 (the
/// widening product, `KernelOp::WideMatmul`).
///
/// # Safety
/// As [`matmul`]; `c` is valid for `a.rows` x `b.cols` f32 elements at its strides.
pub(super) unsafe fn matmul_f32(a: HalfMat, b: HalfMat, c: (*mut f32, isize, isize)) {
    run(1.0, a, b, 0.0, Out::F32(c))
}

/// Where a product's tile sums go: a bf16 matrix (`alpha * sum + beta * c`, rounded once) or
/// an f32 one (the sums themselves).
#[derive(Clone, Copy)]
enum Out<'a> {
    Bf16(&'a HalfMat),
    F32((*mut f32, isize, isize)),
    /// `c += sums` in f32 (one rounding per element).
    F32Add((*mut f32, isize, isize)),
}

unsafe fn run(alpha: f32, a: HalfMat, b: HalfMat, beta: f32, c: Out) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let pairs = k.div_ceil(2);
    let (a_panels, b_panels) = (m.div_ceil(MR), n.div_ceil(NR));
    // A's rows already hold each pair as one u32 when they are contiguous and k is even: the
    // kernel reads them in place. Packing them was ~45% of the kernel's own time for
    // `[1024, 384] @ [384, 128]` (each u32 stored `MR` apart, one at a time).
    let direct = a.cs == 1 && k % 2 == 0;
    PACKED.with(|bufs| {
        let mut bufs = bufs.borrow_mut();
        let (pa, pb) = &mut *bufs;
        if !direct {
            pa.resize(a_panels * pairs * MR, 0);
            pack_a(&a, pairs, pa);
        }
        pb.resize(b_panels * pairs * NR, 0);
        pack_b(&b, pairs, pb);
        let block = (A_BLOCK_BYTES / (MR * pairs * 4)).max(1);
        for ib in (0..a_panels).step_by(block) {
            for jp in 0..b_panels {
                let bp = pb.as_ptr().add(jp * pairs * NR);
                for ip in ib..(ib + block).min(a_panels) {
                    let (i0, j0) = (ip * MR, jp * NR);
                    let tile = (MR.min(m - i0), NR.min(n - j0));
                    let rows = a_panel(&a, direct, pa, ip, pairs);
                    tile_kernel(pairs, rows, bp, alpha, beta, c, (i0, j0), tile);
                }
            }
        }
        trim(pa, pb);
    });
}

/// Where the kernel reads A's panel `ip`: its rows in place (`direct`, see [`run`]) or the
/// panel [`pack_a`] wrote into `packed`. A short last panel read in place repeats its first
/// row: those sums are not stored.
unsafe fn a_panel(a: &HalfMat, direct: bool, packed: &[u32], ip: usize, pairs: usize) -> APanel {
    let i0 = ip * MR;
    if !direct {
        return APanel::Packed(packed.as_ptr().add(ip * pairs * MR));
    }
    let rows = MR.min(a.rows - i0);
    let row = |r: usize| {
        let i = i0 + if r < rows { r } else { 0 };
        a.ptr.offset(i as isize * a.rs) as *const u32
    };
    APanel::Rows(std::array::from_fn(row))
}

/// Frees packing buffers past [`KEEP_BYTES`].
fn trim(pa: &mut Vec<u32>, pb: &mut Vec<u32>) {
    if pa.capacity() * 4 > KEEP_BYTES {
        *pa = Vec::new();
    }
    if pb.capacity() * 4 > KEEP_BYTES {
        *pb = Vec::new();
    }
}

/// Where the kernel reads one panel of A's pairs.
#[derive(Clone, Copy)]
enum APanel {
    /// Packed by [`pack_a`]: pair `p` of row `r` at `p * MR + r`.
    Packed(*const u32),
    /// In place: pair `p` of row `r` at `rows[r] + p` (rows contiguous, k even; unaligned).
    Rows([*const u32; MR]),
}

/// Two bf16 values as the u32 the kernel reads: `lo` (the even k) in the low half.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// A into panels of [`MR`] rows: `out[panel][p][r]` holds row `panel * MR + r`'s elements
/// `2p` and `2p + 1` (zero past the matrix). Rows or columns of A that are contiguous are read
/// two elements at a time or side by side.
unsafe fn pack_a(a: &HalfMat, pairs: usize, out: &mut [u32]) {
    let (m, k) = (a.rows, a.cols);
    let full = k / 2;
    let transposed = a.cs != 1 && a.rs == 1;
    if transposed {
        // Whole panels eight at a time, pairs outermost: each pair's two stored rows are read
        // 128 bytes at a stretch, where panel by panel each cache line was fetched once per
        // panel it feeds (a `g.t() @ x` spent a third of its time here).
        let whole = m / MR;
        for g0 in (0..whole).step_by(8) {
            for p in 0..full {
                let k0 = a.ptr.offset(2 * p as isize * a.cs);
                let k1 = k0.offset(a.cs);
                for panel in g0..(g0 + 8).min(whole) {
                    let at = panel * pairs * MR + p * MR;
                    interleave8(
                        k0.add(panel * MR),
                        k1.add(panel * MR),
                        out[at..].as_mut_ptr(),
                    );
                }
            }
        }
    }
    for (panel, dst) in out.chunks_exact_mut(pairs * MR).enumerate() {
        let i0 = panel * MR;
        let rows = MR.min(m - i0);
        if rows < MR {
            dst.fill(0);
        }
        if a.cs == 1 {
            for r in 0..rows {
                let row = a.ptr.offset((i0 + r) as isize * a.rs);
                for p in 0..full {
                    dst[p * MR + r] = (row.add(2 * p) as *const u32).read_unaligned();
                }
            }
        } else if transposed {
            // Whole panels are packed above; a short last one here.
            if rows < MR {
                for p in 0..full {
                    let k0 = a.ptr.offset(2 * p as isize * a.cs + i0 as isize);
                    let k1 = k0.offset(a.cs);
                    for r in 0..rows {
                        dst[p * MR + r] = pair(*k0.add(r), *k1.add(r));
                    }
                }
            }
        } else {
            for r in 0..rows {
                for p in 0..full {
                    dst[p * MR + r] = pair(a.at(i0 + r, 2 * p), a.at(i0 + r, 2 * p + 1));
                }
            }
        }
        if k % 2 == 1 {
            for r in 0..rows {
                dst[full * MR + r] = pair(a.at(i0 + r, k - 1), 0);
            }
        }
    }
}

/// B into panels of [`NR`] columns: `out[panel][p][j]` holds column `panel * NR + j`'s
/// elements `2p` and `2p + 1` (zero past the matrix). A transposed B (`x @ W.t()`: its columns
/// contiguous) is read two elements at a time, a plain one two rows side by side.
unsafe fn pack_b(b: &HalfMat, pairs: usize, out: &mut [u32]) {
    let (k, n) = (b.rows, b.cols);
    let full = k / 2;
    for (panel, dst) in out.chunks_exact_mut(pairs * NR).enumerate() {
        let j0 = panel * NR;
        let cols = NR.min(n - j0);
        if cols < NR {
            dst.fill(0);
        }
        if b.rs == 1 {
            // 16 columns by 16 pairs at a time: 16 loads down the columns, transposed in
            // registers, 16 stores along the panel (element by element, the panel's writes
            // 128 bytes apart made this pack ~1/3 of a 64-row product's time).
            let (groups, blocks) = (cols / 16, full / 16);
            for g in 0..groups {
                let first = b.ptr.offset((j0 + 16 * g) as isize * b.cs);
                for q in 0..blocks {
                    transpose_pairs(
                        first,
                        b.cs,
                        32 * q,
                        dst[16 * q * NR + 16 * g..].as_mut_ptr(),
                    );
                }
            }
            for j in 0..cols {
                let col = b.ptr.offset((j0 + j) as isize * b.cs);
                let from = if j < 16 * groups { 16 * blocks } else { 0 };
                for p in from..full {
                    dst[p * NR + j] = (col.add(2 * p) as *const u32).read_unaligned();
                }
            }
        } else if b.cs == 1 {
            for p in 0..full {
                let k0 = b.ptr.offset(2 * p as isize * b.rs + j0 as isize);
                let k1 = k0.offset(b.rs);
                if cols == NR {
                    for g in (0..NR).step_by(8) {
                        interleave8(k0.add(g), k1.add(g), dst[p * NR + g..].as_mut_ptr());
                    }
                    continue;
                }
                for (j, slot) in dst[p * NR..p * NR + cols].iter_mut().enumerate() {
                    *slot = pair(*k0.add(j), *k1.add(j));
                }
            }
        } else {
            for p in 0..full {
                for j in 0..cols {
                    dst[p * NR + j] = pair(b.at(2 * p, j0 + j), b.at(2 * p + 1, j0 + j));
                }
            }
        }
        if k % 2 == 1 {
            for j in 0..cols {
                dst[full * NR + j] = pair(b.at(k - 1, j0 + j), 0);
            }
        }
    }
}

/// The 8 pairs `(k0[i], k1[i])` as [`pair`] makes them, stored at `out`: two rows of a
/// transposed A, or of a plain B, side by side (element by element, these packs were a third of
/// a product's time).
#[inline(always)]
unsafe fn interleave8(k0: *const u16, k1: *const u16, out: *mut u32) {
    let (x0, x1) = (
        _mm_loadu_si128(k0 as *const __m128i),
        _mm_loadu_si128(k1 as *const __m128i),
    );
    _mm_storeu_si128(out as *mut __m128i, _mm_unpacklo_epi16(x0, x1));
    _mm_storeu_si128(out.add(4) as *mut __m128i, _mm_unpackhi_epi16(x0, x1));
}

/// Pairs `k0 / 2 .. k0 / 2 + 16` of the 16 columns starting at `first` (`cs` elements apart),
/// stored as 16 rows of 16 u32 at `out`, [`NR`] u32 apart.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_pairs(first: *const u16, cs: isize, k0: usize, out: *mut u32) {
    let rows: [__m512; 16] = std::array::from_fn(|j| {
        _mm512_loadu_ps(first.offset(j as isize * cs).add(k0) as *const f32)
    });
    for (p, v) in super::gemv_avx512::transpose16(rows).iter().enumerate() {
        _mm512_storeu_ps(out.add(p * NR) as *mut f32, *v);
    }
}

/// The `MR x NR` sums over all `pairs`, pair `p` of A's row `r` read by `a_pair(p, r)`.
#[inline(always)]
unsafe fn sums(
    pairs: usize,
    a_pair: impl Fn(usize, usize) -> u32,
    b: *const u32,
) -> [[__m512; 2]; MR] {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for p in 0..pairs {
        let bp = b.add(p * NR);
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(16) as *const _));
        for (r, sums) in acc.iter_mut().enumerate() {
            let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(a_pair(p, r) as i32));
            sums[0] = _mm512_dpbf16_ps(sums[0], x, b0);
            sums[1] = _mm512_dpbf16_ps(sums[1], x, b1);
        }
    }
    acc
}

/// One `MR x NR` tile of sums over all `pairs`, written to `c` at `(i0, j0)` for the `tile`
/// rows and columns inside it.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_kernel(
    pairs: usize,
    a: APanel,
    b: *const u32,
    alpha: f32,
    beta: f32,
    c: Out,
    (i0, j0): (usize, usize),
    (rows, cols): (usize, usize),
) {
    // Matched once, outside the loop over k: each arm is its own copy of the loop.
    let acc = match a {
        APanel::Packed(ap) => sums(pairs, |p, r| *ap.add(p * MR + r), b),
        APanel::Rows(rows) => sums(pairs, |p, r| rows[r].add(p).read_unaligned(), b),
    };
    let c = match c {
        Out::Bf16(c) => c,
        Out::F32((p, rs, cs)) | Out::F32Add((p, rs, cs)) => {
            let add = matches!(c, Out::F32Add(_));
            for (i, v) in acc.iter().enumerate().take(rows) {
                let row = p.offset((i0 + i) as isize * rs + j0 as isize * cs);
                if cols == NR && cs == 1 {
                    let (mut v0, mut v1) = (v[0], v[1]);
                    if add {
                        v0 = _mm512_add_ps(v0, _mm512_loadu_ps(row));
                        v1 = _mm512_add_ps(v1, _mm512_loadu_ps(row.add(16)));
                    }
                    _mm512_storeu_ps(row, v0);
                    _mm512_storeu_ps(row.add(16), v1);
                } else {
                    let mut sums = [0f32; NR];
                    _mm512_storeu_ps(sums.as_mut_ptr(), v[0]);
                    _mm512_storeu_ps(sums.as_mut_ptr().add(16), v[1]);
                    for (j, &s) in sums.iter().enumerate().take(cols) {
                        let at = row.offset(j as isize * cs);
                        *at = if add { s + *at } else { s };
                    }
                }
            }
            return;
        }
    };
    if alpha == 1.0 && beta == 0.0 && cols == NR && c.cs == 1 {
        // The sums are never subnormal (FTZ), so `vcvtne2ps2bf16`'s rounding (nearest even,
        // a NaN made quiet) is `half`'s: 32 columns a store.
        for (i, v) in acc.iter().enumerate().take(rows) {
            let out = c.ptr.offset((i0 + i) as isize * c.rs + j0 as isize);
            let packed = _mm512_cvtne2ps_pbh(v[1], v[0]);
            _mm512_storeu_si512(
                out as *mut _,
                std::mem::transmute::<__m512bh, __m512i>(packed),
            );
        }
        return;
    }
    if cols == NR && c.cs == 1 {
        // `alpha * sum + beta * c` 16 lanes at a time, as the element loop below computes it:
        // a Linear's bias arrives as `c` with beta 1, and element by element that finish took
        // twice as long as the product itself.
        for (i, v) in acc.iter().enumerate().take(rows) {
            let out = c.ptr.offset((i0 + i) as isize * c.rs + j0 as isize);
            for (h, &s) in v.iter().enumerate() {
                let at = out.add(16 * h) as *mut __m256i;
                let t = _mm512_mul_ps(_mm512_set1_ps(alpha), s);
                let v = if beta == 0.0 {
                    t
                } else {
                    _mm512_fmadd_ps(widen(_mm256_loadu_si256(at)), _mm512_set1_ps(beta), t)
                };
                _mm256_storeu_si256(at, narrow(v));
            }
        }
        return;
    }
    let mut sums = [[0f32; NR]; MR];
    for (row, v) in sums.iter_mut().zip(&acc) {
        _mm512_storeu_ps(row.as_mut_ptr(), v[0]);
        _mm512_storeu_ps(row.as_mut_ptr().add(16), v[1]);
    }
    for (i, row) in sums.iter().enumerate().take(rows) {
        for (j, &s) in row.iter().enumerate().take(cols) {
            let out = c
                .ptr
                .offset((i0 + i) as isize * c.rs + (j0 + j) as isize * c.cs);
            let t = alpha * s;
            let v = if beta == 0.0 {
                t
            } else {
                bf16_to_f32(*out).mul_add(beta, t)
            };
            *out = f32_to_bf16(v);
        }
    }
}

/// [`bf16_to_f32`] of 16 values.
#[inline(always)]
unsafe fn widen(h: __m256i) -> __m512 {
    let x = _mm512_cvtepu16_epi32(h);
    let nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fff)),
        _mm512_set1_epi32(0x7f80),
    );
    let quiet = _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x40));
    _mm512_castsi512_ps(_mm512_slli_epi32(quiet, 16))
}

/// [`f32_to_bf16`] of 16 values (subnormal results kept, not flushed as `vcvtne2ps2bf16`
/// would: `alpha` and `beta` can make one).
#[inline(always)]
unsafe fn narrow(v: __m512) -> __m256i {
    let b = _mm512_castps_si512(v);
    let high = _mm512_srli_epi32(b, 16);
    let round_up = _mm512_test_epi32_mask(b, _mm512_set1_epi32(0x8000))
        & _mm512_test_epi32_mask(b, _mm512_set1_epi32(0x1_7fff));
    let rounded = _mm512_mask_add_epi32(high, round_up, high, _mm512_set1_epi32(1));
    let nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(b, _mm512_set1_epi32(0x7fff_ffff)),
        _mm512_set1_epi32(0x7f80_0000),
    );
    let out = _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
    _mm512_cvtepi32_epi16(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::half_gemm::tests::{values, view};
    use deferfuse_fusion::ir::DType;
    use half::bf16;

    /// The sums as the instruction defines them: per pair of k, the odd k's exact product
    /// added first, then the even one's, each addition rounded, subnormals read and written as
    /// zero.
    fn reference_sum(a: &dyn Fn(usize) -> f32, b: &dyn Fn(usize) -> f32, k: usize) -> f32 {
        let flush = |x: f32| {
            if x.is_subnormal() {
                0.0 * x.signum()
            } else {
                x
            }
        };
        let mut s = 0f32;
        for p in 0..k.div_ceil(2) {
            for kk in [2 * p + 1, 2 * p] {
                if kk < k {
                    s = flush(s + flush(a(kk)) * flush(b(kk)));
                }
            }
        }
        s
    }

    #[test]
    fn sixteen_lane_conversions_give_the_element_conversions_bits() {
        if !available() {
            return;
        }
        // Every bf16, and f32 patterns around each rounding case: ties, subnormals, NaNs,
        // infinities, values that round up into the next binade or to infinity.
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let mut floats: Vec<u32> = Vec::new();
        for hi in (0..=u16::MAX as u32)
            .step_by(7)
            .chain([0x7f7f, 0x7f80, 0x7fc0, 0x8000, 0xff80])
        {
            for lo in [0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000] {
                floats.push(hi << 16 | lo);
            }
        }
        floats.resize(floats.len().next_multiple_of(16), 0);
        for chunk in halves.chunks(16) {
            let mut got = [0f32; 16];
            unsafe {
                let v = widen(_mm256_loadu_si256(chunk.as_ptr() as *const __m256i));
                _mm512_storeu_ps(got.as_mut_ptr(), v);
            }
            for (&h, g) in chunk.iter().zip(got) {
                assert_eq!(g.to_bits(), bf16_to_f32(h).to_bits(), "widen {h:#06x}");
            }
        }
        for chunk in floats.chunks(16) {
            let mut got = [0u16; 16];
            unsafe {
                let v = _mm512_loadu_ps(chunk.as_ptr() as *const f32);
                _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, narrow(v));
            }
            for (&b, g) in chunk.iter().zip(got) {
                assert_eq!(g, f32_to_bf16(f32::from_bits(b)), "narrow {b:#010x}");
            }
        }
    }

    #[test]
    fn bf16_products_sum_each_pair_as_vdpbf16ps_defines_in_every_layout() {
        if !available() {
            eprintln!("no AVX512-BF16 on this core: bf16_gemm is not used here");
            return;
        }
        let shapes = [
            (5, 2, 16),
            (8, 7, 32),
            (9, 33, 40),
            (17, 64, 70),
            (40, 301, 97),
            // More than eight whole panels of a transposed A, and a short one after them.
            (70, 40, 33),
            (136, 18, 64),
        ];
        for (m, k, n) in shapes {
            for (ao, bo, co) in [(0, 0, 0), (0, 1, 0), (1, 0, 1), (2, 2, 2)] {
                for (alpha, beta) in [(1.0f32, 0.0f32), (1.0, 1.0), (0.5, -2.0)] {
                    // 33 is the second row's first element in the plain layout (k = 33): a NaN
                    // there must not reach the first row's sums through its last, odd k.
                    let specials: &[usize] = if m == 9 { &[3, 50, 33] } else { &[] };
                    // An infinity at the first special position, NaNs at the others.
                    let special = |i: usize| {
                        let p = specials.iter().position(|&s| s == i)?;
                        Some(if p == 0 { f32::INFINITY } else { f32::NAN })
                    };
                    let mut a = values(DType::BF16, 2 * m * k, 1, special);
                    let mut b = values(DType::BF16, 2 * k * n, 2, |_| None);
                    let mut c = values(DType::BF16, 2 * m * n, 3, |_| None);
                    let (va, vb, vc) = (
                        view(&mut a, m, k, ao),
                        view(&mut b, k, n, bo),
                        view(&mut c, m, n, co),
                    );
                    let f = |h: u16| bf16::from_bits(h).to_f32();
                    let mut want = vec![0u16; m * n];
                    for i in 0..m {
                        for j in 0..n {
                            let s = unsafe {
                                reference_sum(&|q| f(va.at(i, q)), &|q| f(vb.at(q, j)), k)
                            };
                            let old = unsafe { f(vc.at(i, j)) };
                            let t = alpha * s;
                            let v = if beta == 0.0 { t } else { old.mul_add(beta, t) };
                            want[i * n + j] = bf16::from_f32(v).to_bits();
                        }
                    }
                    unsafe { matmul(alpha, va, vb, beta, vc) };
                    for i in 0..m {
                        for j in 0..n {
                            let (g, w) = (unsafe { vc.at(i, j) }, want[i * n + j]);
                            let same = g == w || (f(g).is_nan() && f(w).is_nan());
                            assert!(same, "{m}x{k}x{n} {ao}{bo}{co} a={alpha} b={beta} [{i},{j}]: {g:#06x} want {w:#06x}");
                        }
                    }
                }
            }
        }
    }
}
