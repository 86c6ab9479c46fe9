//! Matmul on the host: f32/f64 through `matrixmultiply` (strided, so views need no copy; f32
//! products through `small_gemm::sgemm`, which runs its own kernel for few rows and
//! `packed_gemm`'s for more, same bits; f32 products of at most four rows in all by a
//! transposed B through `gemv_dot`, dot products in W's memory order), f16 and bf16 through
//! f32 (`half_gemm`), integers through a plain wrapping loop (rare in practice).

use super::half_gemm::{self, HalfMat};
use super::small_gemm;
use super::tiny_gemm;
use deferfuse_fusion::ir::{DType, Layout};

/// One matrix operand: its first element and its layout `[batch.., rows, cols]`.
pub struct Mat<'a> {
    pub ptr: *mut u8,
    pub layout: &'a Layout,
}

/// Calls `f(a_off, b_off, c_off)` (element offsets) for every batch index.
fn for_each_batch(a: &Layout, b: &Layout, c: &Layout, mut f: impl FnMut(isize, isize, isize)) {
    let nb = c.rank() - 2;
    let mut idx = vec![0usize; nb];
    loop {
        let off = |l: &Layout| {
            l.offset as isize
                + idx
                    .iter()
                    .zip(&l.strides)
                    .map(|(&i, &s)| i as isize * s)
                    .sum::<isize>()
        };
        f(off(a), off(b), off(c));
        let mut d = nb;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < c.sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// `c = alpha * a @ b + beta * c` over batch dims, for `c`, a block of rows (or columns) of a
/// product whose whole output has `whole_rows` rows: that count, never the block's, picks the
/// order its f32 sums take (see `gemv_dot`), so a row's bits do not depend on the blocking.
///
/// # Safety
/// The pointers must be valid for every element their layouts address.
pub unsafe fn matmul(
    dtype: DType,
    a: Mat,
    b: Mat,
    c: Mat,
    alpha: f64,
    beta: f64,
    whole_rows: usize,
) {
    let r = c.layout.rank();
    let (m, k, n) = (
        a.layout.sizes[r - 2],
        a.layout.sizes[r - 1],
        b.layout.sizes[r - 1],
    );
    if m == 0 || n == 0 || c.layout.numel() == 0 {
        return;
    }
    let st = |l: &Layout| (l.strides[r - 2], l.strides[r - 1]);
    let (rsa, csa) = st(a.layout);
    let (rsb, csb) = st(b.layout);
    let (rsc, csc) = st(c.layout);
    let sgemm = f32_kernel(whole_rows, (m, k, n), csa, rsb);
    // A short inner dim element by element (`tiny_gemm`), unless f32 takes the dot order.
    let tiny = tiny_gemm::takes((m, k, n), alpha)
        && (dtype != DType::F32 || !takes_dot_order(whole_rows, (m, k, n), csa, rsb));
    for_each_batch(a.layout, b.layout, c.layout, |ao, bo, co| match dtype {
        DType::F32 if tiny => tiny_gemm::gemm(
            (m, k, n),
            ((a.ptr as *const f32).offset(ao), rsa, csa),
            ((b.ptr as *const f32).offset(bo), rsb, csb),
            beta as f32,
            ((c.ptr as *mut f32).offset(co), rsc, csc),
        ),
        DType::F64 if tiny => tiny_gemm::gemm(
            (m, k, n),
            ((a.ptr as *const f64).offset(ao), rsa, csa),
            ((b.ptr as *const f64).offset(bo), rsb, csb),
            beta,
            ((c.ptr as *mut f64).offset(co), rsc, csc),
        ),
        DType::F32 => sgemm(
            (m, k, n),
            alpha as f32,
            ((a.ptr as *const f32).offset(ao), rsa, csa),
            ((b.ptr as *const f32).offset(bo), rsb, csb),
            beta as f32,
            ((c.ptr as *mut f32).offset(co), rsc, csc),
        ),
        DType::F64 => matrixmultiply::dgemm(
            m,
            k,
            n,
            alpha,
            (a.ptr as *const f64).offset(ao),
            rsa,
            csa,
            (b.ptr as *const f64).offset(bo),
            rsb,
            csb,
            beta,
            (c.ptr as *mut f64).offset(co),
            rsc,
            csc,
        ),
        DType::F16 | DType::BF16 => {
            let half = |p: *mut u8, o: isize, (rows, cols): (usize, usize), (rs, cs)| HalfMat {
                ptr: (p as *mut u16).offset(o),
                rows,
                cols,
                rs,
                cs,
            };
            half_gemm::matmul(
                dtype,
                whole_rows,
                alpha as f32,
                half(a.ptr, ao, (m, k), (rsa, csa)),
                half(b.ptr, bo, (k, n), (rsb, csb)),
                if beta == 0.0 { 0.0 } else { beta as f32 },
                half(c.ptr, co, (m, n), (rsc, csc)),
            )
        }
        _ => int_matmul(
            dtype,
            &a,
            &b,
            &c,
            (ao, bo, co),
            (m, k, n),
            alpha as i64,
            beta as i64,
        ),
    });
}

/// `c = a @ b + beta * c` for one f32 product of strided operands `(pointer, row stride,
/// column stride)`, as [`matmul`] computes a block of a product of `whole_rows` rows: for host
/// routines that run products one at a time between their own loops (the LSTM recurrence).
///
/// # Safety
/// The pointers are valid for every element the strides address; `c` overlaps neither operand.
pub unsafe fn sgemm_strided(
    whole_rows: usize,
    (m, k, n): (usize, usize, usize),
    a: (*const f32, isize, isize),
    b: (*const f32, isize, isize),
    beta: f32,
    c: (*mut f32, isize, isize),
) {
    if m == 0 || n == 0 {
        return;
    }
    f32_kernel(whole_rows, (m, k, n), a.2, b.1)((m, k, n), 1.0, a, b, beta, c)
}

/// `c = a @ B + beta * c` for f32, B's row `q` (`n` contiguous floats) at `b.offset(b_rows[q])`,
/// where a kernel reads such a B in place (`packed_gemm::sgemm_b_rows`: the 16-lane tile, at
/// most one row block of rows); `false`, having done nothing, elsewhere. The same bits as
/// [`matmul`] on those rows copied into a matrix.
///
/// # Safety
/// The pointers are valid for every element the strides and offsets address; `c` overlaps
/// neither operand; `b_rows.len() == k`.
pub unsafe fn sgemm_b_rows(
    (m, k, n): (usize, usize, usize),
    a: (*const f32, isize, isize),
    b: (*const f32, &[isize]),
    beta: f32,
    c: (*mut f32, isize, isize),
) -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::packed_gemm::sgemm_b_rows((m, k, n), a, b, beta, c);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ((m, k, n), a, b, beta, c);
        false
    }
}

/// The kernel whose summation order a block of a product of `whole_rows` rows takes: the dot
/// order for few rows in all by a transposed B (A's column stride `csa`, B's row stride
/// `rsb`), `matrixmultiply`'s order otherwise.
fn f32_kernel(
    whole_rows: usize,
    mkn: (usize, usize, usize),
    csa: isize,
    rsb: isize,
) -> small_gemm::SgemmFn {
    #[cfg(target_arch = "x86_64")]
    if takes_dot_order(whole_rows, mkn, csa, rsb) {
        return super::gemv_dot::sgemm;
    }
    small_gemm::sgemm
}

/// Whether an f32 block of a product of `whole_rows` rows sums in the dot order (`gemv_dot`).
fn takes_dot_order(whole_rows: usize, mkn: (usize, usize, usize), csa: isize, rsb: isize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::gemv_dot::takes(whole_rows, mkn, csa, rsb);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (whole_rows, mkn, csa, rsb);
        false
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn int_matmul(
    dtype: DType,
    a: &Mat,
    b: &Mat,
    c: &Mat,
    (ao, bo, co): (isize, isize, isize),
    (m, k, n): (usize, usize, usize),
    alpha: i64,
    beta: i64,
) {
    let r = c.layout.rank();
    let read = |p: *mut u8, off: isize| -> i64 {
        match dtype {
            DType::I32 => *(p as *const i32).offset(off) as i64,
            DType::I64 => *(p as *const i64).offset(off),
            _ => *p.offset(off) as i64,
        }
    };
    let (sa, sb, sc) = (&a.layout.strides, &b.layout.strides, &c.layout.strides);
    for i in 0..m as isize {
        for j in 0..n as isize {
            let mut acc = 0i64;
            for p in 0..k as isize {
                let x = read(a.ptr, ao + i * sa[r - 2] + p * sa[r - 1]);
                let y = read(b.ptr, bo + p * sb[r - 2] + j * sb[r - 1]);
                acc = acc.wrapping_add(x.wrapping_mul(y));
            }
            let off = co + i * sc[r - 2] + j * sc[r - 1];
            let old = if beta == 0 { 0 } else { read(c.ptr, off) };
            let v = alpha.wrapping_mul(acc).wrapping_add(beta.wrapping_mul(old));
            match dtype {
                DType::I32 => *(c.ptr as *mut i32).offset(off) = v as i32,
                DType::I64 => *(c.ptr as *mut i64).offset(off) = v,
                _ => *c.ptr.offset(off) = v as u8,
            }
        }
    }
}
