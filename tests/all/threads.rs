//! Multithreaded execution: a program split over several threads computes exactly what one
//! thread computes (bit for bit), in strict and defer mode, whatever the loop's shape: one long
//! row cut into pieces, rows of strided or broadcast views, walked outer dims, row kernels,
//! full reductions, matmul with and without a fused epilogue (whole and in blocks of few rows;
//! f32, bf16 and f16),
//! in-place writes, depthwise convolutions split by channels, dense convolutions by samples
//! (their weight gradients by input channels), grouped products by row windows, LSTM, GRU and
//! RNN steps by samples.
//! Sizes are above the backend's serial threshold so the work really is split.

use crate::harness;

use deferfuse::*;
use harness::{bin, red, run, tensor, tt, un, view, Rng};

const SPLIT: usize = deferfuse::runtime::backend::cpu::SERIAL_BELOW * 3 + 17;

fn runtime(mode: Mode, threads: usize) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        num_threads: threads,
        ..Default::default()
    })
    .expect("runtime")
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.float(3.0, false)).collect()
}

/// Runs `prog` with 1 and 3 threads in strict and defer mode; every output must be equal.
fn same_on_any_thread_count(prog: impl Fn(&Runtime) -> Vec<Handle>) {
    let mut runs = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        for threads in [1, 3] {
            let rt = runtime(mode, threads);
            assert_eq!(rt.threads(), threads);
            let outs: Vec<_> = prog(&rt)
                .into_iter()
                .map(|h| harness::read_raw(&rt, h))
                .collect();
            runs.push((format!("{mode:?}, {threads} threads"), outs));
        }
    }
    let (first, want) = &runs[0];
    for (name, got) in &runs[1..] {
        for (i, (w, g)) in want.iter().zip(got).enumerate() {
            assert!(w == g, "output {i}: {name} differs from {first}");
        }
    }
}

#[test]
fn one_long_row_split_into_pieces_equals_one_thread() {
    same_on_any_thread_count(|rt| {
        let a = tensor(rt, DType::F32, &[SPLIT], &values(SPLIT, 1));
        let b = tensor(rt, DType::F32, &[SPLIT], &values(SPLIT, 2));
        let x = bin(rt, BinaryOp::Mul, tt(a), tt(b));
        let y = un(rt, UnaryOp::Tanh, x);
        vec![bin(rt, BinaryOp::Add, tt(y), tt(a))]
    });
}

#[test]
fn one_long_row_matches_a_plain_loop() {
    let rt = runtime(Mode::Defer, 3);
    let (va, vb) = (values(SPLIT, 3), values(SPLIT, 4));
    let a = tensor(&rt, DType::F32, &[SPLIT], &va);
    let b = tensor(&rt, DType::F32, &[SPLIT], &vb);
    let x = bin(&rt, BinaryOp::Mul, tt(a), tt(b));
    let y = bin(&rt, BinaryOp::Sub, tt(x), tt(a));
    let (_, _, bytes) = harness::read_raw(&rt, y);
    for (i, c) in bytes.chunks(4).enumerate() {
        let want = (va[i] as f32) * (vb[i] as f32) - va[i] as f32;
        assert_eq!(
            f32::from_le_bytes(c.try_into().unwrap()),
            want,
            "element {i}"
        );
    }
}

#[test]
fn rows_of_transposed_views_equal_one_thread() {
    same_on_any_thread_count(|rt| {
        let a = tensor(rt, DType::F32, &[300, 600], &values(180_000, 5));
        let at = view(rt, a, View::Transpose(0, 1));
        let b = tensor(rt, DType::F32, &[600, 300], &values(180_000, 6));
        let x = bin(rt, BinaryOp::Mul, tt(at), tt(b));
        vec![un(rt, UnaryOp::Exp, x)]
    });
}

#[test]
fn walked_outer_dims_with_broadcasts_equal_one_thread() {
    same_on_any_thread_count(|rt| {
        let a = tensor(rt, DType::F32, &[40, 50, 70], &values(140_000, 7));
        let a = view(
            rt,
            a,
            View::Slice {
                dim: 2,
                start: 1,
                end: 70,
                step: 2,
            },
        );
        let b = tensor(rt, DType::F32, &[50, 1], &values(50, 8));
        vec![bin(rt, BinaryOp::Add, tt(a), tt(b))]
    });
}

#[test]
fn row_kernels_equal_one_thread() {
    same_on_any_thread_count(|rt| {
        let x = tensor(rt, DType::F32, &[700, 300], &values(210_000, 9));
        let m = run(rt, red(ReduceOp::Amax, &[1], true), &[tt(x)]);
        let d = bin(rt, BinaryOp::Sub, tt(x), tt(m));
        let e = un(rt, UnaryOp::Exp, d);
        let s = run(rt, red(ReduceOp::Sum, &[1], true), &[tt(e)]);
        vec![bin(rt, BinaryOp::Div, tt(e), tt(s))]
    });
}

#[test]
fn reductions_over_leading_dims_and_everything_equal_one_thread() {
    same_on_any_thread_count(|rt| {
        let x = tensor(rt, DType::F32, &[400, 300], &values(120_000, 10));
        let cols = run(rt, red(ReduceOp::Sum, &[0], false), &[tt(x)]);
        let all = run(rt, red(ReduceOp::Mean, &[0, 1], false), &[tt(x)]);
        vec![cols, all]
    });
}

/// An nn.Linear's weight as `x @ W.t()` reads it (a transposed view of `[out, in]`) and its
/// bias, from seeds `seed` and `seed + 1`.
fn linear_weight(rt: &Runtime, out: usize, inp: usize, seed: u64) -> (Handle, Handle) {
    let w = tensor(rt, DType::F32, &[out, inp], &values(out * inp, seed));
    let bias = tensor(rt, DType::F32, &[out], &values(out, seed + 1));
    (view(rt, w, View::Transpose(0, 1)), bias)
}

/// `x @ w` twice: once alone, once followed by `+ bias` and ReLU (an epilogue the GEMM may
/// fuse, which it can only while its own product is not also kept).
fn product_alone_and_with_bias_relu(
    rt: &Runtime,
    x: Handle,
    w: Handle,
    bias: Handle,
) -> [Handle; 2] {
    let plain = run(rt, Op::Matmul, &[tt(x), tt(w)]);
    let y = run(rt, Op::Matmul, &[tt(x), tt(w)]);
    let y = bin(rt, BinaryOp::Add, tt(y), tt(bias));
    [plain, un(rt, UnaryOp::Relu, y)]
}

#[test]
fn matmul_with_and_without_epilogue_equals_one_thread() {
    same_on_any_thread_count(|rt| {
        let x = tensor(rt, DType::F32, &[300, 200], &values(60_000, 11));
        let w = tensor(rt, DType::F32, &[200, 150], &values(30_000, 12));
        let bias = tensor(rt, DType::F32, &[150], &values(150, 13));
        product_alone_and_with_bias_relu(rt, x, w, bias).to_vec()
    });
}

#[test]
fn bf16_and_f16_products_split_by_rows_or_columns_equal_one_thread() {
    // 300 rows split by rows, 24 and 20 by columns, 131 into an epilogue's row blocks of
    // 128 + 3 on one thread and by columns on three; bf16 takes the pair-dot-product kernel on
    // AVX512-BF16 cores whatever a block's rows (its sums in k order alone; half_gemm's test
    // pins the 3-row block with inputs where the paths must differ), f16 the widening path;
    // each with its transposed weight, alone and under a bias and ReLU.
    same_on_any_thread_count(|rt| {
        let mut outs = vec![];
        for dtype in [DType::BF16, DType::F16] {
            for (m, seed) in [(300, 31), (24, 33), (131, 35), (20, 37)] {
                let x = tensor(rt, dtype, &[m, 256], &values(m * 256, seed));
                let w = tensor(rt, dtype, &[1000, 256], &values(256_000, seed + 1));
                let wt = view(rt, w, View::Transpose(0, 1));
                let bias = tensor(rt, dtype, &[1000], &values(1000, seed + 2));
                outs.extend(product_alone_and_with_bias_relu(rt, x, wt, bias));
            }
        }
        outs
    });
}

#[test]
fn a_matmul_of_few_rows_split_by_columns_equals_one_thread() {
    // 24 rows are too few to share out; the threads take columns of the output instead.
    same_on_any_thread_count(|rt| {
        let x = tensor(rt, DType::F32, &[24, 256], &values(24 * 256, 21));
        let (wt, bias) = linear_weight(rt, 1000, 256, 22);
        product_alone_and_with_bias_relu(rt, x, wt, bias).to_vec()
    });
}

#[test]
fn gemms_cut_into_blocks_of_few_rows_equal_one_thread() {
    // Few-row blocks run the backend's small-GEMM kernel, whole products `matrixmultiply`: a
    // 3-row last epilogue block (131 = 128 + 3 rows), 16-row thread chunks of 40 rows, single
    // rows; k = 300 spans two of matrixmultiply's k-blocks, and alpha 0.5 its other rounding.
    same_on_any_thread_count(|rt| {
        let (wt, bias) = linear_weight(rt, 128, 300, 24);
        let mut outs = vec![];
        for (i, m) in [1, 3, 40, 131].into_iter().enumerate() {
            let x = tensor(rt, DType::F32, &[m, 300], &values(m * 300, 26 + i as u64));
            outs.extend(product_alone_and_with_bias_relu(rt, x, wt, bias));
            let half = Input::Scalar(Scalar::Float(0.5));
            let one = Input::Scalar(Scalar::Float(1.0));
            let am = run(rt, Op::Addmm, &[tt(bias), tt(x), tt(wt), one, half]);
            outs.push(un(rt, UnaryOp::Tanh, am));
        }
        outs
    });
}

#[test]
fn products_of_few_rows_in_all_split_by_columns_equal_one_thread() {
    // 1 and 4 rows by a transposed weight large enough (2M multiply-adds) that 3 threads split
    // its columns: the products summed along W's rows (`gemv_dot`), alone and with a bias and
    // activation after them.
    same_on_any_thread_count(|rt| {
        let (wt, bias) = linear_weight(rt, 2048, 1024, 30);
        let mut outs = vec![];
        for m in [1, 4] {
            let x = tensor(rt, DType::F32, &[m, 1024], &values(m * 1024, 32 + m as u64));
            outs.extend(product_alone_and_with_bias_relu(rt, x, wt, bias));
        }
        outs
    });
}

#[test]
fn batched_products_split_by_matrices_equal_one_thread() {
    // 3 threads take whole matrices: 6 of them by one broadcast B, 13 (uneven shares), and
    // attention's scores, `q @ k^T` over [6, 4] batch dims with k read transposed.
    same_on_any_thread_count(|rt| {
        let a = tensor(rt, DType::F32, &[6, 128, 96], &values(6 * 128 * 96, 40));
        let b = tensor(rt, DType::F32, &[1, 96, 128], &values(96 * 128, 41));
        let broadcast = run(rt, Op::Matmul, &[tt(a), tt(b)]);
        let a = tensor(rt, DType::F32, &[13, 64, 80], &values(13 * 64 * 80, 42));
        let b = tensor(rt, DType::F32, &[13, 80, 72], &values(13 * 80 * 72, 43));
        let uneven = run(rt, Op::Matmul, &[tt(a), tt(b)]);
        let q = tensor(
            rt,
            DType::F32,
            &[6, 4, 64, 32],
            &values(6 * 4 * 64 * 32, 44),
        );
        let k = tensor(
            rt,
            DType::F32,
            &[6, 4, 64, 32],
            &values(6 * 4 * 64 * 32, 45),
        );
        let kt = view(rt, k, View::Transpose(-1, -2));
        let scores = run(rt, Op::Matmul, &[tt(q), tt(kt)]);
        vec![broadcast, uneven, scores]
    });
}

#[test]
fn in_place_updates_equal_one_thread() {
    same_on_any_thread_count(|rt| {
        let p = tensor(rt, DType::F32, &[SPLIT], &values(SPLIT, 14));
        let g = tensor(rt, DType::F32, &[SPLIT], &values(SPLIT, 15));
        for _ in 0..3 {
            let step = bin(rt, BinaryOp::Mul, tt(g), Input::Scalar(Scalar::Float(0.01)));
            rt.op(0, Op::Binary(BinaryOp::Sub), &[tt(p), tt(step)], Some(p))
                .unwrap();
        }
        vec![p]
    });
}

/// Ten parameters of different shapes, each updated in place as an optimizer does: ten
/// independent regions in one flush (the timeline suite draws them on its worker tracks).
pub(crate) fn optimizer_step(rt: &Runtime) -> Vec<Handle> {
    updates(rt, |k| 100 + 997 * k)
}

/// Ten independent SGD updates `p -= 0.01 * g`, parameter k of `size(k)` elements.
fn updates(rt: &Runtime, size: impl Fn(usize) -> usize) -> Vec<Handle> {
    let mut params = vec![];
    for k in 0..10 {
        let n = size(k);
        let p = tensor(rt, DType::F32, &[n], &values(n, 20 + k as u64));
        let g = tensor(rt, DType::F32, &[n], &values(n, 40 + k as u64));
        let step = bin(rt, BinaryOp::Mul, tt(g), Input::Scalar(Scalar::Float(0.01)));
        rt.op(0, Op::Binary(BinaryOp::Sub), &[tt(p), tt(step)], Some(p))
            .unwrap();
        rt.release(step).unwrap();
        params.push(p);
    }
    params
}

#[test]
fn independent_updates_run_side_by_side_and_equal_one_thread() {
    same_on_any_thread_count(optimizer_step);
    let rt = runtime(Mode::Defer, 2);
    let params = optimizer_step(&rt);
    rt.synchronize_all().unwrap();
    assert_eq!(rt.stats().programs_side_by_side, params.len() as u64);
}

#[test]
fn independent_updates_too_small_to_share_run_one_by_one_on_the_stream_thread() {
    // 10 x 3 x 64 elements: less work than waking a pool thread costs.
    same_on_any_thread_count(|rt| updates(rt, |_| 64));
    let rt = runtime(Mode::Defer, 2);
    let params = updates(&rt, |_| 64);
    rt.synchronize_all().unwrap();
    assert_eq!(rt.stats().programs_side_by_side, 0);
    for p in params {
        rt.release(p).unwrap();
    }
}

#[test]
fn one_thread_runs_independent_updates_one_by_one() {
    let rt = runtime(Mode::Defer, 1);
    optimizer_step(&rt);
    rt.synchronize_all().unwrap();
    assert_eq!(rt.stats().programs_side_by_side, 0);
}

#[test]
fn a_depthwise_convolution_split_by_channels_equals_one_thread() {
    use deferfuse::fusion::ir::{Depthwise, DepthwisePart, KernelOp};
    // 52 channels: six whole vectors of 8 and a partial one, so jobs get unequal windows.
    let (n, c, h) = (2, 52, 13);
    let conv = |part: DepthwisePart| {
        Op::Kernel(KernelOp::Depthwise(Box::new(Depthwise {
            part,
            kernel: [5, 5][..].into(),
            stride: [2, 2][..].into(),
            padding: [2, 2][..].into(),
            dilation: [1, 1][..].into(),
            input: match part {
                DepthwisePart::InputGrad => [h, h][..].into(),
                _ => Default::default(),
            },
        })))
    };
    same_on_any_thread_count(|rt| {
        let x = tensor(rt, DType::F32, &[n, c, h, h], &values(n * c * h * h, 5));
        let w = tensor(rt, DType::F32, &[c, 1, 5, 5], &values(c * 25, 6));
        let y = run(rt, conv(DepthwisePart::Forward), &[tt(x), tt(w)]);
        let gx = run(rt, conv(DepthwisePart::InputGrad), &[tt(y), tt(w)]);
        let gw = run(rt, conv(DepthwisePart::WeightGrad), &[tt(y), tt(x)]);
        vec![y, gx, gw]
    });
}

#[test]
fn a_dense_convolution_split_by_samples_equals_one_thread() {
    use deferfuse::fusion::ir::{Conv, ConvPart, KernelOp};
    let (n, c, oc) = (3, 16, 24);
    let conv = |part: ConvPart, stride: usize| {
        Op::Kernel(KernelOp::Conv(Box::new(Conv {
            part,
            padding: [1, 1][..].into(),
            dilation: [1, 1][..].into(),
            stride: [stride, stride][..].into(),
            sizes: match part {
                ConvPart::WeightGrad => [3, 3][..].into(),
                _ => Default::default(),
            },
        })))
    };
    // Stride 2 on a larger map: the same work per sample, the samples again split.
    for (stride, h) in [(1, 22), (2, 44)] {
        same_on_any_thread_count(|rt| {
            let x = tensor(rt, DType::F32, &[n, c, h, h], &values(n * c * h * h, 7));
            let w = tensor(rt, DType::F32, &[oc, c, 3, 3], &values(oc * c * 9, 8));
            let y = run(rt, conv(ConvPart::Forward, stride), &[tt(x), tt(w)]);
            let gw = run(rt, conv(ConvPart::WeightGrad, stride), &[tt(y), tt(x)]);
            vec![y, gw]
        });
        // bfloat16 operands (their float32 result) split the same way.
        same_on_any_thread_count(|rt| {
            let x = tensor(rt, DType::BF16, &[n, c, h, h], &values(n * c * h * h, 7));
            let w = tensor(rt, DType::BF16, &[oc, c, 3, 3], &values(oc * c * 9, 8));
            vec![run(rt, conv(ConvPart::Forward, stride), &[tt(x), tt(w)])]
        });
    }
}

#[test]
fn a_dense_convolution_weight_gradient_split_by_input_channels_equals_one_thread() {
    use deferfuse::fusion::ir::{Conv, ConvPart, KernelOp};
    // 13 input channels: ranges of 3 and 4 channels. With a 1x1 kernel a range is 3 or 4 rows
    // of dW^T, few enough that its own row count would pick another summation order. At 24x24
    // with 8 samples the whole sums 4 samples at a time in its dot products and a range's
    // smaller grids would fit 5: it must keep the whole's batches.
    let (c, oc) = (13, 32);
    for (n, k, pad, h) in [(2, 3, 1, 40), (2, 1, 0, 80), (8, 3, 1, 24)] {
        let weight_grad = Op::Kernel(KernelOp::Conv(Box::new(Conv {
            part: ConvPart::WeightGrad,
            padding: [pad, pad][..].into(),
            dilation: [1, 1][..].into(),
            stride: [1, 1][..].into(),
            sizes: [k, k][..].into(),
        })));
        // bfloat16 operands take their own dot products (pairs of positions), in the same
        // batches.
        for dtype in [DType::F32, DType::BF16] {
            same_on_any_thread_count(|rt| {
                let x = tensor(rt, dtype, &[n, c, h, h], &values(n * c * h * h, 9));
                let grad = tensor(rt, dtype, &[n, oc, h, h], &values(n * oc * h * h, 10));
                vec![run(rt, weight_grad.clone(), &[tt(grad), tt(x)])]
            });
        }
    }
}

#[test]
fn a_widening_product_split_by_rows_equals_one_thread() {
    use deferfuse::fusion::ir::KernelOp;
    // 8.4M multiply-adds: past the split's threshold; 250 rows cut into blocks of any size
    // keep the whole product's kernel.
    let (m, k, n) = (250, 128, 264);
    for dtype in [DType::BF16, DType::F16] {
        same_on_any_thread_count(|rt| {
            let a = tensor(rt, dtype, &[m, k], &values(m * k, 3));
            let b = tensor(rt, dtype, &[k, n], &values(k * n, 4));
            vec![run(rt, Op::Kernel(KernelOp::WideMatmul), &[tt(a), tt(b)])]
        });
    }
}

#[test]
fn a_grouped_product_split_by_row_windows_equals_one_thread() {
    use deferfuse::fusion::ir::{GroupedMatmul, KernelOp};
    // 4 experts over 700 tokens (uneven groups, one empty, rows past the last offset), then its
    // input and weight gradients: above the split threshold in every case.
    let (m, k, n) = (700, 96, 80);
    let op = |case| Op::Kernel(KernelOp::GroupedMatmul(case));
    same_on_any_thread_count(|rt| {
        let x = tensor(rt, DType::F32, &[m, k], &values(m * k, 7));
        let w = tensor(rt, DType::F32, &[4, k, n], &values(4 * k * n, 8));
        let offs = tensor(rt, DType::I32, &[4], &[300.0, 300.0, 517.0, 690.0]);
        let y = run(rt, op(GroupedMatmul::Rows), &[tt(x), tt(w), tt(offs)]);
        let wt = view(rt, w, View::Transpose(-1, -2));
        let gx = run(rt, op(GroupedMatmul::Rows), &[tt(y), tt(wt), tt(offs)]);
        let xt = view(rt, x, View::Transpose(-1, -2));
        let gw = run(
            rt,
            op(GroupedMatmul::Contraction),
            &[tt(xt), tt(y), tt(offs)],
        );
        vec![y, gx, gw]
    });
}

#[test]
fn rnn_steps_split_by_samples_equal_one_thread() {
    rnn_steps_on_any_thread_count(None);
}

#[test]
fn packed_rnn_steps_split_by_samples_equal_one_thread() {
    // Ranges that lose their samples at different steps, one before the walk's end.
    rnn_steps_on_any_thread_count(Some(&[13, 13, 11, 9, 9, 6, 3, 1]));
}

/// 13 samples in three uneven ranges, hidden 128 over 8 steps (dense, or packed in
/// `batch_sizes`): above the split threshold; every cell and direction, forward with the hidden
/// bias, then the backward of each.
fn rnn_steps_on_any_thread_count(batch_sizes: Option<&[usize]>) {
    use deferfuse::fusion::ir::{KernelOp, Recurrence, RecurrencePart as P};
    let (t, b, h) = (8, 13, 128);
    // Time-major operands' leading dims: [T, B], or packed [N].
    let rows: Vec<usize> = match batch_sizes {
        Some(s) => vec![s.iter().sum()],
        None => vec![t, b],
    };
    let n: usize = rows.iter().product();
    let op = |part, reverse| Op::Kernel(KernelOp::Recurrence(Recurrence { part, reverse }));
    // A bfloat16 hidden weight (autocast's) makes the steps' products bf16 ones: the same split.
    for (forward, gates, w_dtype) in [
        (P::LstmForward, 4, DType::F32),
        (P::GruForward, 3, DType::F32),
        (P::RnnReluForward, 1, DType::F32),
        (P::LstmForward, 4, DType::BF16),
    ] {
        let backward = P::from_u32(forward as u32 + 1).unwrap();
        let (lstm, gru) = (forward == P::LstmForward, forward == P::GruForward);
        same_on_any_thread_count(|rt| {
            let g = gates * h;
            let dims = |last: usize| [&rows[..], &[last]].concat();
            let small: Vec<f64> = values(g * h, 12).iter().map(|x| x * 0.1).collect();
            let xg = tensor(rt, DType::F32, &dims(g), &values(n * g, 11));
            let w = tensor(rt, w_dtype, &[g, h], &small);
            let w_t = view(rt, w, View::Transpose(0, 1));
            let h0 = tensor(rt, DType::F32, &[b, h], &values(b * h, 13));
            let c0 = tensor(rt, DType::F32, &[b, h], &values(b * h, 14));
            let bias = tensor(rt, DType::F32, &[g], &values(g, 15));
            let dy = tensor(rt, DType::F32, &dims(h), &values(n * h, 16));
            let sizes = batch_sizes.map(|s| {
                let v: Vec<f64> = s.iter().map(|&x| x as f64).collect();
                tt(tensor(rt, DType::I64, &[s.len()], &v))
            });
            let mut outs = vec![];
            for reverse in [false, true] {
                let mut ins = if lstm {
                    vec![tt(xg), tt(w_t), tt(h0), tt(c0), tt(bias)]
                } else {
                    vec![tt(xg), tt(w_t), tt(h0), tt(bias)]
                };
                ins.extend(sizes);
                let y = run(rt, op(forward, reverse), &ins);
                let mut ins = vec![tt(y)];
                if lstm || gru {
                    ins.push(tt(if lstm { c0 } else { h0 }));
                }
                ins.extend([tt(w), tt(dy), tt(h0)]);
                if lstm {
                    ins.push(tt(c0));
                }
                ins.extend(sizes);
                outs.extend([y, run(rt, op(backward, reverse), &ins)]);
            }
            outs
        });
    }
}

/// A 4x4 stride-2 padding-1 im2col or col2im op (`part`) with the sizes its operand lacks.
fn columns_op(part: deferfuse::fusion::ir::ConvPart, sizes: [usize; 2]) -> Op {
    use deferfuse::fusion::ir::{Conv, KernelOp};
    Op::Kernel(KernelOp::Conv(Box::new(Conv {
        part,
        padding: [1, 1][..].into(),
        dilation: [1, 1][..].into(),
        stride: [2, 2][..].into(),
        sizes: sizes[..].into(),
    })))
}

/// `op` on values of `shape` (96 planes of 4x4 stride-2 columns: 150k column values, past the
/// serial bound) gives the same bits on any thread count.
fn columns_op_same_on_any_thread_count(op: Op, shape: &[usize], seed: u64) {
    same_on_any_thread_count(|rt| {
        let t = tensor(rt, DType::F32, shape, &values(shape.iter().product(), seed));
        vec![run(rt, op.clone(), &[tt(t)])]
    });
}

#[test]
fn col2im_split_by_planes_equals_one_thread() {
    use deferfuse::fusion::ir::ConvPart;
    let op = columns_op(ConvPart::ColumnsToInput, [14, 14]);
    columns_op_same_on_any_thread_count(op, &[6, 16, 4, 4, 7, 7], 11);
}

#[test]
fn im2col_split_by_planes_equals_one_thread() {
    use deferfuse::fusion::ir::ConvPart;
    let op = columns_op(ConvPart::InputToColumns, [4, 4]);
    columns_op_same_on_any_thread_count(op, &[6, 16, 14, 14], 12);
}
