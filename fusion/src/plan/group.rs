//! The loop region a planner builds while it walks the trace: its body, what it writes and
//! reads, and the rules for whether the next node may join it.

use super::CutReason;
use crate::epilogue::PendingMatmul;
use crate::ir::{Dims, Layout, ReduceOp, Strides};
use crate::lower::{emit_elementwise_over, LoopBuilder};
use crate::reduce_geometry::reduce_space_for;
use crate::region::ValueIdx;
use crate::trace::{BufferId, Node, TensorRef};
use smallvec::SmallVec;
/// Std maps with a fast hasher: keys are our own ids, and planning runs on every new trace.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// A reduction inside a row kernel.
pub(super) struct GroupReduce {
    pub(super) op: ReduceOp,
    pub(super) value: ValueIdx,
    pub(super) output: TensorRef,
    pub(super) node: usize,
    /// The output's strides over the loop's dims (0 along reduced dims).
    pub(super) strides: Strides,
}

/// Most distinct buffers one loop loads. Independent updates of the same shape (an
/// optimizer's parameters) would otherwise fuse into one loop streaming dozens of arrays at
/// once, more than the hardware prefetchers track: AdamW over 100 parameters ran at 56% of
/// STREAM triad that way. A loop that needs more is cut (counted as `max_ops`).
pub const MAX_LOADED_BUFFERS: usize = 8;

/// A loop region being built.
pub(super) struct Group {
    pub(super) b: LoopBuilder,
    /// The iteration shape: the elementwise shape, or the reduced input's shape.
    pub(super) sizes: Dims,
    /// Values written to buffer views (as seen over `sizes`), in order: (view, value, node).
    pub(super) written: Vec<(TensorRef, ValueIdx, usize)>,
    /// Views (over `sizes`) of buffers this loop loads.
    pub(super) reads: HashMap<BufferId, Vec<Layout>>,
    pub(super) nodes: Vec<usize>,
    pub(super) ops: usize,
    /// Once a reduction joined: the reduced dims, shared by every reduction of the loop.
    pub(super) red_dims: Option<Dims>,
    pub(super) reduces: Vec<GroupReduce>,
    /// The matmul this loop is the epilogue of.
    pub(super) mm: Option<PendingMatmul>,
}

/// `t`, a tensor of a row kernel's squeezed row shape (`sizes` without the reduced dims `red`)
/// or broadcastable to it, as a view of the keepdim row shape: the reduced dims back as size-1
/// dims.
pub(super) fn unsqueeze_reduced(t: &TensorRef, sizes: &[usize], red: &[usize]) -> TensorRef {
    let squeezed: Dims = sizes
        .iter()
        .enumerate()
        .filter(|(d, _)| !red.contains(d))
        .map(|(_, &s)| s)
        .collect();
    let l = t.layout.expand(&squeezed);
    let mut kept = l.sizes.iter().zip(l.strides.iter());
    let (mut out_sizes, mut out_strides): (Dims, Strides) = (SmallVec::new(), SmallVec::new());
    for d in 0..sizes.len() {
        let (size, stride) = if red.contains(&d) {
            (1, 0)
        } else {
            let (&size, &stride) = kept.next().expect("a kept dim per squeezed dim");
            (size, stride)
        };
        out_sizes.push(size);
        out_strides.push(stride);
    }
    TensorRef {
        layout: Layout {
            sizes: out_sizes,
            strides: out_strides,
            offset: l.offset,
        },
        ..t.clone()
    }
}

/// `sizes` with the reduced dims set to 1: the shape of a keepdim reduction's result.
pub(super) fn row_shape(sizes: &[usize], red: &[usize]) -> Dims {
    sizes
        .iter()
        .enumerate()
        .map(|(d, &s)| if red.contains(&d) { 1 } else { s })
        .collect()
}

impl Group {
    pub(super) fn new(sizes: Dims) -> Group {
        Group {
            b: LoopBuilder::default(),
            sizes,
            written: Vec::new(),
            reads: HashMap::default(),
            nodes: Vec::new(),
            ops: 0,
            red_dims: None,
            reduces: Vec::new(),
            mm: None,
        }
    }

    /// How an elementwise node of shape `out` iterates in this loop, if it can.
    pub(super) fn fits_shape(&self, out: &[usize]) -> bool {
        out == self.sizes.as_slice()
            || self.red_dims.as_ref().is_some_and(|r| {
                !self.reduces_empty_rows() && out == row_shape(&self.sizes, r).as_slice()
            })
    }

    /// Whether the rows this loop reduces are empty (a reduced dim of size 0): a row kernel
    /// computes ops on a reduced value in its last sweep over the row, which runs no iteration
    /// then, so such ops (`log` of an empty `sum`, `logsumexp` of a [3, 0] tensor) go to a
    /// loop of their own.
    fn reduces_empty_rows(&self) -> bool {
        self.red_dims
            .as_ref()
            .is_some_and(|r| r.iter().any(|&d| self.sizes[d] == 0))
    }

    /// `node` rewritten over this row kernel's keepdim row shape when it is an elementwise op
    /// on a full reduction's squeezed result (`[]` after a full sum):
    /// each operand, broadcast to the squeezed shape, gets its reduced dims back as size-1
    /// dims, so the op runs once per row after the reduction, as an op on the keepdim form
    /// does. Without it `sqrt(sum(x * x))` (every `vector_norm`, so one per parameter in
    /// `clip_grad_norm_`) cut at the sqrt, a program of its own on one element.
    pub(super) fn keepdim_form(&self, node: &Node) -> Option<Node> {
        let red = self.red_dims.as_ref()?;
        if self.reduces_empty_rows() {
            return None;
        }
        // Only a full reduction's scalar: taking `[rows]` results too (batch norm's
        // per-channel statistics) regrouped batch norm's step around a new copy program.
        let full = (0..self.sizes.len()).all(|d| red.contains(&d));
        if !full || node.output.layout.rank() != 0 {
            return None;
        }
        let unsqueeze = |t: &TensorRef| unsqueeze_reduced(t, &self.sizes, red);
        let mut k = node.clone();
        for o in k.inputs.iter_mut() {
            if let Some(t) = o.tensor() {
                *o = crate::trace::Operand::Tensor(unsqueeze(t));
            }
        }
        k.output = unsqueeze(&node.output);
        Some(k)
    }

    /// Why `node` (iterating over this loop's shape) cannot join, if it cannot.
    pub(super) fn conflict(&self, node: &Node, max_ops: usize) -> Option<CutReason> {
        if self.ops >= max_ops || self.loads_with(node) > MAX_LOADED_BUFFERS {
            return Some(CutReason::MaxOps);
        }
        if let Some(mm) = &self.mm {
            let reads: Vec<&TensorRef> = node.inputs.iter().filter_map(|o| o.tensor()).collect();
            if mm.conflicts(&reads, &node.output) {
                return Some(CutReason::Layout);
            }
        }
        let b = node.output.buffer;
        let self_load = node.inputs.iter().filter_map(|o| o.tensor()).any(|t| {
            let view = t.layout.expand(&self.sizes);
            t.buffer == b
                && !self
                    .b
                    .forwards
                    .iter()
                    .any(|(f, _)| f.buffer == b && f.layout == view)
        });
        if !self.reduces.is_empty() && (self.loads_buffer(b) || self_load) {
            // A row kernel sweeps each row several times: a buffer it loads must not change
            // under it (an in-place update would be seen by later sweeps).
            return Some(CutReason::Layout);
        }
        for t in node.inputs.iter().filter_map(|o| o.tensor()) {
            let view = t.layout.expand(&self.sizes);
            let written = self
                .written
                .iter()
                .map(|(w, _, _)| w)
                .filter(|w| w.buffer == t.buffer);
            let reduced = self
                .reduces
                .iter()
                .map(|r| &r.output)
                .filter(|o| o.buffer == t.buffer);
            let mut writes = written.chain(reduced).peekable();
            if writes.peek().is_some()
                && !self
                    .b
                    .forwards
                    .iter()
                    .any(|(f, _)| f.buffer == t.buffer && f.layout == view && f.dtype == t.dtype)
                && !writes.all(|w| w.dtype == t.dtype && w.layout.disjoint(&view))
            {
                // Read back through another view of what the loop wrote: the loop would load
                // memory it has not stored yet. A view apart from every write loads what was
                // there before the loop, which is its value.
                return Some(CutReason::Layout);
            }
        }
        let out = node.output.layout.expand(&self.sizes);
        let b = node.output.buffer;
        // Writing through another view of a buffer the loop reads or writes: an element both
        // views name would be read or stored out of program order. Views that share no element
        // (the pieces of a `cat` or `stack`) cannot race, so one loop may write them all.
        let races = |l: &Layout| *l != out && !l.disjoint(&out);
        if self.reads.get(&b).is_some_and(|ls| ls.iter().any(races)) {
            return Some(CutReason::Layout);
        }
        if self.written.iter().any(|(w, _, _)| {
            w.buffer == b && (races(&w.layout) || (w.layout != out && w.dtype != node.output.dtype))
        }) || self.reduces.iter().any(|r| r.output.buffer == b)
        {
            return Some(CutReason::Layout);
        }
        None
    }

    /// Distinct buffers the loop would load from memory with `node` in it.
    fn loads_with(&self, node: &Node) -> usize {
        let mut bufs: SmallVec<[BufferId; 16]> = SmallVec::new();
        let new = node
            .inputs
            .iter()
            .filter_map(|o| o.tensor())
            .filter(|t| !self.b.forwards.iter().any(|(f, _)| f.buffer == t.buffer));
        for b in self.b.inputs.iter().chain(new).map(|t| t.buffer) {
            if !bufs.contains(&b) {
                bufs.push(b);
            }
        }
        bufs.len()
    }

    /// True when the loop loads `buffer` from memory (rather than forwarding a value).
    pub(super) fn loads_buffer(&self, buffer: BufferId) -> bool {
        self.b.inputs.iter().any(|t| t.buffer == buffer)
    }

    /// True when the loop writes a buffer it also loads: it cannot become a row kernel.
    pub(super) fn updates_in_place(&self) -> bool {
        self.written
            .iter()
            .any(|(w, _, _)| self.loads_buffer(w.buffer))
    }

    pub(super) fn note_reads(&mut self, node: &Node) {
        for t in node.inputs.iter().filter_map(|o| o.tensor()) {
            self.reads
                .entry(t.buffer)
                .or_default()
                .push(t.layout.expand(&self.sizes));
        }
    }

    pub(super) fn add_elementwise(&mut self, i: usize, node: &Node) {
        self.note_reads(node);
        let sizes = self.sizes.clone();
        let v = emit_elementwise_over(&mut self.b, i, node, &sizes);
        let view = TensorRef {
            layout: node.output.layout.expand(&sizes),
            ..node.output.clone()
        };
        self.b.forwards.push((view.clone(), v));
        self.written.push((view, v, i));
        self.nodes.push(i);
        self.ops += 1;
    }

    /// Strides (over `sizes`) of every operand the loop may end up with.
    pub(super) fn operand_strides(&self, extra: &[&TensorRef]) -> Vec<Strides> {
        let mut s: Vec<Strides> = self
            .b
            .inputs
            .iter()
            .map(|t| t.layout.strides.clone())
            .collect();
        s.extend(extra.iter().map(|t| t.layout.expand(&self.sizes).strides));
        s.extend(
            self.written
                .iter()
                .map(|(t, _, _)| t.layout.strides.clone()),
        );
        s.extend(self.reduces.iter().map(|r| r.strides.clone()));
        s
    }

    /// True when a row kernel over these operands still walks each row as one strided dim.
    pub(super) fn rows_coalesce(&self, strides: &[Strides]) -> bool {
        match &self.red_dims {
            Some(r) => reduce_space_for(&self.sizes, r, strides).reduced <= 1,
            None => true,
        }
    }
}
