//! Loop planning (`Capabilities::LOOPS`, the CPU JIT): each fusion rule, and each cut reason
//! with the node that caused it.

use crate::common::{
    bin, in_place_update, node, outputs_of, plan_with, reduce, scalar, shape_of, t, tensor, un,
    view,
};
use deferfuse_fusion::ir::{BinaryOp, DType, Layout, Op, ReduceOp, UnaryOp};
use deferfuse_fusion::plan::{CutReason, PlanOptions, MAX_LOADED_BUFFERS};
use deferfuse_fusion::{Node, Operand};

fn loops() -> PlanOptions {
    PlanOptions::default()
}

fn no_cuts() -> [u64; CutReason::COUNT] {
    [0; CutReason::COUNT]
}

/// `t(b, [rows, 1])` broadcast along the row to `[rows, cols]`.
fn along_rows(b: u64, rows: usize, cols: usize) -> Operand {
    tensor(view(
        t(b, &[rows, 1]),
        Layout::contiguous(&[rows, 1]).expand(&[rows, cols]),
    ))
}

/// Softmax over dim 1 of x (buffer 1, [4, 8]): m = amax; e = exp(x - m); s = sum(e); y = e / s
/// (buffers m 2, x - m 3, e 4, s 5, y 6).
fn softmax() -> Vec<Node> {
    vec![
        reduce(ReduceOp::Amax, &[1], true, t(1, &[4, 8]), t(2, &[4, 1])),
        bin(
            BinaryOp::Sub,
            tensor(t(1, &[4, 8])),
            along_rows(2, 4, 8),
            t(3, &[4, 8]),
        ),
        un(UnaryOp::Exp, t(3, &[4, 8]), t(4, &[4, 8])),
        reduce(ReduceOp::Sum, &[1], true, t(4, &[4, 8]), t(5, &[4, 1])),
        bin(
            BinaryOp::Div,
            tensor(t(4, &[4, 8])),
            along_rows(5, 4, 8),
            t(6, &[4, 8]),
        ),
    ]
}

fn matmul(a: u64, b: u64, out: u64) -> Node {
    node(
        Op::Matmul,
        vec![tensor(t(a, &[4, 3])), tensor(t(b, &[3, 5]))],
        t(out, &[4, 5]),
    )
}

#[test]
fn elementwise_ops_over_one_shape_are_one_loop() {
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        bin(BinaryOp::Mul, tensor(t(2, &[8])), scalar(2.0), t(3, &[8])),
    ];
    let p = plan_with(&nodes, &[1, 3], &loops());
    assert_eq!(shape_of(&p), [("loop", 2)]);
    assert_eq!(p.cuts, no_cuts());
}

#[test]
fn a_value_only_the_loop_reads_stays_in_registers() {
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        bin(BinaryOp::Mul, tensor(t(2, &[8])), scalar(2.0), t(3, &[8])),
    ];
    let p = plan_with(&nodes, &[1, 3], &loops());
    assert_eq!(outputs_of(&p, 0), [3]);
    assert_eq!(p.unmaterialized, 1);
}

#[test]
fn a_value_a_live_handle_holds_is_stored() {
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        bin(BinaryOp::Mul, tensor(t(2, &[8])), scalar(2.0), t(3, &[8])),
    ];
    let p = plan_with(&nodes, &[1, 2, 3], &loops());
    assert_eq!(outputs_of(&p, 0), [2, 3]);
    assert_eq!(p.unmaterialized, 0);
}

#[test]
fn an_op_over_another_shape_cuts_as_shape_and_reads_the_stored_value() {
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        bin(
            BinaryOp::Add,
            tensor(view(t(2, &[8]), Layout::contiguous(&[8]).expand(&[2, 8]))),
            scalar(1.0),
            t(3, &[2, 8]),
        ),
    ];
    let p = plan_with(&nodes, &[1, 3], &loops());
    assert_eq!(shape_of(&p), [("loop", 1), ("loop", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Shape)]);
    assert_eq!(outputs_of(&p, 0), [2], "the next step reads it from memory");
}

#[test]
fn reading_a_value_of_the_loop_through_another_view_cuts_as_layout() {
    let transposed = view(t(2, &[4, 4]), Layout::contiguous(&[4, 4]).permute(&[1, 0]));
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[4, 4]), t(2, &[4, 4])),
        bin(
            BinaryOp::Add,
            tensor(transposed),
            scalar(1.0),
            t(3, &[4, 4]),
        ),
    ];
    let p = plan_with(&nodes, &[1, 3], &loops());
    assert_eq!(shape_of(&p), [("loop", 1), ("loop", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Layout)]);
}

#[test]
fn writing_a_buffer_the_loop_reads_through_another_view_cuts_as_layout() {
    let transposed = view(t(1, &[4, 4]), Layout::contiguous(&[4, 4]).permute(&[1, 0]));
    let nodes = vec![
        un(UnaryOp::Neg, t(1, &[4, 4]), t(2, &[4, 4])),
        bin(
            BinaryOp::Add,
            tensor(t(2, &[4, 4])),
            scalar(1.0),
            transposed,
        ),
    ];
    let p = plan_with(&nodes, &[1, 2], &loops());
    assert_eq!(shape_of(&p), [("loop", 1), ("loop", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Layout)]);
}

/// `exp` of buffer `src` ([4, 4]) written into columns `at..at + 4` of buffer 3 ([4, 8]), as
/// `cat` writes its pieces.
fn exp_into_columns(src: u64, at: usize) -> Node {
    let piece = view(
        t(3, &[4, 4]),
        Layout::contiguous(&[4, 8]).slice(1, at, 4, 1),
    );
    un(UnaryOp::Exp, t(src, &[4, 4]), piece)
}

#[test]
fn writes_to_pieces_of_one_buffer_that_share_no_element_are_one_loop() {
    let nodes = vec![exp_into_columns(1, 0), exp_into_columns(2, 4)];
    let p = plan_with(&nodes, &[1, 2, 3], &loops());
    assert_eq!(shape_of(&p), [("loop", 2)]);
    assert_eq!(p.cuts, no_cuts());
    assert_eq!(outputs_of(&p, 0), [3, 3]);
}

#[test]
fn writes_to_pieces_of_one_buffer_that_overlap_cut_as_layout() {
    let nodes = vec![exp_into_columns(1, 0), exp_into_columns(2, 2)];
    let p = plan_with(&nodes, &[1, 2, 3], &loops());
    assert_eq!(shape_of(&p), [("loop", 1), ("loop", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Layout)]);
}

#[test]
fn reading_a_piece_the_loop_did_not_write_joins_and_loads_it() {
    // Columns 0..4 written, then columns 4..8 (written before the loop) read back.
    let right = view(t(3, &[4, 4]), Layout::contiguous(&[4, 8]).slice(1, 4, 4, 1));
    let nodes = vec![
        exp_into_columns(1, 0),
        bin(BinaryOp::Add, tensor(right), scalar(1.0), t(4, &[4, 4])),
    ];
    let p = plan_with(&nodes, &[1, 3, 4], &loops());
    assert_eq!(shape_of(&p), [("loop", 2)]);
    assert_eq!(p.cuts, no_cuts());
}

#[test]
fn only_the_last_write_to_a_view_reaches_memory() {
    // p *= 0.5; p -= g (`in_place_update`): one loop, p stored once.
    let nodes = in_place_update();
    let p = plan_with(&nodes, &[1, 2], &loops());
    assert_eq!(shape_of(&p), [("loop", 2)]);
    assert_eq!(outputs_of(&p, 0), [1]);
    assert_eq!(p.unmaterialized, 1);
}

#[test]
fn softmax_is_one_row_kernel_with_two_reductions() {
    let p = plan_with(&softmax(), &[1, 6], &loops());
    assert_eq!(shape_of(&p), [("rows", 5)]);
    assert_eq!(p.cuts, no_cuts());
    assert_eq!(
        outputs_of(&p, 0),
        [6],
        "m, x - m, e and s stay in registers"
    );
    assert_eq!(p.unmaterialized, 4);
}

#[test]
fn an_op_over_the_row_results_joins_the_row_kernel() {
    let nodes = vec![
        reduce(ReduceOp::Sum, &[1], true, t(1, &[4, 8]), t(2, &[4, 1])),
        bin(
            BinaryOp::Mul,
            tensor(t(2, &[4, 1])),
            scalar(0.125),
            t(3, &[4, 1]),
        ),
    ];
    let p = plan_with(&nodes, &[1, 3], &loops());
    assert_eq!(shape_of(&p), [("rows", 2)]);
    assert_eq!(p.cuts, no_cuts());
}

#[test]
fn a_reduction_over_other_dims_of_the_same_shape_cuts_as_reduction() {
    let nodes = vec![
        reduce(ReduceOp::Sum, &[1], true, t(1, &[4, 8]), t(2, &[4, 1])),
        reduce(ReduceOp::Sum, &[0], true, t(1, &[4, 8]), t(3, &[1, 8])),
    ];
    let p = plan_with(&nodes, &[1, 2, 3], &loops());
    assert_eq!(shape_of(&p), [("rows", 1), ("rows", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Reduction)]);
}

#[test]
fn a_reduction_after_an_in_place_update_cuts_as_reduction() {
    // A row kernel sweeps each row several times: it cannot also update what it reads.
    let nodes = vec![
        bin(BinaryOp::Mul, tensor(t(1, &[8])), scalar(0.5), t(1, &[8])),
        reduce(ReduceOp::Sum, &[0], false, t(1, &[8]), t(2, &[])),
    ];
    let p = plan_with(&nodes, &[1, 2], &loops());
    assert_eq!(shape_of(&p), [("loop", 1), ("rows", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Reduction)]);
}

#[test]
fn a_reduction_over_another_shape_cuts_as_shape() {
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        reduce(ReduceOp::Sum, &[1], false, t(3, &[4, 8]), t(4, &[4])),
    ];
    let p = plan_with(&nodes, &[1, 2, 3, 4], &loops());
    assert_eq!(shape_of(&p), [("loop", 1), ("rows", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Shape)]);
}

#[test]
fn the_op_bound_cuts_as_max_ops() {
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        un(UnaryOp::Neg, t(2, &[8]), t(3, &[8])),
        un(UnaryOp::Abs, t(3, &[8]), t(4, &[8])),
    ];
    let opts = PlanOptions {
        max_ops_per_region: 2,
        ..loops()
    };
    let p = plan_with(&nodes, &[1, 4], &opts);
    assert_eq!(shape_of(&p), [("loop", 2), ("loop", 1)]);
    assert_eq!(p.cut_log, [(2, CutReason::MaxOps)]);
}

#[test]
fn loading_more_than_the_buffer_bound_cuts_as_max_ops() {
    // acc = x1 + x2; acc += x3; ...: the node that would load one buffer too many cuts.
    let acc = |k: u64| 100 + k;
    let mut nodes = vec![bin(
        BinaryOp::Add,
        tensor(t(1, &[8])),
        tensor(t(2, &[8])),
        t(acc(0), &[8]),
    )];
    for k in 1..MAX_LOADED_BUFFERS as u64 {
        nodes.push(bin(
            BinaryOp::Add,
            tensor(t(acc(k - 1), &[8])),
            tensor(t(k + 2, &[8])),
            t(acc(k), &[8]),
        ));
    }
    let last = acc(MAX_LOADED_BUFFERS as u64 - 1);
    let p = plan_with(&nodes, &[last], &loops());
    let n = MAX_LOADED_BUFFERS;
    assert_eq!(shape_of(&p), [("loop", n - 1), ("loop", 1)]);
    assert_eq!(p.cut_log, [(n - 1, CutReason::MaxOps)]);
}

#[test]
fn an_op_that_is_not_a_loop_cuts_as_unfusable_and_runs_alone() {
    let arange = node(
        Op::Arange { dtype: DType::F32 },
        vec![scalar(0.0), scalar(8.0), scalar(1.0)],
        t(3, &[8]),
    );
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        arange,
        bin(
            BinaryOp::Add,
            tensor(t(2, &[8])),
            tensor(t(3, &[8])),
            t(4, &[8]),
        ),
    ];
    let p = plan_with(&nodes, &[1, 4], &loops());
    assert_eq!(shape_of(&p), [("loop", 1), ("arange", 1), ("loop", 1)]);
    assert_eq!(p.cut_log, [(1, CutReason::Unfusable)]);
}

#[test]
fn an_elementwise_consumer_of_a_matmul_is_its_epilogue() {
    let nodes = vec![
        matmul(1, 2, 3),
        un(UnaryOp::Relu, t(3, &[4, 5]), t(4, &[4, 5])),
    ];
    let p = plan_with(&nodes, &[1, 2, 4], &loops());
    assert_eq!(shape_of(&p), [("matmul+epilogue", 2)]);
    assert_eq!(p.cuts, no_cuts());
}

#[test]
fn an_op_that_does_not_read_the_matmul_result_is_no_epilogue() {
    let nodes = vec![
        matmul(1, 2, 3),
        un(UnaryOp::Relu, t(4, &[4, 5]), t(5, &[4, 5])),
    ];
    let p = plan_with(&nodes, &[1, 2, 3, 4, 5], &loops());
    assert_eq!(shape_of(&p), [("matmul", 1), ("loop", 1)]);
}

#[test]
fn an_epilogue_op_writing_a_matmul_input_cuts_as_layout() {
    // Later row blocks of the GEMM still read its inputs.
    let nodes = vec![
        matmul(1, 2, 3),
        un(UnaryOp::Relu, t(3, &[4, 5]), t(4, &[4, 5])),
        bin(
            BinaryOp::Add,
            tensor(t(4, &[4, 5])),
            scalar(1.0),
            t(2, &[4, 5]),
        ),
    ];
    let p = plan_with(&nodes, &[1, 2, 4], &loops());
    assert_eq!(shape_of(&p), [("matmul+epilogue", 2), ("loop", 1)]);
    assert_eq!(p.cut_log, [(2, CutReason::Layout)]);
}

#[test]
fn nodes_nobody_can_observe_are_dropped() {
    let nodes = vec![
        un(UnaryOp::Exp, t(1, &[8]), t(2, &[8])),
        un(UnaryOp::Neg, t(1, &[8]), t(3, &[8])),
    ];
    let p = plan_with(&nodes, &[1, 2], &loops());
    assert_eq!(p.dead_nodes, 1);
    assert_eq!(shape_of(&p), [("loop", 1)]);
    assert_eq!(p.steps[0].nodes, [0]);
}

#[test]
fn without_fusion_every_node_is_its_own_step_and_nothing_is_dropped() {
    let opts = PlanOptions {
        fuse: false,
        ..loops()
    };
    let p = plan_with(&softmax(), &[], &opts);
    assert_eq!(
        shape_of(&p),
        [
            ("rows", 1),
            ("loop", 1),
            ("loop", 1),
            ("rows", 1),
            ("loop", 1)
        ]
    );
    assert_eq!(p.cuts, no_cuts());
    assert_eq!(p.dead_nodes, 0);
}

#[test]
fn every_step_names_the_nodes_it_runs_in_order() {
    let mut nodes = vec![un(UnaryOp::Exp, t(9, &[8]), t(10, &[8]))];
    nodes.extend(softmax());
    let p = plan_with(&nodes, &[1, 6, 9, 10], &loops());
    let ran: Vec<usize> = p.steps.iter().flat_map(|s| s.nodes.clone()).collect();
    assert_eq!(ran, [0, 1, 2, 3, 4, 5]);
}

/// An optimizer's step over two parameters of different shapes, op-major as foreach ops
/// record it: p1 (buffer 1, [4, 8]) and p2 (buffer 2, [16]) are scaled in place, then each
/// gets its gradient (3, [4, 8]; 4, [16]) added in place.
fn op_major_updates() -> Vec<Node> {
    vec![
        bin(
            BinaryOp::Mul,
            tensor(t(1, &[4, 8])),
            scalar(0.9),
            t(1, &[4, 8]),
        ),
        bin(BinaryOp::Mul, tensor(t(2, &[16])), scalar(0.9), t(2, &[16])),
        bin(
            BinaryOp::Add,
            tensor(t(1, &[4, 8])),
            tensor(t(3, &[4, 8])),
            t(1, &[4, 8]),
        ),
        bin(
            BinaryOp::Add,
            tensor(t(2, &[16])),
            tensor(t(4, &[16])),
            t(2, &[16]),
        ),
    ]
}

#[test]
fn independent_ops_of_one_shape_are_one_loop_though_another_shape_comes_between() {
    let p = plan_with(&op_major_updates(), &[1, 2, 3, 4], &loops());
    assert_eq!(shape_of(&p), [("loop", 2), ("loop", 2)]);
    assert_eq!(p.cuts, {
        let mut c = no_cuts();
        c[CutReason::Shape as usize] = 1;
        c
    });
    assert_eq!(outputs_of(&p, 0), [1]);
    assert_eq!(outputs_of(&p, 1), [2]);
}

#[test]
fn an_op_that_reads_what_a_later_shape_writes_is_not_moved_past_it() {
    // p1's second update adds s = sum(p2) (buffer 5, broadcast), recorded after p2's scaling:
    // it may not move up to p1's first op, before the sum it reads.
    let mut nodes = op_major_updates();
    nodes[2] = bin(
        BinaryOp::Add,
        tensor(t(1, &[4, 8])),
        tensor(view(
            t(5, &[1, 1]),
            Layout::contiguous(&[1, 1]).expand(&[4, 8]),
        )),
        t(1, &[4, 8]),
    );
    nodes.insert(
        2,
        reduce(ReduceOp::Sum, &[0], true, t(2, &[16]), t(5, &[1])),
    );
    let p = plan_with(&nodes, &[1, 2, 5], &loops());
    assert_eq!(
        shape_of(&p),
        [
            ("loop", 1),
            ("loop", 1),
            ("rows", 1),
            ("loop", 1),
            ("loop", 1)
        ]
    );
}

/// SGD with momentum and weight decay over three parameters of one shape, op-major as foreach
/// ops record it: `d = g + p * wd; m = m * 0.9 + d; p = p - m * lr`, parameter k's buffers
/// p `10 + k`, g `20 + k`, m `30 + k` and temporaries from 40 on.
fn op_major_sgd() -> Vec<Node> {
    let x = |b: u64| tensor(t(b, &[8]));
    let (tmp, d, step) = (|k| 40 + k, |k| 50 + k, |k| 60 + k);
    let mut nodes = Vec::new();
    for k in 0..3 {
        nodes.push(bin(BinaryOp::Mul, x(10 + k), scalar(5e-4), t(tmp(k), &[8])));
    }
    for k in 0..3 {
        nodes.push(bin(BinaryOp::Add, x(20 + k), x(tmp(k)), t(d(k), &[8])));
    }
    for k in 0..3 {
        nodes.push(bin(BinaryOp::Mul, x(30 + k), scalar(0.9), t(30 + k, &[8])));
    }
    for k in 0..3 {
        nodes.push(bin(BinaryOp::Add, x(30 + k), x(d(k)), t(30 + k, &[8])));
    }
    for k in 0..3 {
        nodes.push(bin(
            BinaryOp::Mul,
            x(30 + k),
            scalar(1e-3),
            t(step(k), &[8]),
        ));
    }
    for k in 0..3 {
        nodes.push(bin(BinaryOp::Sub, x(10 + k), x(step(k)), t(10 + k, &[8])));
    }
    nodes
}

#[test]
fn same_shape_updates_recorded_op_major_run_parameter_by_parameter() {
    let live = [10, 11, 12, 20, 21, 22, 30, 31, 32];
    let p = plan_with(&op_major_sgd(), &live, &loops());
    // Each parameter's chain loads p, g and m: two chains and the start of the third fit the
    // buffer bound; only the third's decayed gradient, handed across the cut, is stored
    // besides the new momenta and parameters.
    assert_eq!(shape_of(&p), [("loop", 14), ("loop", 4)]);
    assert_eq!(p.cut_log, [(8, CutReason::MaxOps)]);
    assert_eq!(outputs_of(&p, 0), [30, 10, 31, 11, 52]);
    assert_eq!(outputs_of(&p, 1), [32, 12]);
    let ran: Vec<usize> = p.steps.iter().flat_map(|s| s.nodes.clone()).collect();
    assert_eq!(
        ran,
        [0, 3, 6, 9, 12, 15, 1, 4, 7, 10, 13, 16, 2, 5, 8, 11, 14, 17]
    );
}

/// `t(b, sizes)` as a bf16 tensor.
fn bf16(b: u64, sizes: &[usize]) -> deferfuse_fusion::TensorRef {
    deferfuse_fusion::TensorRef {
        dtype: DType::BF16,
        ..t(b, sizes)
    }
}

#[test]
fn a_fused_bf16_chain_rounds_each_computed_value_once_and_no_loaded_or_cast_one() {
    // e = exp(x); p = e * e; c = (p.float() * 2).bfloat16(); y = c + x, one loop: PyTorch
    // rounds e and p to bf16 before their uses (a cast to f32 and back) and c by its cast;
    // x is loaded and c cast, each already a bf16.
    use deferfuse_fusion::region::{InstrKind, Region};
    let nodes = vec![
        un(UnaryOp::Exp, bf16(1, &[64]), bf16(2, &[64])),
        bin(
            BinaryOp::Mul,
            tensor(bf16(2, &[64])),
            tensor(bf16(2, &[64])),
            bf16(3, &[64]),
        ),
        node(
            Op::Cast(DType::F32),
            vec![tensor(bf16(3, &[64]))],
            t(4, &[64]),
        ),
        bin(BinaryOp::Mul, tensor(t(4, &[64])), scalar(2.0), t(5, &[64])),
        node(
            Op::Cast(DType::BF16),
            vec![tensor(t(5, &[64]))],
            bf16(6, &[64]),
        ),
        bin(
            BinaryOp::Add,
            tensor(bf16(6, &[64])),
            tensor(bf16(1, &[64])),
            bf16(7, &[64]),
        ),
    ];
    let p = plan_with(&nodes, &[1, 7], &loops());
    assert_eq!(shape_of(&p), [("loop", 6)]);
    let Region::Loop(l) = &*p.steps[0].region else {
        panic!("a loop")
    };
    let to_bf16: Vec<_> = l
        .body
        .iter()
        .filter_map(|ins| match ins.kind {
            InstrKind::Cast(a) if ins.dtype == DType::BF16 => Some(a),
            _ => None,
        })
        .collect();
    // Each rounding is of a computed value: one the loop computed in f32 (the cast node's
    // product), or a bf16 op's result widened first; never of a loaded or cast value.
    for &src in &to_bf16 {
        let src = match l.body[src as usize].kind {
            InstrKind::Cast(wide) => wide,
            _ => src,
        };
        assert!(
            matches!(
                l.body[src as usize].kind,
                InstrKind::Unary(..) | InstrKind::Binary(..)
            ),
            "a value that already holds a bf16 is rounded again: {l}"
        );
    }
    assert_eq!(
        to_bf16.len(),
        3,
        "exp, mul and the cast node, each once: {l}"
    );
}
