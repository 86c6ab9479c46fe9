//! The LSTM recurrence's host routines (`KernelOp::Lstm`): every step of one direction of one
//! layer, forward or backward, in one call.
//!
//! Each step computes as the step-by-step ops it replaces did, in CPU's cell order: the
//! hidden product `b_hh + h @ W_hh^T` (the bias written first and the product added onto it,
//! as the runtime's addmm does), plus the step's input product, the gates' activations (the
//! JIT's own sigmoid and tanh routines, so the same bits), `c = f * c_prev + i * g`, `h = o *
//! tanh(c)`; the backward as autograd through CPU's cell (`sigmoid_backward` is `d * (1 - y)
//! * y`, `tanh_backward` is `d * (1 - y * y)`), then `dh = gates' gradients @ W_hh`.
//!
//! The samples of a batch never meet: a sample's next step reads only its own `h` and `c`
//! (and, backward, its own gradients). So the batch is split into ranges of samples that run
//! side by side, each walking every step on its own, with no barrier between steps; every
//! product keeps the whole batch's kernel choice, so the bits do not depend on the split.
//!
//! Operands are read in place when they are dense, else copied dense first; the result is
//! written in place when it is dense, else through a dense copy.

use super::{for_each_row, jobs, View};
use crate::backend::cpu::block_math;
use crate::backend::cpu::matmul::sgemm_strided;
use crate::backend::SideBySide;
use crate::error::Result;
use deferfuse_fusion::ir::{Lstm, LstmPart};
use std::borrow::Cow;
use std::ops::Range;

/// Fewest multiply-adds in the steps' products worth splitting the batch over threads.
const SERIAL_BELOW_MACS: usize = 1 << 22;

/// Fewest samples a range of the batch takes: thinner products run far below the GEMM's speed.
const MIN_ROWS: usize = 4;

/// Runs part `k` over `inputs` into `out`, the batch split over `threads` when there is work
/// enough.
pub(super) unsafe fn run(
    k: &Lstm,
    inputs: &[View],
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let ops = Operands::new(k.part, inputs);
    let (t_len, b_len, h) = ops.dims;
    let ranges = match threads {
        Some(t) if t_len * b_len * h * 4 * h >= SERIAL_BELOW_MACS => {
            t.threads().min(b_len / MIN_ROWS).max(1)
        }
        _ => 1,
    };
    let mut result = DenseOut::new(out);
    let dst = Dst(result.as_mut_slice().as_mut_ptr());
    let walk = match k.part {
        LstmPart::Forward => forward,
        LstmPart::Backward => backward,
    };
    jobs(threads.filter(|_| ranges > 1), ranges, &|j| {
        let rows = b_len * j / ranges..b_len * (j + 1) / ranges;
        walk(k.reverse, &ops, dst.0, rows);
        Ok(())
    })?;
    result.finish();
    Ok(())
}

/// The result's first element, which the ranges of the batch write apart.
struct Dst(*mut f32);

// SAFETY: each range writes only its own samples' elements.
unsafe impl Sync for Dst {}

/// Whether `v`'s elements lie row-major and adjacent (dims of size 1 may have any stride).
fn is_dense(v: &View) -> bool {
    let mut want = 1isize;
    for (&size, &stride) in v.sizes.iter().zip(&v.strides).rev() {
        if size != 1 && stride != want {
            return false;
        }
        want *= size as isize;
    }
    true
}

/// An f32 operand as a dense slice: in place when it is dense, else copied.
///
/// # Safety
/// `v` is an f32 view inside its buffer.
unsafe fn dense(v: &View) -> Cow<'_, [f32]> {
    let base = (v.base as *const f32).offset(v.offset);
    if is_dense(v) {
        return Cow::Borrowed(std::slice::from_raw_parts(base, v.numel()));
    }
    let last = v.sizes.len() - 1;
    let (n, step) = (v.sizes[last], v.strides[last]);
    let mut copy = Vec::with_capacity(v.numel());
    for_each_row(&v.sizes, last, &[v], |_, offs| {
        for e in 0..n as isize {
            copy.push(*(v.base as *const f32).offset(offs[0] + e * step));
        }
    });
    Cow::Owned(copy)
}

/// The result as a dense slice: the output itself when it is dense, else a scratch copy that
/// [`DenseOut::finish`] writes out.
struct DenseOut<'a> {
    out: &'a View,
    scratch: Option<Vec<f32>>,
}

impl<'a> DenseOut<'a> {
    fn new(out: &'a View) -> DenseOut<'a> {
        let scratch = (!is_dense(out)).then(|| vec![0.0; out.numel()]);
        DenseOut { out, scratch }
    }

    /// # Safety
    /// The output view lies inside its buffer, which nothing else reads or writes meanwhile.
    unsafe fn as_mut_slice(&mut self) -> &mut [f32] {
        match &mut self.scratch {
            Some(v) => v,
            None => std::slice::from_raw_parts_mut(
                (self.out.base as *mut f32).offset(self.out.offset),
                self.out.numel(),
            ),
        }
    }

    /// Copies a scratch result into the output.
    unsafe fn finish(&self) {
        let Some(scratch) = &self.scratch else {
            return;
        };
        let v = self.out;
        let last = v.sizes.len() - 1;
        let (n, step) = (v.sizes[last], v.strides[last]);
        let mut from = scratch.iter();
        for_each_row(&v.sizes, last, &[v], |_, offs| {
            for e in 0..n as isize {
                *(v.base as *mut f32).offset(offs[0] + e * step) = *from.next().unwrap();
            }
        });
    }
}

/// `row = sigmoid(row)` in place, as the JIT's loops compute it.
fn sigmoid(row: &mut [f32]) {
    if block_math::available() {
        // SAFETY: the row is `row.len()` writable floats and the host has AVX2 and FMA.
        unsafe { block_math::df_block_sigmoid_f32(row.as_mut_ptr(), row.len() as i64) };
    } else {
        row.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp()));
    }
}

/// `row = tanh(row)` in place, as the JIT's loops compute it.
fn tanh(row: &mut [f32]) {
    if block_math::available() {
        // SAFETY: as in `sigmoid`.
        unsafe { block_math::df_block_tanh_f32(row.as_mut_ptr(), row.len() as i64) };
    } else {
        row.iter_mut().for_each(|x| *x = x.tanh());
    }
}

/// The step the walk takes `s`-th: forward in time, or from the last step for a reverse
/// direction.
fn step_at(s: usize, t_len: usize, reverse: bool) -> usize {
    if reverse {
        t_len - 1 - s
    } else {
        s
    }
}

/// A part's operands as its walks read them, shared by the ranges of the batch.
struct Operands<'a> {
    /// Steps, batch, hidden size.
    dims: (usize, usize, usize),
    /// Forward: `xg`, `h0`, `c0`, optionally `b_hh`; backward: the forward's result, `c0`,
    /// `dy`, `dh`, `dc`. Dense.
    dense: Vec<Cow<'a, [f32]>>,
    /// `W_hh^T` (forward) or `W_hh` (backward): first element, row and column strides.
    w: (*const f32, isize, isize),
}

// SAFETY: the ranges only read the operands.
unsafe impl Sync for Operands<'_> {}

impl<'a> Operands<'a> {
    /// # Safety
    /// The views are f32 operands of `part` inside their buffers.
    unsafe fn new(part: LstmPart, inputs: &'a [View]) -> Operands<'a> {
        let first = &inputs[0];
        let (weight, per_step) = match part {
            LstmPart::Forward => (1, 4),
            LstmPart::Backward => (2, 6),
        };
        let v = &inputs[weight];
        Operands {
            dims: (first.sizes[0], first.sizes[1], first.sizes[2] / per_step),
            dense: (0..inputs.len())
                .filter(|&i| i != weight)
                .map(|i| dense(&inputs[i]))
                .collect(),
            w: (
                (v.base as *const f32).offset(v.offset),
                v.strides[0],
                v.strides[1],
            ),
        }
    }
}

/// One sample's `len` floats at element `at` of the result.
///
/// # Safety
/// They lie inside the result, and only the caller's range writes them.
unsafe fn part<'r>(r: *mut f32, at: usize, len: usize) -> &'r mut [f32] {
    std::slice::from_raw_parts_mut(r.add(at), len)
}

/// The forward walk for the samples `rows`: `y [T, B, 6H]` gets each step's `i, f, g, o, c,
/// h`.
///
/// # Safety
/// `y` is the dense result for `ops`; no other range writes `rows`.
unsafe fn forward(reverse: bool, ops: &Operands, y: *mut f32, rows: Range<usize>) {
    let (t_len, b_len, h) = ops.dims;
    let (g_len, row) = (4 * h, 6 * h);
    let (xg, h0, c0) = (&ops.dense[0], &ops.dense[1], &ops.dense[2]);
    let bias = ops.dense.get(3);
    let (mut tanh_c, mut c_prev) = (vec![0f32; h], vec![0f32; h]);
    for s in 0..t_len {
        let t = step_at(s, t_len, reverse);
        let prev = (s > 0).then(|| step_at(s - 1, t_len, reverse) * b_len * row);
        let at = t * b_len * row;
        if let Some(bias) = bias {
            for b in rows.clone() {
                part(y, at + b * row, g_len).copy_from_slice(bias);
            }
        }
        let a = match prev {
            Some(p) => (
                y.add(p + rows.start * row + 5 * h) as *const f32,
                row as isize,
                1,
            ),
            None => (h0.as_ptr().add(rows.start * h), h as isize, 1),
        };
        let c = (y.add(at + rows.start * row), row as isize, 1);
        let beta = if bias.is_some() { 1.0 } else { 0.0 };
        sgemm_strided(b_len, (rows.len(), h, g_len), a, ops.w, beta, c);
        for b in rows.clone() {
            // The previous step's row lies before this one or, walking in reverse, after it.
            c_prev.copy_from_slice(match prev {
                Some(p) => part(y, p + b * row + 4 * h, h),
                None => &c0[b * h..][..h],
            });
            let cell = part(y, at + b * row, row);
            let x = &xg[(t * b_len + b) * g_len..][..g_len];
            cell[..g_len].iter_mut().zip(x).for_each(|(v, x)| *v += x);
            sigmoid(&mut cell[..2 * h]);
            tanh(&mut cell[2 * h..3 * h]);
            sigmoid(&mut cell[3 * h..4 * h]);
            let (gates, state) = cell.split_at_mut(g_len);
            let (i, rest) = gates.split_at(h);
            let (f, rest) = rest.split_at(h);
            let (g, o) = rest.split_at(h);
            let (c_new, h_new) = state.split_at_mut(h);
            for j in 0..h {
                c_new[j] = f[j] * c_prev[j] + i[j] * g[j];
            }
            tanh_c.copy_from_slice(c_new);
            tanh(&mut tanh_c);
            for j in 0..h {
                h_new[j] = o[j] * tanh_c[j];
            }
        }
    }
}

/// `d * (1 - y) * y`: the gradient through a sigmoid whose output was `y` (CPU's order).
fn sigmoid_backward(d: f32, y: f32) -> f32 {
    d * (1.0 - y) * y
}

/// `d * (1 - y * y)`: the gradient through a tanh whose output was `y` (CPU's order).
fn tanh_backward(d: f32, y: f32) -> f32 {
    d * (1.0 - y * y)
}

/// The backward walk for the samples `rows`, from the forward's last step to its first: `r
/// [T + 1, B, 4H]` gets each step's gate gradients, and in row `T` the gradients of `h0` and
/// `c0`.
///
/// # Safety
/// `r` is the dense result for `ops`; no other range writes `rows`.
unsafe fn backward(reverse: bool, ops: &Operands, r: *mut f32, rows: Range<usize>) {
    let (t_len, b_len, h) = ops.dims;
    let (g_len, row) = (4 * h, 6 * h);
    let (steps, c0, dy) = (&ops.dense[0], &ops.dense[1], &ops.dense[2]);
    // This range's running gradients of h and c, from those of the last states.
    let mut dh = ops.dense[3][rows.start * h..rows.end * h].to_vec();
    let mut dc = ops.dense[4][rows.start * h..rows.end * h].to_vec();
    let mut tanh_c = vec![0f32; h];
    for s in 0..t_len {
        // The forward's steps in reverse: its `s`-th from the end.
        let fwd = t_len - 1 - s;
        let t = step_at(fwd, t_len, reverse);
        let prev = (fwd > 0).then(|| step_at(fwd - 1, t_len, reverse));
        for (k, b) in rows.clone().enumerate() {
            let cell = &steps[(t * b_len + b) * row..][..row];
            let (i, f, g, o) = (
                &cell[..h],
                &cell[h..2 * h],
                &cell[2 * h..3 * h],
                &cell[3 * h..4 * h],
            );
            let c = &cell[4 * h..5 * h];
            let c_prev = match prev {
                Some(p) => &steps[(p * b_len + b) * row + 4 * h..][..h],
                None => &c0[b * h..][..h],
            };
            tanh_c.copy_from_slice(c);
            tanh(&mut tanh_c);
            let dy = &dy[(t * b_len + b) * h..][..h];
            let (dh, dc) = (&dh[k * h..][..h], &mut dc[k * h..][..h]);
            let out = part(r, (t * b_len + b) * g_len, g_len);
            for j in 0..h {
                let dh_t = dy[j] + dh[j];
                let tc = tanh_c[j];
                let dc_t = tanh_backward(dh_t * o[j], tc) + dc[j];
                out[j] = sigmoid_backward(dc_t * g[j], i[j]);
                out[h + j] = sigmoid_backward(dc_t * c_prev[j], f[j]);
                out[2 * h + j] = tanh_backward(dc_t * i[j], g[j]);
                out[3 * h + j] = sigmoid_backward(dh_t * tc, o[j]);
                dc[j] = dc_t * f[j];
            }
        }
        let a = (
            r.add((t * b_len + rows.start) * g_len) as *const f32,
            g_len as isize,
            1,
        );
        let dh_out = (dh.as_mut_ptr(), h as isize, 1);
        sgemm_strided(b_len, (rows.len(), g_len, h), a, ops.w, 0.0, dh_out);
    }
    for (k, b) in rows.enumerate() {
        let out = part(r, (t_len * b_len + b) * g_len, g_len);
        out[..h].copy_from_slice(&dh[k * h..][..h]);
        out[h..2 * h].copy_from_slice(&dc[k * h..][..h]);
        out[2 * h..].fill(0.0);
    }
}
