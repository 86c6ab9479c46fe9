//! A dense convolution's weight gradient, `d out / d w` summed over the batch: per sample,
//! the output gradient laid out over the wide positions (zeros past each row's output size)
//! against the rows `(c, tap)` of the columns, runs of the sample's padded grid. On a core
//! with AVX-512F as dot products along the positions ([`weight_dots`]), elsewhere as GEMMs
//! over blocks of copied columns ([`in_blocks`]). Threads take ranges of input channels.

#[cfg(target_arch = "x86_64")]
use super::weight_dots;
#[cfg(target_arch = "x86_64")]
use super::GRID16;
use super::{
    fill_block, fill_grid, for_each_index, jobs, layout2, product, read_run, spatial_offset,
    widened, Geometry, Idx, View, SCRATCH, SERIAL_BELOW_MACS,
};
use crate::backend::SideBySide;
use crate::error::Result;
use deferfuse_fusion::ir::{Conv, DType};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__mmask16, __mmask32};

/// Bytes of the samples the weight gradient's dot products sum at once (grids and wide
/// gradients): half of this machine's L2, as `BLOCK_BYTES`.
#[cfg(target_arch = "x86_64")]
const SAMPLES_BYTES: usize = 512 << 10;

/// The weight gradient of `k` for output gradient `grad` and input `x` into `out`, its input
/// channels split in ranges over `threads` when there is work enough: a range's rows of `dW`
/// are summed over every sample and block in the same order whatever the split (the blocks of
/// columns and the product's summation order follow the whole gradient's `C * K` rows, not the
/// range's), so the bits do not depend on the thread count. Each range fills its own channels
/// of the grid and its own copy of the wide gradient (`OC` rows: the small operand).
///
/// bfloat16 `grad` and `x` are summed into the float32 `out` by `vdpbf16ps` dot products
/// (`weight_dots::accumulate_bf16`) on a core with AVX512-BF16, elsewhere by the float32 path
/// on widened copies.
///
/// # Safety
/// As [`super::run`].
pub(super) unsafe fn by_channels(
    k: &Conv,
    grad: &View,
    x: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let bf16 = grad.dtype == DType::BF16;
    #[cfg(target_arch = "x86_64")]
    let widen = bf16 && !weight_dots::bf16_available();
    #[cfg(not(target_arch = "x86_64"))]
    let widen = bf16;
    if widen {
        let (g, x) = (widened(grad), widened(x));
        return by_channels(k, &g.1, &x.1, out, threads);
    }
    let c = x.sizes[1];
    let whole = Geometry::new(k, x, &k.sizes, &grad.sizes[2..], grad.sizes[1]);
    let order = (whole.rows(), whole.block_cols());
    let macs = out.numel() * grad.numel() / grad.sizes[1].max(1);
    // One range per thread: each range packs the whole wide gradient for its products, so more
    // ranges than threads only repeat that work (4 ranges on 2 threads: [4, 32, 32, 32] ->
    // 64 channels 2.8 -> 3.8 ms, against 2.0 with 2).
    let ranges = match threads {
        Some(t) if c > 1 && macs >= SERIAL_BELOW_MACS => t.threads().min(c),
        _ => 1,
    };
    let range = |r: usize| {
        let (c0, c1) = (c * r / ranges, c * (r + 1) / ranges);
        let (x, out) = (x.narrowed(1, c0..c1), out.narrowed(1, c0..c1));
        let g = Geometry::new(k, &x, &k.sizes, &grad.sizes[2..], grad.sizes[1]);
        SCRATCH.with(|cell| {
            let buf = &mut cell.borrow_mut();
            // SAFETY (both): the caller's contract; each range writes only its own channels of
            // dW.
            #[cfg(target_arch = "x86_64")]
            if bf16 {
                let batch = samples_per_batch(&whole, grad.sizes[0]);
                return unsafe { by_dots_bf16(&g, grad, &x, &out, batch) };
            }
            #[cfg(target_arch = "x86_64")]
            if weight_dots::available() {
                let batch = samples_per_batch(&whole, grad.sizes[0]);
                return unsafe { by_dots(&g, grad, &x, &out, batch, buf) };
            }
            unsafe { in_blocks(&g, grad, &x, &out, order, buf) }
        })
    };
    jobs(threads.filter(|_| ranges > 1), ranges, &range)
}

/// Samples of `n` whose grids and wide gradients the weight gradient's dot products take
/// at once: as many as fit in [`SAMPLES_BYTES`], at least one.
#[cfg(target_arch = "x86_64")]
fn samples_per_batch(g: &Geometry, n: usize) -> usize {
    let per_sample = 4 * (g.c * g.channel + g.oc * g.wide);
    (SAMPLES_BYTES / per_sample.max(1)).clamp(1, n.max(1))
}

/// The weight gradient `[OC, C, k...]` of the convolution whose input is `x` and output
/// gradient `grad`, by dot products along the positions (`weight_dots`): `batch` samples at a
/// time, their grids and wide gradients side by side in the scratch (`batch` is the whole
/// geometry's [`samples_per_batch`], so a range of channels sums in the same batches
/// as the whole).
///
/// # Safety
/// As [`super::run`]; the core has AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn by_dots(
    g: &Geometry,
    grad: &View,
    x: &View,
    out: &View,
    batch: usize,
    buf: &mut Vec<f32>,
) -> Result<()> {
    let (grid_len, wide_len) = (g.c * g.channel, g.oc * g.wide);
    // The wide gradients first, from a cache line: their rows are then aligned wherever the
    // positions are a multiple of 16 (most maps), and the dot products' loads of them never
    // straddle two lines (`[4, 64, 16, 16]` with 64 output channels: 0.51-0.53 -> 0.45-0.47 ms).
    let need = batch * (grid_len + wide_len) + 16;
    if buf.len() < need {
        buf.resize(need, 0.0);
    }
    let skip = buf.as_ptr().align_offset(64).min(15);
    let (wides, grids) = buf[skip..skip + need - 16].split_at_mut(batch * wide_len);
    let positions = weight_dots::positions::<__mmask16>(g.wide, |j| is_output_position(g, j));
    let mut acc = vec![0f32; g.rows() * g.oc];
    in_batches(g, (grad, x), batch, (wides, grids), &positions, |b| {
        // SAFETY: each grid holds every run's `g.wide` floats (its phases' slack), `wides`
        // `samples` gradients of `g.oc` rows of `g.wide`, and acc is `[C * K, OC]`.
        unsafe { weight_dots::accumulate(b, &mut acc) }
    });
    write_weight_grad(g, &acc, out);
    Ok(())
}

/// Walks the samples `batch` at a time: fills each sample's grid and wide gradient into
/// `grids` and `wides` (room for `batch` of each), then hands the batch to `accumulate`.
///
/// # Safety
/// As [`super::run`]; `T` is the views' element type.
#[cfg(target_arch = "x86_64")]
unsafe fn in_batches<T: Copy + Default, M>(
    g: &Geometry,
    (grad, x): (&View, &View),
    batch: usize,
    (wides, grids): (&mut [T], &mut [T]),
    positions: &[M],
    mut accumulate: impl FnMut(&weight_dots::Batch<T, M>),
) {
    let (grid_len, wide_len) = (g.c * g.channel, g.oc * g.wide);
    let offsets = g.row_offsets();
    let n = grad.sizes[0];
    let mut s0 = 0;
    while s0 < n {
        let samples = batch.min(n - s0);
        for i in 0..samples {
            fill_grid(g, x, s0 + i, &mut grids[i * grid_len..(i + 1) * grid_len]);
            let wide = &mut wides[i * wide_len..(i + 1) * wide_len];
            fill_wide_grad(g, grad, s0 + i, wide);
        }
        accumulate(&weight_dots::Batch {
            samples,
            len: g.wide,
            grad: wides,
            oc: g.oc,
            grid: grids,
            grid_len,
            offsets: &offsets,
            positions,
        });
        s0 += samples;
    }
}

/// Whether wide position `j` is an output position: its index along each dim below the first
/// is inside the output (the first dim's always is).
fn is_output_position(g: &Geometry, j: usize) -> bool {
    (1..g.out.len()).all(|k| {
        let per = g.grid_strides[k - 1] / g.grid_strides[k];
        (j / g.grid_strides[k]) % per < g.out[k]
    })
}

/// [`by_dots`] for bfloat16 `grad` and `x`, summed in float32 by
/// `weight_dots::accumulate_bf16`; the grids and wide gradients in this thread's bfloat16
/// scratch.
///
/// # Safety
/// As [`super::run`]; `weight_dots::bf16_available()`.
#[cfg(target_arch = "x86_64")]
unsafe fn by_dots_bf16(
    g: &Geometry,
    grad: &View,
    x: &View,
    out: &View,
    batch: usize,
) -> Result<()> {
    let (grid_len, wide_len) = (g.c * g.channel, g.oc * g.wide);
    let positions = weight_dots::positions::<__mmask32>(g.wide, |j| is_output_position(g, j));
    let mut acc = vec![0f32; g.rows() * g.oc];
    GRID16.with(|cell| {
        let buf = &mut cell.borrow_mut();
        let need = batch * (grid_len + wide_len);
        if buf.len() < need {
            buf.resize(need, 0);
        }
        let scratch = buf[..need].split_at_mut(batch * wide_len);
        in_batches(g, (grad, x), batch, scratch, &positions, |b| {
            // SAFETY: as in `by_dots`, for bfloat16 values.
            unsafe { weight_dots::accumulate_bf16(b, &mut acc) }
        });
    });
    write_weight_grad(g, &acc, out);
    Ok(())
}

/// The weight gradient `[OC, C, k...]` of the convolution whose input is `x` and output
/// gradient `grad`: per sample, the gradient laid out over the wide positions (zeros at the
/// positions past each row's output size), then per block of columns `dW^T += block @
/// grad_block^T` (`[C * K, OC]`, the contraction over the block's positions, accumulated into
/// zeros). Samples and blocks are summed in order, on one thread. `(whole_rows, cols)`: the
/// whole gradient's row count and columns per block (`g.rows()` and `g.block_cols()` when `x`
/// has every channel), which fix every element's summation order (see `matmul`).
unsafe fn in_blocks(
    g: &Geometry,
    grad: &View,
    x: &View,
    out: &View,
    (whole_rows, cols): (usize, usize),
    buf: &mut Vec<f32>,
) -> Result<()> {
    let rows = g.rows();
    debug_assert!(
        cols <= g.block_cols(),
        "a range has fewer rows, so room for more columns"
    );
    let (grid, block, wide) = g.scratch(buf);
    // dW^T [C * K, OC]: the product's rows are the block's, so it reads the block in place.
    let mut acc = vec![0f32; rows * g.oc];
    for s in 0..grad.sizes[0] {
        fill_grid(g, x, s, grid);
        fill_wide_grad(g, grad, s, wide);
        let mut j0 = 0;
        while j0 < g.wide {
            let nb = cols.min(g.wide - j0);
            fill_block(g, grid, j0, &mut block[..rows * nb]);
            let (la, lb, lc) = (
                layout2([rows, nb], [nb as isize, 1], 0),
                layout2([nb, g.oc], [1, g.wide as isize], j0),
                layout2([rows, g.oc], [g.oc as isize, 1], 0),
            );
            product(
                (block.as_ptr(), &la),
                (wide.as_ptr(), &lb),
                (acc.as_mut_ptr(), &lc),
                1.0,
                whole_rows,
            );
            j0 += nb;
        }
    }
    write_weight_grad(g, &acc, out);
    Ok(())
}

/// Sample `s` of `grad` (output-shaped) laid out over the wide positions of `wide` (`g.oc *
/// g.wide` floats), zero at the positions past each row's output size.
unsafe fn fill_wide_grad<T: Copy + Default>(g: &Geometry, grad: &View, s: usize, wide: &mut [T]) {
    let (run, stride) = (g.out[g.out.len() - 1], grad.strides[grad.strides.len() - 1]);
    wide.fill(T::default());
    g.for_each_output_row(grad, s, |to, from| {
        let row = &mut wide[to..to + run];
        read_run(row, (grad.base as *const T).offset(from), stride);
    });
}

/// `out` (`[OC, C, k...]`, any strides) from `dW^T` (`[C * K, OC]`), row `(c, tap)` by row.
unsafe fn write_weight_grad(g: &Geometry, acc: &[f32], out: &View) {
    let taps = g.taps.len();
    let ws = &out.strides[2..];
    let kernel: Idx = out.sizes[2..].iter().copied().collect();
    let mut tap_offsets = Vec::with_capacity(taps);
    for_each_index(&kernel, |t| tap_offsets.push(spatial_offset(t, ws)));
    for c in 0..g.c {
        for (t, &to) in tap_offsets.iter().enumerate() {
            for oc in 0..g.oc {
                let at =
                    out.offset + oc as isize * out.strides[0] + c as isize * out.strides[1] + to;
                *(out.base as *mut f32).offset(at) = acc[(c * taps + t) * g.oc + oc];
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use deferfuse_fusion::ir::{ConvPart, DType};
    use smallvec::SmallVec;

    /// A contiguous float32 view of `data` with shape `sizes`.
    fn view(data: &mut [f32], sizes: &[usize]) -> View {
        let mut strides: SmallVec<[isize; 6]> = SmallVec::from_elem(1, sizes.len());
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * sizes[i + 1] as isize;
        }
        View {
            base: data.as_mut_ptr() as *mut u8,
            dtype: DType::F32,
            sizes: SmallVec::from_slice(sizes),
            strides,
            offset: 0,
        }
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0)
            .collect()
    }

    /// The fallback for cores without AVX-512F runs only there; here it is checked against
    /// the dot products it stands in for, within the rounding of two summation orders.
    #[test]
    fn the_gemm_blocks_and_the_dot_products_give_the_same_gradient() {
        if !weight_dots::available() {
            return;
        }
        type Case = (usize, usize, usize, [usize; 2], [usize; 2], [usize; 2]);
        // (samples, channels, output channels, input, padding, stride), 3x3 kernels: a
        // stride-1 map, a strided one (two phases per dim) and more output channels than a
        // tile takes.
        let cases: [Case; 3] = [
            (3, 5, 7, [9, 11], [1, 1], [1, 1]),
            (2, 4, 6, [13, 10], [0, 1], [2, 2]),
            (2, 3, 20, [10, 12], [1, 1], [1, 2]),
        ];
        for (n, c, oc, input, padding, stride) in cases {
            let k = Conv {
                part: ConvPart::WeightGrad,
                padding: padding[..].into(),
                dilation: [1, 1][..].into(),
                stride: stride[..].into(),
                sizes: [3, 3][..].into(),
            };
            let out = k.output_sizes(&input, &[3, 3]).unwrap();
            let mut xd = values(n * c * input[0] * input[1], 1);
            let mut gd = values(n * oc * out[0] * out[1], 2);
            let (x, grad) = (
                view(&mut xd, &[n, c, input[0], input[1]]),
                view(&mut gd, &[n, oc, out[0], out[1]]),
            );
            let g = Geometry::new(&k, &x, &[3, 3], &out, oc);
            let (mut blocks, mut dots) = (vec![0f32; oc * c * 9], vec![0f32; oc * c * 9]);
            let mut buf = Vec::new();
            unsafe {
                let order = (g.rows(), g.block_cols());
                let w = view(&mut blocks, &[oc, c, 3, 3]);
                in_blocks(&g, &grad, &x, &w, order, &mut buf).unwrap();
                let w = view(&mut dots, &[oc, c, 3, 3]);
                by_dots(&g, &grad, &x, &w, samples_per_batch(&g, n), &mut buf).unwrap();
            }
            let terms = (n * out[0] * out[1]) as f32;
            for (i, (a, b)) in blocks.iter().zip(&dots).enumerate() {
                assert!(
                    (a - b).abs() <= 2.0 * terms * f32::EPSILON,
                    "case {n} {c} {oc} {input:?} {stride:?}: element {i}: {a} vs {b}"
                );
            }
            assert!(
                dots.iter().any(|&v| v != 0.0),
                "a gradient of zeros checks nothing"
            );
        }
    }
}
