//! f16 and bf16 products (what `torch.autocast("tpu", dtype=...)` sends every Linear, matmul
//! and convolution to): bf16 products of five or more rows on AVX512-BF16 cores through
//! `bf16_gemm`'s pair dot products, of at most four rows by a transposed B (a Linear on one
//! token) through `bf16_gemv`'s in place; the rest with each operand widened to f32 once, the
//! f32 product, each output element rounded once to the half type.
//!
//! Widening and rounding run as plain loops over contiguous runs (an operand's rows, or its
//! columns when those are contiguous, as `x @ W.t()`'s B), which LLVM vectorizes: bf16 is
//! f32's high half, so both ways are a shift, a rounding add and a NaN select; f16 goes
//! through `half`'s slice routines (F16C where the core has it). Converting element by
//! element through a call made an autocast MLP's products ~1.7x slower than the same model in
//! float32 on tpu. A widened operand keeps its row or column order, so the f32 product sees the
//! strides it would in float32; `small_gemm::sgemm` gives the same bits for any strides, so the
//! result does not depend on which way an operand was widened.

use super::small_gemm;
use deferfuse_fusion::ir::DType;
use half::{f16, slice::HalfFloatSliceExt};

/// A strided matrix of 16-bit floats: first element, rows, columns, row and column strides in
/// elements.
#[derive(Clone, Copy)]
pub(crate) struct HalfMat {
    pub ptr: *mut u16,
    pub rows: usize,
    pub cols: usize,
    pub rs: isize,
    pub cs: isize,
}

impl HalfMat {
    /// Element `(i, j)`'s bits.
    ///
    /// # Safety
    /// `(i, j)` is inside the matrix.
    #[inline(always)]
    pub(super) unsafe fn at(&self, i: usize, j: usize) -> u16 {
        *self.ptr.offset(i as isize * self.rs + j as isize * self.cs)
    }
}

/// An operand widened to f32, with the strides its elements now have.
pub(crate) struct Widened {
    pub data: Vec<f32>,
    pub rs: isize,
    pub cs: isize,
}

/// `c = alpha * a @ b + beta * c` for f16 or bf16 (`dtype`) matrices `a` `[m, k]`, `b` `[k, n]`,
/// `c` `[m, n]`, in f32 and rounded once; `c` is a block of a product of `whole_rows` rows,
/// which picks the path (see `bf16_gemm::takes`).
///
/// # Safety
/// The pointers are valid for every element their strides address; `c` overlaps neither
/// operand.
pub(super) unsafe fn matmul(
    dtype: DType,
    whole_rows: usize,
    alpha: f32,
    a: HalfMat,
    b: HalfMat,
    beta: f32,
    c: HalfMat,
) {
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::BF16 && super::bf16_gemv::takes(whole_rows, &a, &b) {
        return super::bf16_gemv::matmul(alpha, a, b, beta, c);
    }
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::BF16 && super::bf16_gemm::takes(whole_rows, a.cols) {
        return super::bf16_gemm::matmul(alpha, a, b, beta, c);
    }
    widened_matmul(dtype, alpha, a, b, beta, c)
}

/// `c = a @ b` for f16 or bf16 (`dtype`) matrices `a` `[m, k]` and `b` `[k, n]` into an f32
/// `c` (first element, row and column strides), the sums not rounded to the half type (the
/// widening product, `KernelOp::WideMatmul`): bf16 of five or more rows (`whole_rows`, the
/// whole product's, so a block of rows takes the whole's path) through `bf16_gemm`'s pair dot
/// products, the rest with both operands widened and the f32 product.
///
/// # Safety
/// The pointers are valid for every element their strides address; `c` overlaps neither
/// operand.
pub(crate) unsafe fn matmul_f32_out(
    dtype: DType,
    whole_rows: usize,
    a: HalfMat,
    b: HalfMat,
    c: (*mut f32, isize, isize),
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::BF16 && super::bf16_gemm::takes(whole_rows, k) {
        return super::bf16_gemm::matmul_f32(a, b, c);
    }
    let (wa, wb) = (widen(dtype, a), widen(dtype, b));
    small_gemm::sgemm(
        (m, k, n),
        1.0,
        (wa.data.as_ptr(), wa.rs, wa.cs),
        (wb.data.as_ptr(), wb.rs, wb.cs),
        0.0,
        c,
    );
}

/// A bf16 matrix packed once for [`bf16_matmul_f32_packed`] (a recurrent layer's weight,
/// multiplied by every step's few rows). Only [`bf16_packed`] makes one, on a core with
/// AVX512-BF16.
pub(crate) struct PackedBf16 {
    #[cfg(target_arch = "x86_64")]
    inner: super::bf16_gemm::PackedB,
}

/// `b` packed for [`bf16_matmul_f32_packed`]; `None` on a core without AVX512-BF16.
///
/// # Safety
/// `b` is valid for every element its strides address.
pub(crate) unsafe fn bf16_packed(b: HalfMat) -> Option<PackedBf16> {
    #[cfg(target_arch = "x86_64")]
    if bf16_products_run() {
        let inner = super::bf16_gemm::PackedB::new(b);
        return Some(PackedBf16 { inner });
    }
    let _ = b;
    None
}

/// `c = a @ b`, or (`accumulate`) `c += a @ b`, for a bf16 `a` and a packed bf16 `b` into an
/// f32 `c`: exact products summed in f32, each element as `bf16_gemm::matmul_f32` sums it.
///
/// # Safety
/// `a` and `c` are valid for every element their strides address (`c` for `a.rows` rows of
/// `b`'s columns) and do not overlap; `a.cols` is `b`'s row count.
pub(crate) unsafe fn bf16_matmul_f32_packed(
    a: HalfMat,
    b: &PackedBf16,
    c: (*mut f32, isize, isize),
    accumulate: bool,
) {
    #[cfg(target_arch = "x86_64")]
    super::bf16_gemm::matmul_f32_packed(a, &b.inner, c, accumulate);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, b, c, accumulate);
        unreachable!("no PackedBf16 is made off x86-64");
    }
}

/// Whether this core runs bf16 products on `vdpbf16ps` (AVX512-BF16): where not,
/// [`bf16_matmul_f32_b_rows`] does nothing.
pub(crate) fn bf16_products_run() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::bf16_gemm::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `c = a @ B` for a bf16 `a` into an f32 `c`, B's row `q` (`n` contiguous bf16 values) at
/// `b.offset(b_rows[q])`, on a core with AVX512-BF16 (`bf16_gemm::matmul_f32_b_rows`: the
/// dense convolution's columns read in its padded grid); `false`, having done nothing,
/// elsewhere (the caller widens its operands and takes the f32 path).
///
/// # Safety
/// `a` and `c` as in [`matmul_f32_out`]; every `b.offset(b_rows[q])` is valid for `n` values;
/// `b_rows.len() == a.cols`.
pub(crate) unsafe fn bf16_matmul_f32_b_rows(
    a: HalfMat,
    b: (*const u16, &[isize]),
    n: usize,
    c: (*mut f32, isize, isize),
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if bf16_products_run() {
        super::bf16_gemm::matmul_f32_b_rows(a, b, n, c);
        return true;
    }
    let _ = (a, b, n, c);
    false
}

/// [`matmul`] through f32: the operands widened, the f32 product, the result rounded.
///
/// # Safety
/// As [`matmul`].
unsafe fn widened_matmul(dtype: DType, alpha: f32, a: HalfMat, b: HalfMat, beta: f32, c: HalfMat) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let wa = widen(dtype, a);
    let wb = widen(dtype, b);
    // With beta 0 the product overwrites C: its old values are never read.
    let mut wc = if beta == 0.0 {
        Widened {
            data: vec![0.0; m * n],
            rs: n as isize,
            cs: 1,
        }
    } else {
        widen(dtype, c)
    };
    small_gemm::sgemm(
        (m, k, n),
        alpha,
        (wa.data.as_ptr(), wa.rs, wa.cs),
        (wb.data.as_ptr(), wb.rs, wb.cs),
        beta,
        (wc.data.as_mut_ptr(), wc.rs, wc.cs),
    );
    narrow(dtype, &wc, c);
}

/// `v` widened to f32: row by row where its rows are contiguous, else column by column where
/// its columns are, else element by element.
pub(crate) unsafe fn widen(dtype: DType, v: HalfMat) -> Widened {
    let mut data = vec![0.0f32; v.rows * v.cols];
    let run = |p: *const u16, len: usize, out: &mut [f32]| {
        widen_run(dtype, std::slice::from_raw_parts(p, len), out)
    };
    if v.cs == 1 || v.cols <= 1 {
        for (i, out) in data.chunks_exact_mut(v.cols.max(1)).enumerate() {
            run(v.ptr.offset(i as isize * v.rs), v.cols, out);
        }
        Widened {
            data,
            rs: v.cols as isize,
            cs: 1,
        }
    } else if v.rs == 1 || v.rows <= 1 {
        for (j, out) in data.chunks_exact_mut(v.rows.max(1)).enumerate() {
            run(v.ptr.offset(j as isize * v.cs), v.rows, out);
        }
        Widened {
            data,
            rs: 1,
            cs: v.rows as isize,
        }
    } else {
        for i in 0..v.rows {
            for j in 0..v.cols {
                let p = v.ptr.offset(i as isize * v.rs + j as isize * v.cs);
                run(p, 1, &mut data[i * v.cols + j..][..1]);
            }
        }
        Widened {
            data,
            rs: v.cols as isize,
            cs: 1,
        }
    }
}

/// Rounds the f32 result `w` into `c`, run by run as [`widen`] laid it out.
unsafe fn narrow(dtype: DType, w: &Widened, c: HalfMat) {
    let (rows, cols) = (c.rows, c.cols);
    let at = |i: usize, j: usize| c.ptr.offset(i as isize * c.rs + j as isize * c.cs);
    let run = |p: *mut u16, len: usize, from: &[f32]| {
        narrow_run(dtype, from, std::slice::from_raw_parts_mut(p, len))
    };
    if w.cs == 1 && (c.cs == 1 || cols <= 1) {
        for i in 0..rows {
            run(at(i, 0), cols, &w.data[i * cols..][..cols]);
        }
    } else if w.rs == 1 && (c.rs == 1 || rows <= 1) {
        for j in 0..cols {
            run(at(0, j), rows, &w.data[j * rows..][..rows]);
        }
    } else {
        for i in 0..rows {
            for j in 0..cols {
                let x = w.data[(i as isize * w.rs + j as isize * w.cs) as usize];
                run(at(i, j), 1, &[x]);
            }
        }
    }
}

/// Widens one contiguous run of `dtype` elements.
fn widen_run(dtype: DType, from: &[u16], to: &mut [f32]) {
    if dtype == DType::F16 {
        // SAFETY: `f16` is a transparent `u16`.
        let from: &[f16] = unsafe { std::mem::transmute(from) };
        from.convert_to_f32_slice(to);
    } else {
        for (t, &h) in to.iter_mut().zip(from) {
            *t = bf16_to_f32(h);
        }
    }
}

/// Rounds one contiguous run of f32 values to `dtype` (bf16 through a loop LLVM vectorizes).
pub(crate) fn narrow_run(dtype: DType, from: &[f32], to: &mut [u16]) {
    if dtype == DType::F16 {
        // SAFETY: `f16` is a transparent `u16`.
        let to: &mut [f16] = unsafe { std::mem::transmute(to) };
        to.convert_from_f32_slice(from);
    } else {
        for (t, &x) in to.iter_mut().zip(from) {
            *t = f32_to_bf16(x);
        }
    }
}

/// `half::bf16::to_f32` without branches (a NaN keeps its payload, made quiet), so that a loop
/// of it vectorizes.
#[inline(always)]
pub(super) fn bf16_to_f32(h: u16) -> f32 {
    let quiet = if h & 0x7fff > 0x7f80 { 0x40 } else { 0 };
    f32::from_bits(((h | quiet) as u32) << 16)
}

/// `half::bf16::from_f32` without branches: rounds to nearest, ties to even; a NaN keeps its
/// high payload bits, made quiet.
#[inline(always)]
pub(super) fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let nan = b & 0x7fff_ffff > 0x7f80_0000;
    let round_up = (b & 0x8000 != 0 && b & 0x1_7fff != 0) as u32;
    let rounded = (b >> 16) + round_up;
    if nan {
        ((b >> 16) | 0x40) as u16
    } else {
        rounded as u16
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use half::bf16;

    /// The product as it was computed before this module: every element converted by
    /// `half`, the operands gathered row-major, the f32 product, every element rounded.
    unsafe fn reference(dtype: DType, alpha: f32, a: HalfMat, b: HalfMat, beta: f32, c: HalfMat) {
        let get = |p: *mut u16| {
            if dtype == DType::F16 {
                f16::from_bits(*p).to_f32()
            } else {
                bf16::from_bits(*p).to_f32()
            }
        };
        let gather = |v: HalfMat| {
            let mut out = Vec::new();
            for i in 0..v.rows {
                for j in 0..v.cols {
                    out.push(get(v.ptr.offset(i as isize * v.rs + j as isize * v.cs)));
                }
            }
            out
        };
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let (av, bv, mut cv) = (gather(a), gather(b), gather(c));
        small_gemm::sgemm(
            (m, k, n),
            alpha,
            (av.as_ptr(), k as isize, 1),
            (bv.as_ptr(), n as isize, 1),
            beta,
            (cv.as_mut_ptr(), n as isize, 1),
        );
        for i in 0..m {
            for j in 0..n {
                let x = cv[i * n + j];
                *c.ptr.offset(i as isize * c.rs + j as isize * c.cs) = if dtype == DType::F16 {
                    f16::from_f32(x).to_bits()
                } else {
                    bf16::from_f32(x).to_bits()
                };
            }
        }
    }

    /// Pseudo-random values of `dtype` in [-2, 2] (no subnormals) as bits, `special(i)` in
    /// place of element `i` where it gives one (an infinity, a NaN). The half product tests
    /// share it.
    pub(in crate::backend::cpu) fn values(
        dtype: DType,
        len: usize,
        seed: u32,
        special: impl Fn(usize) -> Option<f32>,
    ) -> Vec<u16> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let v = special(i).unwrap_or((x % 4001) as f32 / 1000.0 - 2.0);
                if dtype == DType::F16 {
                    f16::from_f32(v).to_bits()
                } else {
                    bf16::from_f32(v).to_bits()
                }
            })
            .collect()
    }

    /// A `[rows, cols]` view into `data`: row-major, column-major (a transposed tensor), or
    /// strided both ways (every other column of a row-major matrix twice as wide).
    pub(in crate::backend::cpu) fn view(
        data: &mut [u16],
        rows: usize,
        cols: usize,
        order: usize,
    ) -> HalfMat {
        let (rs, cs) = match order {
            0 => (cols as isize, 1),
            1 => (1, rows as isize),
            _ => (2 * cols as isize, 2),
        };
        HalfMat {
            ptr: data.as_mut_ptr(),
            rows,
            cols,
            rs,
            cs,
        }
    }

    #[test]
    fn widened_half_products_have_the_element_by_element_bits_in_every_layout() {
        for dtype in [DType::BF16, DType::F16] {
            for (m, k, n) in [
                (1, 7, 5),
                (3, 33, 17),
                (4, 64, 40),
                (5, 20, 9),
                (33, 70, 65),
            ] {
                for (ao, bo, co) in [(0, 0, 0), (0, 1, 0), (1, 0, 1), (2, 2, 2), (1, 1, 0)] {
                    for (alpha, beta) in [(1.0, 0.0), (1.0, 1.0), (0.5, -2.0)] {
                        let specials = m == 5;
                        let nan_inf = |i: usize| match (specials, i % 97) {
                            (true, 5) => Some(f32::NAN),
                            (true, 11) => Some(f32::INFINITY),
                            _ => None,
                        };
                        let mut a = values(dtype, 2 * m * k, 1, nan_inf);
                        let mut b = values(dtype, 2 * k * n, 2, |_| None);
                        let c0 = values(dtype, 2 * m * n, 3, |_| None);
                        let (mut c, mut want) = (c0.clone(), c0);
                        unsafe {
                            let (va, vb) = (view(&mut a, m, k, ao), view(&mut b, k, n, bo));
                            let vc = view(&mut c, m, n, co);
                            let vw = view(&mut want, m, n, co);
                            widened_matmul(dtype, alpha, va, vb, beta, vc);
                            reference(dtype, alpha, va, vb, beta, vw);
                        }
                        assert_eq!(c, want, "{dtype:?} {m}x{k}x{n} layouts {ao}{bo}{co}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_block_of_few_rows_takes_its_whole_products_path() {
        // A subnormal bf16 times a large one: the pair kernel reads the subnormal as zero
        // (its DAZ), the widening path does not; the last 3 rows of a 131-row product (an
        // epilogue's last block) computed alone must still have the whole product's bits.
        let (m, k, n) = (131, 4, 16);
        let mut a = vec![0x0001u16; m * k];
        let mut b = vec![bf16::from_f32(1e30).to_bits(); k * n];
        let mut whole = vec![0u16; m * n];
        let mut last = vec![0u16; 3 * n];
        unsafe {
            let (va, vb) = (view(&mut a, m, k, 0), view(&mut b, k, n, 0));
            matmul(DType::BF16, m, 1.0, va, vb, 0.0, view(&mut whole, m, n, 0));
            let rows = HalfMat {
                ptr: va.ptr.add(128 * k),
                rows: 3,
                ..va
            };
            matmul(DType::BF16, m, 1.0, rows, vb, 0.0, view(&mut last, 3, n, 0));
        }
        assert_eq!(last, whole[128 * n..]);
    }

    #[test]
    fn bf16_conversions_match_half_on_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let want = bf16::from_bits(h).to_f32().to_bits();
            assert_eq!(bf16_to_f32(h).to_bits(), want, "{h:#06x}");
        }
        // Every rounding case: each high half with low halves around the tie and the ends.
        for hi in (0..=u16::MAX as u32).step_by(7) {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let x = f32::from_bits(hi << 16 | lo);
                assert_eq!(
                    f32_to_bf16(x),
                    bf16::from_f32(x).to_bits(),
                    "{:#010x}",
                    x.to_bits()
                );
            }
        }
    }
}
