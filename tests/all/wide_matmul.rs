//! The widening product (`KernelOp::WideMatmul`): float16/bfloat16 `a @ b` summed and returned
//! in float32, against the product of the same values in f64 (each product of two half values
//! is exact, so only the f32 sums round), in strict, debug and defer mode (bit for bit alike);
//! plain, transposed and strided operands, broadcast batch dims, products of few and of many
//! rows (the bf16 pair-dot-product kernel takes five or more).

use crate::harness;
use crate::reference;

use deferfuse::fusion::ir::KernelOp;
use deferfuse::{DType, Op};
use harness::*;
use reference::RefTensor;

/// `t`'s values as an f64 tensor: the reference's product is then f64's, not rounded to `t`'s
/// dtype.
fn in_f64(t: &RefTensor) -> RefTensor {
    RefTensor::new(DType::F64, &t.sizes, t.data.clone())
}

#[rustfmt::skip]
const SHAPES: &[(&[usize], &[usize])] = &[
    (&[37, 64], &[64, 29]),
    // Four rows: the widening path, not the pair dot products.
    (&[4, 21], &[21, 7]),
    // Batch dims broadcast both ways, an odd k.
    (&[3, 40, 25], &[25, 50]),
    (&[2, 1, 16, 9], &[4, 9, 33]),
];

fn check(dtype: DType, places: (Place, Place), seed: u64) {
    let mut rng = Rng::new(seed);
    let operands: Vec<_> = SHAPES
        .iter()
        .map(|(a, b)| {
            (
                rng.tensor(dtype, a, 2.0, 0, false),
                rng.tensor(dtype, b, 2.0, 0, false),
            )
        })
        .collect();
    let outs = run_in_every_mode(|rt| {
        operands
            .iter()
            .enumerate()
            .map(|(i, (a, b))| {
                let ins = [tt(place(rt, a, places.0)), tt(place(rt, b, places.1))];
                (
                    format!("shape {i}"),
                    run(rt, Op::Kernel(KernelOp::WideMatmul), &ins),
                )
            })
            .collect()
    });
    let failures: Vec<String> = operands
        .iter()
        .zip(&outs)
        .filter_map(|((a, b), (name, got))| {
            assert_eq!(got.dtype, DType::F32, "{name}: the result is float32");
            // The exact sums, labelled float32: the tolerance covers f32's summation.
            let exact = reference::linalg::matmul(&in_f64(a), &in_f64(b));
            let want = RefTensor::new(DType::F32, &exact.sizes, exact.data);
            let scale = reference::linalg::matmul(&in_f64(&a.abs_f64()), &in_f64(&b.abs_f64()));
            let ctx = format!("{dtype} {places:?} {name}");
            compare(&ctx, got, &want, F32_ACCUM, Some(&scale)).err()
        })
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn a_bf16_product_is_its_f32_sums_in_every_mode() {
    check(DType::BF16, (Place::Contig, Place::Contig), 1);
    check(DType::BF16, (Place::Transposed, Place::Strided), 2);
}

#[test]
fn an_f16_product_is_its_f32_sums_in_every_mode() {
    check(DType::F16, (Place::Contig, Place::Transposed), 3);
}

#[test]
fn a_sum_past_the_half_types_range_stays_finite_in_float32() {
    // 64 products of 256 * 256 = 2^22 million: 2^22 * 64 overflows neither f32 nor the test,
    // but rounded to f16 (max 65504) it would be infinite.
    let a = RefTensor::new(DType::F16, &[5, 64], vec![256.0; 5 * 64]);
    let b = RefTensor::new(DType::F16, &[64, 3], vec![256.0; 64 * 3]);
    let outs = run_in_every_mode(|rt| {
        let ins = [tt(upload(rt, &a)), tt(upload(rt, &b))];
        vec![(
            "out".into(),
            run(rt, Op::Kernel(KernelOp::WideMatmul), &ins),
        )]
    });
    assert!(outs[0].1.data.iter().all(|&v| v == 4_194_304.0));
}
