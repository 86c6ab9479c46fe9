//! Regions: buffer-free, canonical pieces of work that a backend compiles once and runs many
//! times. Buffers, sizes, strides and scalar values are not part of a region; they arrive at run
//! time in a [`Binding`].

use crate::ir::{BinaryOp, DType, KernelOp, ReduceOp, UnaryOp};
use crate::iter::{IterSpace, StrideKind};
use crate::trace::TensorRef;
use std::fmt;
use std::sync::Arc;

/// Index of a value computed inside a loop body.
pub type ValueIdx = u32;

/// One SSA instruction of a loop body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InstrKind {
    /// Element of input operand `n`, converted to the instruction's dtype.
    Load(u32),
    /// Scalar parameter slot `n` (its value is bound at run time).
    Param(u32),
    /// Op `u` applied to a value.
    Unary(UnaryOp, ValueIdx),
    /// Op `b` applied to two values.
    Binary(BinaryOp, ValueIdx, ValueIdx),
    /// `where(cond, a, b)` on three values.
    Where(ValueIdx, ValueIdx, ValueIdx),
    /// Conversion of a value to the instruction's dtype.
    Cast(ValueIdx),
    /// The current row's result of reduction `n` of the loop (a row kernel's later phases
    /// read it as a value broadcast along the row).
    Reduced(u32),
}

/// An instruction and the dtype of the value it yields.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instr {
    /// What the instruction computes.
    pub kind: InstrKind,
    /// The dtype of its result.
    pub dtype: DType,
}

/// An operand of a loop: its stored dtype and how it steps along the innermost dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoopOperand {
    /// The dtype stored in memory.
    pub dtype: DType,
    /// How it steps along the innermost dim.
    pub inner: StrideKind,
}

/// A reduction of a loop: `value` is folded over the innermost dim with `op`; each row's result
/// is stored to `output` when something needs it in memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoopReduce {
    /// How the values are folded.
    pub op: ReduceOp,
    /// The body value folded.
    pub value: ValueIdx,
    /// Where the row results are stored; `None` when nothing needs them in memory.
    pub output: Option<LoopOperand>,
}

/// An elementwise loop nest over one iteration space. With reductions it is a row kernel: for
/// each row, one sweep per reduction (in order; later sweeps read earlier results through
/// `InstrKind::Reduced`), then one sweep that stores the element outputs depending on them.
/// Operands are inputs, then element outputs, then the stored reduction outputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoopRegion {
    /// Input operands, in `InstrKind::Load` slot order.
    pub inputs: Vec<LoopOperand>,
    /// Compute dtype of each scalar parameter slot.
    pub params: Vec<DType>,
    /// The SSA instructions, in order.
    pub body: Vec<Instr>,
    /// Element outputs: each stores one body value at every element.
    pub outputs: Vec<(ValueIdx, LoopOperand)>,
    /// Reductions, in sweep order.
    pub reduces: Vec<LoopReduce>,
}

/// What a backend compiles. The planner produces these; it never names a backend.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// An elementwise loop nest, possibly with row reductions.
    Loop(LoopRegion),
    /// `out = alpha * (a @ b) + beta * out` over batch dims; operands a, b, out with layouts
    /// `[batch.., m, k]`, `[batch.., k, n]`, `[batch.., m, n]`; scalars alpha, beta (f64 bits).
    /// With an `epilogue` (2-D outputs only) the loop region runs on each block of output rows
    /// right after the GEMM wrote it, while it is in cache: the binding is then a, b, the
    /// epilogue's inputs, out, the epilogue's outputs; scalars alpha, beta, then the
    /// epilogue's; `iter` is the epilogue's.
    Matmul {
        /// Element type of a, b and out.
        dtype: DType,
        /// A loop run on each block of output rows after the GEMM.
        epilogue: Option<Box<LoopRegion>>,
    },
    /// `out[i] = start + i * step`; scalars start, step: f64 bits for a float dtype; for an
    /// integer dtype each truncated to an i64, the value computed in i64 (wrapping) and then
    /// wrapped to the dtype, as CPU's kernel computes in its `acc_type` (int64) and casts
    /// (see [`Region::arange_in_integers`]).
    Arange {
        /// Dtype of the output.
        dtype: DType,
    },
    /// A kernel op (gather, scatter, scan, sort, random; see [`KernelOp`]) as its canonical
    /// form. Operands are its tensor inputs in op order, then the output; scalars are its
    /// scalar operands in op order (see `Scalar::bits_for`, in the result's dtype). Dtypes and
    /// layouts come with the binding: one program serves every dtype and view.
    Kernel(KernelOp),
    /// A whole program for a backend whose own compiler fuses (XLA): the steps of a flush
    /// between two cuts, run as one launch (see [`GraphRegion`]).
    Graph(GraphRegion),
}

/// The steps of a flush that run as one program. Buffers are numbered in order of first
/// appearance, so two flushes that do the same work on other buffers give equal regions. The
/// step's binding lists the graph's inputs (buffers whose value the graph may read before
/// writing it whole) then its outputs (buffers written whose value something reads afterwards:
/// a live handle or a later step); every other value stays inside the program.
/// `Binding::parts` holds each part's own binding (views, iteration space, scalars).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphRegion {
    /// The steps, in order.
    pub parts: Vec<GraphPart>,
    /// How many distinct buffers the parts touch.
    pub buffers: u32,
    /// The graph buffer of each binding operand (inputs, then outputs).
    pub operands: Vec<u32>,
    /// How many leading operands are inputs.
    pub n_inputs: usize,
}

/// One step of a [`GraphRegion`]: its region and the graph buffer of each of its operands.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphPart {
    /// The step's region (never itself a graph).
    pub region: Arc<Region>,
    /// The graph buffer of each of the step's binding operands.
    pub operands: Vec<u32>,
}

/// The run-time half of a step: which buffer views and scalar values a region runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    /// Inputs then outputs, in the region's operand order.
    pub operands: Vec<TensorRef>,
    /// For loops: the coalesced iteration space (strides per operand, in elements).
    pub iter: Option<IterSpace>,
    /// 64-bit scalar slots (see `Scalar::bits_for`).
    pub scalars: Vec<u64>,
    /// How many leading operands are inputs.
    pub n_inputs: usize,
    /// For a [`Region::Graph`]: each part's binding, in part order (empty otherwise).
    pub parts: Vec<Binding>,
}

/// One unit of execution: a region and what it runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Shared: a reused plan hands out the same regions every flush, and cloning a loop body
    /// per step per flush cost more than the rest of a cache-hit flush.
    pub region: Arc<Region>,
    /// The buffer views and scalars the region runs on.
    pub binding: Binding,
    /// Trace node indices this step executes (for logs, dumps and stats).
    pub nodes: Vec<usize>,
    /// The executor's key for `region`, computed once: clones share it, so a reused plan does
    /// not hash its regions again on every flush.
    pub key: KeyMemo,
}

/// A lazily computed 128-bit key shared by every clone of a step (the region it keys is the
/// same in all of them). Never part of a step's identity: all memos compare equal.
#[derive(Clone, Debug, Default)]
pub struct KeyMemo(std::sync::Arc<std::sync::OnceLock<u128>>);

impl KeyMemo {
    /// The key, computing it with `f` the first time.
    pub fn get_or_init(&self, f: impl FnOnce() -> u128) -> u128 {
        *self.0.get_or_init(f)
    }
}

impl PartialEq for KeyMemo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Display for LoopRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "loop(")?;
        for (i, inp) in self.inputs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "in{i}:{}:{:?}", inp.dtype, inp.inner)?;
        }
        for (i, p) in self.params.iter().enumerate() {
            write!(f, ", p{i}:{p}")?;
        }
        writeln!(f, ") {{")?;
        for (i, ins) in self.body.iter().enumerate() {
            write!(f, "  v{i}:{} = ", ins.dtype)?;
            match &ins.kind {
                InstrKind::Load(n) => writeln!(f, "load in{n}")?,
                InstrKind::Param(n) => writeln!(f, "param p{n}")?,
                InstrKind::Unary(u, a) => writeln!(f, "{} v{a}", u.name())?,
                InstrKind::Binary(b, x, y) => writeln!(f, "{} v{x}, v{y}", b.name())?,
                InstrKind::Where(c, x, y) => writeln!(f, "where v{c}, v{x}, v{y}")?,
                InstrKind::Cast(a) => writeln!(f, "cast v{a}")?,
                InstrKind::Reduced(n) => writeln!(f, "reduced r{n}")?,
            }
        }
        for (k, r) in self.reduces.iter().enumerate() {
            write!(f, "  r{k} = {}(v{}) over inner dim", r.op.name(), r.value)?;
            match &r.output {
                Some(o) => writeln!(f, ", stored per row as {}", o.dtype)?,
                None => writeln!(f)?,
            }
        }
        for (i, (v, o)) in self.outputs.iter().enumerate() {
            writeln!(f, "  store out{i}:{}:{:?} <- v{v}", o.dtype, o.inner)?;
        }
        f.write_str("}")
    }
}

impl Region {
    /// Whether an arange of `dtype` computes in integers (i64 start and step) rather than f64.
    pub fn arange_in_integers(dtype: DType) -> bool {
        dtype.category() == crate::ir::Category::Integer
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Region::Loop(l) => l.fmt(f),
            Region::Matmul { dtype, epilogue } => {
                write!(f, "matmul.{dtype}(a, b, out; alpha, beta)")?;
                if let Some(e) = epilogue {
                    write!(f, " then per block of rows: {e}")?;
                }
                Ok(())
            }
            Region::Arange { dtype } => write!(f, "arange.{dtype}(out; start, step)"),
            Region::Kernel(k) => write!(f, "kernel {k}(inputs.., out; scalars..)"),
            Region::Graph(g) => {
                writeln!(
                    f,
                    "graph of {} steps over {} buffers (inputs {:?}, outputs {:?}) {{",
                    g.parts.len(),
                    g.buffers,
                    &g.operands[..g.n_inputs],
                    &g.operands[g.n_inputs..]
                )?;
                for p in &g.parts {
                    writeln!(f, "  on {:?}: {}", p.operands, p.region)?;
                }
                f.write_str("}")
            }
        }
    }
}
