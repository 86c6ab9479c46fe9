//! Depthwise convolution (`KernelOp::Depthwise`): the forward and both gradients, vectorized
//! over channels.
//!
//! Each sample is first copied channels-last into a zero-padded scratch of the accumulation
//! type (f32 for f32, f16 and bf16; f64 for f64), channels rounded up to [`LANES`]: the same
//! tap of [`LANES`] neighbouring channels is then one vector load, whatever the spatial size
//! (EfficientNet's last stages are 1x1 and 2x2 with a thousand channels, ConvNeXt's 16x16 with
//! 48), the operand's layout or dtype, and the inner loops need no bounds checks. An output
//! vector is a sum over the live taps (those that read an input element for some output
//! position) in row-major tap order, `acc = fma(x, w, acc)` from zero (one
//! rounding per tap; libm's `fma` where the CPU has no FMA unit, so every CPU gives the same
//! bits), computed for [`UNITS`] output positions at once: independent sums, so the FMAs'
//! latency overlaps.
//!
//! The input gradient is the same loop over the gradient spread onto the input's grid (with a
//! stride above 1 the positions between stay zero) with the taps flipped. The weight gradient
//! of a channel and tap is one sum over the samples and output positions, in that order, of
//! the gradient times the tap's shifted input, [`TAP_GROUP`] taps at a time.

mod channels_last;
mod exact;
mod loops;

use super::View;
use crate::backend::SideBySide;
use crate::error::Result;
use channels_last::{
    each_position, fill, store_sample, Acc, Placement, Planes, Scratch, Vector, LANES,
};
use deferfuse_fusion::ir::{DType, Depthwise, DepthwisePart};
use loops::{sum_over_taps, tap_dots, TAP_GROUP};

/// The geometry over exactly three spatial dims (missing leading dims have size 1, one tap).
struct Geometry {
    kernel: [usize; 3],
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    /// The convolution's input and output spatial sizes.
    input: [usize; 3],
    output: [usize; 3],
}

/// `v` (1 to 3 values) right-aligned into three, the rest `fill`.
fn three(v: &[usize], fill: usize) -> [usize; 3] {
    let mut out = [fill; 3];
    out[3 - v.len()..].copy_from_slice(v);
    out
}

/// Multiply-adds below which a call runs on one thread: about what waking another costs.
const SERIAL_BELOW_MACS: usize = 1 << 16;

/// Most jobs a call is split into (whole channel vectors each).
const MAX_JOBS: usize = 8;

/// A job's operands: views of raw pointers, shared by jobs that each write their own channels.
struct Operands<'a>(&'a View, &'a View, &'a View);

// SAFETY: every job reads the inputs and writes only its own window of the output's channels.
unsafe impl Sync for Operands<'_> {}

/// Computes `k` for operands `a`, `b` (see `DepthwisePart`) into `out`, a view of the
/// operand's dtype; split by channels over `threads` when there is work enough. Every channel
/// is computed alone, so the bits do not depend on the split.
pub(super) fn run(
    k: &Depthwise,
    a: &View,
    b: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let c = a.sizes[1];
    let vectors = c.div_ceil(LANES);
    let positions: usize = match k.part {
        DepthwisePart::InputGrad => out.sizes[2..].iter().product(),
        _ => a.sizes[2..].iter().product(),
    };
    let work = a.sizes[0] * c * positions * k.taps();
    let jobs = vectors.min(MAX_JOBS);
    let Some(threads) = threads.filter(|_| jobs > 1 && work >= SERIAL_BELOW_MACS) else {
        run_channels(k, a, b, out);
        return Ok(());
    };
    // The weight is `[C, 1, k...]`: its channels are dim 0.
    let (b_dim, out_dim) = match k.part {
        DepthwisePart::WeightGrad => (1, 0),
        _ => (0, 1),
    };
    let ops = Operands(a, b, out);
    threads.run_all(jobs, &|j| {
        let range = (j * vectors / jobs * LANES)..((j + 1) * vectors / jobs * LANES).min(c);
        let Operands(a, b, out) = &ops;
        run_channels(
            k,
            &a.narrowed(1, range.clone()),
            &b.narrowed(b_dim, range.clone()),
            &out.narrowed(out_dim, range),
        );
        Ok(())
    })
}

/// [`run`] on one thread.
fn run_channels(k: &Depthwise, a: &View, b: &View, out: &View) {
    let (input, output) = match k.part {
        DepthwisePart::Forward => (&a.sizes[2..], &out.sizes[2..]),
        DepthwisePart::InputGrad => (&out.sizes[2..], &a.sizes[2..]),
        DepthwisePart::WeightGrad => (&b.sizes[2..], &a.sizes[2..]),
    };
    let g = Geometry {
        kernel: three(&k.kernel, 1),
        stride: three(&k.stride, 1),
        padding: three(&k.padding, 0),
        dilation: three(&k.dilation, 1),
        input: three(input, 1),
        output: three(output, 1),
    };
    // SAFETY: the runtime checked every operand's view against its buffer, and the op's
    // shapes against each other when it was recorded.
    unsafe {
        match out.dtype {
            DType::F64 => run_as::<f64>(k.part, &g, a, b, out),
            _ => run_as::<f32>(k.part, &g, a, b, out),
        }
    }
}

/// The taps, row-major, as `(tap, its row-major index)`; with `only_live`, those that read an
/// input element for at least one output position: the others read only padding, which
/// PyTorch's CPU kernel never multiplies in the forward and the input gradient, so a 5x5
/// kernel over a 1x1 input (EfficientNet's last stages) costs one tap there, not 25. (Its
/// weight gradient does multiply the padding: an infinite gradient gives NaN for every tap.)
fn taps_of(g: &Geometry, only_live: bool) -> Vec<([usize; 3], usize)> {
    let live = |i: usize| -> Vec<usize> {
        (0..g.kernel[i])
            .filter(|&t| {
                !only_live
                    || (0..g.output[i]).any(|o| {
                        let p =
                            (o * g.stride[i] + t * g.dilation[i]) as isize - g.padding[i] as isize;
                        (0..g.input[i] as isize).contains(&p)
                    })
            })
            .collect()
    };
    let (l0, l1, l2) = (live(0), live(1), live(2));
    let mut taps = Vec::with_capacity(l0.len() * l1.len() * l2.len());
    for &i in &l0 {
        for &j in &l1 {
            for &l in &l2 {
                taps.push(([i, j, l], (i * g.kernel[1] + j) * g.kernel[2] + l));
            }
        }
    }
    taps
}

/// Each tap's offset (in vectors) in scratch `x`; `flip`: the offset of the mirrored tap
/// (`kernel - 1 - t` in each dim).
fn tap_offsets<T: Acc>(
    g: &Geometry,
    taps: &[([usize; 3], usize)],
    x: &Scratch<T>,
    flip: bool,
) -> Vec<usize> {
    taps.iter()
        .map(|&(t, _)| {
            x.at(std::array::from_fn(|i| {
                let t = if flip { g.kernel[i] - 1 - t[i] } else { t[i] };
                t * g.dilation[i]
            }))
        })
        .collect()
}

/// The index in scratch `x` (in vectors) of the first tap of each output position of `sizes`,
/// read at `stride`.
fn first_taps<T: Acc>(sizes: [usize; 3], stride: [usize; 3], x: &Scratch<T>) -> Vec<usize> {
    let mut out = Vec::with_capacity(sizes.iter().product());
    each_position(sizes, [0; 3], |z, _| {
        out.push(x.at(std::array::from_fn(|i| z[i] * stride[i])));
    });
    out
}

unsafe fn run_as<T: Acc>(part: DepthwisePart, g: &Geometry, a: &View, b: &View, out: &View) {
    let (n, c) = (a.sizes[0], a.sizes[1]);
    let padded: [usize; 3] = std::array::from_fn(|i| g.input[i] + 2 * g.padding[i]);
    match part {
        DepthwisePart::Forward | DepthwisePart::InputGrad => {
            if out.sizes.iter().product::<usize>() == 0 {
                return;
            }
            let forward = part == DepthwisePart::Forward;
            // The input gradient is a stride-1 convolution of the gradient spread onto the
            // input's grid (gradient position o at o * stride - padding + before, where
            // `before` puts input position 0's last tap at 0) with the taps flipped.
            let before: [usize; 3] = std::array::from_fn(|i| (g.kernel[i] - 1) * g.dilation[i]);
            let (dims, stride, result) = if forward {
                (padded, g.stride, g.output)
            } else {
                (
                    std::array::from_fn(|i| g.input[i] + before[i]),
                    [1; 3],
                    g.input,
                )
            };
            // Input position p + before reads gradient position (p - t) for tap t: a tap is
            // live for the input gradient exactly when it is for the forward.
            let live = taps_of(g, true);
            let w = weights::<T>(b, c, &live);
            if !w.iter().all(|v| v.iter().all(|x| x.is_finite())) {
                return exact::run::<T>(forward, g, a, b, out);
            }
            let mut x = Scratch::<T>::new(dims, c);
            let taps = tap_offsets(g, &live, &x, !forward);
            let starts = first_taps(result, stride, &x);
            let mut acc = Scratch::<T>::new(result, c);
            let place = if forward {
                Placement::shifted(g.padding)
            } else {
                Placement {
                    scale: g.stride,
                    shift: std::array::from_fn(|i| before[i] as isize - g.padding[i] as isize),
                }
            };
            let sizes = if forward { g.input } else { g.output };
            for ni in 0..n {
                // Every sample writes the same positions: the others stay zero.
                fill(&mut x, a, ni, sizes, place);
                sum_over_taps(&x.data, &w, &taps, &starts, x.vectors, &mut acc.data);
                store_sample(&acc, out, ni, result);
            }
        }
        DepthwisePart::WeightGrad => {
            let mut x = Scratch::<T>::new(padded, c);
            // Every tap, as PyTorch's CPU kernel (see `taps_of`).
            let every = taps_of(g, false);
            let taps = tap_offsets(g, &every, &x, false);
            let starts = first_taps(g.output, g.stride, &x);
            let mut grad = Scratch::<T>::new(g.output, c);
            let groups = taps.len().div_ceil(TAP_GROUP);
            let mut sums = vec![Vector::<T>::default(); groups * TAP_GROUP * x.vectors];
            // No output position (or no sample): every sum is zero.
            if !starts.is_empty() {
                for ni in 0..n {
                    fill(&mut x, b, ni, g.input, Placement::shifted(g.padding));
                    fill(&mut grad, a, ni, g.output, Placement::shifted([0; 3]));
                    tap_dots(&x.data, &grad.data, &taps, &starts, x.vectors, &mut sums);
                }
            }
            let (tap_at, planes) = (tap_elements(out), Planes::of(out));
            for ci in 0..c {
                let off = planes.at(ci, 0);
                for (t, &at) in tap_at.iter().enumerate() {
                    let v = sums[t * x.vectors + ci / LANES][ci % LANES];
                    v.store(out.dtype, out.base, off + at);
                }
            }
        }
    }
}

/// The element offset of each tap (row-major over the kernel dims) in a `[C, 1, k...]` view,
/// relative to its channel's first element (computed once: a division per dim and tap cost
/// more than EfficientNet's 1x1 convolutions themselves).
fn tap_elements(w: &View) -> Vec<isize> {
    let taps: usize = w.sizes[2..].iter().product();
    (0..taps)
        .map(|mut t| {
            let mut off = 0isize;
            for i in (2..w.sizes.len()).rev() {
                off += (t % w.sizes[i]) as isize * w.strides[i];
                t /= w.sizes[i];
            }
            off
        })
        .collect()
}

/// The weights `[C, 1, k...]` of the `taps` as `[taps, vectors]` (channels past `c` are
/// zero).
///
/// # Safety
/// The view's elements lie inside its buffer.
unsafe fn weights<T: Acc>(w: &View, c: usize, taps: &[([usize; 3], usize)]) -> Vec<Vector<T>> {
    let vectors = c.div_ceil(LANES);
    let mut out = vec![Vector::<T>::default(); taps.len() * vectors];
    let (tap_at, planes) = (tap_elements(w), Planes::of(w));
    for ci in 0..c {
        let off = planes.at(ci, 0);
        for (t, &(_, flat)) in taps.iter().enumerate() {
            out[t * vectors + ci / LANES][ci % LANES] =
                T::load(w.dtype, w.base, off + tap_at[flat]);
        }
    }
    out
}
