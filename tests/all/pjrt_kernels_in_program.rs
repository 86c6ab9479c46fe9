//! Gather and scatter inside whole-program modules on the real XLA plugin: a step that picks a
//! loss's targets, looks up embeddings or accumulates their gradients stays one XLA program,
//! gives the CPU backend's values, and a bad index fails with the CPU backend's error at the
//! sync point, with no value computed from it reaching the host. Depthwise convolutions and
//! their gradients stay in the program too. Tests read `DEFERFUSE_PJRT_PLUGIN` and skip with a
//! message when it is not set.

use crate::harness::depthwise::ConvGeometry as Conv;
use crate::harness::{download, gather, plugin, scatter, upload, Rng};
use crate::reference::kernels as refk;
use crate::reference::RefTensor;
use deferfuse::fusion::ir::{DepthwisePart, ScatterReduce};
use deferfuse::{
    BackendKind, BinaryOp, DType, Error, Handle, Input, Mode, Op, ReduceOp, Runtime, Scalar, View,
};

use crate::pjrt_whole_program::runtime;

/// A CPU backend runtime and a PJRT one, both in defer mode.
fn both() -> Option<[Runtime; 2]> {
    let p = plugin()?;
    Some([
        runtime(BackendKind::Cpu, None, Mode::Defer),
        runtime(BackendKind::Pjrt, Some(p), Mode::Defer),
    ])
}

fn tensor(rt: &Runtime, dtype: DType, sizes: &[usize], vals: &[f64]) -> Handle {
    let bytes: Vec<u8> = match dtype {
        DType::F32 => vals
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect(),
        DType::I64 => vals
            .iter()
            .flat_map(|&v| (v as i64).to_le_bytes())
            .collect(),
        DType::I32 => vals
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect(),
        other => unreachable!("the tests use f32, i64 and i32, not {other}"),
    };
    rt.from_host(&bytes, dtype, sizes).expect("from_host")
}

fn op(rt: &Runtime, op: Op, ins: &[Input]) -> Handle {
    rt.op(0, op.clone(), ins, None)
        .unwrap_or_else(|e| panic!("{op}: {e}"))
}

fn read_f32(rt: &Runtime, h: Handle) -> Result<Vec<f32>, Error> {
    let n: usize = rt.sizes(h).expect("sizes").iter().product();
    let mut b = vec![0u8; n * 4];
    rt.to_host(h, &mut b)?;
    Ok(b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn t(h: Handle) -> Input {
    Input::Tensor(h)
}

fn f(v: f64) -> Input {
    Input::Scalar(Scalar::Float(v))
}

fn mul(rt: &Runtime, a: Input, b: Input) -> Handle {
    op(rt, Op::Binary(BinaryOp::Mul), &[a, b])
}

fn sum_all(rt: &Runtime, x: Handle) -> Handle {
    op(
        rt,
        Op::Reduce {
            op: ReduceOp::Sum,
            dims: Default::default(),
            keepdim: false,
        },
        &[t(x)],
    )
}

/// Runs `build` on both backends, reads what it returns, and checks the PJRT run was
/// `programs` XLA programs and its values are the CPU backend's.
fn same_values_in_programs(programs: u64, build: impl Fn(&Runtime) -> Vec<Handle>) {
    let Some([cpu, pj]) = both() else { return };
    let want: Vec<Vec<f32>> = build(&cpu)
        .into_iter()
        .map(|h| read_f32(&cpu, h).expect("cpu"))
        .collect();
    let outs = build(&pj);
    let before = pj.stats().programs_run;
    // One flush for all of it: a host read would end the first program at its value (see
    // `host_reads.rs`).
    pj.synchronize(0).expect("sync");
    let got: Vec<Vec<f32>> = outs
        .into_iter()
        .map(|h| read_f32(&pj, h).expect("pjrt"))
        .collect();
    assert_eq!(pj.stats().programs_run - before, programs, "XLA programs");
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.len(), g.len(), "result {k}: lengths");
        for (i, (a, b)) in w.iter().zip(g).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + a.abs()),
                "result {k}[{i}]: cpu {a}, pjrt {b}"
            );
        }
    }
}

#[test]
fn a_gather_between_elementwise_ops_is_part_of_one_program() {
    same_values_in_programs(1, |rt| {
        let x = tensor(
            rt,
            DType::F32,
            &[3, 4],
            &(0..12).map(f64::from).collect::<Vec<_>>(),
        );
        let idx = tensor(rt, DType::I64, &[3, 2], &[3.0, 0.0, 1.0, 1.0, 2.0, 3.0]);
        let y = mul(rt, t(x), f(2.0));
        let g = op(rt, gather(1), &[t(y), t(idx)]);
        let z = mul(rt, t(g), f(3.0));
        vec![z, sum_all(rt, z)]
    });
}

#[test]
fn an_index_select_through_a_broadcast_index_matches_the_cpu_backend() {
    // index_select's index is viewed with stride 0 along the other dims (no expanded copy).
    same_values_in_programs(1, |rt| {
        let w = tensor(
            rt,
            DType::F32,
            &[5, 3],
            &(0..15).map(f64::from).collect::<Vec<_>>(),
        );
        let ids = tensor(rt, DType::I32, &[4], &[4.0, 0.0, 4.0, 2.0]);
        let w2 = mul(rt, t(w), f(0.5));
        let ex = rt
            .view(
                0,
                ids,
                &View::AsStrided {
                    sizes: vec![4, 3],
                    strides: vec![1, 0],
                    offset: 0,
                },
            )
            .expect("view");
        let e = op(rt, gather(0), &[t(w2), t(ex)]);
        vec![mul(rt, t(e), f(1.0))]
    });
}

#[test]
fn scatter_sum_amax_and_amin_with_and_without_self_match_the_cpu_backend() {
    for reduce in [ScatterReduce::Sum, ScatterReduce::Amax, ScatterReduce::Amin] {
        for include_self in [true, false] {
            same_values_in_programs(1, |rt| {
                let base = tensor(rt, DType::F32, &[4, 3], &[1.0; 12]);
                let this = mul(rt, t(base), f(-2.0));
                // Duplicate targets combine; row 3 receives nothing and keeps its value.
                let idx = tensor(
                    rt,
                    DType::I64,
                    &[3, 3],
                    &[0., 1., 2., 0., 1., 0., 2., 2., 2.],
                );
                let src = tensor(
                    rt,
                    DType::F32,
                    &[3, 3],
                    &[5., -1., 3., 4., 7., -6., 2., 9., 0.5],
                );
                let s = mul(rt, t(src), f(1.5));
                let r = op(
                    rt,
                    scatter(0, reduce, include_self),
                    &[t(this), t(idx), t(s)],
                );
                vec![mul(rt, t(r), f(1.0))]
            });
        }
    }
}

#[test]
fn a_scatter_of_a_scalar_value_counts_like_the_cpu_backend() {
    // embedding's scale_grad_by_freq counts each index with a scalar scatter_add.
    same_values_in_programs(1, |rt| {
        let zeros = tensor(rt, DType::F32, &[6], &[0.0; 6]);
        let z = mul(rt, t(zeros), f(1.0));
        let idx = tensor(rt, DType::I64, &[5], &[1.0, 4.0, 1.0, 1.0, 0.0]);
        let c = op(
            rt,
            scatter(0, ScatterReduce::Sum, true),
            &[t(z), t(idx), f(1.0)],
        );
        vec![mul(rt, t(c), f(2.0))]
    });
}

fn assert_index_error(e: &Error, msg: &str) {
    assert!(matches!(e, Error::IndexOutOfBounds(_)), "{e:?}");
    assert_eq!(e.to_string(), msg);
}

/// A step whose gather reads `bad` in its second row: returns what the host may read.
fn step_with_index(rt: &Runtime, bad: f64) -> (Handle, Handle) {
    let x = tensor(rt, DType::F32, &[2, 5], &[1.0; 10]);
    let y = mul(rt, t(x), f(2.0));
    let idx = tensor(rt, DType::I64, &[2, 2], &[0.0, 4.0, bad, 9.0]);
    let g = op(rt, gather(1), &[t(y), t(idx)]);
    let loss = sum_all(rt, g);
    (g, loss)
}

#[test]
fn a_bad_index_in_a_program_fails_the_sync_point_with_the_cpu_backends_error() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let (g, loss) = step_with_index(rt, -3.0);
        // The first bad value in the host routine's order: -3 comes before 9.
        let msg = "gather: index -3 is out of bounds for dim 1 with size 5";
        assert_index_error(&read_f32(rt, loss).unwrap_err(), msg);
        assert_index_error(&read_f32(rt, g).unwrap_err(), msg);
        // The runtime stays usable and the error is not raised again by unrelated work.
        let (_, ok) = step_with_index(rt, 1.0);
        assert!(read_f32(rt, ok).is_err(), "9 is out of bounds too");
        let x = tensor(rt, DType::F32, &[2], &[1.0, 2.0]);
        assert_eq!(read_f32(rt, mul(rt, t(x), f(3.0))).unwrap(), [3.0, 6.0]);
    }
}

#[test]
fn only_values_computed_from_a_bad_index_fail() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let x = tensor(rt, DType::F32, &[2, 5], &[1.0; 10]);
        let y = mul(rt, t(x), f(2.0));
        let idx = tensor(rt, DType::I64, &[2, 1], &[0.0, 5.0]);
        let g = op(rt, gather(1), &[t(y), t(idx)]);
        let loss = sum_all(rt, g);
        // Recorded in the same flush, but not computed from the gather.
        let other = mul(rt, t(y), f(3.0));
        let msg = "gather: index 5 is out of bounds for dim 1 with size 5";
        assert_index_error(&read_f32(rt, loss).unwrap_err(), msg);
        assert_eq!(read_f32(rt, other).unwrap(), [6.0; 10]);
    }
}

#[test]
fn a_bad_scatter_index_fails_with_the_cpu_backends_error() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let this = tensor(rt, DType::F32, &[4], &[0.0; 4]);
        let z = mul(rt, t(this), f(1.0));
        let idx = tensor(rt, DType::I64, &[2], &[1.0, 4.0]);
        let r = op(
            rt,
            scatter(0, ScatterReduce::Sum, true),
            &[t(z), t(idx), f(1.0)],
        );
        let out = mul(rt, t(r), f(2.0));
        assert_index_error(
            &read_f32(rt, out).unwrap_err(),
            "scatter_reduce: index 4 is out of bounds for dim 0 with size 4",
        );
    }
}

/// Launches what is recorded and polls until it ran: the programs run, but no sync point
/// reads anything.
fn run_unread(rt: &Runtime) {
    while !rt.query_stream(0).expect("query") {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_programs_bounds_check_is_read_at_the_sync_point_that_needs_it_not_after_its_launch() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let x = tensor(&rt, DType::F32, &[2, 5], &[1.0; 10]);
    let idx = tensor(&rt, DType::I64, &[2, 1], &[0.0, 4.0]);
    let loss = sum_all(
        &rt,
        op(&rt, gather(1), &[t(mul(&rt, t(x), f(2.0))), t(idx)]),
    );
    let downloads = || rt.stats().backend.device_downloads;
    let before = downloads();
    run_unread(&rt);
    assert_eq!(downloads(), before, "the program ran and nothing came back");
    assert_eq!(read_f32(&rt, loss).unwrap(), [4.0]);
    assert_eq!(
        downloads() - before,
        2,
        "the check and the value, at the read"
    );
}

#[test]
fn a_value_computed_from_a_bad_index_before_a_sync_point_read_it_fails_where_it_is_read() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let (g, _) = step_with_index(&rt, 0.0);
    run_unread(&rt);
    // Recorded before any sync point read the check: it runs in a second program, and its
    // value carries the gather's error (the CPU backend refuses the op itself, its gather
    // having raised at launch; see the next test for what a sync point changes).
    let later = mul(&rt, t(g), f(2.0));
    let msg = "gather: index 9 is out of bounds for dim 1 with size 5";
    assert_index_error(&read_f32(&rt, later).unwrap_err(), msg);
}

#[test]
fn after_a_synchronize_an_op_on_a_value_from_a_bad_index_is_refused_as_on_the_cpu_backend() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let (g, _) = step_with_index(rt, 0.0);
        rt.synchronize(0)
            .expect("the failure is carried, not raised");
        let e = rt.op(0, Op::Binary(BinaryOp::Mul), &[t(g), f(2.0)], None);
        let msg = "gather: index 9 is out of bounds for dim 1 with size 5";
        assert_index_error(&e.unwrap_err(), msg);
    }
}

#[rustfmt::skip]
const CONVS: &[Conv] = &[
    Conv { name: "2-D 3x3 p1", n: 2, c: 5, input: &[7, 9], kernel: &[3, 3], stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1] },
    Conv { name: "2-D 7x7 p3 (ConvNeXt)", n: 2, c: 8, input: &[10, 9], kernel: &[7, 7], stride: &[1, 1], padding: &[3, 3], dilation: &[1, 1] },
    Conv { name: "2-D 3x3 s2 p1 (downsampling)", n: 2, c: 4, input: &[9, 8], kernel: &[3, 3], stride: &[2, 2], padding: &[1, 1], dilation: &[1, 1] },
    Conv { name: "2-D 5x5 s2 p2", n: 1, c: 3, input: &[8, 11], kernel: &[5, 5], stride: &[2, 2], padding: &[2, 2], dilation: &[1, 1] },
    Conv { name: "2-D 3x3 d2 p2", n: 1, c: 3, input: &[9, 9], kernel: &[3, 3], stride: &[1, 1], padding: &[2, 2], dilation: &[2, 2] },
    Conv { name: "2-D 3x5 s(2,1) p(1,2) d(1,2)", n: 2, c: 3, input: &[7, 10], kernel: &[3, 5], stride: &[2, 1], padding: &[1, 2], dilation: &[1, 2] },
    // Padding past the dilated kernel: the input gradient crops its spread gradient.
    Conv { name: "2-D 3x3 p3", n: 1, c: 2, input: &[4, 5], kernel: &[3, 3], stride: &[1, 1], padding: &[3, 3], dilation: &[1, 1] },
    // A stride above the kernel: some input positions are read by no output.
    Conv { name: "2-D 2x2 s3", n: 2, c: 2, input: &[8, 7], kernel: &[2, 2], stride: &[3, 3], padding: &[0, 0], dilation: &[1, 1] },
    Conv { name: "1-D k3 p1", n: 2, c: 3, input: &[11], kernel: &[3], stride: &[1], padding: &[1], dilation: &[1] },
    Conv { name: "1-D k5 s2 p3 d2", n: 2, c: 4, input: &[13], kernel: &[5], stride: &[2], padding: &[3], dilation: &[2] },
    Conv { name: "3-D 3x3x3 s(1,2,1) p1", n: 2, c: 3, input: &[4, 5, 3], kernel: &[3, 3, 3], stride: &[1, 2, 1], padding: &[1, 1, 1], dilation: &[1, 1, 1] },
];

/// The host operands of a convolution step at batch `n`: x, w, and the upstream gradient u.
struct ConvStep {
    x: RefTensor,
    w: RefTensor,
    u: RefTensor,
}

impl ConvStep {
    fn new(conv: &Conv, n: usize, dtype: DType, seed: u64) -> ConvStep {
        let mut rng = Rng::new(seed);
        let weight = [&[conv.c, 1][..], conv.kernel].concat();
        ConvStep {
            x: rng.tensor(dtype, &conv.lead(n, conv.input), 1.0, 0, false),
            w: rng.tensor(dtype, &weight, 1.0, 0, false),
            u: rng.tensor(dtype, &conv.lead(n, &conv.out_sizes()), 1.0, 0, false),
        }
    }

    /// Records a layer's forward and backward with elementwise ops around each part, so every
    /// part's operands and result are values inside the flush: `y = conv(1.5 x, w) * 2`,
    /// `gx = conv_input_grad(0.5 u, w) + 1.5 x`, `gw = conv_weight_grad(0.5 u, 1.5 x) * 3`.
    fn record(&self, rt: &Runtime, conv: &Conv) -> Vec<Handle> {
        let (x, w, u) = (
            upload(rt, &self.x),
            upload(rt, &self.w),
            upload(rt, &self.u),
        );
        let x2 = mul(rt, t(x), f(1.5));
        let y = op(rt, conv.op(DepthwisePart::Forward), &[t(x2), t(w)]);
        let g = mul(rt, t(u), f(0.5));
        let gx = op(rt, conv.op(DepthwisePart::InputGrad), &[t(g), t(w)]);
        let gw = op(rt, conv.op(DepthwisePart::WeightGrad), &[t(g), t(x2)]);
        vec![
            mul(rt, t(y), f(2.0)),
            op(rt, Op::Binary(BinaryOp::Add), &[t(gx), t(x2)]),
            mul(rt, t(gw), f(3.0)),
        ]
    }

    /// How far apart two backends' values of each result of [`ConvStep::record`] may be: each
    /// backend's sum of `terms` products is within `terms * u` of the sum of the terms'
    /// magnitudes (`u` the accumulation's unit roundoff, f32 for f16 and bf16), in any order;
    /// each rounds the part's result to the dtype, and the elementwise op's after it, once
    /// (half an ulp each; f16's subnormal step near zero).
    fn tolerances(&self, conv: &Conv) -> Vec<Vec<f64>> {
        let dtype = self.x.dtype;
        let scaled = |t: &RefTensor, s: f64| {
            let data = t.data.iter().map(|v| v * s).collect();
            RefTensor::new(dtype, &t.sizes, data)
        };
        let (x2, g) = (scaled(&self.x, 1.5), scaled(&self.u, 0.5));
        let (u_acc, u_dtype, tiny) = match dtype {
            DType::F64 => (2f64.powi(-53), 2f64.powi(-53), 0.0),
            DType::F32 => (2f64.powi(-24), 2f64.powi(-24), 0.0),
            DType::F16 => (2f64.powi(-24), 2f64.powi(-11), 2f64.powi(-24)),
            _ => (2f64.powi(-24), 2f64.powi(-8), 0.0),
        };
        let n = self.x.sizes[0];
        let taps: usize = conv.kernel.iter().product();
        let positions: usize = conv.out_sizes().iter().product();
        let parts = [
            (DepthwisePart::Forward, (&x2, &self.w), 2.0, taps, None),
            (
                DepthwisePart::InputGrad,
                (&g, &self.w),
                1.0,
                taps,
                Some(&x2),
            ),
            (
                DepthwisePart::WeightGrad,
                (&g, &x2),
                3.0,
                n * positions,
                None,
            ),
        ];
        parts
            .into_iter()
            .map(|(part, (a, b), factor, terms, plus)| {
                let k = conv.depthwise(part);
                let sum = refk::depthwise(&k, a, b);
                let magnitude = refk::depthwise(&k, &a.abs_f64(), &b.abs_f64());
                (0..sum.data.len())
                    .map(|i| {
                        let part = factor * sum.data[i];
                        let value = part + plus.map_or(0.0, |p| p.data[i]);
                        let accumulation = 2.05 * terms as f64 * u_acc * factor * magnitude.data[i];
                        let roundings = 2.1 * u_dtype * (part.abs() + value.abs());
                        accumulation + roundings + 4.0 * tiny
                    })
                    .collect()
            })
            .collect()
    }
}

/// Asserts `got`'s values (PJRT's) are within `tol` of `want`'s (the CPU backend's).
fn assert_within(what: &str, want: &[RefTensor], got: &[RefTensor], tol: &[Vec<f64>]) {
    for (k, ((w, g), tol)) in want.iter().zip(got).zip(tol).enumerate() {
        assert_eq!(w.sizes, g.sizes, "{what}: result {k}'s sizes");
        for (i, ((a, b), tol)) in w.data.iter().zip(&g.data).zip(tol).enumerate() {
            assert!(
                (a - b).abs() <= *tol,
                "{what}: result {k}[{i}]: cpu {a}, pjrt {b} (tolerance {tol:e})"
            );
        }
    }
}

/// Runs `conv`'s step at batch `n` on both backends and checks the PJRT flush was one XLA
/// program, with no cut (the convolution did not run as a host routine), of the CPU
/// backend's values.
fn conv_step_is_one_program(rts: &[Runtime; 2], conv: &Conv, n: usize, dtype: DType, seed: u64) {
    let what = format!("{} {dtype} batch {n}", conv.name);
    let step = ConvStep::new(conv, n, dtype, seed);
    let [cpu, pj] = rts;
    let outs = step.record(cpu, conv);
    let want: Vec<RefTensor> = outs.iter().map(|&h| download(cpu, h)).collect();
    let outs = step.record(pj, conv);
    let (runs, cuts) = (pj.stats().programs_run, pj.stats().cuts);
    pj.synchronize(0).expect("sync");
    let got: Vec<RefTensor> = outs.iter().map(|&h| download(pj, h)).collect();
    assert_eq!(pj.stats().programs_run - runs, 1, "{what}: XLA programs");
    assert_eq!(pj.stats().cuts, cuts, "{what}: cuts");
    assert_within(&what, &want, &got, &step.tolerances(conv));
    for h in outs {
        pj.release(h).expect("release");
    }
}

#[test]
fn depthwise_convolutions_and_their_gradients_stay_in_the_flushs_program() {
    let Some(rts) = both() else { return };
    for (k, conv) in CONVS.iter().enumerate() {
        conv_step_is_one_program(&rts, conv, conv.n, DType::F32, k as u64 + 1);
    }
}

#[test]
fn f64_f16_and_bf16_depthwise_convolutions_stay_in_the_flushs_program() {
    let Some(rts) = both() else { return };
    for dtype in [DType::F64, DType::F16, DType::BF16] {
        for (k, conv) in [&CONVS[0], &CONVS[5], &CONVS[9]].into_iter().enumerate() {
            conv_step_is_one_program(&rts, conv, conv.n, dtype, 100 + k as u64);
        }
    }
}

#[test]
fn a_depthwise_step_whose_batch_changes_runs_its_buckets_module() {
    let Some(rts) = both() else { return };
    let conv = &CONVS[2];
    let mut compiles = Vec::new();
    // 8 compiles its exact module; 6 finds the batch and compiles bucket 8's, whose padded
    // samples must add nothing to the weight gradient; 5 runs bucket 8's module as it is.
    for (k, n) in [8, 6, 5].into_iter().enumerate() {
        let before = rts[1].stats().programs_compiled;
        conv_step_is_one_program(&rts, conv, n, DType::F32, 200 + k as u64);
        compiles.push(rts[1].stats().programs_compiled - before);
    }
    assert_eq!(compiles[2], 0, "compiles per step: {compiles:?}");
}
