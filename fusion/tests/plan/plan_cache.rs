//! The plan cache: a trace of the same structure gets the first trace's plan back, re-bound to
//! its own buffers and scalars; any difference the planner looks at plans again.

use crate::common::{bin, scalar, t, tensor, un};
use deferfuse_fusion::ir::{BinaryOp, UnaryOp};
use deferfuse_fusion::plan::{Capabilities, PlanOptions};
use deferfuse_fusion::plan_cache::PlanCache;
use deferfuse_fusion::{BufferId, Node};
use std::sync::Arc;

/// An optimizer step on parameter `p` (gradient `p + 1`, scratch `p + 2`): p -= lr * g.
fn sgd(p: BufferId, lr: f64) -> Vec<Node> {
    vec![
        bin(
            BinaryOp::Mul,
            tensor(t(p + 1, &[8])),
            scalar(lr),
            t(p + 2, &[8]),
        ),
        bin(
            BinaryOp::Sub,
            tensor(t(p, &[8])),
            tensor(t(p + 2, &[8])),
            t(p, &[8]),
        ),
    ]
}

fn live_params(params: &'static [BufferId]) -> impl Fn(BufferId) -> bool {
    move |b| params.iter().any(|&p| b == p || b == p + 1)
}

#[test]
fn a_repeated_structure_reuses_the_region_with_its_own_buffers_and_scalars() {
    let mut cache = PlanCache::default();
    let opts = PlanOptions::default();
    let (first, reused) = cache.plan(&sgd(1, 0.1), &live_params(&[1]), &opts);
    assert!(!reused);
    let (second, reused) = cache.plan(&sgd(11, 0.2), &live_params(&[11]), &opts);
    assert!(reused);
    assert!(Arc::ptr_eq(&first.steps[0].region, &second.steps[0].region));
    let b = &second.steps[0].binding;
    assert!(b.operands.iter().all(|t| (11..14).contains(&t.buffer)));
    assert_eq!(
        b.scalars
            .iter()
            .map(|&s| f64::from_bits(s))
            .collect::<Vec<_>>(),
        [0.2]
    );
}

#[test]
fn a_reused_plan_keeps_the_counts_of_the_first() {
    let mut cache = PlanCache::default();
    let opts = PlanOptions::default();
    let (first, _) = cache.plan(&sgd(1, 0.1), &live_params(&[1]), &opts);
    let (second, _) = cache.plan(&sgd(11, 0.2), &live_params(&[11]), &opts);
    assert_eq!(second.cuts, first.cuts);
    assert_eq!(second.unmaterialized, first.unmaterialized);
    assert_eq!(second.dead_nodes, first.dead_nodes);
}

#[test]
fn another_op_is_another_structure() {
    let mut cache = PlanCache::default();
    let opts = PlanOptions::default();
    cache.plan(&sgd(1, 0.1), &live_params(&[1]), &opts);
    let mut other = sgd(1, 0.1);
    other[0] = bin(BinaryOp::Div, tensor(t(2, &[8])), scalar(0.1), t(3, &[8]));
    let (_, reused) = cache.plan(&other, &live_params(&[1]), &opts);
    assert!(!reused);
}

#[test]
fn another_liveness_is_another_structure() {
    // The scratch value held by a handle must be stored: the plan differs.
    let mut cache = PlanCache::default();
    let opts = PlanOptions::default();
    cache.plan(&sgd(1, 0.1), &live_params(&[1]), &opts);
    let (p, reused) = cache.plan(&sgd(1, 0.1), &|b| (1..=3).contains(&b), &opts);
    assert!(!reused);
    assert_eq!(
        p.unmaterialized, 0,
        "the scratch value a handle holds is stored"
    );
}

#[test]
fn a_host_read_at_another_node_is_another_plan() {
    // On whole programs the read's node decides where the first program ends.
    let mut cache = PlanCache::default();
    let whole = PlanOptions {
        capabilities: Capabilities::whole_programs(4096),
        ..PlanOptions::default()
    };
    let read_scratch = PlanOptions {
        read_node: Some(0),
        ..whole
    };
    let live = |b: BufferId| (1..=3).contains(&b);
    let (one, _) = cache.plan(&sgd(1, 0.1), &live, &whole);
    let (two, reused) = cache.plan(&sgd(1, 0.1), &live, &read_scratch);
    assert!(!reused);
    assert_eq!((one.steps.len(), two.steps.len()), (1, 2));
    let (_, reused) = cache.plan(&sgd(1, 0.2), &live, &read_scratch);
    assert!(reused);
}

#[test]
fn a_full_cache_forgets_what_it_held() {
    let mut cache = PlanCache::new(1);
    let opts = PlanOptions::default();
    let exp = vec![un(UnaryOp::Exp, t(1, &[8]), t(2, &[8]))];
    cache.plan(&sgd(1, 0.1), &live_params(&[1]), &opts);
    cache.plan(&exp, &|b| b <= 2, &opts);
    let (_, reused) = cache.plan(&sgd(1, 0.1), &live_params(&[1]), &opts);
    assert!(!reused);
}
