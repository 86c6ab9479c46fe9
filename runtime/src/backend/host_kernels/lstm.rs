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
//! Operands are read in place when they are dense, else copied dense first; the result is
//! written in place when it is dense, else through a dense copy.

use super::{for_each_row, View};
use crate::backend::cpu::block_math;
use crate::backend::cpu::matmul::sgemm_strided;
use crate::error::Result;
use deferfuse_fusion::ir::{Lstm, LstmPart};
use std::borrow::Cow;

pub(super) unsafe fn run(k: &Lstm, inputs: &[View], out: &View) -> Result<()> {
    let mut result = DenseOut::new(out);
    match k.part {
        LstmPart::Forward => forward(k.reverse, inputs, result.as_mut_slice()),
        LstmPart::Backward => backward(k.reverse, inputs, result.as_mut_slice()),
    }
    result.finish();
    Ok(())
}

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

/// A weight operand as the GEMM takes it: its first element and (row, column) strides.
unsafe fn matrix(v: &View) -> (*const f32, isize, isize) {
    (
        (v.base as *const f32).offset(v.offset),
        v.strides[0],
        v.strides[1],
    )
}

/// The forward walk: `y [T, B, 6H]` gets each step's `i, f, g, o, c, h`.
unsafe fn forward(reverse: bool, inputs: &[View], y: &mut [f32]) {
    let (t_len, b_len, h) = (
        inputs[0].sizes[0],
        inputs[0].sizes[1],
        inputs[0].sizes[2] / 4,
    );
    let (g_len, row) = (4 * h, 6 * h);
    let xg = dense(&inputs[0]);
    let (h0, c0) = (dense(&inputs[2]), dense(&inputs[3]));
    let bias = inputs.get(4).map(|v| dense(v));
    let w = matrix(&inputs[1]);
    let (mut tanh_c, mut c_prev) = (vec![0f32; h], vec![0f32; h]);
    for s in 0..t_len {
        let t = step_at(s, t_len, reverse);
        let prev = (s > 0).then(|| step_at(s - 1, t_len, reverse) * b_len * row);
        let at = t * b_len * row;
        if let Some(bias) = &bias {
            for b in 0..b_len {
                y[at + b * row..][..g_len].copy_from_slice(bias);
            }
        }
        let a = match prev {
            Some(p) => (y.as_ptr().add(p + 5 * h), row as isize, 1),
            None => (h0.as_ptr(), h as isize, 1),
        };
        let c = (y.as_mut_ptr().add(at), row as isize, 1);
        let beta = if bias.is_some() { 1.0 } else { 0.0 };
        sgemm_strided(b_len, (b_len, h, g_len), a, w, beta, c);
        for b in 0..b_len {
            // The previous step's row lies before this one or, walking in reverse, after it.
            c_prev.copy_from_slice(match prev {
                Some(p) => &y[p + b * row + 4 * h..][..h],
                None => &c0[b * h..][..h],
            });
            let cell = &mut y[at + b * row..][..row];
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

/// The backward walk, from the forward's last step to its first: `r [T + 1, B, 4H]` gets each
/// step's gate gradients, and in row `T` the gradients of `h0` and `c0`.
unsafe fn backward(reverse: bool, inputs: &[View], r: &mut [f32]) {
    let steps = dense(&inputs[0]);
    let (t_len, b_len, h) = (
        inputs[0].sizes[0],
        inputs[0].sizes[1],
        inputs[0].sizes[2] / 6,
    );
    let (g_len, row) = (4 * h, 6 * h);
    let c0 = dense(&inputs[1]);
    let w = matrix(&inputs[2]);
    let dy = dense(&inputs[3]);
    let mut dh = dense(&inputs[4]).into_owned();
    let mut dc = dense(&inputs[5]).into_owned();
    let mut tanh_c = vec![0f32; h];
    for s in 0..t_len {
        // The forward's steps in reverse: its `s`-th from the end.
        let fwd = t_len - 1 - s;
        let t = step_at(fwd, t_len, reverse);
        let prev = (fwd > 0).then(|| step_at(fwd - 1, t_len, reverse));
        for b in 0..b_len {
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
            let (dh, dc) = (&dh[b * h..][..h], &mut dc[b * h..][..h]);
            let out = &mut r[(t * b_len + b) * g_len..][..g_len];
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
        let a = (r.as_ptr().add(t * b_len * g_len), g_len as isize, 1);
        sgemm_strided(
            b_len,
            (b_len, g_len, h),
            a,
            w,
            0.0,
            (dh.as_mut_ptr(), h as isize, 1),
        );
    }
    let last = &mut r[t_len * b_len * g_len..];
    for b in 0..b_len {
        let out = &mut last[b * g_len..][..g_len];
        out[..h].copy_from_slice(&dh[b * h..][..h]);
        out[h..2 * h].copy_from_slice(&dc[b * h..][..h]);
        out[2 * h..].fill(0.0);
    }
}
