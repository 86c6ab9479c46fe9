//! Views, in-place writes through views, empty and 0-dim tensors against the reference, in
//! strict, debug and defer mode. Every value here is exact (f32 adds/muls of small values,
//! copies and integer ops), so every comparison is `EXACT`.

use crate::harness;
use crate::reference;

use deferfuse::{BinaryOp, DType, Error, Input, Op, ReduceOp, Runtime, Scalar, UnaryOp, View};
use harness::*;
use reference::views::{self as rv, RefLayout};
use reference::{apply, Arg, RefTensor};

type Handle = deferfuse::Handle;

fn out<'a>(outs: &'a [(String, RefTensor)], name: &str) -> &'a RefTensor {
    &outs
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no output {name}"))
        .1
}

/// Checks every named output against its expected tensor.
fn expect(outs: &[(String, RefTensor)], want: &[(&str, RefTensor)]) {
    let failures: Vec<String> = want
        .iter()
        .filter_map(|(n, w)| compare(n, out(outs, n), w, EXACT, None).err())
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn views_are_read_correctly() {
    let mut rng = Rng::new(40);
    let x = rng.tensor(DType::F32, &[4, 6], 50.0, 0, true);
    let xi = rng.tensor(DType::I32, &[2, 3, 4], 0.0, 1000, false);
    let xl = RefLayout::contiguous(&[4, 6]);
    let il = RefLayout::contiguous(&[2, 3, 4]);
    // (name, view chain on the runtime, expected values)
    type Chain = Box<dyn Fn(&Runtime, Handle) -> Handle>;
    let v = |vs: Vec<View>| -> Chain {
        Box::new(move |rt, mut h| {
            for w in &vs {
                h = view(rt, h, w.clone());
            }
            h
        })
    };
    let sl = |dim, start, end, step| View::Slice {
        dim,
        start,
        end,
        step,
    };
    let cases: Vec<(&str, bool, Chain, RefTensor)> = vec![
        (
            "transpose",
            false,
            v(vec![View::Transpose(0, 1)]),
            xl.transpose(0, 1).gather(&x),
        ),
        (
            "permute",
            true,
            v(vec![View::Permute(vec![2, 0, -2])]),
            il.permute(&[2, 0, 1]).gather(&xi),
        ),
        (
            "slice cols step 2",
            false,
            v(vec![sl(1, 1, 6, 2)]),
            xl.slice(1, 1, 6, 2).gather(&x),
        ),
        (
            "slice rows clamped",
            false,
            v(vec![sl(0, -3, 100, 2)]),
            xl.slice(0, -3, 100, 2).gather(&x),
        ),
        (
            "slice of transpose step 3",
            false,
            v(vec![View::Transpose(0, 1), sl(0, 0, 6, 3)]),
            xl.transpose(0, 1).slice(0, 0, 6, 3).gather(&x),
        ),
        (
            "expand row",
            false,
            v(vec![sl(0, 1, 2, 1), View::Expand(vec![3, 4, -1])]),
            xl.slice(0, 1, 2, 1).expand(&[3, 4, 6]).gather(&x),
        ),
        (
            "select last col",
            false,
            v(vec![View::Select { dim: 1, index: -1 }]),
            xl.select(1, -1).gather(&x),
        ),
        (
            "select of transpose",
            false,
            v(vec![
                View::Transpose(0, 1),
                View::Select { dim: 0, index: 2 },
            ]),
            xl.transpose(0, 1).select(0, 2).gather(&x),
        ),
        (
            "unsqueeze squeeze",
            false,
            v(vec![
                View::Unsqueeze(1),
                View::Unsqueeze(-1),
                View::Squeeze(Some(1)),
            ]),
            rv::reshape(&x, &[4, 6, 1]),
        ),
        (
            "squeeze all",
            true,
            v(vec![View::Unsqueeze(0), View::Squeeze(None)]),
            xi.clone(),
        ),
        (
            "reshape of transpose (copies)",
            false,
            v(vec![View::Transpose(0, 1), View::Reshape(vec![-1])]),
            rv::reshape(&xl.transpose(0, 1).gather(&x), &[24]),
        ),
        (
            "reshape contiguous",
            false,
            v(vec![View::Reshape(vec![2, -1, 6])]),
            rv::reshape(&x, &[2, 2, 6]),
        ),
        (
            "reshape strided without copy",
            false,
            v(vec![sl(1, 1, 6, 2), View::Reshape(vec![4, 3, 1])]),
            rv::reshape(&xl.slice(1, 1, 6, 2).gather(&x), &[4, 3, 1]),
        ),
        (
            "reshape of permuted ints",
            true,
            v(vec![
                View::Permute(vec![1, 2, 0]),
                View::Reshape(vec![6, 4]),
            ]),
            rv::reshape(&il.permute(&[1, 2, 0]).gather(&xi), &[6, 4]),
        ),
        (
            "as_strided windows",
            false,
            v(vec![View::AsStrided {
                sizes: vec![3, 3],
                strides: vec![1, 6],
                offset: 2,
            }]),
            RefLayout {
                sizes: vec![3, 3],
                strides: vec![1, 6],
                offset: 2,
            }
            .gather(&x),
        ),
        (
            "slice of select of permute",
            true,
            v(vec![
                View::Permute(vec![2, 1, 0]),
                View::Select { dim: 1, index: 1 },
                sl(0, 1, 4, 2),
            ]),
            il.permute(&[2, 1, 0])
                .select(1, 1)
                .slice(0, 1, 4, 2)
                .gather(&xi),
        ),
    ];
    let outs = run_in_every_mode(|rt| {
        let hx = upload(rt, &x);
        let hi = upload(rt, &xi);
        let mut o = Vec::new();
        for (name, int, chain, _) in &cases {
            let h = chain(rt, if *int { hi } else { hx });
            o.push((format!("{name}: read"), h));
            o.push((format!("{name}: copy"), run(rt, Op::Copy, &[tt(h)])));
            o.push((
                format!("{name}: x + x"),
                bin(rt, BinaryOp::Add, tt(h), tt(h)),
            ));
        }
        o
    });
    let mut want = Vec::new();
    for (name, _, _, w) in &cases {
        let twice = apply(&Op::Binary(BinaryOp::Add), &[Arg::T(w), Arg::T(w)]);
        want.push((format!("{name}: read"), w.clone()));
        want.push((format!("{name}: copy"), w.clone()));
        want.push((format!("{name}: x + x"), twice));
    }
    let want: Vec<(&str, RefTensor)> = want.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    expect(&outs, &want);
}

/// An im2col-like window view: its rows (the last two dims, 4 x 4) are short, so the CPU
/// backend's loops take a longer dim as the kernel's rows; values must not depend on that.
#[test]
fn window_views_with_short_rows_are_read_correctly() {
    let mut rng = Rng::new(41);
    let x = rng.tensor(DType::F32, &[2, 5, 6, 6], 50.0, 0, true);
    let windows = RefLayout {
        sizes: vec![2, 5, 3, 3, 4, 4],
        strides: vec![180, 36, 6, 1, 6, 1],
        offset: 0,
    };
    let want = windows.gather(&x);
    let outs = run_in_every_mode(|rt| {
        let h = view(
            rt,
            upload(rt, &x),
            View::AsStrided {
                sizes: windows.sizes.clone(),
                strides: windows.strides.iter().map(|&s| s as isize).collect(),
                offset: 0,
            },
        );
        // The channels-first columns layout a convolution's GEMM reads, and x + x.
        let cols = view(rt, h, View::Permute(vec![1, 2, 3, 0, 4, 5]));
        vec![
            ("copy".to_string(), run(rt, Op::Copy, &[tt(h)])),
            ("columns".to_string(), run(rt, Op::Copy, &[tt(cols)])),
            ("x + x".to_string(), bin(rt, BinaryOp::Add, tt(h), tt(h))),
        ]
    });
    let twice = apply(&Op::Binary(BinaryOp::Add), &[Arg::T(&want), Arg::T(&want)]);
    let columns = RefLayout::contiguous(&windows.sizes)
        .permute(&[1, 2, 3, 0, 4, 5])
        .gather(&want);
    expect(
        &outs,
        &[
            ("copy", want.clone()),
            ("columns", columns),
            ("x + x", twice),
        ],
    );
}

/// A storage and its writes through views, for the in-place reference.
fn write(storage: &mut RefTensor, l: &RefLayout, v: &RefTensor) {
    l.scatter(storage, &v.cast(storage.dtype));
}

#[test]
fn in_place_write_through_view_keeps_eager_semantics() {
    use BinaryOp::*;
    let mut rng = Rng::new(41);
    let x0 = RefTensor::new(
        DType::F32,
        &[3, 4],
        rng.values(DType::F32, 12, 8.0, 0, false),
    );
    let w0 = RefTensor::new(DType::I32, &[9], (0..9).map(|i| (i * i) as f64).collect());
    let s0 = RefTensor::new(DType::F32, &[4, 4], (0..16).map(|i| i as f64).collect());
    let outs = run_in_every_mode(|rt| {
        let x = upload(rt, &x0);
        let y = bin(rt, Mul, tt(x), fs(2.0)); // computed before the write: keeps old values
        let xt = view(rt, x, View::Transpose(0, 1)); // alias made before the write
        let col0 = view(rt, x, View::Select { dim: 1, index: 0 });
        rt.op(0, Op::Binary(Add), &[tt(col0), fs(1.0)], Some(col0))
            .unwrap();
        let even = view(
            rt,
            x,
            View::Slice {
                dim: 1,
                start: 0,
                end: 4,
                step: 2,
            },
        );
        rt.op(0, Op::Unary(UnaryOp::Relu), &[tt(even)], Some(even))
            .unwrap();
        let z = bin(rt, Add, tt(x), fs(0.0)); // computed after: sees the new values
        let xr = view(rt, x, View::Reshape(vec![12])); // alias made after the write
                                                       // w[1:] += w[:-1]: every element reads the old contents.
        let w = upload(rt, &w0);
        let hi = view(
            rt,
            w,
            View::Slice {
                dim: 0,
                start: 1,
                end: 9,
                step: 1,
            },
        );
        let lo = view(
            rt,
            w,
            View::Slice {
                dim: 0,
                start: 0,
                end: 8,
                step: 1,
            },
        );
        rt.op(0, Op::Binary(Add), &[tt(hi), tt(lo)], Some(hi))
            .unwrap();
        // s = s + s^T through the same buffer.
        let s = upload(rt, &s0);
        let st = view(rt, s, View::Transpose(0, 1));
        rt.op(0, Op::Binary(Add), &[tt(s), tt(st)], Some(s))
            .unwrap();
        // In-place results are cast into the out dtype: f32 into f64, int32 into f32.
        let o64 = tensor(rt, DType::F64, &[3, 4], &[0.0; 12]);
        rt.op(0, Op::Binary(Mul), &[tt(x), fs(0.1)], Some(o64))
            .unwrap();
        let of = tensor(rt, DType::F32, &[9], &[0.0; 9]);
        rt.op(0, Op::Binary(Mul), &[tt(w), is(3)], Some(of))
            .unwrap();
        [
            ("y", y),
            ("x", x),
            ("xt", xt),
            ("col0", col0),
            ("z", z),
            ("xr", xr),
        ]
        .into_iter()
        .chain([
            ("w", w),
            ("lo", lo),
            ("s", s),
            ("st", st),
            ("o64", o64),
            ("of", of),
        ])
        .map(|(n, h)| (n.to_string(), h))
        .collect()
    });
    let xl = RefLayout::contiguous(&[3, 4]);
    let mut x = x0.clone();
    let y = apply(&Op::Binary(Mul), &[Arg::T(&x0), Arg::S(Scalar::Float(2.0))]);
    let c = xl.select(1, 0);
    let v = apply(
        &Op::Binary(Add),
        &[Arg::T(&c.gather(&x)), Arg::S(Scalar::Float(1.0))],
    );
    write(&mut x, &c, &v);
    let e = xl.slice(1, 0, 4, 2);
    let v = apply(&Op::Unary(UnaryOp::Relu), &[Arg::T(&e.gather(&x))]);
    write(&mut x, &e, &v);
    let mut w = w0.clone();
    for i in 1..9 {
        w.data[i] = w0.data[i] + w0.data[i - 1];
    }
    let mut s = s0.clone();
    for i in 0..4 {
        for j in 0..4 {
            s.data[i * 4 + j] = s0.data[i * 4 + j] + s0.data[j * 4 + i];
        }
    }
    let sl = RefLayout::contiguous(&[4, 4]);
    let o64 = apply(&Op::Binary(Mul), &[Arg::T(&x), Arg::S(Scalar::Float(0.1))]).cast(DType::F64);
    let of = apply(&Op::Binary(Mul), &[Arg::T(&w), Arg::S(Scalar::Int(3))]).cast(DType::F32);
    expect(
        &outs,
        &[
            ("y", y),
            ("x", x.clone()),
            ("xt", xl.transpose(0, 1).gather(&x)),
            ("col0", c.gather(&x)),
            ("z", x.clone()),
            ("xr", rv::reshape(&x, &[12])),
            ("w", w.clone()),
            (
                "lo",
                RefLayout::contiguous(&[9]).slice(0, 0, 8, 1).gather(&w),
            ),
            ("s", s.clone()),
            ("st", sl.transpose(0, 1).gather(&s)),
            ("o64", o64),
            ("of", of),
        ],
    );
}

#[test]
fn empty_tensors_are_handled() {
    use DType::*;
    let r = |op: ReduceOp, dims: &[usize], keepdim: bool| red(op, dims, keepdim);
    let outs = run_in_every_mode(|rt| {
        let e0 = tensor(rt, F32, &[0], &[]);
        let e30 = tensor(rt, F32, &[3, 0], &[]);
        let e04 = tensor(rt, F32, &[0, 4], &[]);
        let i0 = tensor(rt, I32, &[0], &[]);
        let row = tensor(rt, F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
        let two = tensor(rt, F32, &[2, 4], &[1.0; 8]);
        let fives = tensor(rt, F32, &[3, 4], &[5.0; 12]);
        let bias = tensor(rt, F32, &[3, 4], &[2.0; 12]);
        let empty_slice = view(
            rt,
            row,
            View::Slice {
                dim: 0,
                start: 3,
                end: 1,
                step: 1,
            },
        );
        let mm = rt
            .op(0, Op::Matmul, &[tt(e30), tt(e04)], Some(fives))
            .unwrap();
        let t = tt;
        vec![
            ("neg e0", un(rt, UnaryOp::Neg, e0)),
            ("e04 + row", bin(rt, BinaryOp::Add, t(e04), t(row))),
            ("sum e0", run(rt, r(ReduceOp::Sum, &[], false), &[t(e0)])),
            (
                "sum e30 dim 1",
                run(rt, r(ReduceOp::Sum, &[1], false), &[t(e30)]),
            ),
            (
                "sum e30 dim 0",
                run(rt, r(ReduceOp::Sum, &[0], true), &[t(e30)]),
            ),
            ("prod e0", run(rt, r(ReduceOp::Prod, &[], false), &[t(e0)])),
            ("mean e0", run(rt, r(ReduceOp::Mean, &[], false), &[t(e0)])),
            ("sum i0", run(rt, r(ReduceOp::Sum, &[], false), &[t(i0)])),
            (
                "mean e30 keepdim",
                run(rt, r(ReduceOp::Mean, &[1], true), &[t(e30)]),
            ),
            (
                "argmax e04 dim 1",
                run(rt, r(ReduceOp::Argmax, &[1], false), &[t(e04)]),
            ),
            ("cat", run(rt, Op::Cat { dim: 0 }, &[t(e04), t(two)])),
            ("matmul k=0", mm),
            (
                "addmm k=0",
                run(rt, Op::Addmm, &[t(bias), t(e30), t(e04), fs(0.5), fs(1.0)]),
            ),
            (
                "arange empty",
                run(rt, Op::Arange { dtype: F32 }, &[fs(1.0), fs(1.0), fs(1.0)]),
            ),
            (
                "full empty",
                run(
                    rt,
                    Op::Full {
                        sizes: [2, 0].into_iter().collect(),
                        dtype: I64,
                    },
                    &[is(3)],
                ),
            ),
            ("empty slice", empty_slice),
            (
                "empty slice + 1",
                bin(rt, BinaryOp::Add, t(empty_slice), fs(1.0)),
            ),
        ]
        .into_iter()
        .map(|(n, h)| (n.to_string(), h))
        .collect()
    });
    let f = |s: &[usize], v: Vec<f64>| RefTensor::new(F32, s, v);
    let nan = f64::NAN;
    expect(
        &outs,
        &[
            ("neg e0", f(&[0], vec![])),
            ("e04 + row", f(&[0, 4], vec![])),
            ("sum e0", f(&[], vec![0.0])),
            ("sum e30 dim 1", f(&[3], vec![0.0; 3])),
            ("sum e30 dim 0", f(&[1, 0], vec![])),
            ("prod e0", f(&[], vec![1.0])),
            ("mean e0", f(&[], vec![nan])),
            ("sum i0", RefTensor::new(I64, &[], vec![0.0])),
            ("mean e30 keepdim", f(&[3, 1], vec![nan; 3])),
            ("argmax e04 dim 1", RefTensor::new(I64, &[0], vec![])),
            ("cat", f(&[2, 4], vec![1.0; 8])),
            ("matmul k=0", f(&[3, 4], vec![0.0; 12])),
            ("addmm k=0", f(&[3, 4], vec![1.0; 12])),
            ("arange empty", f(&[0], vec![])),
            ("full empty", RefTensor::new(I64, &[2, 0], vec![])),
            ("empty slice", f(&[0], vec![])),
            ("empty slice + 1", f(&[0], vec![])),
        ],
    );
    // max/min of nothing is undefined: rejected at the call in every mode.
    for mode in MODES {
        let rt = runtime(mode);
        let e0 = tensor(&rt, F32, &[0], &[]);
        let e = rt
            .op(
                0,
                red(ReduceOp::Amax, &[], false),
                &[Input::Tensor(e0)],
                None,
            )
            .unwrap_err();
        assert!(
            matches!(&e, Error::Op(o) if o.op == "amax"),
            "{mode:?}: {e}"
        );
    }
}

#[test]
fn zero_dim_tensors_work() {
    use DType::*;
    let outs = run_in_every_mode(|rt| {
        let z = tensor(rt, F32, &[], &[2.5]);
        let z64 = tensor(rt, F64, &[], &[0.1]);
        let zi = tensor(rt, I32, &[], &[-3.0]);
        let zb = tensor(rt, Bool, &[], &[1.0]);
        let v = tensor(rt, F32, &[3], &[1.0, -2.0, 4.0]);
        let d = tensor(rt, F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
        let one = tensor(rt, F32, &[1], &[7.0]);
        let acc = tensor(rt, F32, &[], &[10.0]);
        rt.op(0, Op::Binary(BinaryOp::Add), &[tt(acc), tt(z)], Some(acc))
            .unwrap();
        let sel = view(rt, v, View::Select { dim: 0, index: 2 });
        let neg_v = un(rt, UnaryOp::Neg, v);
        let sum = |k| red(ReduceOp::Sum, &[], k);
        let t = tt;
        vec![
            ("neg z", un(rt, UnaryOp::Neg, z)),
            ("z + v", bin(rt, BinaryOp::Add, t(z), t(v))),
            ("v + z64", bin(rt, BinaryOp::Add, t(v), t(z64))),
            ("z + 1", bin(rt, BinaryOp::Add, t(z), is(1))),
            ("zi + 0.5", bin(rt, BinaryOp::Add, t(zi), fs(0.5))),
            ("zi * z64", bin(rt, BinaryOp::Mul, t(zi), t(z64))),
            ("sum z", run(rt, sum(false), &[t(z)])),
            ("sum z keepdim", run(rt, sum(true), &[t(z)])),
            (
                "argmax z",
                run(rt, red(ReduceOp::Argmax, &[], false), &[t(z)]),
            ),
            ("mean z", run(rt, red(ReduceOp::Mean, &[], false), &[t(z)])),
            ("dot", run(rt, Op::Matmul, &[t(d), t(d)])),
            ("unsqueeze", view(rt, z, View::Unsqueeze(0))),
            ("expand", view(rt, z, View::Expand(vec![3]))),
            ("reshape up", view(rt, z, View::Reshape(vec![1, 1]))),
            ("reshape down", view(rt, one, View::Reshape(vec![]))),
            ("cast", run(rt, Op::Cast(I32), &[t(z)])),
            ("where", run(rt, Op::Where, &[t(zb), t(v), t(neg_v)])),
            (
                "full",
                run(
                    rt,
                    Op::Full {
                        sizes: Default::default(),
                        dtype: I64,
                    },
                    &[is(7)],
                ),
            ),
            ("in place", acc),
            ("select", sel),
            ("select * 2", bin(rt, BinaryOp::Mul, t(sel), fs(2.0))),
        ]
        .into_iter()
        .map(|(n, h)| (n.to_string(), h))
        .collect()
    });
    let f = |s: &[usize], v: Vec<f64>| RefTensor::new(F32, s, v);
    expect(
        &outs,
        &[
            ("neg z", f(&[], vec![-2.5])),
            ("z + v", f(&[3], vec![3.5, 0.5, 6.5])),
            (
                "v + z64",
                f(
                    &[3],
                    [1.0, -2.0, 4.0]
                        .map(|x: f64| (x as f32 + 0.1f32) as f64)
                        .to_vec(),
                ),
            ),
            ("z + 1", f(&[], vec![3.5])),
            ("zi + 0.5", f(&[], vec![-2.5])),
            ("zi * z64", RefTensor::new(F64, &[], vec![-3.0 * 0.1])),
            ("sum z", f(&[], vec![2.5])),
            ("sum z keepdim", f(&[], vec![2.5])),
            ("argmax z", RefTensor::new(I64, &[], vec![0.0])),
            ("mean z", f(&[], vec![2.5])),
            ("dot", f(&[], vec![30.0])),
            ("unsqueeze", f(&[1], vec![2.5])),
            ("expand", f(&[3], vec![2.5; 3])),
            ("reshape up", f(&[1, 1], vec![2.5])),
            ("reshape down", f(&[], vec![7.0])),
            ("cast", RefTensor::new(I32, &[], vec![2.0])),
            ("where", f(&[3], vec![1.0, -2.0, 4.0])),
            ("full", RefTensor::new(I64, &[], vec![7.0])),
            ("in place", f(&[], vec![12.5])),
            ("select", f(&[], vec![4.0])),
            ("select * 2", f(&[], vec![8.0])),
        ],
    );
}

#[test]
fn in_place_f16_result_into_wider_out_is_rounded_to_f16() {
    // torch.add(a, b, out=o) with f16 a, b and f32 o: the result type is f16 (1025.5 -> 1026,
    // 1 + 2^-11 -> 1), then it is cast into o.
    let outs = run_in_every_mode(|rt| {
        let a = tensor(rt, DType::F16, &[2], &[1024.0, 1.0]);
        let b = tensor(rt, DType::F16, &[2], &[1.5, 1.0 / 2048.0]);
        let o = tensor(rt, DType::F32, &[2], &[0.0, 0.0]);
        rt.op(0, Op::Binary(BinaryOp::Add), &[tt(a), tt(b)], Some(o))
            .unwrap();
        vec![("o".into(), o)]
    });
    assert_eq!(outs[0].1.data, [1026.0, 1.0]);
}

#[test]
fn a_matrix_product_written_into_its_own_factor_reads_the_factors_old_values() {
    // `a.addmm_(a, w)`: the product reads a factor's rows and columns while it writes the
    // output, so a factor that is the output itself is read from a copy. Small integers keep
    // every sum exact; 96 x 96 spans several of the GEMM's blocks.
    let n = 96;
    let mut rng = Rng::new(7);
    let ints = |rng: &mut Rng| {
        let v: Vec<f64> = (0..n * n).map(|_| rng.int(-2, 2) as f64).collect();
        RefTensor::new(DType::F32, &[n, n], v)
    };
    let (x0, w0) = (ints(&mut rng), ints(&mut rng));
    let one = Scalar::Float(1.0);
    let outs = run_in_every_mode(|rt| {
        let w = upload(rt, &w0);
        let into_x = |rt: &Runtime, op: Op, factors: &dyn Fn(Handle) -> Vec<Input>| {
            let x = upload(rt, &x0);
            rt.op(0, op, &factors(x), Some(x)).unwrap();
            x
        };
        let addmm =
            |a: Input, b: Input, c: Input| vec![a, b, c, Input::Scalar(one), Input::Scalar(one)];
        vec![
            (
                "x+x@w",
                into_x(rt, Op::Addmm, &|x| addmm(tt(x), tt(x), tt(w))),
            ),
            (
                "x+w@x",
                into_x(rt, Op::Addmm, &|x| addmm(tt(x), tt(w), tt(x))),
            ),
            (
                "x+x@x",
                into_x(rt, Op::Addmm, &|x| addmm(tt(x), tt(x), tt(x))),
            ),
            ("x@w", into_x(rt, Op::Matmul, &|x| vec![tt(x), tt(w)])),
        ]
        .into_iter()
        .map(|(name, h)| (name.to_string(), h))
        .collect()
    });
    let addmm = |c: &RefTensor, a: &RefTensor, b: &RefTensor| {
        let s = Arg::S(one);
        apply(&Op::Addmm, &[Arg::T(c), Arg::T(a), Arg::T(b), s, s])
    };
    expect(
        &outs,
        &[
            ("x+x@w", addmm(&x0, &x0, &w0)),
            ("x+w@x", addmm(&x0, &w0, &x0)),
            ("x+x@x", addmm(&x0, &x0, &x0)),
            ("x@w", apply(&Op::Matmul, &[Arg::T(&x0), Arg::T(&w0)])),
        ],
    );
}
