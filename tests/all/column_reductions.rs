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
/// and weight gradients in one loop; returns both outputs' bytes and the programs run.
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
                assert_eq!(programs, 1, "{case}");
            }
        }
    }
}
