//! Depthwise convolutions (`KernelOp::Depthwise`) inside a whole-program module, so a
//! MobileNet, EfficientNet or ConvNeXt step stays one XLA program instead of a host routine
//! between two programs (with a download and an upload) for every depthwise layer.
//!
//! Each part is a sum over the kernel taps of strided slices: elementwise ops and reductions,
//! which XLA fuses on every backend and dtype (what the composed ops gave before the kernel op
//! existed). Per spatial dim, output position `o` of tap `t` reads input position
//! `o * stride - padding + t * dilation`:
//!
//! - forward: the input zero-padded by `padding` on both sides; tap `t`'s window starts at
//!   `t * dilation` and steps by `stride`; `out = sum over t of window(t) * w[c, t]`;
//! - input gradient: the gradient spread onto the input's grid (`stride - 1` zeros between
//!   its elements, so only the positions an output read receive a value) and edge-padded so
//!   that input position `p` of tap `t` sits at `p + (kernel - 1 - t) * dilation`; then
//!   `gx = sum over t of window(t) * w[c, t]` with unit steps;
//! - weight gradient: per tap, the gradient times the forward's window of the input, summed
//!   over the batch and the output positions: one `[C]` reduction per tap.
//!
//! Except the weight gradient computed in f32 (f32, f16, bf16): one convolution with a group
//! per channel (`weight_grad_conv`). Measured on the xla-cpu-pjrt plugin at ConvNeXt's sizes
//! (N 8, C 96, 56x56, 7x7), that convolution ran five times faster than the reductions;
//! grouped convolutions for the forward and the input gradient ran two to three times slower
//! than their sums of windows, and every f64 grouped convolution far slower (XLA's CPU
//! compiler expands those into dense ones).
//!
//! Values are in their compute element (f16 and bf16 as f32, like the host routine's
//! accumulation), rounded once when the part's result is stored (`graph::stored`).
//!
//! In a bucketed module (`graph_bucket`) the batch dim is padded, and the padding of every
//! buffer is zero: a padded sample's output is then zero too, and it adds nothing to the
//! weight gradient, so no part needs a mask.

use super::hlo::{Elem, Func, Ty, Val};
use deferfuse_fusion::ir::{Depthwise, DepthwisePart};

/// Every tap of `k` in row-major order, as its index in each spatial dim.
fn taps(k: &Depthwise) -> Vec<Vec<usize>> {
    let mut all: Vec<Vec<usize>> = vec![Vec::new()];
    for &n in &k.kernel {
        all = all
            .into_iter()
            .flat_map(|t| {
                (0..n).map(move |i| {
                    let mut t = t.clone();
                    t.push(i);
                    t
                })
            })
            .collect();
    }
    all
}

/// `[N, C]` followed by `spatial`.
fn lead<T: Copy>(n: T, c: T, spatial: &[T]) -> Vec<T> {
    let mut v = vec![n, c];
    v.extend_from_slice(spatial);
    v
}

/// The weights of tap number `t` of `w2` (`[C, taps]`), broadcast over `dims` (`[N, C, ...]`).
fn tap_weight(f: &mut Func, w2: &Val, t: usize, dims: &[usize]) -> Val {
    let c = w2.ty.dims[0];
    let column = f.slice_strided(w2, &[0, t], &[c, 1], &[1, 1]);
    let column = f.reshape(&column, &[c]);
    f.broadcast(&column, dims, &[1])
}

/// `v` zero-padded by `low` and `high` on its spatial dims (negative: cropped), with
/// `interior` zeros between the elements of each.
fn pad_spatial(f: &mut Func, v: &Val, low: &[i64], high: &[i64], interior: &[usize]) -> Val {
    f.pad(
        v,
        &lead(0, 0, low),
        &lead(0, 0, high),
        &lead(0, 0, interior),
    )
}

/// The sum over `taps` (in that order) of `v`'s window of each tap times the tap's weight
/// from `w2`: the window of `(number, start)` starts at `start` in each spatial dim and holds
/// `count` positions `step` apart.
fn sum_of_windows(
    f: &mut Func,
    v: &Val,
    w2: &Val,
    taps: impl Iterator<Item = (usize, Vec<usize>)>,
    count: &[usize],
    step: &[usize],
) -> Val {
    let (n, c) = (v.ty.dims[0], v.ty.dims[1]);
    let dims = lead(n, c, count);
    let steps = lead(1, 1, step);
    let mut acc: Option<Val> = None;
    for (number, start) in taps {
        let window = f.slice_strided(v, &lead(0, 0, &start), &dims, &steps);
        let weight = tap_weight(f, w2, number, &dims);
        let term = f.ew("multiply", &[&window, &weight]);
        acc = Some(match acc {
            None => term,
            Some(a) => f.ew("add", &[&a, &term]),
        });
    }
    acc.expect("a kernel has at least one tap")
}

/// Lowers depthwise part `k` on its two operands (see `DepthwisePart`), each at its tensor's
/// sizes in its compute element; the result is in the same element.
pub fn lower(f: &mut Func, k: &Depthwise, inputs: &[Val]) -> Val {
    let (a, b) = (&inputs[0], &inputs[1]);
    let (n, c) = (a.ty.dims[0], a.ty.dims[1]);
    let padding: Vec<i64> = k.padding.iter().map(|&p| p as i64).collect();
    let no_interior = vec![0; k.kernel.len()];
    let taps = taps(k);
    match k.part {
        DepthwisePart::Forward => {
            let out = k
                .output_sizes(&a.ty.dims[2..])
                .expect("the op's shapes were checked when it was recorded");
            let xp = pad_spatial(f, a, &padding, &padding, &no_interior);
            let w2 = f.reshape(b, &[c, taps.len()]);
            let starts = taps.iter().enumerate().map(|(number, t)| {
                let start = t.iter().zip(&k.dilation).map(|(&t, &d)| t * d).collect();
                (number, start)
            });
            sum_of_windows(f, &xp, &w2, starts, &out, &k.stride)
        }
        DepthwisePart::InputGrad => {
            let out = &a.ty.dims[2..];
            let (low, high): (Vec<i64>, Vec<i64>) = (0..k.kernel.len())
                .map(|i| {
                    let span = ((k.kernel[i] - 1) * k.dilation[i]) as i64;
                    let (p, s) = (k.padding[i] as i64, k.stride[i] as i64);
                    let last = (out[i] as i64 - 1) * s;
                    (span - p, k.input[i] as i64 + p - last - 1)
                })
                .unzip();
            let interior: Vec<usize> = k.stride.iter().map(|&s| s - 1).collect();
            let spread = pad_spatial(f, a, &low, &high, &interior);
            let w2 = f.reshape(b, &[c, taps.len()]);
            // In tap order, as the host routine sums them: tap t's weight times the window at
            // its mirrored tap's offset.
            let starts = taps.iter().enumerate().map(|(number, t)| {
                let start = (0..t.len())
                    .map(|i| (k.kernel[i] - 1 - t[i]) * k.dilation[i])
                    .collect();
                (number, start)
            });
            let ones = vec![1; k.kernel.len()];
            sum_of_windows(f, &spread, &w2, starts, &k.input, &ones)
        }
        DepthwisePart::WeightGrad if a.ty.elem == Elem::F32 && n * c > 0 => {
            weight_grad_conv(f, k, a, b)
        }
        DepthwisePart::WeightGrad => {
            let out = &a.ty.dims[2..];
            let xp = pad_spatial(f, b, &padding, &padding, &no_interior);
            let dims = lead(n, c, out);
            let steps = lead(1, 1, &k.stride);
            let over: Vec<usize> = (0..dims.len()).filter(|&d| d != 1).collect();
            let zero = f.fconst(0.0, Ty::new(a.ty.elem, &[]));
            let mut columns = Vec::with_capacity(taps.len());
            for t in &taps {
                let start: Vec<usize> = t.iter().zip(&k.dilation).map(|(&t, &d)| t * d).collect();
                let window = f.slice_strided(&xp, &lead(0, 0, &start), &dims, &steps);
                let product = f.ew("multiply", &[a, &window]);
                let sum = f.reduce(&[&product], &[&zero], &over, |f, v| {
                    vec![f.ew("add", &[&v[0], &v[1]])]
                });
                columns.push(f.reshape(&sum[0], &[c, 1]));
            }
            let refs: Vec<&Val> = columns.iter().collect();
            let ty = Ty::new(a.ty.elem, &[c, taps.len()]);
            let w2 = f.op("concatenate", &refs, "dimension = 1 : i64", ty);
            let mut weight = vec![c, 1];
            weight.extend_from_slice(&k.kernel);
            f.reshape(&w2, &weight)
        }
    }
}

/// The weight gradient of `k` for gradient `g` and input `x` as one convolution with a group
/// per channel: the input, channel-major (`[1, C * N, padded...]`: channel `c`'s group holds
/// its `N` samples as features), convolved with the gradient as the kernel (`[C, N, out...]`:
/// per channel, one output feature from its `N` input features), stepping `dilation` between
/// output positions (the taps) and `stride` between kernel positions (the outputs), gives
/// `[1, C, kernel...]`. The input is padded by `padding` in front and cropped or padded behind
/// to what the last tap of the last output reads, so the result has exactly `kernel` positions.
fn weight_grad_conv(f: &mut Func, k: &Depthwise, g: &Val, x: &Val) -> Val {
    let (n, c) = (g.ty.dims[0], g.ty.dims[1]);
    let d = k.kernel.len();
    let (out, input) = (&g.ty.dims[2..], &x.ty.dims[2..]);
    let low: Vec<i64> = k.padding.iter().map(|&p| p as i64).collect();
    let high: Vec<i64> = (0..d)
        .map(|i| {
            let read = (out[i] - 1) * k.stride[i] + (k.kernel[i] - 1) * k.dilation[i] + 1;
            read as i64 - (input[i] + k.padding[i]) as i64
        })
        .collect();
    let xp = pad_spatial(f, x, &low, &high, &vec![0; d]);
    let mut channels_first: Vec<usize> = vec![1, 0];
    channels_first.extend(2..d + 2);
    let xt = f.transpose(&xp, &channels_first);
    let mut grouped = vec![1, c * n];
    grouped.extend_from_slice(&xt.ty.dims[2..]);
    let lhs = f.reshape(&xt, &grouped);
    let rhs = f.transpose(g, &channels_first);
    let mut weight = vec![1, c];
    weight.extend_from_slice(&k.kernel);
    let r = f.convolution(&lhs, &rhs, c, &k.dilation, &k.stride, &weight);
    weight[0] = c;
    weight[1] = 1;
    f.reshape(&r, &weight)
}
