//! Reductions over leading dims (bias and layernorm weight gradients) whose region also writes
//! an element output: the CPU backend runs them on gathered rows and scatters the element
//! output back (`runtime/src/backend/cpu/columns.rs`). Specified by results equal to strict
//! mode bit for bit (same instructions in the same order; only loads and stores move) and by
//! one program in defer mode.

use crate::harness;

use deferfuse::*;
use harness::{read_raw, red, run, tensor, tt, Rng};

fn rt(mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        ..Default::default()
    })
    .unwrap()
}

/// `y = x * w + x` (kept) and `sum(x * w, dim 0)`, as a layernorm backward computes the input
/// and weight gradients; returns both outputs' bytes and the programs run.
fn grad_and_column_sum(
    mode: Mode,
    dtype: DType,
    rows: usize,
    cols: usize,
    keepdim: bool,
) -> (Vec<Vec<u8>>, u64) {
    let mut rng = Rng::new(11);
    let x: Vec<f64> = (0..rows * cols).map(|_| rng.float(3.0, false)).collect();
    let w: Vec<f64> = (0..rows * cols).map(|_| rng.float(3.0, false)).collect();
    let r = rt(mode);
    let (hx, hw) = (
        tensor(&r, dtype, &[rows, cols], &x),
        tensor(&r, dtype, &[rows, cols], &w),
    );
    let before = r.stats().programs_run;
    let xw = harness::bin(&r, BinaryOp::Mul, tt(hx), tt(hw));
    let y = harness::bin(&r, BinaryOp::Add, tt(xw), tt(hx));
    let s = run(&r, red(ReduceOp::Sum, &[0], keepdim), &[tt(xw)]);
    r.release(xw).unwrap();
    let got = vec![read_raw(&r, y).2, read_raw(&r, s).2];
    (got, r.stats().programs_run - before)
}

#[test]
fn a_column_sum_with_an_element_output_equals_strict_bit_for_bit() {
    // Rows of at least 64 take the gathered path; 130 columns are two blocks of rows of the
    // kernel, and 9 or 17 leave edges past the 8x8 register tiles.
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for (rows, cols) in [(64, 9), (100, 17), (257, 130), (70, 1)] {
            for keepdim in [false, true] {
                let (strict, _) = grad_and_column_sum(Mode::Strict, dtype, rows, cols, keepdim);
                let (defer, programs) =
                    grad_and_column_sum(Mode::Defer, dtype, rows, cols, keepdim);
                let case = format!("{dtype:?} {rows}x{cols} keepdim={keepdim}");
                assert_eq!(strict[0], defer[0], "element output, {case}");
                assert_eq!(strict[1], defer[1], "column sum, {case}");
                // The product's loop, then the sum alone reading it in place (fused, the sum
                // ran on gathered columns, 1.5-5x slower: `plan::join_reduce`); one loop where
                // a single column makes dim 0 the contiguous one.
                assert_eq!(programs, if cols == 1 { 1 } else { 2 }, "{case}");
            }
        }
    }
}

#[test]
fn sums_and_means_over_leading_and_trailing_dims_match_the_reference_in_every_mode() {
    // Batch norm's statistics (dims {0, 2, 3}) and their like run as two reductions, the
    // trailing dims first (`trailing_then_leading`): f32 and f64, keepdim or not, two leading
    // dims, against the reference's exact sums within the accumulation tolerance.
    use crate::reference::{self, Arg, RefTensor};
    use harness::{accum_tol, compare, run_in_every_mode, upload};
    let mut rng = Rng::new(3);
    let cases: [(DType, ReduceOp, &[usize], bool); 4] = [
        (DType::F32, ReduceOp::Sum, &[0, 2, 3], false),
        (DType::F32, ReduceOp::Mean, &[0, 2, 3], true),
        (DType::F64, ReduceOp::Sum, &[0, 1, 3], false),
        (DType::F32, ReduceOp::Mean, &[3, 0], false),
    ];
    let x: Vec<RefTensor> = cases
        .iter()
        .map(|c| rng.tensor(c.0, &[3, 5, 7, 33], 2.0, 0, false))
        .collect();
    let outs = run_in_every_mode(|rt| {
        cases
            .iter()
            .zip(&x)
            .map(|(&(_, op, dims, keepdim), x)| {
                let h = run(rt, red(op, dims, keepdim), &[tt(upload(rt, x))]);
                (format!("{op:?} {dims:?} keepdim {keepdim}"), h)
            })
            .collect()
    });
    for ((&(dtype, op, dims, keepdim), x), (name, got)) in cases.iter().zip(&x).zip(&outs) {
        let want = reference::apply(&red(op, dims, keepdim), &[Arg::T(x)]);
        let scale = reference::apply(&red(op, dims, keepdim), &[Arg::T(&x.abs_f64())]);
        compare(name, got, &want, accum_tol(dtype), Some(&scale)).unwrap();
    }
}
