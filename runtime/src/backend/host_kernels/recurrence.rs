//! The RNN recurrences' host routines (`KernelOp::Recurrence`): every step of one direction of
//! one LSTM, GRU or plain RNN layer, forward or backward, in one call (the cells' walks:
//! `lstm.rs`, `gru.rs`, `rnn.rs`).
//!
//! Each step computes as the step-by-step ops it replaces did, in CPU's cell order: the
//! hidden product `b_hh + h @ W_hh^T` (the bias written first and the product added onto it,
//! as the runtime's addmm does), the step's input product added, the gates' activations (the
//! JIT's own sigmoid and tanh routines, so the same bits), the cell's state update; the
//! backward as autograd through CPU's cell (`sigmoid_backward` is `d * (1 - y) * y`,
//! `tanh_backward` is `d * (1 - y * y)`), then `dh` through the gates' gradients `@ W_hh`.
//!
//! The samples of a batch never meet: a sample's next step reads only its own states (and,
//! backward, its own gradients). So the batch is split into ranges of samples that run side
//! by side, each walking every step on its own, with no barrier between steps; every product
//! keeps the whole batch's kernel choice, so the bits do not depend on the split.
//!
//! Packed steps (a `PackedSequence`: step `t` holds its first `batch_sizes[t]` samples) walk
//! the same way: a step works on the samples it holds ([`Steps`]), a sample that left keeps
//! its state untouched (its last states, or backward its first states' gradients), and walking
//! in reverse a sample joins at its own last step from the first states.
//!
//! Operands are read in place when they are dense, else copied dense first; the result is
//! written in place when it is dense, else through a dense copy.

mod gru;
mod hidden;
mod lstm;
mod rnn;

use super::{for_each_row, jobs, View};
use crate::backend::cpu::block_math;
use crate::backend::SideBySide;
use crate::error::{Error, Result};
use deferfuse_fusion::ir::{Cell, Recurrence, RecurrencePart};
use std::borrow::Cow;
use std::ops::Range;

/// Fewest multiply-adds in the steps' products worth splitting the batch over threads.
const SERIAL_BELOW_MACS: usize = 1 << 22;

/// Fewest samples a range of the batch takes: thinner products run far below the GEMM's speed.
const MIN_ROWS: usize = 4;

/// Runs part `k` over `inputs` into `out`, the batch split over `threads` when there is work
/// enough.
pub(super) unsafe fn run(
    k: &Recurrence,
    inputs: &[View],
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let ops = Operands::new(k.part, inputs)?;
    let (t_len, b_len, h) = ops.dims;
    let ranges = match threads {
        Some(t) if t_len * b_len * h * k.part.gates() * h >= SERIAL_BELOW_MACS => {
            t.threads().min(b_len / MIN_ROWS).max(1)
        }
        _ => 1,
    };
    let mut result = DenseOut::new(out);
    let dst = Dst(result.as_mut_slice().as_mut_ptr());
    let walk = match k.part {
        RecurrencePart::LstmForward => lstm::forward,
        RecurrencePart::LstmBackward => lstm::backward,
        RecurrencePart::GruForward => gru::forward,
        RecurrencePart::GruBackward => gru::backward,
        RecurrencePart::RnnTanhForward | RecurrencePart::RnnReluForward => rnn::forward,
        RecurrencePart::RnnTanhBackward | RecurrencePart::RnnReluBackward => rnn::backward,
    };
    let how = Walk {
        reverse: k.reverse,
        relu: k.part.cell() == Cell::RnnRelu,
    };
    jobs(threads.filter(|_| ranges > 1), ranges, &|j| {
        walk(
            how,
            &ops,
            dst.0,
            b_len * j / ranges..b_len * (j + 1) / ranges,
        );
        Ok(())
    })?;
    result.finish();
    Ok(())
}

/// How a walk goes: from the last step (`reverse`); the plain RNN's activation (`relu`, else
/// tanh; the other cells ignore it).
#[derive(Clone, Copy)]
struct Walk {
    reverse: bool,
    relu: bool,
}

/// The result's first element, which the ranges of the batch write apart.
struct Dst(*mut f32);

// SAFETY: each range writes only its own samples' elements.
unsafe impl Sync for Dst {}

/// An f32 operand as a dense slice: in place when it is dense, else copied.
///
/// # Safety
/// `v` is an f32 view inside its buffer.
unsafe fn dense(v: &View) -> Cow<'_, [f32]> {
    let base = (v.base as *const f32).offset(v.offset);
    if v.is_dense_from(0) {
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
        let scratch = (!out.is_dense_from(0)).then(|| vec![0.0; out.numel()]);
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
    /// Where each step's samples lie.
    steps: Steps,
    /// The operands but the weight and `batch_sizes`, dense, in their order
    /// (`RecurrencePart`'s doc): `h0` is second in every forward.
    dense: Vec<Cow<'a, [f32]>>,
    /// `W_hh^T` (forward) or `W_hh` (backward), as the steps' hidden products read it.
    w: hidden::HiddenWeight,
}

// SAFETY: the ranges only read the operands.
unsafe impl Sync for Operands<'_> {}

impl<'a> Operands<'a> {
    /// # Safety
    /// The views are operands of `part` inside their buffers (f32, the hidden weight f32 or
    /// bf16, and packed steps' int64 `batch_sizes` last).
    unsafe fn new(part: RecurrencePart, inputs: &'a [View]) -> Result<Operands<'a>> {
        let first = &inputs[0];
        let names = part.operands();
        let weight = names
            .iter()
            .position(|n| n.starts_with("w_hh"))
            .expect("every part has a hidden weight");
        let per_step = if part.is_backward() {
            part.kept()
        } else {
            part.gates()
        };
        let packed = first.sizes.len() == 2;
        let h = first.sizes[first.sizes.len() - 1] / per_step;
        let (steps, floats) = if packed {
            // The batch: the first states' (a backward's last states') rows.
            let state = if part.is_backward() { "dh" } else { "h0" };
            let at = names
                .iter()
                .position(|&n| n == state)
                .expect("every part has it");
            let b = inputs[at].sizes[0];
            let sizes = inputs.last().expect("batch_sizes");
            let steps = Steps::packed(part.name(), sizes, b, first.sizes[0])?;
            (steps, inputs.len() - 1)
        } else {
            (Steps::dense(first.sizes[0], first.sizes[1]), inputs.len())
        };
        let v = &inputs[weight];
        Ok(Operands {
            dims: (steps.len.len(), steps.batch(), h),
            steps,
            dense: (0..floats)
                .filter(|&i| i != weight)
                .map(|i| dense(&inputs[i]))
                .collect(),
            w: hidden::HiddenWeight::new(v),
        })
    }
}

/// Where each step's samples lie in the time-major operands and results: step `t` holds
/// samples `0..len[t]`, in rows `start[t]..start[t] + len[t]` (every step the whole batch, or
/// packed steps' batch sizes, which only shrink).
struct Steps {
    start: Vec<usize>,
    len: Vec<usize>,
    /// Rows of all steps: where a backward's first states' rows begin.
    rows: usize,
}

impl Steps {
    /// `t` steps of the whole batch `b`.
    fn dense(t: usize, b: usize) -> Steps {
        Steps {
            start: (0..t).map(|s| s * b).collect(),
            len: vec![b; t],
            rows: t * b,
        }
    }

    /// Packed steps of batch `b` over `n` rows, their sizes read from `sizes` (int64 `[T]`),
    /// or why they do not describe such steps.
    ///
    /// # Safety
    /// `sizes` is an int64 vector inside its buffer.
    unsafe fn packed(name: &str, sizes: &View, b: usize, n: usize) -> Result<Steps> {
        let len: Vec<i64> = (0..sizes.sizes[0] as isize)
            .map(|t| *(sizes.base as *const i64).offset(sizes.offset + t * sizes.strides[0]))
            .collect();
        let shrinks = len.windows(2).all(|w| w[1] <= w[0]);
        let total: i64 = len.iter().sum();
        if len[0] != b as i64 || !shrinks || len.iter().any(|&l| l < 1) || total != n as i64 {
            let shown: Vec<String> = len.iter().take(16).map(|l| l.to_string()).collect();
            let more = if len.len() > 16 { ", ..." } else { "" };
            return Err(Error::InvalidArgument(format!(
                "{name}: batch_sizes [{}{more}] do not describe packed steps: expected \
                 non-increasing sizes from the batch size {b}, each at least 1, summing to \
                 the {n} packed rows (pass a PackedSequence's own batch_sizes)",
                shown.join(", ")
            )));
        }
        let len: Vec<usize> = len.into_iter().map(|l| l as usize).collect();
        let start = len
            .iter()
            .scan(0, |at, &l| {
                let here = *at;
                *at += l;
                Some(here)
            })
            .collect();
        Ok(Steps {
            start,
            len,
            rows: n,
        })
    }

    /// The batch: the samples the first step holds.
    fn batch(&self) -> usize {
        self.len[0]
    }

    /// Where a walk stands at the forward's `s`-th step (`reverse`: counted from the last) for
    /// the samples `rows`: `None` when that step holds none of them.
    fn visit(&self, s: usize, reverse: bool, rows: &Range<usize>) -> Option<Step> {
        let t_len = self.len.len();
        let t = step_at(s, t_len, reverse);
        let prev = (s > 0).then(|| step_at(s - 1, t_len, reverse));
        let held = rows.start..rows.end.min(self.len[t]).max(rows.start);
        // The samples the step before held go on from it; the rest start here.
        let on = prev.map_or(0, |p| self.len[p]).clamp(held.start, held.end);
        (!held.is_empty()).then(|| Step {
            prev_start: prev.map(|p| self.start[p]),
            start: self.start[t],
            held,
            on,
        })
    }
}

/// One step of a walk for a range of samples (see [`Steps::visit`]).
struct Step {
    /// The first row of the forward's step before it (`None` at the first step).
    prev_start: Option<usize>,
    /// The step's first row (sample 0's).
    start: usize,
    /// The range's samples the step holds.
    held: Range<usize>,
    /// Samples of `held` below this go on from the step before; the others start at this one
    /// from the first states.
    on: usize,
}

impl Step {
    /// Sample `b`'s row at the step before, or `None` when it starts here (from the first
    /// states).
    fn row_before(&self, b: usize) -> Option<usize> {
        self.prev_start.filter(|_| b < self.on).map(|p| p + b)
    }
}

/// A forward step's hidden products for the samples it holds: those going on read the previous
/// step's `h` (`h_in_row` floats into its rows), those starting read `h0`. `row` floats a sample
/// in `y`, the products in their first `g_len`.
///
/// # Safety
/// As [`hidden_product`].
unsafe fn hidden_products(
    ops: &Operands,
    y: *mut f32,
    step: &Step,
    (row, g_len, h_in_row): (usize, usize, usize),
    bias: Option<&[f32]>,
) {
    let at = step.start * row;
    let h_prev = step.prev_start.map(|p| p * row + h_in_row);
    let (on, fresh) = (step.held.start..step.on, step.on..step.held.end);
    hidden_product(ops, y, &on, (at, row, g_len), h_prev, bias);
    hidden_product(ops, y, &fresh, (at, row, g_len), None, bias);
}

/// Writes each sample's hidden product `b_hh + h_prev @ W_hh^T` into the first `g_len` floats
/// of its row of a forward's step, for the samples `rows`: the step's rows start at element `at`
/// of `y` (sample 0's), `row` floats a sample; `h_prev` is where the previous step's `h`
/// starts (sample 0's), `None` for samples that start at this step, which read `h0`. The bias
/// is written first and the product added onto it, as the runtime's addmm does.
///
/// # Safety
/// `y` is the dense result of a forward part of `ops`; no other range writes `rows`.
unsafe fn hidden_product(
    ops: &Operands,
    y: *mut f32,
    rows: &Range<usize>,
    (at, row, g_len): (usize, usize, usize),
    h_prev: Option<usize>,
    bias: Option<&[f32]>,
) {
    let h = ops.dims.2;
    if let Some(bias) = bias {
        for b in rows.clone() {
            part(y, at + b * row, g_len).copy_from_slice(bias);
        }
    }
    let a = match h_prev {
        Some(p) => (y.add(p + rows.start * row) as *const f32, row as isize, 1),
        None => (ops.dense[1].as_ptr().add(rows.start * h), h as isize, 1),
    };
    let c = (y.add(at + rows.start * row), row as isize, 1);
    let beta = if bias.is_some() { 1.0 } else { 0.0 };
    ops.w
        .product(ops.dims.1, (rows.len(), h, g_len), a, beta, c);
}

/// Lanes the backward walks' per-unit arithmetic takes at once.
const V: usize = 8;

/// Runs a backward's per-unit arithmetic `f` over one sample's `h` units, `V` at a time through
/// arrays (over the slices themselves LLVM left the loop scalar: it cannot tell them apart).
/// `f` gets each lane group of `ins` and of `state` (a running value, such as the LSTM's `dc`)
/// and returns the groups of `out`'s `O` blocks of `h` floats, then the next `state`.
fn in_lanes<const I: usize, const O: usize>(
    h: usize,
    ins: [&[f32]; I],
    state: &mut [f32],
    out: &mut [f32],
    f: impl Fn(&[[f32; V]; I], &[f32; V]) -> ([[f32; V]; O], [f32; V]),
) {
    let mut j = 0;
    while j < h {
        let n = V.min(h - j);
        let mut x = [[0f32; V]; I];
        for (lanes, from) in x.iter_mut().zip(ins) {
            copy_lanes(lanes, &from[j..], n);
        }
        let mut s = [0f32; V];
        copy_lanes(&mut s, &state[j..], n);
        let (y, next) = f(&x, &s);
        for (q, lanes) in y.iter().enumerate() {
            copy_lanes(&mut out[q * h + j..], lanes, n);
        }
        copy_lanes(&mut state[j..], &next, n);
        j += n;
    }
}

/// Copies the first `n <= V` floats of `from` into `to`. A whole group is copied at the
/// constant length `V`, which compiles to a few vector moves; copied at the variable length `n`
/// every group was a call to libc's `memcpy` for 32 bytes, ten or more per group, and those
/// calls were 7% of an LSTM language model's training step (`perf`, one thread).
#[inline(always)]
fn copy_lanes(to: &mut [f32], from: &[f32], n: usize) {
    if n == V {
        to[..V].copy_from_slice(&from[..V]);
    } else {
        to[..n].copy_from_slice(&from[..n]);
    }
}

/// One sample's `len` floats at element `at` of the result.
///
/// # Safety
/// They lie inside the result, and only the caller's range writes them.
unsafe fn part<'r>(r: *mut f32, at: usize, len: usize) -> &'r mut [f32] {
    std::slice::from_raw_parts_mut(r.add(at), len)
}

/// `d * (1 - y) * y`: the gradient through a sigmoid whose output was `y` (CPU's order).
fn sigmoid_backward(d: f32, y: f32) -> f32 {
    d * (1.0 - y) * y
}

/// `d * (1 - y * y)`: the gradient through a tanh whose output was `y` (CPU's order).
fn tanh_backward(d: f32, y: f32) -> f32 {
    d * (1.0 - y * y)
}
