//! A sum over one short dim (2 to 8 elements, many kept: grouped-query attention's backward
//! summing over the query heads that share a key/value head) is recorded as the element-wise
//! chain `0 + x[.., 0, ..] + x[.., 1, ..] + ...`: the same bits in every mode (PyTorch's CPU
//! bits for 2 to 4 elements: deferfuse_torch's test_reductions_views checks those), and one
//! program in strict mode.

use crate::harness::*;
use deferfuse::{DType, Mode, ReduceOp};

/// Values spanning magnitudes, so that another summation order shows in the bits.
fn values(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let v = ((i * 7919 % 1009) as f64 - 504.0) / 97.0;
            v * [1.0, 1e-4, 1e4][i % 3]
        })
        .collect()
}

/// Row-major `[outer, n, inner]` summed over dim 1 in order from +0, as f32.
fn sequential_sums(xs: &[f64], (outer, n, inner): (usize, usize, usize)) -> Vec<f32> {
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = 0f32;
            for r in 0..n {
                acc += xs[(o * n + r) * inner + i] as f32;
            }
            out.push(acc);
        }
    }
    out
}

fn f32s(raw: &Raw) -> Vec<f32> {
    raw.2
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn a_sum_over_a_short_middle_dim_is_the_sequential_sum_in_every_mode() {
    for n in [2, 3, 8] {
        for keepdim in [false, true] {
            let shape = (6, n, 40);
            let xs = values(6 * n * 40);
            let outs = run_in_every_mode_raw(|rt| {
                let x = tensor(rt, DType::F32, &[6, n, 40], &xs);
                let s = run(rt, red(ReduceOp::Sum, &[1], keepdim), &[tt(x)]);
                vec![("sum".into(), s)]
            });
            let (_, sizes, _) = &outs[0].1;
            let want: &[usize] = if keepdim { &[6, 1, 40] } else { &[6, 40] };
            assert_eq!(sizes, want);
            let got = f32s(&outs[0].1);
            let expected = sequential_sums(&xs, shape);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "n {n} keepdim {keepdim} at {i}");
            }
        }
    }
}

#[test]
fn a_short_sum_of_negative_zeros_is_positive_zero() {
    let xs = vec![-0.0; 2 * 2 * 16];
    let outs = run_in_every_mode_raw(|rt| {
        let x = tensor(rt, DType::F32, &[2, 2, 16], &xs);
        vec![(
            "sum".into(),
            run(rt, red(ReduceOp::Sum, &[1], false), &[tt(x)]),
        )]
    });
    assert!(f32s(&outs[0].1).iter().all(|v| v.to_bits() == 0));
}

#[test]
fn a_short_sum_runs_as_one_program_in_strict_mode() {
    let rt = runtime(Mode::Strict);
    let x = tensor(&rt, DType::F32, &[16, 4, 64], &values(16 * 4 * 64));
    rt.synchronize(0).unwrap();
    let before = rt.stats().programs_run;
    let s = run(&rt, red(ReduceOp::Sum, &[1], false), &[tt(x)]);
    rt.synchronize(0).unwrap();
    assert_eq!(rt.stats().programs_run - before, 1);
    assert_eq!(read_raw(&rt, s).1, vec![16, 64]);
}
