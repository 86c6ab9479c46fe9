//! The steps' hidden products `a @ W`, where `a` is each step's rows of `h` (forward) or of the
//! gate gradients (backward). An f32 weight is read in place by the f32 product. A bfloat16
//! weight (a layer under bfloat16 autocast, whose operands hold bfloat16 values as CPU's
//! oneDNN LSTM reads them) makes them bf16 products: each step's rows rounded to bfloat16, as
//! CPU's bf16 layer keeps its states and gradients, times the weight packed once per call,
//! exact products summed in f32 (twice the f32 product's multiply-adds per instruction on
//! AVX512-BF16 cores). Without that instruction the same values go through the f32 product,
//! the weight widened once.

use super::View;
use crate::backend::cpu::half_gemm::{
    bf16_matmul_f32_packed, bf16_packed, narrow_run, widen, HalfMat, PackedBf16, Widened,
};
use crate::backend::cpu::matmul::sgemm_strided;
use deferfuse_fusion::ir::DType;
use std::cell::RefCell;

thread_local! {
    /// A step's rows rounded to bfloat16: as bits, and as f32 values for the widened weight.
    static ROUNDED: RefCell<(Vec<u16>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The hidden weight as the steps' products read it.
pub(super) enum HiddenWeight {
    /// f32, read in place: first element, row and column strides.
    F32((*const f32, isize, isize)),
    /// bf16, packed for the bf16 kernel.
    Packed(PackedBf16),
    /// bf16 widened to f32 once, on a core without the bf16 kernel.
    Widened(Widened),
}

impl HiddenWeight {
    /// The weight operand `v` (`[K, N]` as the product reads it: `W_hh^T` forward, `W_hh`
    /// backward).
    ///
    /// # Safety
    /// `v` is a 2-D f32 or bf16 view inside its buffer, which outlives the returned weight when
    /// it is f32 (read in place).
    pub(super) unsafe fn new(v: &View) -> HiddenWeight {
        if v.dtype != DType::BF16 {
            let first = (v.base as *const f32).offset(v.offset);
            return HiddenWeight::F32((first, v.strides[0], v.strides[1]));
        }
        let (k, n) = (v.sizes[0], v.sizes[1]);
        let mat = HalfMat {
            ptr: (v.base as *mut u16).offset(v.offset),
            rows: k,
            cols: n,
            rs: v.strides[0],
            cs: v.strides[1],
        };
        if let Some(packed) = bf16_packed(mat) {
            return HiddenWeight::Packed(packed);
        }
        HiddenWeight::Widened(widen(DType::BF16, mat))
    }

    /// `c = a @ W + beta * c` (`beta` 0 or 1) for `m` rows of `a` (`k` floats each), as a block
    /// of a product of `whole_rows` rows (which picks the f32 product's summation order, so
    /// the bits do not depend on how the batch is split).
    ///
    /// # Safety
    /// `a` and `c` are valid for every element their strides address and do not overlap; `k`
    /// and `n` are the weight's rows and columns.
    pub(super) unsafe fn product(
        &self,
        whole_rows: usize,
        (m, k, n): (usize, usize, usize),
        a: (*const f32, isize, isize),
        beta: f32,
        c: (*mut f32, isize, isize),
    ) {
        match self {
            HiddenWeight::F32(w) => sgemm_strided(whole_rows, (m, k, n), a, *w, beta, c),
            HiddenWeight::Packed(w) => ROUNDED.with(|cell| {
                let mut scratch = cell.borrow_mut();
                let bits = rounded_rows(a, (m, k), &mut scratch.0);
                let rows = HalfMat {
                    ptr: bits.as_mut_ptr(),
                    rows: m,
                    cols: k,
                    rs: k as isize,
                    cs: 1,
                };
                bf16_matmul_f32_packed(rows, w, c, beta != 0.0);
            }),
            HiddenWeight::Widened(w) => ROUNDED.with(|cell| {
                let (bits, values) = &mut *cell.borrow_mut();
                let bits = rounded_rows(a, (m, k), bits);
                values.clear();
                values.extend(bits.iter().map(|&b| half::bf16::from_bits(b).to_f32()));
                let (rows, w) = (
                    (values.as_ptr(), k as isize, 1),
                    (w.data.as_ptr(), w.rs, w.cs),
                );
                sgemm_strided(whole_rows, (m, k, n), rows, w, beta, c);
            }),
        }
    }
}

/// The `m x k` rows `a` rounded to bfloat16 bits (nearest even) in `buf`, row-major.
///
/// # Safety
/// `a` is valid for every element its strides address.
unsafe fn rounded_rows(
    a: (*const f32, isize, isize),
    (m, k): (usize, usize),
    buf: &mut Vec<u16>,
) -> &mut [u16] {
    let bits = bits_at(buf, m * k);
    for r in 0..m {
        let row = a.0.offset(r as isize * a.1);
        let to = &mut bits[r * k..(r + 1) * k];
        if a.2 == 1 {
            // Vector code: element by element this rounding cost as much as the product (a
            // backward step's 16 x 512 gate gradients).
            narrow_run(DType::BF16, std::slice::from_raw_parts(row, k), to);
        } else {
            for (j, t) in to.iter_mut().enumerate() {
                *t = half::bf16::from_f32(*row.offset(j as isize * a.2)).to_bits();
            }
        }
    }
    bits
}

/// `buf` grown to at least `len` elements, its first `len`.
fn bits_at(buf: &mut Vec<u16>, len: usize) -> &mut [u16] {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    &mut buf[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `c = a @ W` through `w`, for `m` rows of `a` (row stride `k + 3`: a strided block).
    fn product_of(w: &HiddenWeight, a: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        let a = (a.as_ptr(), (k + 3) as isize, 1);
        unsafe { w.product(m, (m, k, n), a, 0.0, (c.as_mut_ptr(), n as isize, 1)) };
        c
    }

    #[test]
    fn the_widened_fallback_and_the_bf16_kernel_both_give_the_products_of_rows_rounded_to_bf16() {
        let (m, k, n) = (5, 24, 40);
        let w_bits: Vec<u16> = (0..k * n)
            .map(|i| half::bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0).to_bits())
            .collect();
        let a: Vec<f32> = (0..m * (k + 3))
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 37.0)
            .collect();
        let bf = |b: u16| half::bf16::from_bits(b).to_f32() as f64;
        let want: Vec<f64> = (0..m * n)
            .map(|e| {
                let (r, j) = (e / n, e % n);
                (0..k)
                    .map(|q| {
                        let x = half::bf16::from_f32(a[r * (k + 3) + q]).to_bits();
                        bf(x) * bf(w_bits[q * n + j])
                    })
                    .sum()
            })
            .collect();
        let mut bits = w_bits.clone();
        let mat = HalfMat {
            ptr: bits.as_mut_ptr(),
            rows: k,
            cols: n,
            rs: n as isize,
            cs: 1,
        };
        let mut weights = vec![HiddenWeight::Widened(unsafe { widen(DType::BF16, mat) })];
        if let Some(p) = unsafe { bf16_packed(mat) } {
            weights.push(HiddenWeight::Packed(p));
        }
        for w in &weights {
            let got = product_of(w, &a, (m, k, n));
            for (e, (&g, &x)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - x).abs() <= 1e-5 * (1.0 + x.abs()),
                    "[{e}] {g} vs {x}"
                );
            }
        }
    }
}
