//! Matmul epilogues: an elementwise loop that consumes a 2-D matmul's output (bias, activation,
//! residual) runs inside the matmul's program, on each block of output rows right after the
//! GEMM wrote it, so the rows are still in cache when the loop reads them.

use crate::ir::Op;
use crate::region::{Binding, Region, Step};
use crate::trace::{Node, TensorRef};
use std::sync::Arc;

/// A lowered matmul waiting to see whether the next ops can be its epilogue.
#[derive(Clone, Debug)]
pub(crate) struct PendingMatmul {
    /// Index of the matmul's node in the trace.
    pub node: usize,
    /// The lowered steps: an optional bias copy, then the GEMM (last).
    pub steps: Vec<Step>,
}

impl PendingMatmul {
    fn gemm(&self) -> &Step {
        self.steps
            .last()
            .expect("a matmul lowers to at least its GEMM")
    }

    /// The GEMM's output view.
    pub fn out(&self) -> &TensorRef {
        &self.gemm().binding.operands[2]
    }

    /// The GEMM's two inputs.
    pub fn inputs(&self) -> [&TensorRef; 2] {
        let o = &self.gemm().binding.operands;
        [&o[0], &o[1]]
    }

    /// Can `node` start this matmul's epilogue? It must be elementwise over the 2-D output
    /// and read the output itself, element for element.
    pub fn accepts(&self, mm: &Node, node: &Node) -> bool {
        let out = self.out();
        matches!(mm.op, Op::Matmul | Op::Addmm)
            && out.layout.rank() == 2
            && mm.output.layout.rank() == 2
            && node.op.is_elementwise()
            && node.output.layout.sizes == out.layout.sizes
            && node
                .inputs
                .iter()
                .filter_map(|o| o.tensor())
                .any(|t| t.buffer == out.buffer && t.layout == out.layout)
    }

    /// True when an epilogue op reading `t` or writing `w` would break row-block execution: it
    /// reads the output through another view, or writes a GEMM input (later blocks read it).
    pub fn conflicts(&self, reads: &[&TensorRef], w: &TensorRef) -> bool {
        let out = self.out();
        let [a, b] = self.inputs();
        reads
            .iter()
            .any(|t| t.buffer == out.buffer && t.layout != out.layout)
            || w.buffer == a.buffer
            || w.buffer == b.buffer
            || (w.buffer == out.buffer && w.layout != out.layout)
    }
}

/// Joins the GEMM step `gemm` and the epilogue loop step `e` into one step (see
/// `Region::Matmul`).
pub fn combine(gemm: Step, e: Step) -> Step {
    let Region::Matmul { dtype, .. } = *gemm.region else {
        unreachable!("the last lowered step of a matmul is its GEMM")
    };
    let Region::Loop(l) = Arc::unwrap_or_clone(e.region) else {
        unreachable!("an epilogue is a loop")
    };
    let mut g = gemm.binding.operands.into_iter();
    let (a, b, out) = (g.next().unwrap(), g.next().unwrap(), g.next().unwrap());
    let n_in = e.binding.n_inputs;
    let mut e_ops = e.binding.operands.into_iter();
    let mut operands = vec![a, b];
    operands.extend(e_ops.by_ref().take(n_in));
    operands.push(out);
    operands.extend(e_ops);
    let mut scalars = gemm.binding.scalars;
    scalars.extend(e.binding.scalars);
    let mut nodes = gemm.nodes;
    nodes.extend(e.nodes);
    Step {
        region: Arc::new(Region::Matmul {
            dtype,
            epilogue: Some(Box::new(l)),
        }),
        binding: Binding {
            operands,
            iter: e.binding.iter,
            scalars,
            n_inputs: 2 + n_in,
            parts: Vec::new(),
        },
        nodes,
        key: Default::default(),
    }
}

/// Re-binds a cached combined step to a freshly lowered GEMM (new buffers and alpha/beta).
pub(crate) fn rebind_gemm(combined: &mut Step, gemm: &Step) {
    let Region::Matmul {
        epilogue: Some(l), ..
    } = &*combined.region
    else {
        unreachable!("a combined step has an epilogue")
    };
    let k = l.inputs.len();
    let g = &gemm.binding.operands;
    combined.binding.operands[0] = g[0].clone();
    combined.binding.operands[1] = g[1].clone();
    combined.binding.operands[2 + k] = g[2].clone();
    combined.binding.scalars[..2].copy_from_slice(&gemm.binding.scalars[..2]);
}
