//! The depthwise convolution kernel op (`KernelOp::Depthwise`): its forward, input gradient and
//! weight gradient against the reference in `reference/kernels.rs`, in strict, debug and defer
//! mode (which must agree bit for bit), over 1-D, 2-D and 3-D geometries, float dtypes and
//! operand layouts; the planner's cut around it; and its record-time errors.

use crate::harness;
use crate::reference;

use deferfuse::fusion::ir::{Depthwise, DepthwisePart, KernelOp};
use deferfuse::fusion::plan::CutReason;
use deferfuse::{BinaryOp, DType, Error, Handle, Input, Mode, Op, Runtime, Scalar, UnaryOp, View};
use harness::depthwise::ConvGeometry as Geo;
use harness::*;
use reference::kernels as refk;
use reference::views::{self as rv, RefLayout};
use reference::{apply, Arg, RefTensor};

const PARTS: [DepthwisePart; 3] = DepthwisePart::ALL;

#[rustfmt::skip]
const GEOS: &[Geo] = &[
    Geo { name: "1-D k3 p1", n: 2, c: 3, input: &[9], kernel: &[3], stride: &[1], padding: &[1], dilation: &[1] },
    Geo { name: "1-D k5 s2 p3 d2", n: 1, c: 4, input: &[11], kernel: &[5], stride: &[2], padding: &[3], dilation: &[2] },
    Geo { name: "2-D 3x3 p1", n: 2, c: 5, input: &[6, 7], kernel: &[3, 3], stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1] },
    Geo { name: "2-D 3x3 s2 p1 (downsampling)", n: 1, c: 4, input: &[9, 8], kernel: &[3, 3], stride: &[2, 2], padding: &[1, 1], dilation: &[1, 1] },
    Geo { name: "2-D 7x7 p3, 48 channels (ConvNeXt)", n: 1, c: 48, input: &[8, 8], kernel: &[7, 7], stride: &[1, 1], padding: &[3, 3], dilation: &[1, 1] },
    Geo { name: "2-D 7x7 p3 on 16x16, N=2", n: 2, c: 3, input: &[16, 16], kernel: &[7, 7], stride: &[1, 1], padding: &[3, 3], dilation: &[1, 1] },
    // 20 channels on rows of 17: whole 8x8 tiles, a row's leftover positions and leftover
    // channels, all copied their own way.
    Geo { name: "2-D 3x3 p1, 20 channels on 9x17", n: 2, c: 20, input: &[9, 17], kernel: &[3, 3], stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1] },
    // The input gradient spreads a strided gradient over 12 channels (tiles, scaled placement).
    Geo { name: "2-D 5x5 s2 p2, 12 channels on 11x10", n: 1, c: 12, input: &[11, 10], kernel: &[5, 5], stride: &[2, 2], padding: &[2, 2], dilation: &[1, 1] },
    // Inner outputs read taps outside the input on both sides at once.
    Geo { name: "2-D 7x7 p3 on 5x6", n: 2, c: 3, input: &[5, 6], kernel: &[7, 7], stride: &[1, 1], padding: &[3, 3], dilation: &[1, 1] },
    Geo { name: "2-D 5x5 p2, N=3", n: 3, c: 2, input: &[5, 6], kernel: &[5, 5], stride: &[1, 1], padding: &[2, 2], dilation: &[1, 1] },
    Geo { name: "2-D 5x5 p0", n: 2, c: 3, input: &[7, 9], kernel: &[5, 5], stride: &[1, 1], padding: &[0, 0], dilation: &[1, 1] },
    Geo { name: "2-D 3x5 s(2,1) p(1,2)", n: 2, c: 3, input: &[7, 6], kernel: &[3, 5], stride: &[2, 1], padding: &[1, 2], dilation: &[1, 1] },
    Geo { name: "2-D 1x4 s(1,3) p(0,1) d(1,2)", n: 1, c: 2, input: &[3, 10], kernel: &[1, 4], stride: &[1, 3], padding: &[0, 1], dilation: &[1, 2] },
    // A stride above the kernel: some input positions are read by no output.
    Geo { name: "2-D 2x2 s3 p0", n: 2, c: 2, input: &[8, 7], kernel: &[2, 2], stride: &[3, 3], padding: &[0, 0], dilation: &[1, 1] },
    Geo { name: "2-D 3x3 d2 p2", n: 1, c: 3, input: &[7, 7], kernel: &[3, 3], stride: &[1, 1], padding: &[2, 2], dilation: &[2, 2] },
    // The border outputs read nothing but padding.
    Geo { name: "2-D 3x3 p3", n: 1, c: 2, input: &[4, 4], kernel: &[3, 3], stride: &[1, 1], padding: &[3, 3], dilation: &[1, 1] },
    Geo { name: "2-D 3x3 p1 on 1x6", n: 2, c: 3, input: &[1, 6], kernel: &[3, 3], stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1] },
    Geo { name: "3-D 3x3x3 s(1,2,1) p1", n: 2, c: 3, input: &[4, 5, 3], kernel: &[3, 3, 3], stride: &[1, 2, 1], padding: &[1, 1, 1], dilation: &[1, 1, 1] },
    Geo { name: "3-D 2x3x1 p(0,1,0) d(2,1,1)", n: 1, c: 2, input: &[5, 4, 3], kernel: &[2, 3, 1], stride: &[1, 1, 1], padding: &[0, 1, 0], dilation: &[2, 1, 1] },
];

impl Geo {
    /// The output's shape `[N, C, out...]`.
    fn out(&self) -> Vec<usize> {
        self.lead(self.n, &self.out_sizes())
    }

    /// Random operands of `part` (values in [-2, 2], a quarter multiples of 0.5, some zeros).
    fn operands(&self, part: DepthwisePart, dtype: DType, rng: &mut Rng) -> (RefTensor, RefTensor) {
        let (a, b) = match part {
            DepthwisePart::Forward => (self.lead(self.n, self.input), self.weight()),
            DepthwisePart::InputGrad => (self.out(), self.weight()),
            DepthwisePart::WeightGrad => (self.out(), self.lead(self.n, self.input)),
        };
        (
            rng.tensor(dtype, &a, 2.0, 0, false),
            rng.tensor(dtype, &b, 2.0, 0, false),
        )
    }

    /// The most terms any result element sums: the taps (forward; the input gradient, which
    /// sums at most one term per tap), or every sample's output positions (weight gradient).
    fn terms(&self, part: DepthwisePart) -> usize {
        match part {
            DepthwisePart::WeightGrad => self.out()[2..].iter().product::<usize>() * self.n,
            _ => self.kernel.iter().product(),
        }
    }
}

/// The allowed difference from the reference for sums of at most `terms` products of `dtype`
/// operands, `u` being a unit roundoff (half an ulp): the runtime accumulates in f32 (f64 for
/// f64) in an order of its own, within `terms * u_acc` of the sum of the terms' magnitudes for
/// any order (the dot product bound, product roundings included); the f64 reference errs by
/// `terms * 2^-53` of it; both round the result to the dtype once, so they may be an ulp of
/// the dtype apart (`rel`: u for f32 and f64, whose runtime result is not rounded again; 2u for
/// f16 and bf16), plus f16's subnormal step. The 2% covers second-order terms. For an f32 7x7
/// forward that is `rel` 6e-8 and 3e-6 of the sum of |terms|.
fn tol(dtype: DType, terms: usize) -> Tol {
    let u_acc = if dtype == DType::F64 {
        2f64.powi(-53)
    } else {
        2f64.powi(-24)
    };
    let (rel, abs) = match dtype {
        DType::F64 => (2f64.powi(-53), 0.0),
        DType::F32 => (2f64.powi(-24), 0.0),
        DType::F16 => (2f64.powi(-10), 2f64.powi(-24)),
        _ => (2f64.powi(-7), 0.0),
    };
    Tol {
        rel,
        abs,
        scaled: 1.02 * terms as f64 * (u_acc + 2f64.powi(-53)),
    }
}

/// Compares `got`, the result of `part` of `g` on `a` and `b`, with the reference.
fn against_reference(
    ctx: &str,
    g: &Geo,
    part: DepthwisePart,
    (a, b): &(RefTensor, RefTensor),
    got: &RefTensor,
) -> Result<(), String> {
    let k = g.depthwise(part);
    let want = refk::depthwise(&k, a, b);
    let scale = refk::depthwise(&k, &a.abs_f64(), &b.abs_f64());
    let tol = tol(a.dtype, g.terms(part));
    compare(ctx, got, &want, tol, Some(&scale))
}

/// Runs `part` of each geometry on random contiguous operands of `dtype` in every mode (which
/// must agree bit for bit) and checks each result against the reference.
fn check_part(part: DepthwisePart, dtype: DType, geos: &[Geo], seed: u64) {
    let mut rng = Rng::new(seed);
    let operands: Vec<_> = geos
        .iter()
        .map(|g| g.operands(part, dtype, &mut rng))
        .collect();
    let outs = run_in_every_mode(|rt| {
        geos.iter()
            .zip(&operands)
            .map(|(g, (a, b))| {
                let ins = [tt(upload(rt, a)), tt(upload(rt, b))];
                (g.name.to_string(), run(rt, g.op(part), &ins))
            })
            .collect()
    });
    let failures: Vec<String> = geos
        .iter()
        .zip(&operands)
        .zip(&outs)
        .filter_map(|((g, ab), (name, got))| {
            against_reference(&format!("{part:?} {dtype} {name}"), g, part, ab, got).err()
        })
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn a_small_1d_convolution_and_its_gradients_have_the_hand_computed_values() {
    // x [1, 2, 3, 4], w [1, 10, 100], padding 1: out[o] = x[o-1] + 10 x[o] + 100 x[o+1].
    let g = Geo {
        name: "1-D k3 p1 on 4",
        n: 1,
        c: 1,
        input: &[4],
        ..GEOS[0]
    };
    let one = |sizes: &[usize], v: &[f64]| RefTensor::new(DType::F32, sizes, v.to_vec());
    let x = one(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let w = one(&[1, 1, 3], &[1.0, 10.0, 100.0]);
    let ones = one(&[1, 1, 4], &[1.0; 4]);
    let outs = run_in_every_mode(|rt| {
        let (hx, hw, h1) = (upload(rt, &x), upload(rt, &w), upload(rt, &ones));
        vec![
            (
                "out".into(),
                run(rt, g.op(DepthwisePart::Forward), &[tt(hx), tt(hw)]),
            ),
            (
                "gx".into(),
                run(rt, g.op(DepthwisePart::InputGrad), &[tt(h1), tt(hw)]),
            ),
            (
                "gw".into(),
                run(rt, g.op(DepthwisePart::WeightGrad), &[tt(h1), tt(hx)]),
            ),
        ]
    });
    let want: [(&[f64], _, _); 3] = [
        (
            &[210.0, 321.0, 432.0, 43.0],
            (&x, &w),
            DepthwisePart::Forward,
        ),
        (
            &[11.0, 111.0, 111.0, 110.0],
            (&ones, &w),
            DepthwisePart::InputGrad,
        ),
        (&[6.0, 10.0, 9.0], (&ones, &x), DepthwisePart::WeightGrad),
    ];
    for ((name, got), (values, (a, b), part)) in outs.iter().zip(want) {
        assert_eq!(got.data, values, "{name}");
        assert_eq!(
            refk::depthwise(&g.depthwise(part), a, b).data,
            values,
            "{name}: the reference"
        );
    }
}

#[test]
fn the_forward_matches_the_reference_in_every_mode() {
    check_part(DepthwisePart::Forward, DType::F32, GEOS, 1);
}

#[test]
fn the_input_gradient_matches_the_reference_in_every_mode() {
    check_part(DepthwisePart::InputGrad, DType::F32, GEOS, 2);
}

#[test]
fn the_weight_gradient_matches_the_reference_in_every_mode() {
    check_part(DepthwisePart::WeightGrad, DType::F32, GEOS, 3);
}

#[test]
fn float64_operands_give_a_float64_result_within_its_rounding() {
    for (i, part) in PARTS.into_iter().enumerate() {
        check_part(part, DType::F64, GEOS, 10 + i as u64);
    }
}

#[test]
fn float16_and_bfloat16_operands_accumulate_in_f32_and_round_once() {
    for (i, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        for (j, part) in PARTS.into_iter().enumerate() {
            check_part(part, dtype, GEOS, 20 + 3 * i as u64 + j as u64);
        }
    }
}

/// How an operand is laid out in the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// One of the harness's placements (contiguous, every other element, last two dims
    /// transposed).
    Placed(Place),
    /// Dim 1 (the channels) innermost in storage, read through a permuted view (channels-last).
    ChannelsLast,
    /// A slice of a larger buffer: channels from 1 and the last dim from 2, garbage around.
    Cropped,
}

const LAYOUTS: [Layout; 5] = [
    Layout::Placed(Place::Contig),
    Layout::Placed(Place::Strided),
    Layout::Placed(Place::Transposed),
    Layout::ChannelsLast,
    Layout::Cropped,
];

/// A runtime view whose elements equal `t`, laid out as `layout` says.
fn lay_out(rt: &Runtime, t: &RefTensor, layout: Layout) -> Handle {
    let r = t.rank();
    match layout {
        Layout::Placed(p) => place(rt, t, p),
        Layout::ChannelsLast => {
            // Storage [d0, d2, ..., d1]; the permutation back puts storage dim r-1 at 1.
            let to: Vec<usize> = [&[0][..], &(2..r).collect::<Vec<_>>(), &[1]].concat();
            let back: Vec<i64> = [
                &[0, r as i64 - 1][..],
                &(1..r as i64 - 1).collect::<Vec<_>>(),
            ]
            .concat();
            let base = upload(rt, &rv::view(t, |l| l.permute(&to)));
            let h = view(rt, base, View::Permute(back));
            rt.release(base).unwrap();
            h
        }
        Layout::Cropped => {
            let (c, last) = (t.sizes[1], t.sizes[r - 1]);
            let mut big = t.sizes.clone();
            big[1] += 3;
            big[r - 1] += 3;
            let mut data = vec![-1234.5; big.iter().product()];
            let crop = RefLayout::contiguous(&big)
                .slice(1, 1, 1 + c as i64, 1)
                .slice(-1, 2, 2 + last as i64, 1);
            for (p, &v) in crop.positions().into_iter().zip(&t.data) {
                data[p] = v;
            }
            let base = upload(rt, &RefTensor::new(t.dtype, &big, data));
            let slice = |dim, start: usize, len: usize| View::Slice {
                dim,
                start: start as i64,
                end: (start + len) as i64,
                step: 1,
            };
            let h = view(rt, base, slice(1, 1, c));
            let h2 = view(rt, h, slice(-1, 2, last));
            rt.release(base).unwrap();
            rt.release(h).unwrap();
            h2
        }
    }
}

#[test]
fn non_contiguous_operands_give_the_values_of_contiguous_ones() {
    let mut rng = Rng::new(30);
    let geos: Vec<&Geo> = [0, 1, 4, 9, 15].iter().map(|&i| &GEOS[i]).collect();
    let mut cases = Vec::new();
    for g in &geos {
        for part in PARTS {
            cases.push((*g, part, g.operands(part, DType::F32, &mut rng)));
        }
    }
    let outs = run_in_every_mode(|rt| {
        let mut outs = Vec::new();
        for (g, part, (a, b)) in &cases {
            for la in LAYOUTS {
                let ins = [tt(lay_out(rt, a, la)), tt(lay_out(rt, b, la))];
                let name = format!("{part:?} {} {la:?}", g.name);
                outs.push((name, run(rt, g.op(*part), &ins)));
            }
        }
        outs
    });
    let mut failures = Vec::new();
    for ((g, part, ab), outs) in cases.iter().zip(outs.chunks(LAYOUTS.len())) {
        let (contig, got) = (&outs[0].1, &outs[1..]);
        failures.extend(against_reference(&outs[0].0, g, *part, ab, contig).err());
        for (name, got) in got {
            failures.extend(compare(name, got, contig, EXACT, None).err());
        }
    }
    assert_no_failures(&failures);
}

#[test]
fn in_defer_mode_elementwise_ops_fuse_on_either_side_of_the_cut_and_equal_strict() {
    // relu(conv(2 x + 1, w)) * 0.5, the intermediates released.
    let g = &GEOS[2];
    let mut rng = Rng::new(40);
    let (x, w) = g.operands(DepthwisePart::Forward, DType::F32, &mut rng);
    let prog = |rt: &Runtime| {
        let (hx, hw) = (upload(rt, &x), upload(rt, &w));
        let a = bin(rt, BinaryOp::Mul, tt(hx), fs(2.0));
        let b = bin(rt, BinaryOp::Add, tt(a), fs(1.0));
        let y = run(rt, g.op(DepthwisePart::Forward), &[tt(b), tt(hw)]);
        let r = un(rt, UnaryOp::Relu, y);
        let z = bin(rt, BinaryOp::Mul, tt(r), fs(0.5));
        for h in [hx, hw, a, b, y, r] {
            rt.release(h).unwrap();
        }
        z
    };
    let outs = run_in_every_mode(|rt| vec![("z".into(), prog(rt))]);

    let rt = runtime(Mode::Defer);
    let z = prog(&rt);
    assert_eq!(download(&rt, z), outs[0].1, "defer equals strict");
    let st = rt.stats();
    assert!(st.cuts[CutReason::Unfusable as usize] >= 1, "{st:?}");
    // `2 x` and the relu stay in registers: the ops before and after fused with their
    // neighbours; the conv's input and output are in memory.
    assert_eq!(st.unmaterialized, 2, "{st:?}");

    let ew = |op, a: &RefTensor, s: f64| apply(&op, &[Arg::T(a), Arg::S(Scalar::Float(s))]);
    let b = ew(
        Op::Binary(BinaryOp::Add),
        &ew(Op::Binary(BinaryOp::Mul), &x, 2.0),
        1.0,
    );
    let y = refk::depthwise(&g.depthwise(DepthwisePart::Forward), &b, &w);
    let relu = apply(&Op::Unary(UnaryOp::Relu), &[Arg::T(&y)]);
    let want = ew(Op::Binary(BinaryOp::Mul), &relu, 0.5);
    let scale = refk::depthwise(
        &g.depthwise(DepthwisePart::Forward),
        &b.abs_f64(),
        &w.abs_f64(),
    );
    let tol = tol(DType::F32, g.terms(DepthwisePart::Forward));
    compare("relu(conv) * 0.5", &outs[0].1, &want, tol, Some(&scale))
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn bad_operands_fail_at_the_call_naming_the_operand_in_every_mode() {
    let conv = |part, k: usize, s: usize, p: usize, input: &[usize]| {
        Op::Kernel(KernelOp::Depthwise(Box::new(Depthwise {
            part,
            kernel: [k, k][..].into(),
            stride: [s, s][..].into(),
            padding: [p, p][..].into(),
            dilation: [1, 1][..].into(),
            input: input.into(),
        })))
    };
    let fwd = conv(DepthwisePart::Forward, 3, 1, 1, &[]);
    for mode in MODES {
        let rt = runtime(mode);
        let t = |dtype, sizes: &[usize]| {
            let n = sizes.iter().product();
            tt(upload(&rt, &RefTensor::new(dtype, sizes, vec![1.0; n])))
        };
        let f32s = |sizes: &[usize]| t(DType::F32, sizes);
        let cases: Vec<(Op, Vec<Input>, &str)> = vec![
            (
                fwd.clone(),
                vec![f32s(&[2, 8, 6, 6]), f32s(&[4, 1, 3, 3])],
                "depthwise_conv: input 1 (weight): expected shape [8, 1, 3, 3], got shape [4, 1, 3, 3]",
            ),
            (
                fwd.clone(),
                vec![f32s(&[2, 8, 6, 6]), f32s(&[8, 3, 3])],
                "depthwise_conv: input 1 (weight): expected shape [8, 1, 3, 3], got shape [8, 3, 3]",
            ),
            (
                fwd.clone(),
                vec![f32s(&[8, 6, 6]), f32s(&[8, 1, 3, 3])],
                "depthwise_conv: input 0 (x): expected 4 dims [N, C, 2 spatial], got shape [8, 6, 6]",
            ),
            (
                fwd.clone(),
                vec![f32s(&[2, 8, 6, 6]), t(DType::F64, &[8, 1, 3, 3])],
                "depthwise_conv: input 1 (weight): expected dtype float32 (the dtype of input 0), got dtype float64",
            ),
            (
                fwd.clone(),
                vec![t(DType::I64, &[2, 8, 6, 6]), t(DType::I64, &[8, 1, 3, 3])],
                "depthwise_conv: input 0 (x): expected a floating dtype, got dtype int64",
            ),
            (
                conv(DepthwisePart::Forward, 7, 1, 0, &[]),
                vec![f32s(&[1, 2, 5, 9]), f32s(&[2, 1, 7, 7])],
                "depthwise_conv: geometry: expected a padded input at least as long as the dilated kernel in spatial dim 0",
            ),
            (
                conv(DepthwisePart::InputGrad, 3, 2, 1, &[15, 16]),
                vec![f32s(&[2, 8, 7, 8]), f32s(&[8, 1, 3, 3])],
                "depthwise_conv: input 0 (grad): expected shape [2, 8, 8, 8], got shape [2, 8, 7, 8]",
            ),
            (
                conv(DepthwisePart::WeightGrad, 3, 1, 1, &[]),
                vec![f32s(&[2, 8, 6, 6]), f32s(&[3, 8, 6, 6])],
                "depthwise_conv: input 1 (x): expected batch and channels [2, 8], got shape [3, 8, 6, 6]",
            ),
            (
                conv(DepthwisePart::Forward, 3, 0, 1, &[]),
                vec![f32s(&[2, 8, 6, 6]), f32s(&[8, 1, 3, 3])],
                "depthwise_conv: geometry: expected 1 to 3 spatial dims",
            ),
        ];
        for (op, ins, msg) in cases {
            let e = rt.op(0, op, &ins, None).unwrap_err();
            assert!(matches!(e, Error::Op(_)), "{e:?}");
            assert!(
                e.to_string().starts_with(msg),
                "{mode:?}: {e}\n  should start with {msg}"
            );
        }
    }
}
