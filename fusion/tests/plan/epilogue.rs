//! Matmul epilogues as one step: the GEMM and the loop that consumes its output, bound as
//! a, b, the loop's inputs, the GEMM's output, the loop's outputs; scalars alpha, beta, then
//! the loop's.

use crate::common::{bin, node, outputs_of, plan_with, scalar, t, tensor};
use deferfuse_fusion::ir::{BinaryOp, Layout, Op};
use deferfuse_fusion::plan::PlanOptions;
use deferfuse_fusion::plan_cache::PlanCache;
use deferfuse_fusion::region::Region;
use deferfuse_fusion::{BufferId, Node};

/// y = x @ w (buffers x 1, w 2, y 3); z = y + bias * `scale` (bias 4 broadcast, z 5, scratch
/// 6).
fn linear(scale: f64, base: BufferId) -> Vec<Node> {
    let b = |k: BufferId| base + k;
    let bias = t(b(4), &[5]);
    let bias = crate::common::view(bias, Layout::contiguous(&[5]).expand(&[4, 5]));
    vec![
        node(
            Op::Matmul,
            vec![tensor(t(b(1), &[4, 3])), tensor(t(b(2), &[3, 5]))],
            t(b(3), &[4, 5]),
        ),
        bin(BinaryOp::Mul, tensor(bias), scalar(scale), t(b(6), &[4, 5])),
        bin(
            BinaryOp::Add,
            tensor(t(b(3), &[4, 5])),
            tensor(t(b(6), &[4, 5])),
            t(b(5), &[4, 5]),
        ),
    ]
}

#[test]
fn an_epilogue_reading_other_buffers_is_not_joined_by_ops_before_its_first_read() {
    // The scaled bias does not read y: the matmul runs alone, then one loop.
    let p = plan_with(&linear(2.0, 0), &[1, 2, 4, 5], &PlanOptions::default());
    assert_eq!(crate::common::shape_of(&p), [("matmul", 1), ("loop", 2)]);
}

#[test]
fn the_combined_step_binds_gemm_operands_around_the_epilogues() {
    let nodes = vec![
        node(
            Op::Matmul,
            vec![tensor(t(1, &[4, 3])), tensor(t(2, &[3, 5]))],
            t(3, &[4, 5]),
        ),
        bin(
            BinaryOp::Add,
            tensor(t(3, &[4, 5])),
            tensor(t(4, &[4, 5])),
            t(5, &[4, 5]),
        ),
        bin(
            BinaryOp::Mul,
            tensor(t(5, &[4, 5])),
            scalar(3.0),
            t(6, &[4, 5]),
        ),
    ];
    let p = plan_with(&nodes, &[1, 2, 4, 6], &PlanOptions::default());
    let Region::Matmul {
        epilogue: Some(e), ..
    } = &*p.steps[0].region
    else {
        panic!("a matmul with an epilogue: {:?}", p.steps[0].region)
    };
    let b = &p.steps[0].binding;
    let ids: Vec<BufferId> = b.operands.iter().map(|t| t.buffer).collect();
    assert_eq!(b.n_inputs, 2 + e.inputs.len());
    assert_eq!(&ids[..2], [1, 2], "the GEMM's inputs first");
    assert_eq!(
        ids[b.n_inputs], 3,
        "the GEMM's output after the epilogue's inputs"
    );
    assert_eq!(outputs_of(&p, 0).last(), Some(&6));
    let scalars: Vec<f64> = b.scalars.iter().map(|&s| f64::from_bits(s)).collect();
    assert_eq!(scalars, [1.0, 0.0, 3.0], "alpha, beta, then the epilogue's");
}

#[test]
fn a_cached_epilogue_plan_rebinds_the_gemm_and_the_epilogue_scalars() {
    let trace = |base: BufferId, s: f64| {
        let b = |k: BufferId| base + k;
        vec![
            node(
                Op::Matmul,
                vec![tensor(t(b(1), &[4, 3])), tensor(t(b(2), &[3, 5]))],
                t(b(3), &[4, 5]),
            ),
            bin(
                BinaryOp::Mul,
                tensor(t(b(3), &[4, 5])),
                scalar(s),
                t(b(4), &[4, 5]),
            ),
        ]
    };
    let mut cache = PlanCache::default();
    let opts = PlanOptions::default();
    cache.plan(&trace(0, 2.0), &|b| [1, 2, 4].contains(&b), &opts);
    let (p, reused) = cache.plan(&trace(10, 5.0), &|b| [11, 12, 14].contains(&b), &opts);
    assert!(reused);
    let b = &p.steps[0].binding;
    let ids: Vec<BufferId> = b.operands.iter().map(|t| t.buffer).collect();
    assert_eq!(&ids[..2], [11, 12]);
    assert!(ids.iter().all(|&i| i > 10), "{ids:?}");
    assert_eq!(f64::from_bits(*b.scalars.last().unwrap()), 5.0);
}
