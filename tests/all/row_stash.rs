//! Row kernels that stash a costly value (a transcendental, a division) computed by one sweep
//! for later sweeps, instead of recomputing it: specified by results equal to strict mode bit
//! for bit (the stash keeps the computed bits; no reassociation happens) and, for softmax, by
//! the generated code holding one exp per element.

use crate::harness;

use deferfuse::*;
use harness::{read_raw, red, run, tensor, tt, un, Rng};

fn rt(mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        ..Default::default()
    })
    .unwrap()
}

fn bin(r: &Runtime, b: BinaryOp, x: Handle, y: Handle) -> Handle {
    harness::bin(r, b, tt(x), tt(y))
}

fn reduce(r: &Runtime, op: ReduceOp, x: Handle, keepdim: bool) -> Handle {
    run(r, red(op, &[1], keepdim), &[tt(x)])
}

/// `exp(x - max_row)` and its row sum, as softmax computes them.
fn exp_and_sum(r: &Runtime, x: Handle) -> (Handle, Handle) {
    let m = reduce(r, ReduceOp::Amax, x, true);
    let d = bin(r, BinaryOp::Sub, x, m);
    let e = un(r, UnaryOp::Exp, d);
    let s = reduce(r, ReduceOp::Sum, e, true);
    r.release(m).unwrap();
    r.release(d).unwrap();
    (e, s)
}

fn softmax(r: &Runtime, x: Handle) -> Handle {
    let (e, s) = exp_and_sum(r, x);
    let y = bin(r, BinaryOp::Div, e, s);
    r.release(e).unwrap();
    r.release(s).unwrap();
    y
}

/// Runs `graph` on a [rows, cols] input of `dtype` in strict and in defer mode; returns each
/// mode's output bytes and the programs defer mode ran.
fn strict_and_defer(
    dtype: DType,
    rows: usize,
    cols: usize,
    graph: impl Fn(&Runtime, Handle) -> Vec<Handle>,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, u64) {
    let mut rng = Rng::new(7);
    let x: Vec<f64> = (0..rows * cols).map(|_| rng.float(4.0, false)).collect();
    let run = |mode| {
        let r = rt(mode);
        let h = tensor(&r, dtype, &[rows, cols], &x);
        let before = r.stats().programs_run;
        let outs = graph(&r, h);
        let got: Vec<Vec<u8>> = outs.iter().map(|&o| read_raw(&r, o).2).collect();
        (got, r.stats().programs_run - before)
    };
    let (strict, _) = run(Mode::Strict);
    let (defer, programs) = run(Mode::Defer);
    (strict, defer, programs)
}

#[test]
fn softmax_defer_equals_strict_for_every_row_length_and_is_one_program() {
    for cols in 1..=19 {
        let (strict, defer, programs) =
            strict_and_defer(DType::F32, 3, cols, |r, x| vec![softmax(r, x)]);
        assert_eq!(strict, defer, "{cols} columns");
        assert_eq!(programs, 1, "{cols} columns");
    }
}

#[test]
fn f16_softmax_stashes_the_unrounded_f32_exp() {
    let (strict, defer, _) = strict_and_defer(DType::F16, 5, 37, |r, x| vec![softmax(r, x)]);
    assert_eq!(strict, defer);
}

#[test]
fn f64_softmax_defer_equals_strict() {
    let (strict, defer, programs) = strict_and_defer(DType::F64, 4, 45, |r, x| vec![softmax(r, x)]);
    assert_eq!(strict, defer);
    assert_eq!(programs, 1);
}

#[test]
fn a_later_reduction_folds_a_stashed_value() {
    // sum(exp(x - max)) in the second sweep; amax(exp(x - max)) in the third loads exp back.
    let (strict, defer, programs) = strict_and_defer(DType::F32, 6, 33, |r, x| {
        let (e, s) = exp_and_sum(r, x);
        let se = bin(r, BinaryOp::Mul, e, s);
        let top = reduce(r, ReduceOp::Amax, se, true);
        let y = bin(r, BinaryOp::Div, e, top);
        for h in [e, s, se, top] {
            r.release(h).unwrap();
        }
        vec![y]
    });
    assert_eq!(strict, defer);
    assert_eq!(programs, 1);
}

#[test]
fn argmax_of_a_stashed_quotient() {
    let (strict, defer, _) = strict_and_defer(DType::F32, 7, 29, |r, x| {
        let p = softmax(r, x);
        let sq = bin(r, BinaryOp::Mul, p, p);
        let a = reduce(r, ReduceOp::Argmax, sq, false);
        r.release(sq).unwrap();
        vec![a, p]
    });
    assert_eq!(strict, defer);
}

#[test]
fn rows_longer_than_the_kept_scratch_are_stashed_correctly() {
    // 300K f32 per row: a 1.2 MB scratch row, more than a thread keeps between calls.
    let (strict, defer, _) = strict_and_defer(DType::F32, 2, 300_000, |r, x| vec![softmax(r, x)]);
    assert_eq!(strict, defer);
}

#[test]
fn softmax_computes_exp_once_per_element() {
    let dumps = harness::dumped_ir("stash", &["= exp ", "amax", "= div "], |r| {
        let x = tensor(r, DType::F32, &[4, 16], &[0.5; 64]);
        let y = softmax(r, x);
        read_raw(r, y);
    });
    assert!(!dumps.is_empty(), "the softmax row kernel was dumped");
    let ir = &dumps[0];
    // With the row routines (AVX2 hosts) the exp sweep calls the exp routine once per row;
    // inline, it emits exp four times (two chunks of 4 per step of 8, one chunk of 4, the
    // single-element tail), each with one `floor`. A final sweep recomputing exp would add a
    // second call, or four more floors.
    let got = (
        ir.matches("call fn").count(),
        ir.matches(" = floor").count(),
    );
    let routines = deferfuse::runtime::backend::cpu::CpuBackend::new(false, 1)
        .unwrap()
        .row_routines();
    let want = if routines { (1, 0) } else { (0, 4) };
    assert_eq!(got, want, "{ir}");
}
