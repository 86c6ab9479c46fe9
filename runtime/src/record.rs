//! Recording: checks an op at its own call (shapes, dtypes, handles), makes its output, and
//! hands the node to the stream: run now (strict, debug) or append to the trace (defer).

use crate::buffer::{Buffer, BufferState, Writer};
use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::mode::{self, Mode};
use crate::runtime::{Runtime, Tensor};
use crate::stats::SyncReason;
use crate::stream::{OpBuffers, Stream};
use deferfuse_fusion::ir::infer::can_cast;
use deferfuse_fusion::ir::layout::fmt_dims;
use deferfuse_fusion::ir::{
    infer_memo_operands, BinaryOp, DType, Dims, KernelOp, Layout, Op, OpError, ReduceOp, Scalar,
};
use deferfuse_fusion::reduce_geometry::{
    reduce_needs_copy, reduced_dims, short_reduced_dim, trailing_then_leading,
};
use deferfuse_fusion::{Node, Operand, TensorRef};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One operand of an op call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Input {
    /// A tensor handle.
    Tensor(Handle),
    /// A scalar passed by value.
    Scalar(Scalar),
    /// An optional operand left out (a clamp bound).
    Absent,
}

type Buffers = OpBuffers;

/// Which operand of an op a handle was passed as; named only when an error message needs it
/// (formatting it for every op would cost more than recording the op).
#[derive(Clone, Copy)]
enum OperandName {
    Input(usize),
    Out,
}

fn tref(t: &Tensor) -> TensorRef {
    TensorRef {
        buffer: t.buffer.id,
        layout: t.layout.clone(),
        dtype: t.dtype,
    }
}

impl Runtime {
    /// Records `op` on `stream` (0 = default). Without `out` the result is a new tensor handle;
    /// with `out` the result is written into that tensor (an in-place op) and `out` is returned.
    pub fn op(
        &self,
        stream: Handle,
        op: Op,
        inputs: &[Input],
        out: Option<Handle>,
    ) -> Result<Handle> {
        self.op_described(stream, op, inputs, out).map(|(h, ..)| h)
    }

    /// [`Runtime::op`], also returning the result's dtype and sizes: a front end that wraps
    /// every result in a tensor of its own needs them, and asking for them in a second call
    /// cost a runtime and a handle lookup per op.
    pub fn op_described(
        &self,
        stream: Handle,
        op: Op,
        inputs: &[Input],
        out: Option<Handle>,
    ) -> Result<(Handle, DType, Dims)> {
        let mut other = None;
        let s = self.stream_ref(stream, &mut other)?;
        let mut buffers = Buffers::default();
        // The node is built where it is recorded from: operands go straight into it, and its
        // output in place of this empty one once known (building the operand list apart and
        // moving it in was a ~400-byte copy per op).
        let mut node = Node {
            op,
            inputs: SmallVec::new(),
            output: TensorRef {
                buffer: 0,
                layout: Layout {
                    sizes: SmallVec::new(),
                    strides: SmallVec::new(),
                    offset: 0,
                },
                dtype: DType::Bool,
            },
            compute: DType::Bool,
        };
        for (i, inp) in inputs.iter().enumerate() {
            match *inp {
                Input::Tensor(h) => {
                    let t = self.operand_tensor(h, &node.op, OperandName::Input(i))?;
                    node.inputs.push(Operand::Tensor(TensorRef {
                        buffer: t.buffer.id,
                        layout: t.layout,
                        dtype: t.dtype,
                    }));
                    buffers.insert(t.buffer);
                }
                Input::Scalar(v) => node.inputs.push(Operand::Scalar(v)),
                Input::Absent => node.inputs.push(Operand::Absent),
            }
        }
        let op = &node.op;
        let inf = infer_memo_operands(op, &node.inputs)?;
        // Assigned in each branch rather than returned as a pair: the pair was built and then
        // copied out (~140 bytes per op).
        let output;
        let result;
        let result_dtype;
        match out {
            Some(h) => {
                let t = self.out_tensor(h, op, &node.inputs)?;
                check_out(op, &inf.sizes, inf.dtype, &t)?;
                buffers.insert(t.buffer.clone());
                output = tref(&t);
                result = h;
                result_dtype = t.dtype;
            }
            None => {
                let buffer = self.new_buffer(inf.dtype, &inf.sizes, || op.name())?;
                // Built in place: the layout is cloned once, into the node, and moved into the
                // new handle's tensor below.
                output = TensorRef {
                    buffer: buffer.id,
                    layout: Layout::contiguous(&inf.sizes),
                    dtype: inf.dtype,
                };
                result = 0;
                result_dtype = inf.dtype;
                buffers.insert_new(buffer);
            }
        }
        self.snapshot_overlapping_inputs(s, &node.op, &mut node.inputs, &output, &mut buffers)?;
        let out_buffer = buffers
            .get(output.buffer)
            .cloned()
            .expect("output buffer is tracked");
        match &node.op {
            Op::Cat { dim } => self.record_cat(s, *dim, &node.inputs, &output, &buffers)?,
            Op::Reduce {
                dims,
                keepdim,
                op: ReduceOp::Sum,
            } if is_short_sum(&node.inputs[0], &output, inf.compute, dims) => {
                let input = node.inputs[0].tensor().expect("checked by infer");
                let dim = short_reduced_dim(&input.layout, dims).expect("checked above");
                self.record_short_sum(s, dim, *keepdim, input, &output, &buffers)?
            }
            Op::Reduce {
                dims,
                keepdim,
                op: r @ (ReduceOp::Sum | ReduceOp::Mean),
            } if splits_in_two(&node.inputs[0], &output, dims) => {
                let input = node.inputs[0].tensor().expect("checked by infer");
                let split = trailing_then_leading(&input.layout, dims).expect("checked above");
                let place = (&output, &mut buffers);
                self.record_reduce_in_two(s, (*r, split, *keepdim), input, place)?
            }
            Op::Reduce {
                dims,
                keepdim,
                op: r,
            } if reduce_needs_copy(
                &node.inputs[0].tensor().expect("checked by infer").layout,
                dims,
            ) =>
            {
                self.record_reduce_via_copy(
                    s,
                    *r,
                    dims,
                    *keepdim,
                    &node.inputs[0],
                    &output,
                    inf.compute,
                    &mut buffers,
                )?
            }
            _ => {
                // Moved, not cloned: the new handle's layout is made afresh below.
                node.output = output;
                node.compute = inf.compute;
                self.record(s, node, buffers)?
            }
        }
        if result != 0 {
            return Ok((result, result_dtype, inf.sizes));
        }
        // Without `out` the result is the new dense tensor made above: making its layout again
        // costs less than cloning the node's (~45 instructions per op).
        let h = self.tensors.insert(Tensor {
            buffer: out_buffer,
            layout: Layout::contiguous(&inf.sizes),
            dtype: inf.dtype,
        })?;
        Ok((h, result_dtype, inf.sizes))
    }

    /// The tensor behind an op's operand; a bad handle's message names the op and operand.
    /// Inlined: returned through a call, the ~140-byte tensor was copied once more per operand.
    #[inline(always)]
    fn operand_tensor(&self, h: Handle, op: &Op, operand: OperandName) -> Result<Tensor> {
        let t = self.handle_tensor(h, op, operand)?;
        // Its value was lost to a failed flush (or a device check it depends on failed, as a
        // synchronize found): computing from it would use stale memory.
        t.buffer.known_failure()?;
        Ok(t)
    }

    /// The tensor behind handle `h`, whose message when bad names the op and operand.
    #[inline(always)]
    fn handle_tensor(&self, h: Handle, op: &Op, operand: OperandName) -> Result<Tensor> {
        self.tensor(h).map_err(|e| match e {
            Error::InvalidHandle(m) => {
                let operand = match operand {
                    OperandName::Input(i) => format!("input {i}"),
                    OperandName::Out => "out".into(),
                };
                Error::InvalidHandle(format!("{}: {operand}: {m}", op.name()))
            }
            e => e,
        })
    }

    /// The tensor an in-place op writes. A value lost to a failed flush (an out-of-memory
    /// error) fails the op, as for an input, unless the op replaces every byte of the buffer
    /// without reading it (a copy or cast into the whole tensor: `fill_`, `copy_`,
    /// `load_state_dict`): that write makes a new value, so the lost one is forgotten and the
    /// tensor is usable again, as a CUDA tensor is after its out-of-memory error.
    fn out_tensor(&self, h: Handle, op: &Op, inputs: &[Operand]) -> Result<Tensor> {
        let t = self.handle_tensor(h, op, OperandName::Out)?;
        if let Err(e) = t.buffer.known_failure() {
            let reads_out = inputs
                .iter()
                .any(|o| o.tensor().is_some_and(|i| i.buffer == t.buffer.id));
            let whole = t.layout.offset == 0
                && t.layout.is_contiguous()
                && t.layout.numel() * t.dtype.size() == t.buffer.len;
            if !(matches!(op, Op::Copy | Op::Cast(_)) && whole && !reads_out) {
                return Err(e);
            }
            t.buffer.clear_failure();
        }
        Ok(t)
    }

    /// An input that is a different view of the buffer being written (`x[1:] += x[:-1]`), or
    /// the very output of an op that reads it elsewhere than at the written element (a matrix
    /// product's factor: `a.addmm_(a, w)`), is copied first, so every element reads the old
    /// contents, as in eager PyTorch.
    fn snapshot_overlapping_inputs(
        &self,
        s: &Arc<Stream>,
        op: &Op,
        operands: &mut [Operand],
        out: &TensorRef,
        buffers: &mut Buffers,
    ) -> Result<()> {
        for (i, o) in operands.iter_mut().enumerate() {
            let Operand::Tensor(t) = o else { continue };
            if t.buffer != out.buffer || (t.layout == out.layout && op.can_run_in_place_on(i)) {
                continue;
            }
            let tmp = self.new_buffer(t.dtype, &t.layout.sizes, || "copy")?;
            let tmp_ref = TensorRef {
                buffer: tmp.id,
                layout: Layout::contiguous(&t.layout.sizes),
                dtype: t.dtype,
            };
            buffers.insert_new(tmp);
            let node = Node {
                op: Op::Copy,
                inputs: SmallVec::from_elem(Operand::Tensor(t.clone()), 1),
                output: tmp_ref.clone(),
                compute: t.dtype,
            };
            self.record(s, node, buffers.clone())?;
            *t = tmp_ref;
        }
        Ok(())
    }

    /// cat = one copy per input into a slice of the output.
    fn record_cat(
        &self,
        s: &Arc<Stream>,
        dim: usize,
        inputs: &[Operand],
        out: &TensorRef,
        buffers: &Buffers,
    ) -> Result<()> {
        // Each copy lists only its own two buffers: given the whole op's list, each of n
        // copies cloned and kept the other inputs' buffers, O(n^2) for a cat of n tensors
        // (torch.stack of 1,600: 40-57 ms where CPU takes 1; clip_grad_norm_ stacks one norm
        // per parameter).
        let out_buffer = buffers.get(out.buffer).expect("output buffer is tracked");
        let mut at = 0;
        for inp in inputs {
            let t = inp.tensor().expect("cat inputs are tensors");
            let input_buffer = buffers
                .get(t.buffer)
                .expect("cat input buffers are tracked");
            let mut own = Buffers::default();
            own.insert_new(out_buffer.clone());
            own.insert(input_buffer.clone());
            let len = t.layout.sizes[dim];
            let dst = TensorRef {
                layout: out.layout.slice(dim, at, len, 1),
                ..out.clone()
            };
            at += len;
            let op = if t.dtype == out.dtype {
                Op::Copy
            } else {
                Op::Cast(out.dtype)
            };
            let node = Node {
                op,
                inputs: SmallVec::from_elem(inp.clone(), 1),
                output: dst,
                compute: out.dtype.compute(),
            };
            self.record(s, node, own)?;
        }
        Ok(())
    }

    /// A sum over one short dim (see [`short_reduced_dim`]) as the element-wise chain
    /// `out = 0 + x[.., 0, ..]`, `out += x[.., i, ..]`: the order PyTorch's CPU kernel sums 2
    /// to 4 elements in, so its bits there (5 to 8 it sums in another order); the leading
    /// `0 +` turns a sum of -0s into +0, as there. One op group: strict runs it as one fused
    /// program.
    fn record_short_sum(
        &self,
        s: &Arc<Stream>,
        dim: usize,
        keepdim: bool,
        input: &TensorRef,
        out: &TensorRef,
        buffers: &Buffers,
    ) -> Result<()> {
        let slice = |i: usize| {
            let l = input.layout.slice(dim, i, 1, 1);
            Operand::Tensor(TensorRef {
                layout: if keepdim { l } else { l.squeeze(&[dim]) },
                ..input.clone()
            })
        };
        let add = |a: Operand, b: Operand| Node {
            op: Op::Binary(BinaryOp::Add),
            inputs: SmallVec::from_vec(vec![a, b]),
            output: out.clone(),
            compute: out.dtype,
        };
        mode::enter_group(self.id);
        let mut recorded = self.record(
            s,
            add(Operand::Scalar(Scalar::Float(0.0)), slice(0)),
            buffers.clone(),
        );
        for i in 1..input.layout.sizes[dim] {
            if recorded.is_err() {
                break;
            }
            let sum = Operand::Tensor(out.clone());
            recorded = self.record(s, add(sum, slice(i)), buffers.clone());
        }
        if mode::leave_group(self.id)? && self.mode() != Mode::Defer {
            self.run_op_group(s)?;
        }
        recorded
    }

    /// A float32/float64 sum or mean over leading and trailing dims (see
    /// [`trailing_then_leading`]) as two reductions: over the trailing dims into a buffer of
    /// the leading and kept dims, then over the leading dims into `out`. No copy of the input;
    /// the sums are regrouped (per trailing row first), within f32 rounding of one reduction.
    fn record_reduce_in_two(
        &self,
        s: &Arc<Stream>,
        (r, (trailing, leading), keepdim): (ReduceOp, (Dims, Dims), bool),
        input: &TensorRef,
        (out, buffers): (&TensorRef, &mut Buffers),
    ) -> Result<()> {
        let rank = input.layout.rank();
        let partial: Vec<usize> = input.layout.sizes[..rank - trailing.len()].to_vec();
        let tmp = self.new_buffer(out.dtype, &partial, || "reduce")?;
        let tmp_ref = TensorRef {
            buffer: tmp.id,
            layout: Layout::contiguous(&partial),
            dtype: out.dtype,
        };
        buffers.insert_new(tmp);
        let reduce = |dims: Dims, from: TensorRef, to: TensorRef| Node {
            op: Op::Reduce {
                op: r,
                dims,
                keepdim: false,
            },
            inputs: SmallVec::from_elem(Operand::Tensor(from), 1),
            output: to,
            compute: out.dtype,
        };
        let red: Vec<usize> = leading.iter().chain(&trailing).copied().collect();
        self.record(
            s,
            reduce(trailing, input.clone(), tmp_ref.clone()),
            buffers.clone(),
        )?;
        let out_view = if keepdim {
            out.layout.squeeze(&red)
        } else {
            out.layout.clone()
        };
        let to = TensorRef {
            layout: out_view,
            ..out.clone()
        };
        self.record(s, reduce(leading, tmp_ref, to), buffers.clone())
    }

    /// A reduction whose reduced dims cannot be walked as one: copy them last first.
    #[allow(clippy::too_many_arguments)]
    fn record_reduce_via_copy(
        &self,
        s: &Arc<Stream>,
        r: deferfuse_fusion::ir::ReduceOp,
        dims: &[usize],
        keepdim: bool,
        input: &Operand,
        out: &TensorRef,
        compute: deferfuse_fusion::ir::DType,
        buffers: &mut Buffers,
    ) -> Result<()> {
        let t = input.tensor().expect("reduce input is a tensor");
        let rank = t.layout.rank();
        let red = reduced_dims(dims, rank);
        let order: Vec<usize> = (0..rank)
            .filter(|d| !red.contains(d))
            .chain(red.iter().copied())
            .collect();
        let permuted = t.layout.permute(&order);
        let tmp = self.new_buffer(t.dtype, &permuted.sizes, || "reduce")?;
        let tmp_ref = TensorRef {
            buffer: tmp.id,
            layout: Layout::contiguous(&permuted.sizes),
            dtype: t.dtype,
        };
        buffers.insert_new(tmp);
        let copy = Node {
            op: Op::Copy,
            inputs: SmallVec::from_elem(
                Operand::Tensor(TensorRef {
                    layout: permuted,
                    ..t.clone()
                }),
                1,
            ),
            output: tmp_ref.clone(),
            compute: t.dtype,
        };
        self.record(s, copy, buffers.clone())?;
        let kept = rank - red.len();
        let out_view = if keepdim {
            out.layout.squeeze(&red)
        } else {
            out.layout.clone()
        };
        let node = Node {
            op: Op::Reduce {
                op: r,
                dims: (kept..rank).collect(),
                keepdim: false,
            },
            inputs: SmallVec::from_elem(Operand::Tensor(tmp_ref), 1),
            output: TensorRef {
                layout: out_view,
                ..out.clone()
            },
            compute,
        };
        self.record(s, node, buffers.clone())
    }

    /// Hands a checked node to its stream according to the calling thread's mode.
    pub(crate) fn record(&self, s: &Arc<Stream>, node: Node, buffers: Buffers) -> Result<()> {
        self.counters.ops_recorded.fetch_add(1, Ordering::Relaxed);
        self.order_after_other_streams(s, buffers.iter())?;
        let mode = self.recording_mode();
        if self.captures_active.load(Ordering::Relaxed) > 0 {
            self.note_op_while_capturing(s, mode);
        }
        let out = || {
            buffers
                .get(node.output.buffer)
                .expect("output buffer is tracked")
        };
        if mode == Mode::Defer {
            let mut p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
            if p.capture.is_none() && self.pipelines_before(&node.op, p.trace.len()) {
                drop(p);
                self.flush_pipelined(s)?;
                p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
            }
            // Borrowed, not cloned: a clone and its drop are two atomic ops on every op.
            let out = out();
            out.mark_recorded();
            out.set_writer(Writer {
                stream: s.id,
                done: None,
            });
            let new_bytes = if out.is_allocated() { 0 } else { out.len };
            if p.buffers.record(&node, buffers) {
                p.bytes += new_bytes;
            }
            p.trace.push(node);
            if self.timeline.on() {
                let tag = crate::timeline::Timeline::tag();
                if tag != 0 {
                    let i = p.trace.len() - 1;
                    p.tags.push((i, tag));
                }
            }
            // A capture's trace is the whole graph: its length and bytes are checked only
            // when it ends.
            let reason = if p.capture.is_some() {
                None
            } else if p.trace.len() >= self.config.max_pending_ops {
                Some(SyncReason::MaxPending)
            } else if p.bytes > self.config.max_pending_bytes {
                Some(SyncReason::MemoryBound)
            } else {
                None
            };
            let pipelined =
                reason.is_none() && p.capture.is_none() && self.pipelines_after(p.trace.len());
            drop(p);
            if let Some(r) = reason {
                self.flush(s, r)?;
            } else if pipelined {
                self.flush_pipelined(s)?;
            }
            return Ok(());
        }
        self.flush(s, SyncReason::ModeSwitch)?;
        let out = out().clone();
        self.exec.run_now(s, node, buffers, mode)?;
        if mode == Mode::Debug && out.state() != BufferState::Materialized {
            return Err(Error::Internal(
                "debug check: an op's output is not materialized after it ran".into(),
            ));
        }
        Ok(())
    }

    /// Reading (or writing) a buffer another stream produces: run that stream's pending work and
    /// make this stream wait for it on its worker.
    pub(crate) fn order_after_other_streams<'a>(
        &self,
        s: &Arc<Stream>,
        buffers: impl Iterator<Item = &'a Arc<Buffer>>,
    ) -> Result<()> {
        for b in buffers {
            if b.written_by(s.id) {
                continue;
            }
            let Some(w) = b.writer() else { continue };
            if w.stream == s.id {
                continue;
            }
            if w.done.is_none() {
                if let Some(other) = self.stream_by_id(w.stream) {
                    self.flush(&other, SyncReason::CrossStream)?;
                }
            }
            if let Some(Some((p, seq))) = b.writer().map(|w| w.done) {
                if p.completed() < seq {
                    s.wait_for(&p, seq);
                }
            }
        }
        Ok(())
    }
}

/// Whether a sum of `input` over `dims` into `out` is recorded by
/// [`Runtime::record_short_sum`]: one short reduced dim, and no dtype change (a float16 sum
/// accumulates in float32 and rounds once; a chain of adds would round at each step).
fn is_short_sum(input: &Operand, out: &TensorRef, compute: DType, dims: &[usize]) -> bool {
    let t = input.tensor().expect("checked by infer");
    matches!(t.dtype, DType::F32 | DType::F64)
        && t.dtype == out.dtype
        && compute == out.dtype
        && short_reduced_dim(&t.layout, dims).is_some()
}

/// An in-place op's result must have the out tensor's shape and be castable to its dtype, and
/// the out tensor must not be an expanded view (two indices, one element).
/// Whether `op` writes an `out` of another dtype than its result's, converting each element:
/// elementwise loops and reductions convert at their store, and these kernels write through the
/// output's dtype. Products, `arange` and the other kernels write their result's dtype into
/// whatever `out` holds (a bf16 product into a float32 `out` read as float32 was garbage), so
/// they refuse one, as PyTorch's `mm`/`addmm`/`bmm` do.
fn converts_into_out(op: &Op) -> bool {
    match op {
        Op::Matmul | Op::Addmm | Op::Arange { .. } => false,
        Op::Kernel(k) => matches!(
            k,
            KernelOp::Gather { .. }
                | KernelOp::Scatter { .. }
                | KernelOp::Scan { .. }
                | KernelOp::Sort { .. }
        ),
        _ => true,
    }
}

fn check_out(
    op: &Op,
    sizes: &[usize],
    dtype: deferfuse_fusion::ir::DType,
    out: &Tensor,
) -> Result<()> {
    if out.layout.sizes.as_slice() != sizes {
        return Err(OpError::new(
            op.name(),
            "out",
            format!("shape {} (the result's shape)", fmt_dims(sizes)),
            fmt_dims(&out.layout.sizes),
        )
        .hint("in-place ops cannot change the shape of their output")
        .into());
    }
    if out.dtype != dtype && !converts_into_out(op) {
        return Err(OpError::new(
            op.name(),
            "out",
            format!(
                "dtype {dtype} (the result's: {} writes no other)",
                op.name()
            ),
            out.dtype.to_string(),
        )
        .hint(format!(
            "expected out tensor to have dtype {dtype}; pass one of that dtype, or cast the \
             result afterwards"
        ))
        .into());
    }
    if !can_cast(dtype, out.dtype) {
        return Err(OpError::new(
            op.name(),
            "out",
            format!("a dtype that {dtype} can be cast to"),
            out.dtype.to_string(),
        )
        .hint(format!(
            "result type {dtype} can't be cast to the desired output type {}",
            out.dtype
        ))
        .into());
    }
    if out.layout.has_overlap() {
        return Err(OpError::new(
            op.name(),
            "out",
            "a view without repeated elements",
            "an expanded view",
        )
        .hint("write into a contiguous tensor, or clone() the view first")
        .into());
    }
    Ok(())
}

/// Whether a reduction of `input` into `out` runs as two (`Runtime::record_reduce_in_two`):
/// float32/float64 in and out, over leading and trailing dims that one reduction would copy.
fn splits_in_two(input: &Operand, out: &TensorRef, dims: &[usize]) -> bool {
    let Some(t) = input.tensor() else {
        return false;
    };
    matches!(out.dtype, DType::F32 | DType::F64)
        && t.dtype == out.dtype
        && trailing_then_leading(&t.layout, dims).is_some()
}
