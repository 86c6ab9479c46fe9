//! The dense convolution kernel op (`KernelOp::Conv`) against the reference in
//! `reference/kernels.rs`, in strict, debug and defer mode (which must agree bit for bit), over
//! 1-D, 2-D and 3-D geometries and operand layouts, and its record-time errors.

use crate::harness;
use crate::reference;

use deferfuse::fusion::ir::{Conv, ConvPart, Dims, KernelOp};
use deferfuse::{DType, Error, Op, Runtime};
use harness::*;
use reference::kernels as refk;
use reference::RefTensor;

/// A batch, channels in and out, the input's spatial sizes and the kernel's geometry.
struct Geo {
    name: &'static str,
    n: usize,
    c: usize,
    oc: usize,
    input: &'static [usize],
    kernel: &'static [usize],
    padding: &'static [usize],
    dilation: &'static [usize],
    stride: &'static [usize],
}

#[rustfmt::skip]
const GEOS: &[Geo] = &[
    Geo { name: "1-D k3 p1", n: 2, c: 3, oc: 4, input: &[9], kernel: &[3], padding: &[1], dilation: &[1], stride: &[1] },
    Geo { name: "1-D k5 p0 d2", n: 1, c: 2, oc: 3, input: &[12], kernel: &[5], padding: &[0], dilation: &[2], stride: &[1] },
    Geo { name: "2-D 3x3 p1, 16 channels on 16x16", n: 2, c: 16, oc: 16, input: &[16, 16], kernel: &[3, 3], padding: &[1, 1], dilation: &[1, 1], stride: &[1, 1] },
    // 288 rows of columns: blocks of 224 wide columns, 440 of them (two blocks, one partial).
    Geo { name: "2-D 3x3 p1, 32 channels on 20x20", n: 1, c: 32, oc: 8, input: &[20, 20], kernel: &[3, 3], padding: &[1, 1], dilation: &[1, 1], stride: &[1, 1] },
    Geo { name: "2-D 3x5 p(1,0)", n: 2, c: 3, oc: 2, input: &[7, 9], kernel: &[3, 5], padding: &[1, 0], dilation: &[1, 1], stride: &[1, 1] },
    Geo { name: "2-D 3x3 p0", n: 2, c: 3, oc: 4, input: &[8, 7], kernel: &[3, 3], padding: &[0, 0], dilation: &[1, 1], stride: &[1, 1] },
    Geo { name: "2-D 3x3 d2 p2", n: 1, c: 3, oc: 5, input: &[9, 8], kernel: &[3, 3], padding: &[2, 2], dilation: &[2, 2], stride: &[1, 1] },
    Geo { name: "2-D 1x1", n: 2, c: 5, oc: 3, input: &[4, 4], kernel: &[1, 1], padding: &[0, 0], dilation: &[1, 1], stride: &[1, 1] },
    // The kernel is larger than the input; border outputs read nothing but padding.
    Geo { name: "2-D 7x7 p3 on 5x6", n: 2, c: 2, oc: 3, input: &[5, 6], kernel: &[7, 7], padding: &[3, 3], dilation: &[1, 1], stride: &[1, 1] },
    Geo { name: "2-D 3x3 p2 (a border of padding only)", n: 1, c: 2, oc: 2, input: &[4, 4], kernel: &[3, 3], padding: &[2, 2], dilation: &[1, 1], stride: &[1, 1] },
    // More output channels than the GEMM's one row block.
    Geo { name: "2-D 3x3 p1, 100 output channels", n: 1, c: 3, oc: 100, input: &[6, 7], kernel: &[3, 3], padding: &[1, 1], dilation: &[1, 1], stride: &[1, 1] },
    Geo { name: "2-D 3x3 p1, one input channel", n: 3, c: 1, oc: 4, input: &[5, 5], kernel: &[3, 3], padding: &[1, 1], dilation: &[1, 1], stride: &[1, 1] },
    // No input channels: every output is an empty sum, zero.
    Geo { name: "2-D 3x3 p1, no input channels", n: 2, c: 0, oc: 3, input: &[4, 5], kernel: &[3, 3], padding: &[1, 1], dilation: &[1, 1], stride: &[1, 1] },
    Geo { name: "3-D 2x3x2 p(1,2,0) d(2,1,2)", n: 1, c: 2, oc: 3, input: &[5, 4, 6], kernel: &[2, 3, 2], padding: &[1, 2, 0], dilation: &[2, 1, 2], stride: &[1, 1, 1] },
    // Strided: each dim's padded input split by phase in the grid.
    Geo { name: "1-D k3 s2 (an audio encoder's)", n: 2, c: 3, oc: 4, input: &[17], kernel: &[3], padding: &[0], dilation: &[1], stride: &[2] },
    Geo { name: "1-D k10 s5 (raw samples)", n: 1, c: 1, oc: 4, input: &[64], kernel: &[10], padding: &[0], dilation: &[1], stride: &[5] },
    Geo { name: "2-D 3x3 s2 p1 on an even map", n: 2, c: 4, oc: 5, input: &[10, 12], kernel: &[3, 3], padding: &[1, 1], dilation: &[1, 1], stride: &[2, 2] },
    Geo { name: "2-D 4x4 s4 (patches)", n: 1, c: 3, oc: 6, input: &[12, 8], kernel: &[4, 4], padding: &[0, 0], dilation: &[1, 1], stride: &[4, 4] },
    Geo { name: "2-D 2x2 s3 (a stride past the kernel)", n: 2, c: 2, oc: 3, input: &[8, 7], kernel: &[2, 2], padding: &[0, 0], dilation: &[1, 1], stride: &[3, 3] },
    Geo { name: "2-D 3x5 s(2,3) p(1,2) d(1,2)", n: 2, c: 3, oc: 2, input: &[9, 14], kernel: &[3, 5], padding: &[1, 2], dilation: &[1, 2], stride: &[2, 3] },
    Geo { name: "2-D 7x7 s2 p3 (a stem), 16 channels out", n: 1, c: 3, oc: 16, input: &[20, 19], kernel: &[7, 7], padding: &[3, 3], dilation: &[1, 1], stride: &[2, 2] },
    // 288 rows of columns over several blocks, as at stride 1.
    Geo { name: "2-D 3x3 s2 p1, 32 channels on 40x40", n: 1, c: 32, oc: 8, input: &[40, 40], kernel: &[3, 3], padding: &[1, 1], dilation: &[1, 1], stride: &[2, 2] },
    Geo { name: "3-D 3x3x3 s(1,2,2) p1", n: 1, c: 2, oc: 3, input: &[4, 7, 6], kernel: &[3, 3, 3], padding: &[1, 1, 1], dilation: &[1, 1, 1], stride: &[1, 2, 2] },
];

impl Geo {
    fn conv(&self, mirrored: bool) -> Conv {
        Conv {
            part: if mirrored {
                ConvPart::InputGrad
            } else {
                ConvPart::Forward
            },
            padding: self.padding.into(),
            dilation: self.dilation.into(),
            stride: self.stride.into(),
            sizes: Dims::new(),
        }
    }

    /// The weight gradient's op: the kernel sizes given, as its operands do not hold them.
    fn weight_grad(&self) -> Conv {
        Conv {
            part: ConvPart::WeightGrad,
            sizes: self.kernel.into(),
            ..self.conv(false)
        }
    }

    /// The output's shape `[N, OC, out...]`.
    fn out(&self) -> Vec<usize> {
        let out = self
            .conv(false)
            .output_sizes(self.input, self.kernel)
            .unwrap();
        [&[self.n, self.oc][..], &out].concat()
    }

    fn op(&self, mirrored: bool) -> Op {
        Op::Kernel(KernelOp::Conv(Box::new(self.conv(mirrored))))
    }

    fn x(&self) -> Vec<usize> {
        [&[self.n, self.c][..], self.input].concat()
    }

    /// The weight's shape as given: `[OC, C, k...]`, or mirrored `[C, OC, k...]`.
    fn w(&self, mirrored: bool) -> Vec<usize> {
        let (a, b) = if mirrored {
            (self.c, self.oc)
        } else {
            (self.oc, self.c)
        };
        [&[a, b][..], self.kernel].concat()
    }

    /// Random operands of `dtype` (values in [-2, 2], some zeros).
    fn operands(&self, dtype: DType, mirrored: bool, rng: &mut Rng) -> (RefTensor, RefTensor) {
        (
            rng.tensor(dtype, &self.x(), 2.0, 0, false),
            rng.tensor(dtype, &self.w(mirrored), 2.0, 0, false),
        )
    }

    /// Whether the op takes the geometry mirrored (the input gradient is stride 1 only).
    fn mirrors(&self) -> bool {
        self.stride.iter().all(|&s| s == 1)
    }

    /// The terms each output element sums: channels times taps.
    fn terms(&self) -> usize {
        self.c * self.kernel.iter().product::<usize>()
    }
}

/// A mirrored weight `[C, OC, k...]` as the plain one it stands for: `[OC, C, k...]`, every
/// tap reversed.
fn unmirrored(w: &RefTensor) -> RefTensor {
    let kernel = &w.sizes[2..];
    let sizes = [&[w.sizes[1], w.sizes[0]][..], kernel].concat();
    let data = reference::indices(&sizes)
        .into_iter()
        .map(|i| {
            let taps = (0..kernel.len()).map(|d| kernel[d] - 1 - i[2 + d]);
            let from: Vec<usize> = [i[1], i[0]].into_iter().chain(taps).collect();
            w.at(&from)
        })
        .collect();
    RefTensor::new(w.dtype, &sizes, data)
}

/// `got` against the reference: within f32 accumulation over `terms` products of the sum of
/// their magnitudes (the dot product bound for any order), plus the result's own rounding.
fn against_reference(
    ctx: &str,
    g: &Geo,
    mirrored: bool,
    (x, w): &(RefTensor, RefTensor),
    got: &RefTensor,
) -> Result<(), String> {
    let k = g.conv(false);
    let w = if mirrored { unmirrored(w) } else { w.clone() };
    let want = refk::conv(&k, x, &w);
    let scale = refk::conv(&k, &x.abs_f64(), &w.abs_f64());
    let tol = Tol {
        rel: 2f64.powi(-24),
        abs: 0.0,
        scaled: 1.02 * g.terms() as f64 * (2f64.powi(-24) + 2f64.powi(-53)),
    };
    compare(ctx, got, &want, tol, Some(&scale))
}

/// Runs every geometry (mirrored: every stride-1 one) on float32 operands placed as `places`
/// say, in every mode (bit for bit alike), and checks each result against the reference.
fn check(mirrored: bool, places: (Place, Place), seed: u64) {
    check_dtype(DType::F32, mirrored, places, seed)
}

/// [`check`] on operands of `dtype` (float32, or bfloat16 summed into a float32 result: each
/// product of two bfloat16 values is exact in float32, so the same bound holds).
fn check_dtype(dtype: DType, mirrored: bool, places: (Place, Place), seed: u64) {
    let mut rng = Rng::new(seed);
    let geos: Vec<&Geo> = GEOS.iter().filter(|g| !mirrored || g.mirrors()).collect();
    let operands: Vec<_> = geos
        .iter()
        .map(|g| g.operands(dtype, mirrored, &mut rng))
        .collect();
    let outs = run_in_every_mode(|rt| {
        geos.iter()
            .zip(&operands)
            .map(|(g, (x, w))| {
                let ins = [tt(place(rt, x, places.0)), tt(place(rt, w, places.1))];
                (g.name.to_string(), run(rt, g.op(mirrored), &ins))
            })
            .collect()
    });
    let failures: Vec<String> = geos
        .iter()
        .zip(&operands)
        .zip(&outs)
        .filter_map(|((g, xw), (name, got))| {
            assert_eq!(got.dtype, DType::F32, "{name}: the result is float32");
            let ctx = format!("{dtype} mirrored {mirrored}, {places:?} {name}");
            against_reference(&ctx, g, mirrored, xw, got).err()
        })
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn contiguous_operands_match_the_reference_in_every_mode() {
    check(false, (Place::Contig, Place::Contig), 1);
}

#[test]
fn strided_and_transposed_operand_views_match_the_reference_in_every_mode() {
    check(false, (Place::Strided, Place::Transposed), 2);
    check(false, (Place::Transposed, Place::Strided), 3);
}

#[test]
fn a_mirrored_weight_is_read_transposed_with_its_taps_reversed() {
    check(true, (Place::Contig, Place::Contig), 4);
    check(true, (Place::Strided, Place::Transposed), 5);
}

#[test]
fn bfloat16_operands_are_summed_into_a_float32_result_in_every_mode() {
    check_dtype(DType::BF16, false, (Place::Contig, Place::Contig), 11);
    check_dtype(DType::BF16, false, (Place::Strided, Place::Transposed), 12);
    check_dtype(DType::BF16, true, (Place::Transposed, Place::Contig), 13);
}

#[test]
fn a_bfloat16_infinite_weight_multiplies_no_padding_either() {
    // As the float32 case below: on a core with AVX512-BF16 the bfloat16 path's grid holds
    // padding, so a non-finite weight takes the float32 path on widened operands.
    let g = &GEOS[0];
    let x = RefTensor::new(DType::BF16, &[1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    let w = RefTensor::new(DType::BF16, &[1, 1, 3], vec![f64::INFINITY, 10.0, 100.0]);
    let outs = run_in_every_mode(|rt| {
        let ins = [tt(upload(rt, &x)), tt(upload(rt, &w))];
        vec![("out".into(), run(rt, g.op(false), &ins))]
    });
    assert_eq!(
        outs[0].1.data,
        [210.0, f64::INFINITY, f64::INFINITY, f64::INFINITY]
    );
}

#[test]
fn a_mirrored_convolution_is_the_input_gradient_of_the_plain_one() {
    // d/dx of sum(conv(x, w) * g) at stride 1 is the mirrored convolution of g by w with
    // padding span - 1 - padding: checked on one geometry against the gradient summed term by
    // term (each input element sums g times the weight over the outputs that read it).
    let g = &GEOS[4]; // 2-D 3x5 p(1,0)
    let mut rng = Rng::new(6);
    let w = rng.tensor(DType::F32, &g.w(false), 2.0, 0, false);
    let grad = rng.tensor(DType::F32, &g.out(), 2.0, 0, false);
    let gradient_padding: Vec<usize> = (0..g.kernel.len())
        .map(|i| g.dilation[i] * (g.kernel[i] - 1) - g.padding[i])
        .collect();
    let op = Op::Kernel(KernelOp::Conv(Box::new(Conv {
        padding: gradient_padding.as_slice().into(),
        ..g.conv(true)
    })));
    let outs = run_in_every_mode(|rt| {
        let ins = [tt(upload(rt, &grad)), tt(upload(rt, &w))];
        vec![("gx".into(), run(rt, op.clone(), &ins))]
    });
    let want = refk::conv_input_grad(&g.conv(false), &grad, &w, g.input);
    let tol = Tol {
        rel: 2f64.powi(-22),
        abs: 1e-5,
        scaled: 0.0,
    };
    compare("input gradient", &outs[0].1, &want, tol, None).unwrap();
}

#[test]
fn an_infinite_weight_multiplies_no_padding_in_the_forward_or_the_mirrored_convolution() {
    // x [1, 2, 3, 4], w [inf, 10, 100], padding 1: out[0] = 10 x[0] + 100 x[1] reads no x[-1],
    // so it is finite (as the reference's term-by-term sum, and CPU's kernels, which never read
    // padding), where the products' padded grid gave inf * 0 = NaN. Mirrored (the input
    // gradient's form), the taps reversed: out[3] = 10 x[3] + inf * x[4]... reads no x[4].
    let g = &GEOS[0];
    let x = RefTensor::new(DType::F32, &[1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    let w = RefTensor::new(DType::F32, &[1, 1, 3], vec![f64::INFINITY, 10.0, 100.0]);
    let outs = run_in_every_mode(|rt| {
        [false, true]
            .into_iter()
            .map(|mirrored| {
                let ins = [tt(upload(rt, &x)), tt(upload(rt, &w))];
                (
                    format!("mirrored {mirrored}"),
                    run(rt, g.op(mirrored), &ins),
                )
            })
            .collect()
    });
    assert_eq!(
        outs[0].1.data,
        [210.0, f64::INFINITY, f64::INFINITY, f64::INFINITY]
    );
    assert_eq!(
        outs[1].1.data,
        [f64::INFINITY, f64::INFINITY, f64::INFINITY, 340.0]
    );
    assert_eq!(
        refk::conv(&g.conv(false), &x, &w).data,
        outs[0].1.data,
        "the reference"
    );
}

#[test]
fn a_small_1d_convolution_has_the_hand_computed_values() {
    // x [1, 2, 3, 4], w [1, 10, 100], padding 1: out[o] = x[o-1] + 10 x[o] + 100 x[o+1].
    let g = &GEOS[0];
    let x = RefTensor::new(DType::F32, &[1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    let w = RefTensor::new(DType::F32, &[1, 1, 3], vec![1.0, 10.0, 100.0]);
    let outs = run_in_every_mode(|rt| {
        let ins = [tt(upload(rt, &x)), tt(upload(rt, &w))];
        vec![("out".into(), run(rt, g.op(false), &ins))]
    });
    let want = [210.0, 321.0, 432.0, 43.0];
    assert_eq!(outs[0].1.data, want);
    assert_eq!(
        refk::conv(&g.conv(false), &x, &w).data,
        want,
        "the reference"
    );
}

#[test]
fn the_weight_gradient_matches_the_reference_in_every_mode() {
    check_weight_grad(DType::F32);
}

#[test]
fn a_bfloat16_weight_gradient_is_summed_into_a_float32_result_in_every_mode() {
    check_weight_grad(DType::BF16);
}

/// The weight gradient of every geometry on operands of `dtype` (float32, or bfloat16 summed
/// into a float32 result), contiguous and strided, against the reference.
fn check_weight_grad(dtype: DType) {
    for (places, seed) in [
        ((Place::Contig, Place::Contig), 7),
        ((Place::Strided, Place::Transposed), 8),
    ] {
        let mut rng = Rng::new(seed);
        let operands: Vec<_> = GEOS
            .iter()
            .map(|g| {
                (
                    rng.tensor(dtype, &g.out(), 2.0, 0, false),
                    rng.tensor(dtype, &g.x(), 2.0, 0, false),
                )
            })
            .collect();
        let outs = run_in_every_mode(|rt| {
            GEOS.iter()
                .zip(&operands)
                .map(|(g, (grad, x))| {
                    let ins = [tt(place(rt, grad, places.0)), tt(place(rt, x, places.1))];
                    let op = Op::Kernel(KernelOp::Conv(Box::new(g.weight_grad())));
                    (g.name.to_string(), run(rt, op, &ins))
                })
                .collect()
        });
        let failures: Vec<String> = GEOS
            .iter()
            .zip(&operands)
            .zip(&outs)
            .filter_map(|((g, (grad, x)), (name, got))| {
                let k = g.weight_grad();
                let want = refk::conv_weight_grad(&k, grad, x);
                let scale = refk::conv_weight_grad(&k, &grad.abs_f64(), &x.abs_f64());
                let terms = g.out()[2..].iter().product::<usize>() * g.n;
                let tol = Tol {
                    rel: 2f64.powi(-24),
                    abs: 0.0,
                    scaled: 1.02 * terms as f64 * (2f64.powi(-24) + 2f64.powi(-53)),
                };
                assert_eq!(got.dtype, DType::F32, "{name}: the result is float32");
                compare(
                    &format!("{dtype} weight gradient {places:?} {name}"),
                    got,
                    &want,
                    tol,
                    Some(&scale),
                )
                .err()
            })
            .collect();
        assert_no_failures(&failures);
    }
}

/// The error recording conv on operands of `x` and `w` (shapes, dtypes) gives.
fn record_error(g: &Geo, x: (DType, &[usize]), w: (DType, &[usize])) -> String {
    let rt = Runtime::new(Default::default()).unwrap();
    let hx = tensor(&rt, x.0, x.1, &vec![0.0; x.1.iter().product()]);
    let hw = tensor(&rt, w.0, w.1, &vec![0.0; w.1.iter().product()]);
    match rt.op(0, g.op(false), &[tt(hx), tt(hw)], None) {
        Err(e @ Error::Op(_)) => e.to_string(),
        other => panic!("expected a record-time op error, got {other:?}"),
    }
}

#[test]
fn a_weight_of_another_channel_count_fails_at_record_naming_the_weight() {
    let e = record_error(
        &GEOS[2],
        (DType::F32, &[1, 16, 8, 8]),
        (DType::F32, &[4, 8, 3, 3]),
    );
    assert!(e.contains("conv") && e.contains("weight"), "{e}");
}

#[test]
fn a_bfloat16_gradient_with_a_float32_input_fails_at_record_naming_the_input() {
    let g = &GEOS[2];
    let rt = Runtime::new(Default::default()).unwrap();
    let grad = tensor(&rt, DType::BF16, &[1, 16, 16, 16], &vec![0.0; 16 * 256]);
    let x = tensor(&rt, DType::F32, &[1, 16, 16, 16], &vec![0.0; 16 * 256]);
    let op = Op::Kernel(KernelOp::Conv(Box::new(g.weight_grad())));
    match rt.op(0, op, &[tt(grad), tt(x)], None) {
        Err(e @ Error::Op(_)) => {
            let e = e.to_string();
            assert!(e.contains("input 1 (x)") && e.contains("bfloat16"), "{e}")
        }
        other => panic!("expected a record-time op error, got {other:?}"),
    }
}

#[test]
fn a_float16_input_fails_at_record_naming_the_dtype() {
    let e = record_error(
        &GEOS[2],
        (DType::F16, &[1, 16, 8, 8]),
        (DType::F16, &[4, 16, 3, 3]),
    );
    assert!(e.contains("float32"), "{e}");
}

#[test]
fn a_kernel_longer_than_the_padded_input_fails_at_record() {
    let e = record_error(
        &GEOS[5],
        (DType::F32, &[1, 3, 2, 8]),
        (DType::F32, &[4, 3, 3, 3]),
    );
    assert!(e.contains("spatial dim 0"), "{e}");
}
