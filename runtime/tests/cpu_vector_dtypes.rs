//! The CPU backend computes f64, i64 and i32-computed dtypes (i32, u8, bool) in 128-bit vector
//! registers, with per-lane fallbacks where x64 has no vector instruction. These tests pin what
//! that must not change: main loop and tail agree bit for bit, integers wrap, 64-bit lanes are
//! compared and multiplied in full, float -> int casts truncate and saturate (NaN -> 0), and the
//! loops really use vector types.

mod common;

use common::lanes::*;
use common::{blocks, optimized_ir};
use deferfuse_fusion::ir::{BinaryOp, DType, Layout, Op, ReduceOp, Scalar, UnaryOp};
use deferfuse_fusion::lower::lower_node;
use deferfuse_fusion::trace::{Node, Operand, TensorRef};
use deferfuse_runtime::backend::cpu::CpuBackend;
use deferfuse_runtime::backend::Backend;
use deferfuse_runtime::{Handle, Input, Runtime};

/// max(a * b + c, a) - b * 0.5 with a, b, c derived from x, then ops that run per lane
/// (exp, remainder) and blends (where, sign).
fn float_chain(rt: &Runtime, x: Handle) -> Handle {
    let f = |v: f64| Input::Scalar(Scalar::Float(v));
    let b = bin(rt, BinaryOp::Mul, t(x), f(-1.25));
    let c = bin(rt, BinaryOp::Add, t(x), f(0.75));
    let ab = bin(rt, BinaryOp::Mul, t(x), t(b));
    let abc = bin(rt, BinaryOp::Add, t(ab), t(c));
    let m = bin(rt, BinaryOp::Maximum, t(abc), t(x));
    let h = bin(rt, BinaryOp::Mul, t(b), f(0.5));
    let y = bin(rt, BinaryOp::Sub, t(m), t(h));
    let s = un(rt, UnaryOp::Sqrt, un(rt, UnaryOp::Abs, y));
    let e = un(rt, UnaryOp::Exp, bin(rt, BinaryOp::Mul, t(y), f(0.01)));
    let r = bin(rt, BinaryOp::Remainder, t(y), f(-3.0));
    let pos = bin(rt, BinaryOp::Gt, t(y), f(0.0));
    let w = rt.op(0, Op::Where, &[t(pos), t(s), t(e)], None).unwrap();
    let sg = un(rt, UnaryOp::Sign, x);
    let z = bin(rt, BinaryOp::Add, t(w), t(r));
    let z = bin(rt, BinaryOp::Minimum, t(z), t(sg));
    un(rt, UnaryOp::Floor, bin(rt, BinaryOp::Div, t(z), f(0.3)))
}

/// max(a * b + c, a) - b * 3, then remainder (per lane), abs, sign, min and a blend.
fn int_chain(rt: &Runtime, x: Handle) -> Handle {
    let i = |v: i64| Input::Scalar(Scalar::Int(v));
    let b = bin(rt, BinaryOp::Sub, i(7), t(x));
    let c = bin(rt, BinaryOp::Mul, t(x), i(-3));
    let ab = bin(rt, BinaryOp::Mul, t(x), t(b));
    let abc = bin(rt, BinaryOp::Add, t(ab), t(c));
    let m = bin(rt, BinaryOp::Maximum, t(abc), t(x));
    let h = bin(rt, BinaryOp::Mul, t(b), i(3));
    let y = bin(rt, BinaryOp::Sub, t(m), t(h));
    let r = bin(rt, BinaryOp::Remainder, t(y), t(b));
    let a = un(rt, UnaryOp::Abs, y);
    let s = un(rt, UnaryOp::Sign, c);
    let lt = bin(rt, BinaryOp::Lt, t(x), t(b));
    let w = rt.op(0, Op::Where, &[t(lt), t(r), t(a)], None).unwrap();
    let z = bin(rt, BinaryOp::Minimum, t(w), t(s));
    bin(rt, BinaryOp::Add, t(z), t(un(rt, UnaryOp::Neg, x)))
}

const FLOATS: [f64; 17] = [
    1.5,
    -2.25,
    0.0,
    -0.0,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    3.0e10,
    -7.0,
    1.0e-310,
    0.1,
    -123.456,
    42.0,
    -0.5,
    9.75,
    1.0e300,
    -3.0,
];

#[test]
fn f64_chain_gives_the_same_bits_in_main_loop_and_tail() {
    main_loop_and_tail_agree::<f64, f64>(&FLOATS, float_chain);
}

#[test]
fn f32_chain_gives_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<f32> = FLOATS.iter().map(|&x| x as f32).collect();
    main_loop_and_tail_agree::<f32, f32>(&xs, float_chain);
}

const INTS: [i64; 17] = [
    0,
    1,
    -1,
    7,
    -8,
    46_341,
    -46_341,
    i32::MAX as i64,
    i32::MIN as i64,
    123_456_789,
    -987_654,
    3,
    -3,
    100,
    i64::MAX,
    i64::MIN,
    (1 << 40) + 5,
];

#[test]
fn i64_chain_gives_the_same_bits_in_main_loop_and_tail() {
    main_loop_and_tail_agree::<i64, i64>(&INTS, int_chain);
}

#[test]
fn i32_chain_gives_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<i32> = INTS.iter().map(|&x| x as i32).collect();
    main_loop_and_tail_agree::<i32, i32>(&xs, int_chain);
}

#[test]
fn u8_chain_gives_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<u8> = INTS.iter().map(|&x| x as u8).collect();
    main_loop_and_tail_agree::<u8, u8>(&xs, |rt, x| {
        let i = |v: i64| Input::Scalar(Scalar::Int(v));
        let y = bin(rt, BinaryOp::Mul, t(x), i(3));
        let y = bin(rt, BinaryOp::Add, t(y), i(200));
        let m = bin(rt, BinaryOp::Maximum, t(y), t(x));
        let lt = bin(rt, BinaryOp::Lt, t(m), i(128));
        rt.op(0, Op::Where, &[t(lt), t(m), t(y)], None).unwrap()
    });
}

#[test]
fn float_to_int_and_back_casts_give_the_same_bits_in_main_loop_and_tail() {
    // f64 -> i32 -> f64 -> i64 -> f32 -> i64 -> f64: every vector and per-lane cast path.
    main_loop_and_tail_agree::<f64, f64>(&FLOATS, |rt, x| {
        let y = cast(rt, x, DType::I32);
        let y = cast(rt, y, DType::F64);
        let y = bin(rt, BinaryOp::Mul, t(y), Input::Scalar(Scalar::Float(3.5)));
        let y = cast(rt, y, DType::I64);
        let y = cast(rt, y, DType::F32);
        let y = cast(rt, y, DType::I64);
        cast(rt, y, DType::F64)
    });
}

/// `(x + 1) * x - (-x) + abs(x)`, recorded: every integer op that can overflow.
fn add_mul_neg_abs(rt: &Runtime, x: Handle) -> Handle {
    let y = bin(rt, BinaryOp::Add, t(x), Input::Scalar(Scalar::Int(1)));
    let y = bin(rt, BinaryOp::Mul, t(y), t(x));
    let y = bin(rt, BinaryOp::Sub, t(y), t(un(rt, UnaryOp::Neg, x)));
    bin(rt, BinaryOp::Add, t(y), t(un(rt, UnaryOp::Abs, x)))
}

/// [`add_mul_neg_abs`] of each of `xs` with two's-complement wrapping, as PyTorch computes it.
macro_rules! wrapped_add_mul_neg_abs {
    ($xs:expr) => {
        $xs.iter()
            .map(|&x| {
                x.wrapping_add(1)
                    .wrapping_mul(x)
                    .wrapping_sub(x.wrapping_neg())
                    .wrapping_add(x.wrapping_abs())
            })
            .collect()
    };
}

#[test]
fn i32_add_mul_neg_abs_wrap_around() {
    let xs = [i32::MAX, i32::MIN, 65_536, -65_537, 1, -1, 0, 12_345];
    let got: Vec<i32> = apply(&xs, add_mul_neg_abs);
    let want: Vec<i32> = wrapped_add_mul_neg_abs!(xs);
    assert_eq!(got, want);
}

#[test]
fn i64_add_mul_neg_abs_wrap_around_in_all_64_bits() {
    let xs = [
        i64::MAX,
        i64::MIN,
        1 << 32,
        (1 << 33) + 3,
        -(1 << 35) - 7,
        0x1234_5678_9abc_def0,
        -1,
        3,
    ];
    let got: Vec<i64> = apply(&xs, add_mul_neg_abs);
    let want: Vec<i64> = wrapped_add_mul_neg_abs!(xs);
    assert_eq!(got, want);
}

#[test]
fn u8_add_sub_mul_wrap_modulo_256() {
    let xs: [u8; 8] = [0, 1, 16, 127, 128, 200, 250, 255];
    let got: Vec<u8> = apply(&xs, |rt, x| {
        let y = bin(rt, BinaryOp::Add, t(x), Input::Scalar(Scalar::Int(10)));
        let y = bin(rt, BinaryOp::Mul, t(y), t(x));
        bin(rt, BinaryOp::Sub, t(y), Input::Scalar(Scalar::Int(1)))
    });
    let want: Vec<u8> = xs
        .iter()
        .map(|&x| x.wrapping_add(10).wrapping_mul(x).wrapping_sub(1))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn i64_max_and_min_compare_all_64_bits() {
    // Pairs that differ only in the high half, only in the low half, or in sign.
    let a: [i64; 8] = [
        1 << 32,
        5,
        -1,
        i64::MIN,
        i64::MAX,
        -(1 << 40),
        0xffff_ffff,
        7,
    ];
    let b: [i64; 8] = [
        (1 << 32) + 1,
        (1 << 33) + 4,
        1,
        i64::MAX,
        -1,
        1 << 40,
        0x1_0000_0000,
        7,
    ];
    let rt = runtime();
    let (x, y) = (upload(&rt, &a), upload(&rt, &b));
    let mx = bin(&rt, BinaryOp::Maximum, t(x), t(y));
    let mn = bin(&rt, BinaryOp::Minimum, t(x), t(y));
    let gt = bin(&rt, BinaryOp::Gt, t(x), t(y));
    let gt = cast(&rt, gt, DType::I64);
    let got_max: Vec<i64> = download(&rt, mx, 8);
    let got_min: Vec<i64> = download(&rt, mn, 8);
    let got_gt: Vec<i64> = download(&rt, gt, 8);
    for k in 0..8 {
        assert_eq!(got_max[k], a[k].max(b[k]), "max at {k}");
        assert_eq!(got_min[k], a[k].min(b[k]), "min at {k}");
        assert_eq!(got_gt[k], (a[k] > b[k]) as i64, "gt at {k}");
    }
}

const EDGES: [f64; 16] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1.0e20,
    -1.0e20,
    2_147_483_647.9,
    -2_147_483_648.9,
    2_147_483_648.0,
    -2_147_483_649.0,
    9.3e18,
    -9.3e18,
    2.5,
    -2.5,
    -0.9,
    300.7,
    -300.7,
];

#[test]
fn f64_to_int_casts_truncate_saturate_and_map_nan_to_zero() {
    let i32s: Vec<i32> = apply(&EDGES, |rt, x| cast(rt, x, DType::I32));
    let i64s: Vec<i64> = apply(&EDGES, |rt, x| cast(rt, x, DType::I64));
    let u8s: Vec<u8> = apply(&EDGES, |rt, x| cast(rt, x, DType::U8));
    for (k, &x) in EDGES.iter().enumerate() {
        assert_eq!(i32s[k], x as i32, "f64 {x} -> i32");
        assert_eq!(i64s[k], x as i64, "f64 {x} -> i64");
        assert_eq!(u8s[k], (x as i32) as u8, "f64 {x} -> u8 (through i32)");
    }
}

#[test]
fn f32_to_int_casts_truncate_saturate_and_map_nan_to_zero() {
    let xs: Vec<f32> = EDGES.iter().map(|&x| x as f32).collect();
    let i32s: Vec<i32> = apply(&xs, |rt, x| cast(rt, x, DType::I32));
    let i64s: Vec<i64> = apply(&xs, |rt, x| cast(rt, x, DType::I64));
    for (k, &x) in xs.iter().enumerate() {
        assert_eq!(i32s[k], x as i32, "f32 {x} -> i32");
        assert_eq!(i64s[k], x as i64, "f32 {x} -> i64");
    }
}

#[test]
fn int_casts_truncate_and_sign_extend() {
    let xs: [i64; 8] = [
        i64::MIN,
        i64::MAX,
        (1 << 32) + 5,
        -(1 << 32) - 5,
        0x7fff_ffff,
        0x8000_0000,
        -1,
        258,
    ];
    let to_i32: Vec<i32> = apply(&xs, |rt, x| cast(rt, x, DType::I32));
    let to_u8: Vec<u8> = apply(&xs, |rt, x| cast(rt, x, DType::U8));
    let to_f64: Vec<f64> = apply(&xs, |rt, x| cast(rt, x, DType::F64));
    let to_f32: Vec<f32> = apply(&xs, |rt, x| cast(rt, x, DType::F32));
    let back: Vec<i64> = apply(&xs, |rt, x| cast(rt, cast(rt, x, DType::I32), DType::I64));
    for (k, &x) in xs.iter().enumerate() {
        assert_eq!(to_i32[k], x as i32, "i64 {x} -> i32");
        assert_eq!(to_u8[k], x as u8, "i64 {x} -> u8");
        assert_eq!(to_f64[k], x as f64, "i64 {x} -> f64");
        assert_eq!(to_f32[k], x as f32, "i64 {x} -> f32");
        assert_eq!(back[k], x as i32 as i64, "i64 {x} -> i32 -> i64");
    }
}

#[test]
fn f64_max_and_min_propagate_nan() {
    let a = [f64::NAN, 1.0, f64::NAN, -0.0, 2.0, -3.0, 5.0, f64::INFINITY];
    let b = [
        1.0,
        f64::NAN,
        f64::NAN,
        0.0,
        1.0,
        -2.0,
        5.0,
        f64::NEG_INFINITY,
    ];
    let rt = runtime();
    let (x, y) = (upload(&rt, &a), upload(&rt, &b));
    let mx: Vec<f64> = download(&rt, bin(&rt, BinaryOp::Maximum, t(x), t(y)), 8);
    let mn: Vec<f64> = download(&rt, bin(&rt, BinaryOp::Minimum, t(x), t(y)), 8);
    for k in 0..8 {
        if a[k].is_nan() || b[k].is_nan() {
            assert!(mx[k].is_nan() && mn[k].is_nan(), "NaN at {k}");
        } else {
            assert_eq!(mx[k], a[k].max(b[k]), "max at {k}");
            assert_eq!(mn[k], a[k].min(b[k]), "min at {k}");
        }
    }
}

/// A contiguous 1-D tensor of 1000 elements (or a 0-d one) of dtype `d` in `buffer`.
fn tensor_ref(buffer: u64, d: DType, sizes: &[usize]) -> TensorRef {
    TensorRef {
        buffer,
        layout: Layout {
            sizes: sizes.iter().copied().collect(),
            strides: sizes.iter().map(|_| 1).collect(),
            offset: 0,
        },
        dtype: d,
    }
}

/// The optimized Cranelift IR of the programs `nodes` lower to, one after the other.
fn optimized_ir_of(nodes: &[Node]) -> String {
    let mut listing = String::new();
    for n in nodes {
        for step in lower_node(n, 0) {
            let program = CpuBackend::new(true, 1)
                .unwrap()
                .compile(&step.region)
                .unwrap();
            listing.push_str(optimized_ir(&program.listing()));
        }
    }
    listing
}

/// The optimized IR of `x * y`, `_ + x` and `max(_, y)` on contiguous tensors of dtype `d`.
fn optimized_ir_of_elementwise(d: DType) -> String {
    let tr = |buffer| tensor_ref(buffer, d, &[1000]);
    let node = |op, a, b, out| Node {
        op: Op::Binary(op),
        inputs: [Operand::Tensor(tr(a)), Operand::Tensor(tr(b))]
            .into_iter()
            .collect(),
        output: tr(out),
        compute: d,
    };
    optimized_ir_of(&[
        node(BinaryOp::Mul, 1, 2, 3),
        node(BinaryOp::Add, 3, 1, 4),
        node(BinaryOp::Maximum, 4, 2, 5),
    ])
}

/// The optimized IR of a full reduction `op` of a contiguous tensor of dtype `d`.
fn optimized_ir_of_reduction(op: ReduceOp, d: DType, out: DType) -> String {
    optimized_ir_of(&[Node {
        op: Op::Reduce {
            op,
            dims: [0].into_iter().collect(),
            keepdim: false,
        },
        inputs: [Operand::Tensor(tensor_ref(1, d, &[1000]))]
            .into_iter()
            .collect(),
        output: tensor_ref(2, out, &[]),
        compute: out,
    }])
}

/// Some loop blocks load `vt` registers, and those blocks compute `op` without splitting a
/// register into lanes (which would mean the ops ran on scalars).
fn assert_vector_loops(ir: &str, vt: &str, op: &str) {
    let load = format!("load.{vt} ");
    let main: Vec<(String, String)> = blocks(ir)
        .into_iter()
        .filter(|(_, body)| body.contains(&load))
        .collect();
    assert!(
        !main.is_empty(),
        "no `{load}`: the loop is not vectorized\n{ir}"
    );
    for (name, body) in &main {
        for bad in ["extractlane", "insertlane", "call"] {
            assert!(
                !body.contains(bad),
                "`{bad}` in vector loop {name}: lanes are computed one by one\n{ir}"
            );
        }
    }
    assert!(
        main.iter().any(|(_, body)| body.contains(op)),
        "no `{op}` in the vector loops\n{ir}"
    );
}

#[test]
fn f64_elementwise_loops_compute_in_f64x2_registers() {
    let ir = optimized_ir_of_elementwise(DType::F64);
    assert_vector_loops(&ir, "f64x2", "fmul");
    assert_vector_loops(&ir, "f64x2", "bitselect");
}

#[test]
fn i32_elementwise_loops_compute_in_i32x4_registers() {
    let ir = optimized_ir_of_elementwise(DType::I32);
    assert_vector_loops(&ir, "i32x4", "imul");
    assert_vector_loops(&ir, "i32x4", "smax");
}

#[test]
fn i64_elementwise_loops_compute_in_i64x2_registers() {
    let ir = optimized_ir_of_elementwise(DType::I64);
    assert_vector_loops(&ir, "i64x2", "imul");
    assert_vector_loops(&ir, "i64x2", "smax");
}

#[test]
fn f64_sum_folds_into_f64x2_accumulators() {
    let ir = optimized_ir_of_reduction(ReduceOp::Sum, DType::F64, DType::F64);
    assert_vector_loops(&ir, "f64x2", "fadd");
}

#[test]
fn i64_amax_folds_into_i64x2_accumulators() {
    let ir = optimized_ir_of_reduction(ReduceOp::Amax, DType::I64, DType::I64);
    assert_vector_loops(&ir, "i64x2", "smax");
}

#[test]
fn i32_sum_widens_to_i64x2_accumulators() {
    let ir = optimized_ir_of_reduction(ReduceOp::Sum, DType::I32, DType::I64);
    assert_vector_loops(&ir, "i32x4", "swiden");
}
