//! Values a loop computes once per row: what depends only on an input with one element per
//! row (a cross-entropy's target `[rows, 1]` against `[rows, classes]` logits), on scalar
//! parameters and on earlier reductions' results. Specified by results equal to the reference
//! and alike in every mode for every row length (the main loop's chunks, its tail, both), and,
//! on the CPU backend, by the generated code computing such a value outside the row's loop.

use crate::harness;

use deferfuse::*;
use harness::{i64s, is, read_raw, red, run, run_in_every_mode_raw, tensor, tt, Rng};

fn bin(r: &Runtime, b: BinaryOp, x: Input, y: Input) -> Handle {
    harness::bin(r, b, x, y)
}

/// A cross-entropy-shaped program on logits `x` `[rows, cols]` and an int64 target `t`
/// `[rows, 1]`: the target with class 2 ignored (`where(t != 2, t, 0)`, `[rows, 1]`), whether
/// it is class 5 (`[rows, 1]`), and `x - amax(x) + float(t)` (`[rows, cols]`), all in one row
/// kernel in defer mode.
fn per_row_program(r: &Runtime, x: Handle, t: Handle) -> Vec<(String, Handle)> {
    let m = run(r, red(ReduceOp::Amax, &[1], true), &[tt(x)]);
    let d = bin(r, BinaryOp::Sub, tt(x), tt(m));
    let keep = bin(r, BinaryOp::Ne, tt(t), is(2));
    let kept = run(r, Op::Where, &[tt(keep), tt(t), is(0)]);
    let is5 = bin(r, BinaryOp::Eq, tt(t), is(5));
    let tf = run(r, Op::Cast(DType::F32), &[tt(t)]);
    let y = bin(r, BinaryOp::Add, tt(d), tt(tf));
    vec![("kept".into(), kept), ("is5".into(), is5), ("y".into(), y)]
}

fn inputs(rows: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let mut rng = Rng::new(11);
    let x = (0..rows * cols)
        .map(|_| rng.float(4.0, false) as f32 as f64)
        .collect();
    let t = (0..rows).map(|_| rng.int(0, 7) as f64).collect();
    (x, t)
}

#[test]
fn values_from_a_per_row_input_match_the_reference_in_every_mode_for_every_row_length() {
    let rows = 5;
    for cols in (1..=10).chain([37]) {
        let (x, t) = inputs(rows, cols);
        let got = run_in_every_mode_raw(|r| {
            let xh = tensor(r, DType::F32, &[rows, cols], &x);
            let th = tensor(r, DType::I64, &[rows, 1], &t);
            per_row_program(r, xh, th)
        });
        let kept: Vec<i64> = t
            .iter()
            .map(|&v| if v != 2.0 { v as i64 } else { 0 })
            .collect();
        assert_eq!(i64s(&got[0].1), kept, "{cols} columns: kept target");
        let is5: Vec<u8> = t.iter().map(|&v| (v == 5.0) as u8).collect();
        assert_eq!(got[1].1 .2, is5, "{cols} columns: is class 5");
        let y: Vec<f32> = got[2]
            .1
             .2
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b)) as f32;
            for c in 0..cols {
                let want = (row[c] as f32 - m) + t[r] as f32;
                assert_eq!(y[r * cols + c], want, "{cols} columns: y[{r}, {c}]");
            }
        }
    }
}

#[test]
fn a_per_row_input_is_converted_once_per_row_not_per_element() {
    let (x, t) = inputs(4, 16);
    let dumps = harness::dumped_ir("row-constants", &["amax", "= cast "], |r| {
        let xh = tensor(r, DType::F32, &[4, 16], &x);
        let th = tensor(r, DType::I64, &[4, 1], &t);
        for (_, h) in per_row_program(r, xh, th) {
            read_raw(r, h);
        }
    });
    assert_eq!(dumps.len(), 1, "one row kernel was dumped");
    let ir = &dumps[0];
    // i64 -> f32 runs lane by lane: once per row it is the hoisted 4-lane value's 4
    // conversions and the 1-lane value's one, per sweep that needs it (the late sweep only).
    // Per element it was 4 per 4-lane chunk (three chunks per main-loop step of 8 and 4) and
    // one in the tail: 13.
    let conversions = ir.matches("fcvt_from_sint").count();
    assert!(conversions <= 5, "{conversions} conversions:\n{ir}");
}
