//! Ops whose shapes do the work (reductions, argmax, matmul, cat, views, in-place writes, empty
//! and 0-dim tensors) against the reference interpreter, in strict, debug and defer mode.
//!
//! Tolerances (see `harness::Tol`): integer, bool, amax/amin and arg results are exact;
//! float sum/mean/matmul use `accum_tol` (f32: 1e-5 of the sum of |terms|, the vector
//! accumulation order; f64: 1e-13; f16/bf16 add one ulp of the storage type, 1e-3 / 8e-3
//! relative); float prod uses `PROD_F32` (rel 1e-4: up to 1000 roundings of 2^-24 each).

use crate::harness;
use crate::reference;

use deferfuse::{DType, Input, Op, ReduceOp, Scalar, View};
use harness::*;
use reference::reduce::reduce;
use reference::{linalg, RefTensor};

const PROD_F32: Tol = Tol {
    rel: 1e-4,
    abs: 1e-30,
    scaled: 0.0,
};

fn reduce_tol(op: ReduceOp, dtype: DType) -> Tol {
    match op {
        _ if !dtype.is_float() => EXACT,
        ReduceOp::Sum | ReduceOp::Mean => accum_tol(dtype),
        ReduceOp::Prod => match dtype {
            DType::F64 => Tol {
                rel: 1e-12,
                ..EXACT
            },
            DType::F32 => PROD_F32,
            DType::F16 => Tol {
                rel: 1.1e-3,
                ..F16_TOL
            },
            _ => Tol {
                rel: 8.1e-3,
                ..BF16_TOL
            },
        },
        _ => EXACT,
    }
}

#[test]
fn reductions_over_any_dims_with_keepdim_match_reference() {
    let shapes: [(&[usize], &[&[usize]]); 9] = [
        // A 0-dim tensor's dim 0 is the tensor itself (`x.sum(0)` of a scalar is x).
        (&[], &[&[], &[0]]),
        // Empty tensors: every output the fold's identity (or none), whichever dim is empty.
        (&[5, 0], &[&[], &[0], &[1]]),
        (&[2, 0, 3], &[&[], &[1], &[0, 2], &[2]]),
        (&[1], &[&[], &[0]]),
        (&[7], &[&[], &[0]]),
        (&[1000], &[&[], &[0]]),
        (&[3, 5], &[&[], &[0], &[1], &[1, 0]]),
        (&[4, 1, 6], &[&[], &[1], &[2], &[0, 2]]),
        (
            &[2, 3, 4, 5],
            &[&[], &[3], &[0], &[1, 2], &[0, 2], &[1, 3], &[0, 1, 3]],
        ),
    ];
    let mut rng = Rng::new(10);
    let mut cases = Vec::new();
    for dtype in DType::ALL {
        for (si, (shape, dim_sets)) in shapes.iter().enumerate() {
            let plain = rng.tensor(dtype, shape, 4.0, 9, false);
            let special = rng.tensor(dtype, shape, 4.0, 9, true);
            // Products stay in range: magnitudes near 1 (and small integers).
            let near_one: Vec<f64> = (0..plain.numel())
                .map(|_| match dtype {
                    d if d.is_float() => rng.pick(&[-1.0, 1.0]) * (0.9 + 0.2 * rng.unit()),
                    DType::Bool | DType::U8 => rng.int(0, 1) as f64,
                    _ => rng.int(-2, 2) as f64,
                })
                .collect();
            let near_one = RefTensor::new(dtype, shape, near_one);
            for (k, dims) in dim_sets.iter().enumerate() {
                let keepdim = (si + k) % 2 == 1;
                let place = PLACES[(si + k) % 3];
                for op in ReduceOp::ALL {
                    let x = match op {
                        ReduceOp::Prod => &near_one,
                        ReduceOp::Sum | ReduceOp::Mean => &plain,
                        _ => &special,
                    };
                    let o = red(op, dims, keepdim);
                    let mut c = Case::new(
                        format!(
                            "{}({dtype}{shape:?} {place:?}, {dims:?}, keepdim {keepdim})",
                            op.name()
                        ),
                        o,
                        vec![In::T(x.clone(), place)],
                        reduce_tol(op, dtype),
                    );
                    if !c.is_valid() {
                        continue;
                    }
                    if matches!(op, ReduceOp::Sum | ReduceOp::Mean) && dtype.is_float() {
                        c.scale = Some(reduce(op, &x.abs_f64(), dims, keepdim));
                    }
                    cases.push(c);
                }
            }
        }
    }
    assert!(cases.len() > 600, "{} cases", cases.len());
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn argmax_picks_first_maximum_and_nan() {
    use DType::*;
    let nan = f64::NAN;
    let arg = |op: ReduceOp, dims: &[usize], keepdim: bool| red(op, dims, keepdim);
    let outs = run_in_every_mode_raw(|rt| {
        let a = tensor(rt, F32, &[5], &[1.0, 3.0, 3.0, 2.0, -1.0]);
        let b = tensor(rt, F32, &[5], &[1.0, nan, 5.0, nan, -1.0]);
        let c = tensor(rt, F32, &[2, 4], &[2.0, 7.0, 7.0, 0.0, nan, 1.0, nan, 1.0]);
        let ct = view(rt, c, View::Transpose(0, 1));
        let i = tensor(rt, I32, &[6], &[4.0, -2.0, 9.0, 9.0, -2.0, 0.0]);
        let bo = tensor(rt, Bool, &[4], &[0.0, 1.0, 1.0, 0.0]);
        let h = tensor(rt, F16, &[4], &[-0.0, 0.0, -1.0, -1.0]);
        let (mx, mn) = (ReduceOp::Argmax, ReduceOp::Argmin);
        let r = |op: Op, x: Handle| run(rt, op, &[Input::Tensor(x)]);
        vec![
            ("argmax ties".into(), r(arg(mx, &[], false), a)),
            ("argmin".into(), r(arg(mn, &[0], false), a)),
            ("argmax nan".into(), r(arg(mx, &[], false), b)),
            ("argmin nan".into(), r(arg(mn, &[], true), b)),
            ("argmax rows".into(), r(arg(mx, &[1], false), c)),
            ("argmin rows keepdim".into(), r(arg(mn, &[1], true), c)),
            ("argmax all 2-d".into(), r(arg(mx, &[], false), c)),
            (
                "argmax cols of transpose".into(),
                r(arg(mx, &[0], false), ct),
            ),
            ("argmax i32".into(), r(arg(mx, &[], false), i)),
            ("argmin i32".into(), r(arg(mn, &[0], false), i)),
            ("argmax bool".into(), r(arg(mx, &[], false), bo)),
            ("argmin f16 zeros".into(), r(arg(mn, &[], false), h)),
            ("argmax f16 zeros".into(), r(arg(mx, &[], false), h)),
        ]
    });
    let get = |n: &str| {
        let raw = &outs.iter().find(|(m, _)| m == n).unwrap().1;
        (raw.1.clone(), i64s(raw))
    };
    let e: Vec<usize> = vec![];
    assert_eq!(get("argmax ties"), (e.clone(), vec![1]));
    assert_eq!(get("argmin"), (e.clone(), vec![4]));
    assert_eq!(get("argmax nan"), (e.clone(), vec![1]));
    assert_eq!(get("argmin nan"), (vec![1], vec![1]));
    assert_eq!(get("argmax rows"), (vec![2], vec![1, 0]));
    assert_eq!(get("argmin rows keepdim"), (vec![2, 1], vec![3, 0]));
    assert_eq!(get("argmax all 2-d"), (e.clone(), vec![4]));
    assert_eq!(get("argmax cols of transpose"), (vec![2], vec![1, 0]));
    assert_eq!(get("argmax i32"), (e.clone(), vec![2]));
    assert_eq!(get("argmin i32"), (e.clone(), vec![1]));
    assert_eq!(get("argmax bool"), (e.clone(), vec![1]));
    assert_eq!(get("argmin f16 zeros"), (e.clone(), vec![2]));
    assert_eq!(get("argmax f16 zeros"), (e, vec![0]));
}

type Handle = deferfuse::Handle;
type ToScalar = fn(f64) -> Scalar;

#[test]
fn matmul_variants_match_reference() {
    use DType::*;
    let shapes: [(&[usize], &[usize]); 13] = [
        (&[3, 4], &[4, 5]),
        (&[1, 1], &[1, 1]),
        (&[7, 33], &[33, 5]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[4], &[4]),
        (&[4], &[4, 5]),
        (&[3, 4], &[4]),
        (&[2, 3, 4], &[4]),
        (&[4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[5, 4, 6]),
        (&[6, 9], &[9, 1]),
        (&[1, 8], &[8, 40]),
        (&[2, 300], &[300, 70]),
    ];
    let mut rng = Rng::new(20);
    let mut cases = Vec::new();
    for dtype in [F32, F64, F16, BF16, I32, I64, U8] {
        for (si, (sa, sb)) in shapes.iter().enumerate() {
            let a = rng.tensor(dtype, sa, 3.0, 5, false);
            let b = rng.tensor(dtype, sb, 3.0, 5, false);
            let (pa, pb) = (PLACES[si % 3], PLACES[(si + 2) % 3]);
            let mut c = Case::new(
                format!("matmul({dtype}{sa:?} {pa:?}, {sb:?} {pb:?})"),
                Op::Matmul,
                vec![In::T(a.clone(), pa), In::T(b.clone(), pb)],
                accum_tol(dtype),
            );
            if dtype.is_float() {
                c.scale = Some(linalg::matmul(&a.abs_f64(), &b.abs_f64()));
            }
            cases.push(c);
        }
        // addmm(input, m1, m2, beta, alpha) with broadcast bias.
        let m1 = rng.tensor(dtype, &[3, 4], 3.0, 5, false);
        let m2 = rng.tensor(dtype, &[4, 5], 3.0, 5, false);
        let (beta_alpha, scalars): (&[(f64, f64)], ToScalar) = if dtype.is_float() {
            (&[(1.0, 1.0), (0.5, 2.0), (0.0, -1.5)], Scalar::Float)
        } else {
            (&[(1.0, 1.0), (2.0, 3.0), (0.0, -1.0)], |v| {
                Scalar::Int(v as i64)
            })
        };
        for (k, bias_shape) in [&[3usize, 5][..], &[5], &[3, 1]].iter().enumerate() {
            let bias = rng.tensor(dtype, bias_shape, 3.0, 5, dtype.is_float());
            let (beta, alpha) = beta_alpha[k];
            let ins = vec![
                In::T(bias.clone(), PLACES[k]),
                In::T(m1.clone(), PLACES[(k + 1) % 3]),
                In::T(m2.clone(), PLACES[(k + 2) % 3]),
                In::S(scalars(beta)),
                In::S(scalars(alpha)),
            ];
            let name = format!("addmm({dtype}, bias {bias_shape:?}, beta {beta}, alpha {alpha})");
            let mut c = Case::new(name, Op::Addmm, ins, accum_tol(dtype));
            if dtype.is_float() {
                let p = linalg::matmul(&m1.abs_f64(), &m2.abs_f64());
                let mut s = p.clone();
                for (i, v) in s.data.iter_mut().enumerate() {
                    let b = reference::bget(&bias, &[i / 5, i % 5]).abs();
                    *v = alpha.abs() * *v + if beta == 0.0 { 0.0 } else { beta.abs() * b };
                }
                c.scale = Some(s);
                if beta != 0.0 && bias.data.iter().any(|v| !v.is_finite()) {
                    c.scale = None; // the reference result is inf/NaN there anyway
                }
            }
            cases.push(c);
        }
    }
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn cat_promotes_and_concatenates() {
    use DType::*;
    let mut rng = Rng::new(30);
    let mut r = |d: DType, s: &[usize]| rng.tensor(d, s, 8.0, 9, true);
    let groups: Vec<(Vec<RefTensor>, usize)> = vec![
        (vec![r(F32, &[2, 3]), r(I32, &[2, 5])], 1),
        (vec![r(Bool, &[1, 3]), r(U8, &[4, 3])], 0),
        (vec![r(F16, &[3]), r(BF16, &[4]), r(I64, &[33])], 0),
        (
            vec![r(I64, &[2, 2, 2]), r(F16, &[2, 3, 2]), r(Bool, &[2, 1, 2])],
            1,
        ),
        (vec![r(F32, &[0, 3]), r(F32, &[5, 3])], 0),
        (vec![r(I32, &[4, 7]), r(I32, &[4, 7])], 1),
        (vec![r(F64, &[1000]), r(F32, &[1])], 0),
    ];
    let mut cases = Vec::new();
    for (gi, (ts, dim)) in groups.iter().enumerate() {
        let ins = ts
            .iter()
            .enumerate()
            .map(|(k, t)| In::T(t.clone(), PLACES[(gi + k) % 3]))
            .collect();
        let dtypes: Vec<DType> = ts.iter().map(|t| t.dtype).collect();
        cases.push(Case::new(
            format!("cat({dtypes:?}, {dim})"),
            Op::Cat { dim: *dim },
            ins,
            EXACT,
        ));
    }
    assert_no_failures(&run_cases(&cases));
    // The promotion table itself, independently of `infer`.
    let want = [F32, U8, F32, F16, F32, I32, F64];
    for ((ts, dim), w) in groups.iter().zip(want) {
        let refs: Vec<&RefTensor> = ts.iter().collect();
        assert_eq!(linalg::cat(&refs, *dim).dtype, w);
    }
}
