//! Whole-program planning (`Capabilities::whole_programs`): a flush becomes one graph region,
//! cut only by ops the backend cannot lower, the size bound and a buffer's second dtype.

use crate::common::{bin, in_place_update, node, plan_with, scalar, shape_of, t, tensor};
use deferfuse_fusion::ir::{
    BinaryOp, DType, KernelOp, Layout, Op, RandomDist, ReduceOp, Scalar, ScatterReduce,
};
use deferfuse_fusion::plan::{Capabilities, CutReason, KernelsInRegion, PlanOptions};
use deferfuse_fusion::plan_cache::PlanCache;
use deferfuse_fusion::region::Region;
use deferfuse_fusion::{BufferId, Node, Operand, TensorRef};
use smallvec::smallvec;

fn whole(max_ops: usize) -> PlanOptions {
    PlanOptions {
        capabilities: Capabilities::whole_programs(max_ops),
        ..PlanOptions::default()
    }
}

/// A linear layer and its loss, over three shapes: y = x @ w; z = y + b; s = sum(z * z, 1);
/// loss = sum(s) (buffers: x 1, w 2, b 3, y 4, z 5, zz 6, s 7, loss 8).
fn layer() -> Vec<Node> {
    let red = |dims: &[usize]| Op::Reduce {
        op: ReduceOp::Sum,
        dims: dims.iter().copied().collect(),
        keepdim: false,
    };
    vec![
        node(
            Op::Matmul,
            vec![tensor(t(1, &[4, 3])), tensor(t(2, &[3, 5]))],
            t(4, &[4, 5]),
        ),
        bin(
            BinaryOp::Add,
            tensor(t(4, &[4, 5])),
            tensor(TensorRef {
                layout: Layout::contiguous(&[5]).expand(&[4, 5]),
                ..t(3, &[5])
            }),
            t(5, &[4, 5]),
        ),
        bin(
            BinaryOp::Mul,
            tensor(t(5, &[4, 5])),
            tensor(t(5, &[4, 5])),
            t(6, &[4, 5]),
        ),
        node(red(&[1]), vec![tensor(t(6, &[4, 5]))], t(7, &[4])),
        node(red(&[]), vec![tensor(t(7, &[4]))], t(8, &[])),
    ]
}

#[test]
fn a_flush_of_matmuls_reductions_and_shape_changes_is_one_graph() {
    let p = plan_with(&layer(), &[1, 2, 3, 8], &whole(4096));
    assert_eq!(shape_of(&p), [("graph", 5)]);
    assert_eq!(p.cuts, [0; CutReason::COUNT]);
}

#[test]
fn the_same_flush_on_loop_capabilities_keeps_the_loop_cuts() {
    let p = plan_with(&layer(), &[1, 2, 3, 8], &PlanOptions::default());
    assert!(p.steps.len() > 1, "{:?}", shape_of(&p));
    assert!(p
        .steps
        .iter()
        .all(|s| !matches!(*s.region, Region::Graph(_))));
    assert!(p.cuts.iter().sum::<u64>() > 0);
}

#[test]
fn graph_inputs_are_the_values_read_and_outputs_the_values_read_afterwards() {
    let p = plan_with(&layer(), &[1, 2, 3, 8], &whole(4096));
    let b = &p.steps[0].binding;
    let ids: Vec<BufferId> = b.operands.iter().map(|t| t.buffer).collect();
    // The loss is also offered as an input: a live handle could see a part of its buffer the
    // write does not cover; the backend skips it when the write covers the buffer.
    assert_eq!(&ids[..b.n_inputs], &[1, 2, 3, 8]);
    assert_eq!(&ids[b.n_inputs..], &[8]);
    // y, z, z*z and the row sums stay inside the program.
    assert_eq!(p.unmaterialized, 4);
}

#[test]
fn a_value_a_live_handle_holds_is_an_output() {
    let p = plan_with(&layer(), &[1, 2, 3, 5, 8], &whole(4096));
    let b = &p.steps[0].binding;
    let outs: Vec<BufferId> = b.operands[b.n_inputs..].iter().map(|t| t.buffer).collect();
    assert_eq!(outs, [5, 8]);
}

#[test]
fn an_in_place_update_is_an_input_and_an_output_of_its_graph() {
    // p *= 0.5; p -= g (`in_place_update`): the optimizer's in-place writes.
    let nodes = in_place_update();
    let p = plan_with(&nodes, &[1, 2], &whole(4096));
    assert_eq!(shape_of(&p), [("graph", 2)]);
    let Region::Graph(g) = &*p.steps[0].region else {
        panic!("a graph")
    };
    let b = &p.steps[0].binding;
    let ids: Vec<BufferId> = b.operands.iter().map(|t| t.buffer).collect();
    assert_eq!(ids, [1, 2, 1], "inputs p, g; output p");
    assert_eq!(g.operands[0], g.operands[2], "one graph buffer, in and out");
}

#[test]
fn a_kernel_op_runs_as_its_own_step_and_cuts_as_unfusable() {
    let mut nodes = layer();
    let random = Op::Kernel(KernelOp::Random {
        dist: RandomDist::Uniform,
        sizes: smallvec![4],
        dtype: DType::F32,
    });
    nodes.insert(
        2,
        node(
            random,
            vec![
                Operand::Scalar(Scalar::Int(1)),
                Operand::Scalar(Scalar::Int(0)),
            ],
            t(9, &[4]),
        ),
    );
    let p = plan_with(&nodes, &[1, 2, 3, 8, 9], &whole(4096));
    assert_eq!(shape_of(&p), [("graph", 2), ("kernel", 1), ("graph", 3)]);
    assert_eq!(p.cuts[CutReason::Unfusable as usize], 1);
    assert_eq!(p.cut_log, [(2, CutReason::Unfusable)]);
    // z crosses from the first graph to the second: an output of one, an input of the next.
    let first = &p.steps[0].binding;
    assert!(first.operands[first.n_inputs..]
        .iter()
        .any(|t| t.buffer == 5));
    let last = &p.steps[2].binding;
    assert!(last.operands[..last.n_inputs].iter().any(|t| t.buffer == 5));
}

#[test]
fn a_host_read_ends_the_program_it_waits_for_at_the_read_value() {
    // The host reads z (node 1): y and z make the first program, z * z and the sums the
    // second, which reads z as its input. Not a fusion cut: no cut is counted or logged.
    let opts = PlanOptions {
        read_node: Some(1),
        ..whole(4096)
    };
    let p = plan_with(&layer(), &[1, 2, 3, 5, 8], &opts);
    assert_eq!(shape_of(&p), [("graph", 2), ("graph", 3)]);
    assert_eq!(p.cuts, [0; CutReason::COUNT]);
    assert!(p.cut_log.is_empty());
    let first = &p.steps[0].binding;
    assert!(first.operands[first.n_inputs..]
        .iter()
        .any(|t| t.buffer == 5));
}

#[test]
fn a_host_read_of_the_last_value_leaves_one_program() {
    let opts = PlanOptions {
        read_node: Some(4),
        ..whole(4096)
    };
    let p = plan_with(&layer(), &[1, 2, 3, 8], &opts);
    assert_eq!(shape_of(&p), [("graph", 5)]);
    assert_eq!(p.cuts, [0; CutReason::COUNT]);
}

#[test]
fn loop_plans_ignore_the_read_node() {
    let with_read = PlanOptions {
        read_node: Some(1),
        ..PlanOptions::default()
    };
    let a = plan_with(&layer(), &[1, 2, 3, 5, 8], &with_read);
    let b = plan_with(&layer(), &[1, 2, 3, 5, 8], &PlanOptions::default());
    assert_eq!(shape_of(&a), shape_of(&b));
    assert_eq!(a.cuts, b.cuts);
}

#[test]
fn the_size_bound_cuts_as_max_ops() {
    let p = plan_with(&layer(), &[1, 2, 3, 8], &whole(2));
    assert_eq!(shape_of(&p), [("graph", 2), ("graph", 2), ("rows", 1)]);
    assert_eq!(p.cuts[CutReason::MaxOps as usize], 2);
}

#[test]
fn a_buffer_seen_with_a_second_dtype_cuts_as_layout() {
    let as_i32 = TensorRef {
        dtype: DType::I32,
        ..t(2, &[8])
    };
    let nodes = vec![
        bin(BinaryOp::Add, tensor(t(1, &[8])), scalar(1.0), t(2, &[8])),
        node(Op::Cast(DType::F32), vec![tensor(as_i32)], t(3, &[8])),
    ];
    let p = plan_with(&nodes, &[1, 3], &whole(4096));
    assert_eq!(shape_of(&p), [("loop", 1), ("loop", 1)]);
    assert_eq!(p.cuts[CutReason::Layout as usize], 1);
}

#[test]
fn a_graph_of_one_step_is_that_step() {
    let nodes = vec![bin(
        BinaryOp::Add,
        tensor(t(1, &[8])),
        scalar(1.0),
        t(2, &[8]),
    )];
    let p = plan_with(&nodes, &[1, 2], &whole(4096));
    assert_eq!(shape_of(&p), [("loop", 1)]);
}

#[test]
fn dead_nodes_are_dropped_before_grouping() {
    let mut nodes = layer();
    nodes.push(bin(
        BinaryOp::Mul,
        tensor(t(5, &[4, 5])),
        scalar(2.0),
        t(10, &[4, 5]),
    ));
    let p = plan_with(&nodes, &[1, 2, 3, 8], &whole(4096));
    assert_eq!(p.dead_nodes, 1);
    assert_eq!(shape_of(&p), [("graph", 5)]);
}

#[test]
fn a_repeated_trace_reuses_its_graph_region_and_rebinds_scalars() {
    let trace = |lr: f64, p: BufferId| {
        vec![
            bin(
                BinaryOp::Mul,
                tensor(t(p, &[8])),
                scalar(lr),
                t(p + 1, &[8]),
            ),
            bin(
                BinaryOp::Sub,
                tensor(t(p, &[8])),
                tensor(t(p + 1, &[8])),
                t(p, &[8]),
            ),
        ]
    };
    let mut cache = PlanCache::default();
    let opts = whole(4096);
    let (first, reused) = cache.plan(&trace(0.1, 1), &|b| b == 1, &opts);
    assert!(!reused);
    let (second, reused) = cache.plan(&trace(0.2, 11), &|b| b == 11, &opts);
    assert!(reused);
    assert!(std::sync::Arc::ptr_eq(
        &first.steps[0].region,
        &second.steps[0].region
    ));
    let b = &second.steps[0].binding;
    assert!(b.operands.iter().all(|t| t.buffer == 11));
    assert_eq!(f64::from_bits(b.parts[0].scalars[0]), 0.2);
    assert_eq!(b.parts[0].operands[0].buffer, 11);
}

#[test]
fn an_op_over_an_empty_tensor_runs_as_its_own_step() {
    let nodes = vec![
        bin(BinaryOp::Add, tensor(t(1, &[8])), scalar(1.0), t(2, &[8])),
        bin(BinaryOp::Add, tensor(t(3, &[0])), scalar(1.0), t(4, &[0])),
        bin(BinaryOp::Mul, tensor(t(2, &[8])), scalar(2.0), t(5, &[8])),
        bin(BinaryOp::Mul, tensor(t(5, &[8])), scalar(2.0), t(6, &[8])),
    ];
    let p = plan_with(&nodes, &[1, 3, 4, 6], &whole(4096));
    assert_eq!(shape_of(&p), [("loop", 1), ("loop", 1), ("graph", 2)]);
    assert_eq!(p.cuts[CutReason::Unfusable as usize], 1);
}

/// The layer, then a gather of `z` by an int64 index (buffer 10) and a scatter of what it
/// picked back into a copy of `z` (buffer 12) with `reduce`.
fn layer_with_gather_and_scatter(reduce: ScatterReduce) -> Vec<Node> {
    let mut nodes = layer();
    let idx = TensorRef {
        buffer: 10,
        layout: Layout::contiguous(&[4, 1]),
        dtype: DType::I64,
    };
    let gather = Op::Kernel(KernelOp::Gather { dim: 1 });
    nodes.push(node(
        gather,
        vec![tensor(t(5, &[4, 5])), tensor(idx.clone())],
        t(11, &[4, 1]),
    ));
    let scatter = Op::Kernel(KernelOp::Scatter {
        dim: 1,
        reduce,
        include_self: true,
        wide: false,
    });
    nodes.push(node(
        scatter,
        vec![tensor(t(5, &[4, 5])), tensor(idx), tensor(t(11, &[4, 1]))],
        t(12, &[4, 5]),
    ));
    nodes
}

fn with_gather_and_scatter_sum() -> PlanOptions {
    PlanOptions {
        capabilities: Capabilities::whole_programs(4096).with_kernels(KernelsInRegion {
            gather: true,
            scatter: &[ScatterReduce::Sum],
            depthwise: false,
        }),
        ..PlanOptions::default()
    }
}

#[test]
fn kernel_ops_the_backend_lowers_join_the_graph() {
    let nodes = layer_with_gather_and_scatter(ScatterReduce::Sum);
    let p = plan_with(
        &nodes,
        &[1, 2, 3, 8, 10, 12],
        &with_gather_and_scatter_sum(),
    );
    assert_eq!(shape_of(&p), [("graph", nodes.len())]);
    assert_eq!(p.cuts, [0; CutReason::COUNT]);
}

#[test]
fn a_scatter_reduction_the_backend_does_not_lower_still_cuts() {
    let nodes = layer_with_gather_and_scatter(ScatterReduce::Assign);
    let p = plan_with(
        &nodes,
        &[1, 2, 3, 8, 10, 12],
        &with_gather_and_scatter_sum(),
    );
    assert_eq!(shape_of(&p), [("graph", nodes.len() - 1), ("kernel", 1)]);
    assert_eq!(p.cuts[CutReason::Unfusable as usize], 1);
}
