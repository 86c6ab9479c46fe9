//! Reference matmul (torch.matmul: 1-D operands and broadcast batch dims), addmm, cat, arange
//! and full.

use super::{broadcast_shapes, cast_value, check, indices, numel, Arg, RefTensor};
use deferfuse::{DType, Op, Scalar};

/// `[batch.., rows, cols]` view of a matmul operand (1-D operands get a unit dim).
fn as_matrix(t: &RefTensor, left: bool) -> Vec<usize> {
    match t.rank() {
        1 if left => vec![1, t.sizes[0]],
        1 => vec![t.sizes[0], 1],
        _ => t.sizes.clone(),
    }
}

/// Sum of `a[b, i, k] * b[b, k, j]` over k, accumulated in f64 (floats) or wrapping i64.
fn dot(
    a: &RefTensor,
    am: &[usize],
    b: &RefTensor,
    bm: &[usize],
    bidx: &[usize],
    i: usize,
    j: usize,
) -> f64 {
    let k = am[am.len() - 1];
    let mut fsum = 0.0f64;
    let mut isum = 0i64;
    for p in 0..k {
        let x = matrix_get(a, am, bidx, i, p);
        let y = matrix_get(b, bm, bidx, p, j);
        if a.dtype.is_float() {
            fsum += x * y;
        } else {
            isum = isum.wrapping_add((x as i64).wrapping_mul(y as i64));
        }
    }
    if a.dtype.is_float() {
        fsum
    } else {
        isum as f64
    }
}

/// Element `[bidx.., r, c]` of `t` seen with matrix shape `m`, broadcasting batch dims.
fn matrix_get(t: &RefTensor, m: &[usize], bidx: &[usize], r: usize, c: usize) -> f64 {
    let nb = m.len() - 2;
    let lead = bidx.len() - nb;
    let mut flat = 0usize;
    let mut stride = 1usize;
    let mut full = Vec::with_capacity(m.len());
    for d in 0..nb {
        full.push(if m[d] == 1 { 0 } else { bidx[lead + d] });
    }
    full.push(r);
    full.push(c);
    for d in (0..m.len()).rev() {
        flat += full[d] * stride;
        stride *= m[d];
    }
    t.data[flat]
}

fn matmul_parts(a: &RefTensor, b: &RefTensor) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let am = as_matrix(a, true);
    let bm = as_matrix(b, false);
    let batch = broadcast_shapes(&[&am[..am.len() - 2], &bm[..bm.len() - 2]]).expect("batch");
    (am, bm, batch)
}

/// torch.matmul, rounded once to the dtype.
pub fn matmul(a: &RefTensor, b: &RefTensor) -> RefTensor {
    let dtype = check(&Op::Matmul, &[Arg::T(a), Arg::T(b)])
        .expect("valid matmul")
        .dtype;
    let (am, bm, batch) = matmul_parts(a, b);
    let (m, n) = (am[am.len() - 2], bm[bm.len() - 1]);
    let mut data = Vec::new();
    for bidx in indices(&batch) {
        for i in 0..m {
            for j in 0..n {
                let v = dot(a, &am, b, &bm, &bidx, i, j);
                data.push(cast_value(
                    v,
                    if dtype.is_float() {
                        DType::F64
                    } else {
                        DType::I64
                    },
                    dtype,
                ));
            }
        }
    }
    let mut sizes = batch;
    if a.rank() >= 2 {
        sizes.push(m);
    }
    if b.rank() >= 2 {
        sizes.push(n);
    }
    RefTensor { dtype, sizes, data }
}

/// `beta * c + alpha * (a @ b)`; with `beta == 0` the input is ignored (NaN included).
pub fn addmm(
    c: &RefTensor,
    a: &RefTensor,
    b: &RefTensor,
    beta: Scalar,
    alpha: Scalar,
) -> RefTensor {
    let dtype = check(
        &Op::Addmm,
        &[Arg::T(c), Arg::T(a), Arg::T(b), Arg::S(beta), Arg::S(alpha)],
    )
    .expect("valid addmm")
    .dtype;
    let (m, n) = (a.sizes[0], b.sizes[1]);
    let (am, bm) = (a.sizes.clone(), b.sizes.clone());
    let mut data = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let prod = dot(a, &am, b, &bm, &[], i, j);
            let bias = super::bget(c, &[i, j]);
            let v = if dtype.is_float() {
                let (be, al) = (beta.as_f64(), alpha.as_f64());
                let base = if be == 0.0 { 0.0 } else { be * bias };
                base + al * prod
            } else {
                let (be, al) = (beta.as_i64(), alpha.as_i64());
                let base = if be == 0 {
                    0
                } else {
                    be.wrapping_mul(bias as i64)
                };
                base.wrapping_add(al.wrapping_mul(prod as i64)) as f64
            };
            data.push(cast_value(
                v,
                if dtype.is_float() {
                    DType::F64
                } else {
                    DType::I64
                },
                dtype,
            ));
        }
    }
    RefTensor {
        dtype,
        sizes: vec![m, n],
        data,
    }
}

/// torch.cat along `dim` with type promotion.
pub fn cat(ts: &[&RefTensor], dim: usize) -> RefTensor {
    let args: Vec<Arg> = ts.iter().map(|t| Arg::T(t)).collect();
    let dtype = check(&Op::Cat { dim }, &args).expect("valid cat").dtype;
    let mut sizes = ts[0].sizes.clone();
    sizes[dim] = ts.iter().map(|t| t.sizes[dim]).sum();
    let mut data = Vec::with_capacity(numel(&sizes));
    for mut idx in indices(&sizes) {
        let mut at = idx[dim];
        let t = ts
            .iter()
            .find(|t| {
                if at < t.sizes[dim] {
                    true
                } else {
                    at -= t.sizes[dim];
                    false
                }
            })
            .unwrap();
        idx[dim] = at;
        data.push(cast_value(t.at(&idx), t.dtype, dtype));
    }
    RefTensor { dtype, sizes, data }
}

/// `arange(start, end, step)`: `ceil((end - start) / step)` values `start + i * step`.
pub fn arange(start: Scalar, end: Scalar, step: Scalar, dtype: DType) -> RefTensor {
    let (s, e, st) = (start.as_f64(), end.as_f64(), step.as_f64());
    let n = match (start, end, step) {
        // An int64 range of integers is counted in integers (ceil of the exact quotient).
        (Scalar::Int(a), Scalar::Int(b), Scalar::Int(c)) if dtype == DType::I64 => {
            let (a, b, c) = (a as i128, b as i128, c as i128);
            let q = (b - a) / c;
            (q + ((q * c != b - a) as i128)).max(0) as usize
        }
        _ => ((e - s) / st).ceil().max(0.0) as usize,
    };
    // PyTorch computes half types' values in f32 (their accumulation type), integer types' in
    // int64 from the truncated start and step (wrapping into the dtype), the rest in f64.
    let data = (0..n)
        .map(|i| match dtype {
            DType::F16 | DType::BF16 => {
                let v = s as f32 + st as f32 * i as f32;
                cast_value(v as f64, DType::F32, dtype)
            }
            DType::I64 | DType::I32 | DType::U8 => {
                let v = start
                    .as_i64()
                    .wrapping_add(step.as_i64().wrapping_mul(i as i64));
                match dtype {
                    DType::I32 => v as i32 as f64,
                    DType::U8 => v as u8 as f64,
                    _ => v as f64,
                }
            }
            _ => cast_value(s + i as f64 * st, DType::F64, dtype),
        })
        .collect();
    RefTensor {
        dtype,
        sizes: vec![n],
        data,
    }
}

/// `full(sizes, value, dtype)`: the scalar converted like a cast from its Python type.
pub fn full(sizes: &[usize], value: Scalar, dtype: DType) -> RefTensor {
    let v = match value {
        Scalar::Float(f) => cast_value(f, DType::F64, dtype),
        Scalar::Int(i) => cast_value(i as f64, DType::I64, dtype),
        Scalar::Bool(b) => cast_value(b as u8 as f64, DType::Bool, dtype),
    };
    RefTensor {
        dtype,
        sizes: sizes.to_vec(),
        data: vec![v; numel(sizes)],
    }
}
