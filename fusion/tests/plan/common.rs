//! Builders for trace nodes over small contiguous f32 tensors, and a one-line view of a plan.

use deferfuse_fusion::ir::{BinaryOp, DType, Layout, Op, ReduceOp, Scalar, UnaryOp};
use deferfuse_fusion::plan::{plan, Plan, PlanOptions};
use deferfuse_fusion::region::Region;
use deferfuse_fusion::{BufferId, Node, Operand, TensorRef};

/// Buffer `buffer` as a contiguous f32 tensor of `sizes`.
pub fn t(buffer: BufferId, sizes: &[usize]) -> TensorRef {
    TensorRef {
        buffer,
        layout: Layout::contiguous(sizes),
        dtype: DType::F32,
    }
}

/// `r` seen through `layout` (a broadcast, a transpose, a slice).
pub fn view(r: TensorRef, layout: Layout) -> TensorRef {
    TensorRef { layout, ..r }
}

pub fn node(op: Op, inputs: Vec<Operand>, output: TensorRef) -> Node {
    Node {
        op,
        inputs: inputs.into_iter().collect(),
        compute: output.dtype,
        output,
    }
}

pub fn tensor(r: TensorRef) -> Operand {
    Operand::Tensor(r)
}

pub fn scalar(v: f64) -> Operand {
    Operand::Scalar(Scalar::Float(v))
}

pub fn bin(op: BinaryOp, a: Operand, b: Operand, out: TensorRef) -> Node {
    node(Op::Binary(op), vec![a, b], out)
}

pub fn un(op: UnaryOp, a: TensorRef, out: TensorRef) -> Node {
    node(Op::Unary(op), vec![tensor(a)], out)
}

/// `op` of `input` over `dims`.
pub fn reduce(
    op: ReduceOp,
    dims: &[usize],
    keepdim: bool,
    input: TensorRef,
    out: TensorRef,
) -> Node {
    let op = Op::Reduce {
        op,
        dims: dims.iter().copied().collect(),
        keepdim,
    };
    node(op, vec![tensor(input)], out)
}

/// Plans `nodes` with the buffers in `live` held by handles.
pub fn plan_with(nodes: &[Node], live: &[BufferId], opts: &PlanOptions) -> Plan {
    plan(nodes, &|b| live.contains(&b), opts)
}

/// Each step as (kind, how many trace nodes it runs).
pub fn shape_of(p: &Plan) -> Vec<(&'static str, usize)> {
    p.steps
        .iter()
        .map(|s| {
            let kind = match &*s.region {
                Region::Graph(_) => "graph",
                Region::Loop(l) if l.reduces.is_empty() => "loop",
                Region::Loop(_) => "rows",
                Region::Matmul { epilogue: None, .. } => "matmul",
                Region::Matmul { .. } => "matmul+epilogue",
                Region::Arange { .. } => "arange",
                Region::Kernel(_) => "kernel",
            };
            (kind, s.nodes.len())
        })
        .collect()
}

/// The buffers a step writes, in binding order.
pub fn outputs_of(p: &Plan, step: usize) -> Vec<BufferId> {
    let b = &p.steps[step].binding;
    b.operands[b.n_inputs..].iter().map(|t| t.buffer).collect()
}

/// An optimizer's in-place update of parameter `p` (buffer 1) by gradient `g` (buffer 2):
/// `p *= 0.5; p -= g`, both writes to `p`'s own buffer.
pub fn in_place_update() -> Vec<Node> {
    vec![
        bin(BinaryOp::Mul, tensor(t(1, &[8])), scalar(0.5), t(1, &[8])),
        bin(
            BinaryOp::Sub,
            tensor(t(1, &[8])),
            tensor(t(2, &[8])),
            t(1, &[8]),
        ),
    ]
}
