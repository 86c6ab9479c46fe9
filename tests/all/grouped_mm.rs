//! The grouped matrix product kernel op (`KernelOp::GroupedMatmul`, `torch._grouped_mm`): each
//! case against the reference in `reference/kernels.rs` in strict, debug and defer mode (which
//! must agree bit for bit), with empty groups, rows past the last offset and offsets out of
//! range; strided and transposed operands; float dtypes; offsets written on the device in the
//! same flush; and its record-time errors.

use crate::harness;
use crate::reference;

use deferfuse::fusion::ir::{GroupedMatmul, KernelOp};
use deferfuse::{DType, Error, Handle, Input, Op, Runtime};
use harness::*;
use reference::kernels as refk;
use reference::RefTensor;

fn op(case: GroupedMatmul) -> Op {
    Op::Kernel(KernelOp::GroupedMatmul(case))
}

/// One product to check: the case, the group sizes along the cut dim as offsets, and the
/// uncut sizes `(m, k, n)` (for `Contraction`, `k` is the cut dim's extent).
struct Shape {
    case: GroupedMatmul,
    offs: &'static [i64],
    mkn: (usize, usize, usize),
}

impl Shape {
    /// The shapes of a and b.
    fn operands(&self) -> (Vec<usize>, Vec<usize>) {
        let g = self.offs.len();
        let (m, k, n) = self.mkn;
        match self.case {
            GroupedMatmul::Rows => (vec![m, k], vec![g, k, n]),
            GroupedMatmul::Cols => (vec![g, m, k], vec![k, n]),
            GroupedMatmul::Contraction => (vec![m, k], vec![k, n]),
        }
    }
}

#[rustfmt::skip]
const SHAPES: &[Shape] = &[
    // An expert layer's forward: 4 experts, one with no tokens, rows past the last offset.
    Shape { case: GroupedMatmul::Rows, offs: &[3, 3, 9, 12], mkn: (14, 16, 8) },
    // Enough rows and columns for the packed GEMM kernels.
    Shape { case: GroupedMatmul::Rows, offs: &[40, 41, 100], mkn: (100, 64, 48) },
    Shape { case: GroupedMatmul::Cols, offs: &[2, 7, 7, 10], mkn: (5, 6, 11) },
    // The weight gradient: each group's own tokens, an empty group gives a zero matrix.
    Shape { case: GroupedMatmul::Contraction, offs: &[4, 4, 13, 20], mkn: (6, 20, 5) },
    Shape { case: GroupedMatmul::Contraction, offs: &[33, 70, 96], mkn: (32, 96, 40) },
    // Out of range: past the end (clamped), a decreasing end (an empty group, and the next
    // group starting from it overlaps the one before), negative.
    Shape { case: GroupedMatmul::Rows, offs: &[-2, 5, 3, 30], mkn: (9, 4, 3) },
    Shape { case: GroupedMatmul::Contraction, offs: &[6, 2, 9], mkn: (3, 7, 2) },
];

/// Terms per result element, for the accumulation tolerance's scale.
fn scale_of(s: &Shape, a: &RefTensor, b: &RefTensor) -> RefTensor {
    refk::grouped_mm(s.case, &a.abs_f64(), &b.abs_f64(), s.offs)
}

fn offsets(rt: &Runtime, offs: &[i64], dtype: DType) -> Handle {
    let v: Vec<f64> = offs.iter().map(|&o| o as f64).collect();
    tensor(rt, dtype, &[offs.len()], &v)
}

/// Runs every shape with operands of `dtype` laid out as `places` in every mode and checks
/// each against the reference.
fn check(dtype: DType, places: (Place, Place), offs_dtype: DType, seed: u64) {
    let mut rng = Rng::new(seed);
    let operands: Vec<_> = SHAPES
        .iter()
        .map(|s| {
            let (sa, sb) = s.operands();
            (
                rng.tensor(dtype, &sa, 2.0, 0, false),
                rng.tensor(dtype, &sb, 2.0, 0, false),
            )
        })
        .collect();
    let outs = run_in_every_mode(|rt| {
        SHAPES
            .iter()
            .zip(&operands)
            .enumerate()
            .map(|(i, (s, (a, b)))| {
                let ins = [
                    tt(place(rt, a, places.0)),
                    tt(place(rt, b, places.1)),
                    tt(offsets(rt, s.offs, offs_dtype)),
                ];
                (format!("shape {i} {:?}", s.case), run(rt, op(s.case), &ins))
            })
            .collect()
    });
    let failures: Vec<String> = SHAPES
        .iter()
        .zip(&operands)
        .zip(&outs)
        .filter_map(|((s, (a, b)), (name, got))| {
            let want = refk::grouped_mm(s.case, a, b, s.offs);
            let ctx = format!("{dtype} {places:?} {name}");
            compare(&ctx, got, &want, accum_tol(dtype), Some(&scale_of(s, a, b))).err()
        })
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn a_small_grouped_product_has_the_hand_computed_values() {
    // Rows 0-1 use expert 0 (x1), row 2 expert 1 (x10), row 3 is past the last offset.
    let a = RefTensor::new(DType::F32, &[4, 1], vec![1.0, 2.0, 3.0, 4.0]);
    let b = RefTensor::new(DType::F32, &[2, 1, 2], vec![1.0, -1.0, 10.0, 100.0]);
    let outs = run_in_every_mode(|rt| {
        let ins = [
            tt(upload(rt, &a)),
            tt(upload(rt, &b)),
            tt(offsets(rt, &[2, 3], DType::I32)),
        ];
        vec![("out".into(), run(rt, op(GroupedMatmul::Rows), &ins))]
    });
    let want = [1.0, -1.0, 2.0, -2.0, 30.0, 300.0, 0.0, 0.0];
    assert_eq!(outs[0].1.data, want);
    assert_eq!(
        refk::grouped_mm(GroupedMatmul::Rows, &a, &b, &[2, 3]).data,
        want,
        "the reference"
    );
}

#[test]
fn every_case_matches_the_reference_in_every_mode() {
    check(DType::F32, (Place::Contig, Place::Contig), DType::I32, 1);
}

#[test]
fn int64_offsets_are_read_like_int32_ones() {
    check(DType::F32, (Place::Contig, Place::Contig), DType::I64, 2);
}

#[test]
fn strided_and_transposed_operands_are_read_through_their_views() {
    // nn.Linear-layout expert weights arrive transposed (`weight.transpose(-2, -1)`), the
    // weight gradient's a is a transposed activation.
    for (i, places) in [
        (Place::Contig, Place::Transposed),
        (Place::Transposed, Place::Contig),
        (Place::Strided, Place::Strided),
    ]
    .into_iter()
    .enumerate()
    {
        check(DType::F32, places, DType::I32, 10 + i as u64);
    }
}

#[test]
fn float64_float16_and_bfloat16_operands_give_their_own_dtype() {
    for (i, dtype) in [DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .enumerate()
    {
        check(
            dtype,
            (Place::Contig, Place::Contig),
            DType::I32,
            20 + i as u64,
        );
    }
}

#[test]
fn offsets_computed_in_the_same_flush_are_read_after_they_are_written() {
    // An MoE layer's offsets are a cumsum of per-expert counts recorded just before the
    // product; in defer mode both sit in one flush.
    let a = RefTensor::new(DType::F32, &[5, 1], vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    let b = RefTensor::new(DType::F32, &[2, 1, 1], vec![1.0, 10.0]);
    let outs = run_in_every_mode(|rt| {
        let counts = offsets(rt, &[1, 3], DType::I32);
        let ends = run(
            rt,
            Op::Kernel(KernelOp::Scan {
                op: deferfuse::fusion::ir::ScanOp::Sum,
                dim: 0,
                dtype: Some(DType::I32),
            }),
            &[tt(counts)],
        );
        let ins = [tt(upload(rt, &a)), tt(upload(rt, &b)), tt(ends)];
        vec![("out".into(), run(rt, op(GroupedMatmul::Rows), &ins))]
    });
    assert_eq!(outs[0].1.data, [1.0, 20.0, 30.0, 40.0, 0.0]);
}

fn record_error(case: GroupedMatmul, ins: &[(DType, &[usize])]) -> String {
    let rt = runtime(deferfuse::Mode::Strict);
    let hs: Vec<Input> = ins
        .iter()
        .map(|(d, s)| {
            let n: usize = s.iter().product();
            tt(tensor(&rt, *d, s, &vec![0.0; n]))
        })
        .collect();
    match rt.op(0, op(case), &hs, None) {
        Err(e @ Error::Op(_)) => e.to_string(),
        other => panic!("expected a BadOp error, got {other:?}"),
    }
}

#[test]
fn shapes_that_do_not_fit_the_case_fail_at_record_time_naming_the_operand() {
    let e = record_error(
        GroupedMatmul::Rows,
        &[
            (DType::F32, &[8, 4]),
            (DType::F32, &[3, 5, 2]),
            (DType::I32, &[3]),
        ],
    );
    assert!(e.contains("grouped_mm") && e.contains("input 1 (b)"), "{e}");
    let e = record_error(
        GroupedMatmul::Cols,
        &[
            (DType::F32, &[2, 8, 4]),
            (DType::F32, &[4, 6]),
            (DType::I32, &[3]),
        ],
    );
    assert!(e.contains("input 0 (a)") && e.contains("3 groups"), "{e}");
    let e = record_error(
        GroupedMatmul::Contraction,
        &[
            (DType::F32, &[8, 4]),
            (DType::F32, &[4, 6]),
            (DType::F32, &[3]),
        ],
    );
    assert!(e.contains("input 2 (offs)"), "{e}");
}
