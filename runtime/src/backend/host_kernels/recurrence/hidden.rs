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
    bf16_matmul_f32_packed, bf16_packed, narrow_run, HalfMat, PackedBf16,
};
use crate::backend::cpu::matmul::sgemm_strided;
use deferfuse_fusion::ir::DType;
use std::cell::RefCell;

thread_local! {
    /// A step's rows rounded to bfloat16 (as bits, or as f32 values without the bf16 kernel).
    static ROUNDED: RefCell<(Vec<u16>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The hidden weight as the steps' products read it.
pub(super) enum HiddenWeight {
    /// f32, read in place: first element, row and column strides.
    F32((*const f32, isize, isize)),
    /// bf16, packed for the bf16 kernel.
    Packed(PackedBf16),
    /// bf16 widened to a dense f32 `[K, N]` (`N` the second field), on a core without the bf16
    /// kernel.
    Widened(Vec<f32>, usize),
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
        let mut dense = Vec::with_capacity(k * n);
        for i in 0..k {
            for j in 0..n {
                let at = mat.ptr.offset(i as isize * mat.rs + j as isize * mat.cs);
                dense.push(half::bf16::from_bits(*at).to_f32());
            }
        }
        HiddenWeight::Widened(dense, n)
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
                let bits = bits_at(&mut scratch.0, m * k);
                for r in 0..m {
                    let row = a.0.offset(r as isize * a.1);
                    let to = &mut bits[r * k..(r + 1) * k];
                    if a.2 == 1 {
                        // Vector code: element by element this rounding cost as much as the
                        // product (a backward step's 16 x 512 gate gradients).
                        narrow_run(DType::BF16, std::slice::from_raw_parts(row, k), to);
                    } else {
                        for (j, t) in to.iter_mut().enumerate() {
                            *t = half::bf16::from_f32(*row.offset(j as isize * a.2)).to_bits();
                        }
                    }
                }
                let rows = HalfMat {
                    ptr: bits.as_mut_ptr(),
                    rows: m,
                    cols: k,
                    rs: k as isize,
                    cs: 1,
                };
                bf16_matmul_f32_packed(rows, w, c, beta != 0.0);
            }),
            HiddenWeight::Widened(w, cols) => ROUNDED.with(|cell| {
                let values = &mut cell.borrow_mut().1;
                round_rows(a, (m, k), |i, v| {
                    values_at(values, m * k)[i] = half::bf16::from_f32(v).to_f32()
                });
                let rows = (values.as_ptr(), k as isize, 1);
                sgemm_strided(
                    whole_rows,
                    (m, k, n),
                    rows,
                    (w.as_ptr(), *cols as isize, 1),
                    beta,
                    c,
                );
            }),
        }
    }
}

/// Calls `put(i, v)` for each element `v` of the `m x k` rows `a`, `i` its row-major index.
///
/// # Safety
/// `a` is valid for every element its strides address.
unsafe fn round_rows(
    a: (*const f32, isize, isize),
    (m, k): (usize, usize),
    mut put: impl FnMut(usize, f32),
) {
    for r in 0..m {
        for j in 0..k {
            put(r * k + j, *a.0.offset(r as isize * a.1 + j as isize * a.2));
        }
    }
}

/// `buf` grown to at least `len` elements, its first `len`.
fn bits_at(buf: &mut Vec<u16>, len: usize) -> &mut [u16] {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    &mut buf[..len]
}

/// `buf` grown to at least `len` elements.
fn values_at(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    buf
}
