//! The per-stream trace buffer: an append-only list of recorded ops over buffer views.
//!
//! The trace sees tensors as `(buffer id, layout, dtype)`: it never holds storage, so it cannot
//! keep memory alive by itself, and an in-place write is simply a node whose output names an
//! existing buffer.

use crate::ir::{DType, Layout, Op, Scalar};
use smallvec::SmallVec;
use std::fmt;

/// Identifies a buffer in the runtime's store; the trace only compares these.
pub type BufferId = u64;

/// A tensor as an op sees it: a view of a buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    /// The buffer viewed.
    pub buffer: BufferId,
    /// Which elements of the buffer, in which order.
    pub layout: Layout,
    /// The element type of the buffer.
    pub dtype: DType,
}

/// One operand of a recorded op.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A tensor operand.
    Tensor(TensorRef),
    /// A Python number operand.
    Scalar(Scalar),
    /// An optional operand left out (a missing clamp bound).
    Absent,
}

impl Operand {
    /// The tensor, unless the operand is a scalar or absent.
    pub fn tensor(&self) -> Option<&TensorRef> {
        match self {
            Operand::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// One recorded op: inputs are read, `output` is written (a fresh buffer or, for in-place ops, a
/// view of an existing one).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The op and its attributes.
    pub op: Op,
    /// Operands, in op order.
    pub inputs: SmallVec<[Operand; 3]>,
    /// The view written.
    pub output: TensorRef,
    /// The dtype the op's arithmetic runs in (see `ir::infer::Inferred::compute`).
    pub compute: DType,
}

impl Node {
    /// Buffers this node reads.
    pub fn reads(&self) -> impl Iterator<Item = BufferId> + '_ {
        self.inputs
            .iter()
            .filter_map(|o| o.tensor().map(|t| t.buffer))
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "b{}{}:{} = {}(",
            self.output.buffer, self.output.layout, self.output.dtype, self.op
        )?;
        for (i, o) in self.inputs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match o {
                Operand::Tensor(t) => write!(f, "b{}{}:{}", t.buffer, t.layout, t.dtype)?,
                Operand::Scalar(s) => write!(f, "{s}")?,
                Operand::Absent => f.write_str("_")?,
            }
        }
        f.write_str(")")
    }
}

/// A stream's pending ops, in program order.
#[derive(Default, Debug)]
pub struct Trace {
    nodes: Vec<Node>,
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inlined: a node is ~600 bytes, and passing it on to a call copied it once more per op.
    #[inline]
    pub fn push(&mut self, node: Node) {
        self.nodes.push(node);
    }

    /// Number of pending nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no op is pending.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The pending nodes, in program order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Takes every pending node, leaving the trace empty (the flush owns them now).
    pub fn take(&mut self) -> Vec<Node> {
        std::mem::take(&mut self.nodes)
    }

    /// Gives back a flushed node list's allocation, so the next trace of similar length grows
    /// without reallocating (and copying its nodes) a dozen times.
    pub fn recycle(&mut self, mut nodes: Vec<Node>) {
        if self.nodes.is_empty() && nodes.capacity() > self.nodes.capacity() {
            nodes.clear();
            self.nodes = nodes;
        }
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nodes.iter().enumerate() {
            writeln!(f, "%{i}: {n}")?;
        }
        Ok(())
    }
}
