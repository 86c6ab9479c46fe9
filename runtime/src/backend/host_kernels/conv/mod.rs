//! The dense convolution (`KernelOp::Conv`) without im2col columns in memory: the
//! product reads them where they lie in a padded copy of the input, or from blocks copied just
//! before their product, so neither the columns nor a transposed product's `C * K` values per
//! position ever reach memory.
//!
//! Per sample, the input is copied once into a zero-padded grid (`P` positions per dim, rows
//! of the grid contiguous). Every kernel tap of an output position is then a fixed offset into
//! that grid, and so is a whole run of positions: column `j` of the "wide" position space (the
//! first spatial dim at its output size, the others at their padded size) reads grid element
//! `j + offset(c, tap)`. The product of the weight viewed as `[OC, C * K]` with those columns
//! reads each row `(c, tap)` where it lies in the grid, through a table of offsets (the GEMM's
//! `sgemm_b_rows`); where the GEMM has no such kernel, a block of wide columns is copied row by
//! row (one contiguous run per `(c, tap)`) into a buffer that stays in L2 and multiplied from
//! there. The wide result is cropped into the output (the
//! positions past each row's output size are computed and dropped: `(P - out) / out` more
//! columns, 3% for a 64-wide map with a 3x3 kernel). Each output element is the product's sum
//! over `(c, tap)` in that order, as the GEMM kernels sum it whatever the blocking, so results
//! do not depend on the blocks, the threads or whether the columns were copied. The weight
//! gradient reads the same runs of the grid against the gradient laid out over the wide
//! positions ([`weight_grad`]: dot products along the positions, [`weight_dots`], on a core with
//! AVX-512F); its threads take ranges of input channels, each summing its rows of the gradient
//! over every sample in an order fixed by the whole geometry, so its bits do not depend on the
//! thread count either.
//!
//! A strided dim is split by phase in the grid: padded element `p` of a dim of stride `s` lies
//! in phase `p % s` at position `p / s`, each combination of phases a grid of its own. Tap `t`
//! then reads phase `(t * dilation) % s` at offset `(t * dilation) / s` from the output
//! position, and consecutive output positions are consecutive grid elements again, so the
//! columns are still fixed offsets into the grid and everything above holds as at stride 1
//! (where there is one phase and the grid is the padded input).

mod exact;
#[cfg(target_arch = "x86_64")]
mod weight_dots;
mod weight_grad;

use super::{jobs, View};
use crate::backend::cpu::half_gemm::{bf16_matmul_f32_b_rows, bf16_products_run, HalfMat};
use crate::backend::cpu::matmul::{matmul, sgemm_b_rows, Mat};
use crate::backend::SideBySide;
use crate::error::{Error, Result};
use deferfuse_fusion::ir::{Conv, ConvPart, DType, Layout};
use smallvec::{smallvec, SmallVec};
use std::cell::RefCell;

/// Bytes of one block of columns (`C * K` rows by a multiple of 32 columns): half of this
/// machine's L2, so the block stays there while the product reads it.
const BLOCK_BYTES: usize = 256 << 10;

/// Fewest multiply-adds worth splitting the samples over threads.
const SERIAL_BELOW_MACS: usize = 1 << 22;

thread_local! {
    /// The padded input, the block of columns and the wide result, kept between calls: fresh
    /// buffers of this size are fresh pages (faults and zeroing) every call.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A bfloat16 convolution's padded input (its wide result is in [`SCRATCH`]).
    static GRID16: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

type Idx = SmallVec<[usize; 3]>;

/// Calls `f(index)` for every index of `dims` in row-major order (once for no dims). Its own
/// odometer, not `for_each_row`'s: that one's per-row bookkeeping made the input gradient of a
/// `[4, 16, 64, 64]` gradient 1.7 -> 1.9 ms (its grid fill and crop walk short rows).
fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    if dims.contains(&0) {
        return;
    }
    let mut idx: Idx = smallvec![0; dims.len()];
    loop {
        f(&idx);
        let mut d = dims.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Fills `row` from the elements `stride` apart at `from`: one copy when they are contiguous
/// (the usual case; the element loop does not vectorize for a stride it cannot see).
///
/// # Safety
/// `from` is valid for `row.len()` elements `stride` apart.
unsafe fn read_run<T: Copy>(row: &mut [T], from: *const T, stride: isize) {
    if stride == 1 {
        row.copy_from_slice(std::slice::from_raw_parts(from, row.len()));
    } else {
        for (e, v) in row.iter_mut().enumerate() {
            *v = *from.offset(e as isize * stride);
        }
    }
}

/// Writes `row` to the elements `stride` apart at `to` ([`read_run`]'s mirror).
///
/// # Safety
/// `to` is valid for `row.len()` elements `stride` apart and does not overlap `row`.
unsafe fn write_run(to: *mut f32, stride: isize, row: &[f32]) {
    if stride == 1 {
        std::ptr::copy_nonoverlapping(row.as_ptr(), to, row.len());
    } else {
        for (e, &v) in row.iter().enumerate() {
            *to.offset(e as isize * stride) = v;
        }
    }
}

/// One call's sizes: what every sample shares.
struct Geometry {
    c: usize,
    oc: usize,
    input: Idx,
    out: Idx,
    padding: Idx,
    stride: Idx,
    /// Row-major strides of one phase's grid (`ceil(padded / stride)` positions per dim).
    grid_strides: Idx,
    /// Floats of one phase's grid, with the zeros the last wide columns' taps read past its
    /// end.
    phase: usize,
    /// Floats of one channel's grid: one per combination of phases (one at stride 1).
    channel: usize,
    /// Wide columns: `out[0]` times the grid's positions below the first dim.
    wide: usize,
    /// Grid offset of each tap, in the weight's row-major tap order.
    taps: Vec<usize>,
}

impl Geometry {
    /// The geometry of `k` over input `x` with a kernel of spatial sizes `kernel`, an output of
    /// spatial sizes `out` and `oc` output channels.
    fn new(k: &Conv, x: &View, kernel: &[usize], out: &[usize], oc: usize) -> Geometry {
        let d = k.padding.len();
        let input: Idx = x.sizes[2..].iter().copied().collect();
        let stride: Idx = k.stride.iter().copied().collect();
        // Positions of a phase per dim: the padded input's, split over the stride's phases.
        let positions: Idx = (0..d)
            .map(|i| (input[i] + 2 * k.padding[i]).div_ceil(stride[i]))
            .collect();
        let mut grid_strides: Idx = smallvec![1; d];
        for i in (0..d.saturating_sub(1)).rev() {
            grid_strides[i] = grid_strides[i + 1] * positions[i + 1];
        }
        // Where tap `t` of dim `i` reads, relative to the output position: (phase, offset).
        let tap_at = |i: usize, t: usize| {
            let v = t * k.dilation[i];
            (v % stride[i], v / stride[i])
        };
        // The last wide column's farthest tap reads this far past its phase's end: the
        // farthest offsets of the dims below the first, each at its stride.
        let past_end: usize = (1..d)
            .map(|i| tap_at(i, kernel[i] - 1).1 * grid_strides[i])
            .sum();
        let phase = positions[0] * grid_strides[0] + past_end;
        let mut taps = Vec::new();
        for_each_index(kernel, |t| {
            let (mut which, mut at) = (0, 0);
            for i in 0..d {
                let (r, q) = tap_at(i, t[i]);
                which = which * stride[i] + r;
                at += q * grid_strides[i];
            }
            taps.push(which * phase + at);
        });
        let out_sizes: Idx = out.iter().copied().collect();
        Geometry {
            c: x.sizes[1],
            oc,
            wide: out_sizes[0] * grid_strides[0],
            channel: stride.iter().product::<usize>() * phase,
            phase,
            input,
            out: out_sizes,
            padding: k.padding.iter().copied().collect(),
            stride,
            grid_strides,
            taps,
        }
    }

    /// Where padded position `p` (per dim, all but the last) starts in a channel's grid: its
    /// phase's grid and its place there, with phase `r_last` of the last dim.
    fn grid_at(&self, p: &[usize], r_last: usize) -> usize {
        let last = self.stride.len() - 1;
        let (mut which, mut at) = (0, 0);
        for (i, &p) in p.iter().enumerate() {
            which = which * self.stride[i] + p % self.stride[i];
            at += p / self.stride[i] * self.grid_strides[i];
        }
        (which * self.stride[last] + r_last) * self.phase + at
    }

    /// This call's scratch in `buf` (grown as needed): the padded grid, one block of columns
    /// and the wide result (or gradient).
    fn scratch<'a>(&self, buf: &'a mut Vec<f32>) -> (&'a mut [f32], &'a mut [f32], &'a mut [f32]) {
        let lens = [
            self.c * self.channel,
            self.rows() * self.block_cols(),
            self.oc * self.wide,
        ];
        if buf.len() < lens.iter().sum() {
            buf.resize(lens.iter().sum(), 0.0);
        }
        let (grid, rest) = buf.split_at_mut(lens[0]);
        let (block, wide) = rest.split_at_mut(lens[1]);
        (grid, block, &mut wide[..lens[2]])
    }

    /// Calls `f(wide_at, view_at)` for each row of the last spatial dim of every output
    /// channel of sample `s` of `v` (an output-shaped view): where the row starts in the wide
    /// layout and in `v`.
    fn for_each_output_row(&self, v: &View, s: usize, mut f: impl FnMut(usize, isize)) {
        let last = self.out.len() - 1;
        let vs = &v.strides[2..];
        let v0 = v.offset + s as isize * v.strides[0];
        let grid_strides: SmallVec<[isize; 3]> =
            self.grid_strides.iter().map(|&g| g as isize).collect();
        for oc in 0..self.oc {
            for_each_index(&self.out[..last], |i| {
                let wide_at = oc * self.wide + spatial_offset(i, &grid_strides[..last]) as usize;
                f(
                    wide_at,
                    v0 + oc as isize * v.strides[1] + spatial_offset(i, vs),
                );
            });
        }
    }

    /// Where each row `(c, tap)` of the columns starts in the grid: the block of columns
    /// starting at wide column `j0` has row `r` at `grid[row_offsets[r] + j0..]`.
    fn row_offsets(&self) -> Vec<isize> {
        (0..self.c)
            .flat_map(|c| {
                self.taps
                    .iter()
                    .map(move |&t| (c * self.channel + t) as isize)
            })
            .collect()
    }

    /// Rows of the product's contraction: `C * K`.
    fn rows(&self) -> usize {
        self.c * self.taps.len()
    }

    /// Wide columns per block of columns: a multiple of 32 (the widest GEMM tile's panel),
    /// at least 32.
    fn block_cols(&self) -> usize {
        let fit = BLOCK_BYTES / 4 / self.rows().max(1);
        (fit / 32 * 32).max(32).min(self.wide.next_multiple_of(32))
    }
}

/// Element offset of `idx` (a spatial index) in a view whose spatial strides are `strides`.
fn spatial_offset(idx: &[usize], strides: &[isize]) -> isize {
    idx.iter().zip(strides).map(|(&i, &s)| i as isize * s).sum()
}

/// `out = conv(x, w)` (see [`Conv`]), split over `threads` by samples when there is work
/// enough.
///
/// # Safety
/// Every view lies inside its buffer; `x` and `w` are both float32 or both bfloat16, and `out`
/// is float32; `out` does not overlap `x` or `w`.
pub(super) unsafe fn run(
    k: &Conv,
    x: &View,
    w: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let bf16 = [x.dtype, w.dtype] == [DType::BF16; 2];
    if !(bf16 || [x.dtype, w.dtype] == [DType::F32; 2]) || out.dtype != DType::F32 {
        return Err(Error::Internal(format!(
            "conv: two float32 or two bfloat16 operands and a float32 result expected, got {} \
             x {} -> {}",
            x.dtype, w.dtype, out.dtype
        )));
    }
    if out.numel() == 0 {
        return Ok(());
    }
    if k.part == ConvPart::WeightGrad {
        // x and w are the gradient and the input here.
        return weight_grad::by_channels(k, x, w, out, threads);
    }
    let g = Geometry::new(k, x, &w.sizes[2..], &out.sizes[2..], out.sizes[1]);
    if bf16 {
        return run_bf16(k, (x, w, out), &g, threads);
    }
    let weight = dense_weight::<f32>(k.part == ConvPart::InputGrad, w, &g);
    if !weight.iter().all(|v| v.is_finite()) {
        exact::run(k, x, &weight, &w.sizes[2..], out);
        return Ok(());
    }
    let offsets = g.row_offsets();
    by_samples(&g, x, out, threads, &|s| {
        SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            // SAFETY: the caller's contract; each sample writes only its own output slice.
            unsafe { run_sample(&g, x, (&weight, &offsets), out, s, &mut buf) };
        })
    })
}

/// Runs `sample(s)` for every sample of `x`, split over `threads` when there is work enough.
fn by_samples(
    g: &Geometry,
    x: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
    sample: &dyn Fn(usize),
) -> Result<()> {
    let n = x.sizes[0];
    let macs = out.numel() * g.rows();
    jobs(
        threads.filter(|_| n > 1 && macs >= SERIAL_BELOW_MACS),
        n,
        &|s| {
            sample(s);
            Ok(())
        },
    )
}

/// A bfloat16 convolution into a float32 `out` (autocast's, whose caller rounds once after
/// adding a bias): each element the f32 sum of the exact products, as [`run`]'s float32 path on
/// the widened operands, summed in `vdpbf16ps`'s pair order on a core with AVX512-BF16 (the
/// grid and the columns' panels in bf16, twice the f32 path's multiply-adds per
/// instruction). Elsewhere, and with a non-finite weight (whose padded taps must stay out of
/// the sums: [`exact`]), it is that float32 path on widened copies.
unsafe fn run_bf16(
    k: &Conv,
    (x, w, out): (&View, &View, &View),
    g: &Geometry,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let weight = dense_weight::<u16>(k.part == ConvPart::InputGrad, w, g);
    let finite = weight.iter().all(|&b| b & 0x7f80 != 0x7f80);
    let offsets = g.row_offsets();
    let a = HalfMat {
        ptr: weight.as_ptr() as *mut u16,
        rows: g.oc,
        cols: g.rows(),
        rs: g.rows() as isize,
        cs: 1,
    };
    if !finite || !bf16_products_run() {
        let (xw, ww) = (widened(x), widened(w));
        return run(k, &xw.1, &ww.1, out, threads);
    }
    by_samples(g, x, out, threads, &|s| {
        GRID16.with(|grid| {
            SCRATCH.with(|wide| {
                let (mut grid, mut wide) = (grid.borrow_mut(), wide.borrow_mut());
                let (grid_len, wide_len) = (g.c * g.channel, g.oc * g.wide);
                if grid.len() < grid_len {
                    grid.resize(grid_len, 0);
                }
                if wide.len() < wide_len {
                    wide.resize(wide_len, 0.0);
                }
                let (grid, wide) = (&mut grid[..grid_len], &mut wide[..wide_len]);
                // SAFETY: the caller's contract; each sample writes only its own output slice.
                unsafe {
                    fill_grid(g, x, s, grid);
                    let c = (wide.as_mut_ptr(), g.wide as isize, 1);
                    bf16_matmul_f32_b_rows(a, (grid.as_ptr(), &offsets), g.wide, c);
                    write_output(g, out, s, wide);
                }
            })
        })
    })
}

/// A float32 copy of a bfloat16 view (dense), and the view of it.
unsafe fn widened(v: &View) -> (Vec<f32>, View) {
    let mut data = Vec::with_capacity(v.numel());
    let from = v.base as *const u16;
    for_each_index(&v.sizes, |i| {
        let at = v.offset + spatial_offset(i, &v.strides);
        data.push(f32::from_bits((*from.offset(at) as u32) << 16));
    });
    let view = View::dense(data.as_mut_ptr() as *mut u8, DType::F32, &v.sizes);
    (data, view)
}

/// Sample `s` of `x` into `grid` (`g.c * g.channel` floats): zeros, then each input row at its
/// place in the padded grid, one run per phase of the last dim (every `stride`-th element to
/// consecutive places; at stride 1 the whole row as one run).
unsafe fn fill_grid<T: Copy + Default>(g: &Geometry, x: &View, s: usize, grid: &mut [T]) {
    grid.fill(T::default());
    let d = g.input.len();
    let last = d - 1;
    let xs = &x.strides[2..];
    let x0 = x.offset + s as isize * x.strides[0];
    let (pad, n, step) = (g.padding[last], g.input[last], g.stride[last]);
    let mut padded: Idx = smallvec![0; last];
    for c in 0..g.c {
        for_each_index(&g.input[..last], |i| {
            for a in 0..last {
                padded[a] = i[a] + g.padding[a];
            }
            let from = x0 + c as isize * x.strides[1] + spatial_offset(i, xs);
            let from = (x.base as *const T).offset(from);
            // Phase by phase, not element by element: a division per element made this copy
            // as slow as the product.
            for r in 0..step {
                // The first element in phase r, its place in that phase's grid, and how many.
                let e0 = (r + step - pad % step) % step;
                let count = n.saturating_sub(e0).div_ceil(step);
                let to = c * g.channel + g.grid_at(&padded, r) + (e0 + pad) / step;
                let run_from = from.offset(e0 as isize * xs[last]);
                read_run(
                    &mut grid[to..to + count],
                    run_from,
                    xs[last] * step as isize,
                );
            }
        });
    }
}

/// The block of columns of the `block.len() / g.rows()` wide positions from `j0`: row `(c,
/// tap)` is the grid's run at the tap's offset.
fn fill_block(g: &Geometry, grid: &[f32], j0: usize, block: &mut [f32]) {
    let nb = block.len() / g.rows().max(1);
    for c in 0..g.c {
        for (t, &off) in g.taps.iter().enumerate() {
            let r = c * g.taps.len() + t;
            let from = c * g.channel + off + j0;
            block[r * nb..(r + 1) * nb].copy_from_slice(&grid[from..from + nb]);
        }
    }
}

/// `c = a @ b + beta * c` for f32 matrices in this routine's scratch, by the runtime's GEMM
/// (`whole_rows`: the row count that picks its summation order, see `matmul`).
///
/// # Safety
/// Each pointer is valid for every element its layout addresses; `c` overlaps neither.
unsafe fn product(
    (a, la): (*const f32, &Layout),
    (b, lb): (*const f32, &Layout),
    (c, lc): (*mut f32, &Layout),
    beta: f64,
    whole_rows: usize,
) {
    let mat = |ptr: *const f32, layout| Mat {
        ptr: ptr as *mut u8,
        layout,
    };
    matmul(
        DType::F32,
        mat(a, la),
        mat(b, lb),
        mat(c, lc),
        1.0,
        beta,
        whole_rows,
    );
}

/// A 2-D layout.
fn layout2(sizes: [usize; 2], strides: [isize; 2], offset: usize) -> Layout {
    Layout {
        sizes: smallvec![sizes[0], sizes[1]],
        strides: smallvec![strides[0], strides[1]],
        offset,
    }
}

/// The weight as the dense `[OC, C * K]` matrix the product reads, each row's taps in the
/// kernel's row-major order: `w` itself, or (`mirrored`) `w`'s `[C, OC, k...]` read transposed
/// with every tap reversed.
unsafe fn dense_weight<T: Copy>(mirrored: bool, w: &View, g: &Geometry) -> Vec<T> {
    let kernel = &w.sizes[2..];
    let mut taps = Vec::with_capacity(g.taps.len());
    for_each_index(kernel, |t| {
        let at = |i: usize| if mirrored { kernel[i] - 1 - t[i] } else { t[i] };
        taps.push(
            (0..kernel.len())
                .map(|i| at(i) as isize * w.strides[2 + i])
                .sum::<isize>(),
        );
    });
    let (to_out, to_in) = match mirrored {
        false => (w.strides[0], w.strides[1]),
        true => (w.strides[1], w.strides[0]),
    };
    let p = w.base as *const T;
    let mut v = Vec::with_capacity(g.oc * g.rows());
    for o in 0..g.oc {
        for c in 0..g.c {
            let row = w.offset + o as isize * to_out + c as isize * to_in;
            v.extend(taps.iter().map(|&t| *p.offset(row + t)));
        }
    }
    v
}

/// Sample `s` of the convolution, in scratch `buf` (grown as needed): the product reads the
/// columns where they lie in the grid (`offsets`, [`Geometry::row_offsets`]) where the GEMM has
/// such a kernel, else copies them block by block.
unsafe fn run_sample(
    g: &Geometry,
    x: &View,
    (weight, offsets): (&[f32], &[isize]),
    out: &View,
    s: usize,
    buf: &mut Vec<f32>,
) {
    let (rows, cols) = (g.rows(), g.block_cols());
    let (grid, block, wide) = g.scratch(buf);
    fill_grid(g, x, s, grid);
    let in_place = sgemm_b_rows(
        (g.oc, rows, g.wide),
        (weight.as_ptr(), rows as isize, 1),
        (grid.as_ptr(), offsets),
        0.0,
        (wide.as_mut_ptr(), g.wide as isize, 1),
    );
    // Else the wide result, a block of columns at a time.
    let mut j0 = if in_place { g.wide } else { 0 };
    while j0 < g.wide {
        let nb = cols.min(g.wide - j0);
        fill_block(g, grid, j0, &mut block[..rows * nb]);
        let (la, lb) = (
            layout2([g.oc, rows], [rows as isize, 1], 0),
            layout2([rows, nb], [nb as isize, 1], 0),
        );
        let lc = layout2([g.oc, nb], [g.wide as isize, 1], j0);
        product(
            (weight.as_ptr(), &la),
            (block.as_ptr(), &lb),
            (wide.as_mut_ptr(), &lc),
            0.0,
            g.oc,
        );
        j0 += nb;
    }
    write_output(g, out, s, wide);
}

/// Sample `s`'s output positions of the wide result, row by row of the last dim.
///
/// # Safety
/// `out` is a float32 view inside its buffer, shaped as the convolution's output.
unsafe fn write_output(g: &Geometry, out: &View, s: usize, wide: &[f32]) {
    let (run, stride) = (g.out[g.out.len() - 1], out.strides[out.strides.len() - 1]);
    g.for_each_output_row(out, s, |from, to| {
        let row = &wide[from..from + run];
        write_run((out.base as *mut f32).offset(to), stride, row);
    });
}
