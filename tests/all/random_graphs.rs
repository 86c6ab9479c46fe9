//! Random op programs (see `graphgen`) run in strict, debug and defer mode and checked against
//! the reference interpreter (`graphgen::check` says how).
//!
//! 64 cases by default; `PROPTEST_CASES` (or `DEFERFUSE_FUZZ_CASES`, see `fuzz_config`) for
//! more.

use crate::graphgen;
use crate::harness;
use crate::reference;

use deferfuse::{BinaryOp, DType, Input, Op, ReduceOp, Scalar, UnaryOp};
use graphgen::check::check_program;
use graphgen::*;
use harness::*;
use proptest::prelude::*;

/// The short profile (CI): 64 cases from a fixed seed, reproducible. The long one:
/// `DEFERFUSE_FUZZ_CASES=100000` runs that many from a fresh random seed, printed first so a
/// failure can be replayed with `DEFERFUSE_FUZZ_SEED`. `PROPTEST_CASES` also sets the count.
fn config() -> ProptestConfig {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let long = env("DEFERFUSE_FUZZ_CASES");
    let seed = env("DEFERFUSE_FUZZ_SEED").unwrap_or_else(|| match long {
        Some(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
        None => 0x5eed_df05,
    });
    if long.is_some() {
        eprintln!("random_graphs: DEFERFUSE_FUZZ_SEED={seed}");
    }
    ProptestConfig {
        cases: long
            .or(env("PROPTEST_CASES"))
            .map_or(64, |c| c.min(u32::MAX as u64) as u32),
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 1024,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_programs_agree_across_modes_and_with_reference(
        n in prop::sample::select(vec![1usize, 2, 3, 4, 5, 7, 9]),
        seed in any::<u64>(),
        specs in prop::collection::vec((any::<u8>(), any::<bool>(), any::<bool>()), 1..=4),
        raw in prop::collection::vec((any::<u8>(), any::<u32>(), any::<u32>(), any::<u32>()), 2..=24),
    ) {
        let p = build(n, seed, &specs, &raw);
        check_program(&p);
    }
}

#[test]
fn a_fixed_program_with_every_instruction_kind_runs() {
    // Guards the generator: a known program exercises each instruction kind at least once.
    let raw: Vec<(u8, u32, u32, u32)> = (0..16u8)
        .map(|k| (k, 3 * k as u32 + 1, 7 * k as u32 + 2, 5))
        .collect();
    let p = build(
        5,
        7,
        &[(0, false, true), (1, true, false), (3, false, false)],
        &raw,
    );
    let kinds: std::collections::HashSet<&str> = p
        .ins
        .iter()
        .map(|i| match i {
            Ins::Unary(..) => "unary",
            Ins::Binary(..) => "binary",
            Ins::Where(..) => "where",
            Ins::Clamp(..) => "clamp",
            Ins::Cast(..) => "cast",
            Ins::Reduce(..) => "reduce",
            Ins::View(..) => "view",
            Ins::Sync(_) | Ins::Flush => "sync",
            Ins::Mode(_) => "mode",
            Ins::Release(_) => "release",
        })
        .collect();
    assert!(kinds.len() >= 8, "{kinds:?} in {p:#?}");
    check_program(&p);
}

// ---- known defer bugs, minimized from failures of the property above ----

#[test]
fn defer_row_kernel_recomputes_an_in_place_update() {
    let outs = run_in_every_mode(|rt| {
        let x = tensor(rt, DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        rt.op(0, Op::Binary(BinaryOp::Add), &[tt(x), fs(1.0)], Some(x))
            .unwrap();
        let s = run(rt, red(ReduceOp::Sum, &[1], true), &[tt(x)]);
        let y = bin(rt, BinaryOp::Mul, tt(x), tt(s));
        vec![("y".into(), y)]
    });
    // Defer gives [27, 36, 45, 108, 126, 144]: ((x + 1) + 1) * s.
    assert_eq!(outs[0].1.data, [18.0, 27.0, 36.0, 90.0, 108.0, 126.0]);
}

#[test]
fn defer_row_kernel_applies_an_in_place_op_once() {
    let outs = run_in_every_mode(|rt| {
        let z = tensor(rt, DType::F32, &[2], &[1.0, 2.0]);
        let y = tensor(rt, DType::F32, &[1], &[-6.0]);
        let s = run(rt, red(ReduceOp::Sum, &[], true), &[tt(z)]);
        let n = un(rt, UnaryOp::Neg, y);
        rt.op(0, Op::Binary(BinaryOp::Add), &[tt(y), fs(10.0)], Some(y))
            .unwrap();
        vec![("n".into(), n), ("y".into(), y), ("s".into(), s)]
    });
    // Defer gives n = [-4], y = [14].
    assert_eq!(
        (outs[0].1.data.clone(), outs[1].1.data.clone()),
        (vec![6.0], vec![4.0])
    );
}

#[test]
fn defer_row_kernel_second_reduction_reads_old_values() {
    let outs = run_in_every_mode(|rt| {
        let x0 = tensor(rt, DType::F32, &[6], &[10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
        let x1 = tensor(rt, DType::F32, &[6], &[-1.0, 2.0, -3.0, 4.0, -5.0, 6.0]);
        let pos = bin(rt, BinaryOp::Gt, tt(x1), fs(0.0));
        let total = run(rt, red(ReduceOp::Sum, &[], true), &[tt(x0)]);
        rt.op(
            0,
            Op::Binary(BinaryOp::Maximum),
            &[tt(x1), tt(x0)],
            Some(x1),
        )
        .unwrap();
        let count = run(rt, red(ReduceOp::Sum, &[], false), &[tt(pos)]);
        vec![
            ("count".into(), count),
            ("total".into(), total),
            ("x1".into(), x1),
        ]
    });
    assert_eq!(outs[0].1.data, [3.0]);
}

// ---- found by the long fuzz profile (the reference was wrong; these pin both sides) ----

/// The runtime in every mode, and the reference, on one op of one input.
fn agree_with_reference(op: Op, input: reference::RefTensor, other: Option<Scalar>) -> Vec<f64> {
    let outs = run_in_every_mode(|rt| {
        let x = upload(rt, &input);
        let mut ins = vec![tt(x)];
        ins.extend(other.map(Input::Scalar));
        vec![("r".into(), run(rt, op.clone(), &ins))]
    });
    let mut args = vec![reference::Arg::T(&input)];
    args.extend(other.map(reference::Arg::S));
    let want = reference::apply(&op, &args);
    compare("result", &outs[0].1, &want, EXACT, None).unwrap();
    want.data
}

#[test]
fn int64_neg_and_abs_of_int64_min_wrap() {
    let x = || reference::RefTensor::new(DType::I64, &[2], vec![i64::MIN as f64, -5.0]);
    let neg = agree_with_reference(Op::Unary(UnaryOp::Neg), x(), None);
    assert_eq!(neg, [i64::MIN as f64, 5.0]);
    let abs = agree_with_reference(Op::Unary(UnaryOp::Abs), x(), None);
    assert_eq!(abs, [i64::MIN as f64, 5.0]);
}

#[test]
fn a_negative_int_scalar_takes_a_uint8_computations_dtype() {
    // PyTorch: `torch.tensor([5, 254], dtype=torch.uint8) < -3` is [True, False] (-3 is 253).
    let x = || reference::RefTensor::new(DType::U8, &[2], vec![5.0, 254.0]);
    let lt = agree_with_reference(Op::Binary(BinaryOp::Lt), x(), Some(Scalar::Int(-3)));
    assert_eq!(lt, [1.0, 0.0]);
}

#[test]
fn f64_gelu_far_below_zero_is_within_1e_13_of_the_reference() {
    // Found by the long fuzz profile at x = -3.527...: 1 + erf(x / sqrt 2) cancels there.
    let x = reference::RefTensor::new(DType::F64, &[3], vec![-3.5274391338723725, -5.5, -2.0]);
    let outs = run_in_every_mode(|rt| {
        let h = upload(rt, &x);
        vec![("gelu".into(), un(rt, UnaryOp::GeluErf, h))]
    });
    let want = reference::apply(&Op::Unary(UnaryOp::GeluErf), &[reference::Arg::T(&x)]);
    let tol = Tol {
        rel: 1e-13,
        abs: 1e-13,
        scaled: 0.0,
    };
    compare("gelu", &outs[0].1, &want, tol, None).unwrap();
}
