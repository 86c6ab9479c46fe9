//! Ops run alone (strict, debug) reuse the lowered steps and programs of an earlier op of the
//! same structure on their stream, re-bound to their own buffers and scalars
//! (`fusion/src/node_cache.rs`): the results, errors and counters are those of lowering each
//! op afresh.

use crate::harness::*;
use deferfuse::runtime::Error;
use deferfuse::{BinaryOp, DType, Handle, Mode, Op, Runtime, UnaryOp, View};

fn reused(rt: &Runtime) -> u64 {
    rt.stats().strict_plans_reused
}

fn vals(rt: &Runtime, h: Handle) -> Vec<f64> {
    download(rt, h).data
}

#[test]
fn a_second_op_of_the_same_structure_reuses_the_first_ones_plan_and_program() {
    for mode in [Mode::Strict, Mode::Debug] {
        let rt = runtime(mode);
        let x = tensor(&rt, DType::F32, &[8], &[1.0; 8]);
        let y = bin(&rt, BinaryOp::Mul, tt(x), fs(2.0));
        let st = rt.stats();
        assert_eq!(
            (st.strict_plans_reused, st.cache_misses),
            (0, 1),
            "{mode:?}"
        );
        bin(&rt, BinaryOp::Mul, tt(y), fs(2.0));
        let st = rt.stats();
        assert_eq!(st.strict_plans_reused, 1, "{mode:?}");
        assert_eq!(
            (st.cache_hits, st.cache_misses),
            (1, 1),
            "{mode:?}: a reused program still counts as a cache hit"
        );
    }
}

#[test]
fn a_reused_plan_computes_with_its_own_ops_scalar_values() {
    let rt = runtime(Mode::Strict);
    let x = tensor(&rt, DType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let a = bin(&rt, BinaryOp::Mul, tt(x), fs(2.0));
    let b = bin(&rt, BinaryOp::Mul, tt(x), fs(-0.5));
    let c = bin(&rt, BinaryOp::Mul, tt(a), fs(10.0));
    assert_eq!(reused(&rt), 2);
    assert_eq!(vals(&rt, a), [2.0, 4.0, 6.0, 8.0]);
    assert_eq!(vals(&rt, b), [-0.5, -1.0, -1.5, -2.0]);
    assert_eq!(vals(&rt, c), [20.0, 40.0, 60.0, 80.0]);
    let i = tensor(&rt, DType::I32, &[3], &[1.0, 2.0, 3.0]);
    let j = bin(&rt, BinaryOp::Add, tt(i), is(5));
    let k = bin(&rt, BinaryOp::Add, tt(i), is(-7));
    assert_eq!(
        (vals(&rt, j), vals(&rt, k)),
        (vec![6.0, 7.0, 8.0], vec![-6.0, -5.0, -4.0])
    );
}

#[test]
fn ops_that_differ_in_shape_dtype_or_layout_do_not_share_a_plan() {
    let rt = runtime(Mode::Strict);
    let m: Vec<f64> = (0..6).map(f64::from).collect();
    let x = tensor(&rt, DType::F32, &[2, 3], &m);
    let xt = view(&rt, x, View::Transpose(0, 1));
    let x64 = tensor(&rt, DType::F64, &[2, 3], &m);
    let x6 = tensor(&rt, DType::F32, &[6], &m);
    let neg = |h| un(&rt, UnaryOp::Neg, h);
    let first = [neg(x), neg(xt), neg(x64), neg(x6)];
    assert_eq!(reused(&rt), 0, "four structures");
    let again = [neg(x), neg(xt), neg(x64), neg(x6)];
    assert_eq!(reused(&rt), 4);
    let transposed = [-0.0, -3.0, -1.0, -4.0, -2.0, -5.0];
    let flat: Vec<f64> = m.iter().map(|v| -v).collect();
    for hs in [first, again] {
        let got: Vec<Vec<f64>> = hs.iter().map(|&h| vals(&rt, h)).collect();
        assert_eq!(
            got,
            [
                flat.clone(),
                transposed.to_vec(),
                flat.clone(),
                flat.clone()
            ]
        );
    }
}

#[test]
fn an_addmm_with_beta_zero_after_one_with_beta_one_ignores_a_nan_bias() {
    let rt = runtime(Mode::Strict);
    let eye = tensor(&rt, DType::F32, &[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let bias = tensor(&rt, DType::F32, &[2, 2], &[f64::NAN; 4]);
    let addmm = |beta| {
        run(
            &rt,
            Op::Addmm,
            &[tt(bias), tt(eye), tt(eye), fs(beta), fs(1.0)],
        )
    };
    let with_bias = addmm(1.0);
    let without = addmm(0.0);
    assert!(vals(&rt, with_bias).iter().all(|v| v.is_nan()));
    assert_eq!(
        vals(&rt, without),
        [1.0, 0.0, 0.0, 1.0],
        "beta 0: the bias is not read"
    );
    addmm(2.0);
    assert_eq!(reused(&rt), 1, "beta 2 takes beta 1's plan");
}

/// A [2, 5] source and a [2, 2] index holding `bad` at [1, 0], gathered along dim 1.
fn gather_with(rt: &Runtime, bad: f64) -> deferfuse::runtime::Result<Handle> {
    let src = tensor(rt, DType::F32, &[2, 5], &[1.0; 10]);
    let idx = tensor(rt, DType::I64, &[2, 2], &[0.0, 4.0, bad, 1.0]);
    rt.op(0, gather(1), &[tt(src), tt(idx)], None)
}

#[test]
fn an_op_that_fails_on_a_reused_plan_fails_where_and_as_a_fresh_one_does() {
    let msg = "gather: index 7 is out of bounds for dim 1 with size 5";
    let is_msg = |e: &Error| matches!(e, Error::IndexOutOfBounds(_)) && e.to_string() == msg;
    // Debug mode: at the op's own call.
    let rt = runtime(Mode::Debug);
    gather_with(&rt, 2.0).unwrap();
    let e = gather_with(&rt, 7.0).unwrap_err();
    assert!(is_msg(&e), "{e:?}");
    assert_eq!(reused(&rt), 1);
    // Strict mode: at the next use of the result.
    let rt = runtime(Mode::Strict);
    let ok = gather_with(&rt, 2.0).unwrap();
    let bad = gather_with(&rt, 7.0).unwrap();
    assert_eq!(reused(&rt), 1);
    let mut out = vec![0u8; 16];
    let e = rt.to_host(bad, &mut out).unwrap_err();
    assert!(is_msg(&e), "{e:?}");
    assert_eq!(vals(&rt, ok), [1.0; 4], "the op before it is unaffected");
}
