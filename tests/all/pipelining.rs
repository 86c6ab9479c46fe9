//! Defer mode's pipelining: once a stream holds `pipeline_ops` deferred ops it hands them to
//! its worker without waiting, so they run while the host records on. Such a flush is not a
//! sync point, cuts the trace at the same ops every time, changes no bits, and is skipped
//! while a graph is captured.

use crate::harness::*;
use deferfuse::{BinaryOp, BufferState, Config, DType, Handle, Mode, ReduceOp, Runtime, UnaryOp};
use std::time::{Duration, Instant};

fn defer_runtime(pipeline_ops: usize) -> Runtime {
    Runtime::new(Config {
        mode: Some(Mode::Defer),
        pipeline_ops: Some(pipeline_ops),
        ..Default::default()
    })
    .expect("runtime")
}

/// `n` dependent ops from `x`: an add, a multiply and an exp in turn, each from the last.
fn chain(rt: &Runtime, x: Handle, n: usize) -> Vec<Handle> {
    let mut out = vec![x];
    for i in 0..n {
        let last = *out.last().unwrap();
        let next = match i % 3 {
            0 => bin(rt, BinaryOp::Add, tt(last), fs(0.25)),
            1 => bin(rt, BinaryOp::Mul, tt(last), fs(0.5)),
            _ => un(rt, UnaryOp::Exp, last),
        };
        out.push(next);
    }
    out
}

fn input(rt: &Runtime) -> Handle {
    let vals: Vec<f64> = (0..100).map(|i| (i as f64 - 50.0) / 40.0).collect();
    tensor(rt, DType::F32, &[4, 25], &vals)
}

fn sync_points(rt: &Runtime) -> u64 {
    rt.stats().sync_points.iter().sum()
}

/// Waits (up to a minute: a loaded machine is slow, never wrong) for `h` to be materialized
/// with no sync point asked for.
fn materializes_by_itself(rt: &Runtime, h: Handle) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if rt.state(h).unwrap() == BufferState::Materialized {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn a_trace_of_pipeline_ops_ops_runs_without_a_sync_point() {
    let rt = defer_runtime(8);
    let x = input(&rt);
    let before = sync_points(&rt);
    let hs = chain(&rt, x, 8);
    assert_eq!(rt.stats().pipelined_flushes, 1);
    assert!(materializes_by_itself(&rt, hs[8]));
    assert_eq!(
        sync_points(&rt),
        before,
        "a pipelined flush is not a sync point"
    );
}

#[test]
fn fewer_ops_than_pipeline_ops_stay_deferred() {
    let rt = defer_runtime(8);
    let hs = chain(&rt, input(&rt), 7);
    assert_eq!(rt.stats().pipelined_flushes, 0);
    assert_eq!(rt.state(hs[7]).unwrap(), BufferState::Deferred);
}

#[test]
fn zero_pipeline_ops_keeps_the_whole_trace_until_a_sync_point() {
    let rt = defer_runtime(0);
    let hs = chain(&rt, input(&rt), 300);
    assert_eq!(rt.stats().pipelined_flushes, 0);
    assert_eq!(rt.state(hs[300]).unwrap(), BufferState::Deferred);
}

#[test]
fn a_long_trace_is_cut_every_pipeline_ops_ops() {
    let rt = defer_runtime(10);
    chain(&rt, input(&rt), 35);
    assert_eq!(rt.stats().pipelined_flushes, 3);
}

#[test]
fn pipelined_results_have_the_bits_of_one_flush() {
    // Cuts at 7 ops split fused loops and the reduction's producers at odd places.
    let results = [0, 7, 64].map(|ops| {
        let rt = defer_runtime(ops);
        let hs = chain(&rt, input(&rt), 100);
        let s = run(&rt, red(ReduceOp::Sum, &[1], false), &[tt(hs[100])]);
        (read_raw(&rt, hs[50]), read_raw(&rt, s))
    });
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

#[test]
fn pipeline_ops_can_change_at_run_time() {
    let rt = defer_runtime(0);
    assert_eq!(rt.set_pipeline_ops(5), 0);
    assert_eq!(rt.pipeline_ops(), 5);
    chain(&rt, input(&rt), 5);
    assert_eq!(rt.stats().pipelined_flushes, 1);
    assert_eq!(rt.set_pipeline_ops(0), 5);
    chain(&rt, input(&rt), 50);
    assert_eq!(rt.stats().pipelined_flushes, 1);
}

#[test]
fn a_graph_capture_is_not_pipelined() {
    let rt = defer_runtime(4);
    let x = input(&rt);
    rt.graph_capture_begin(0).unwrap();
    let hs = chain(&rt, x, 20);
    let g = rt.graph_capture_end(0, &[x], &[hs[20]]).unwrap();
    assert_eq!(rt.stats().pipelined_flushes, 0);
    let y = input(&rt);
    let launched = rt.graph_launch(0, g, &[y]).unwrap();
    let eager = chain(&rt, y, 20);
    assert_eq!(read_raw(&rt, launched[0]), read_raw(&rt, eager[20]));
}

#[test]
fn a_trace_is_not_cut_inside_an_op_group() {
    let rt = defer_runtime(8);
    let x = input(&rt);
    rt.begin_op_group();
    chain(&rt, x, 20);
    assert_eq!(
        rt.stats().pipelined_flushes,
        0,
        "one ATen op's pieces stay together"
    );
    rt.end_op_group(0).unwrap();
    chain(&rt, x, 1);
    assert_eq!(rt.stats().pipelined_flushes, 1, "the next op cuts");
}

#[test]
fn a_strict_op_group_is_never_pipelined() {
    let rt = Runtime::new(Config {
        mode: Some(Mode::Strict),
        pipeline_ops: Some(2),
        ..Default::default()
    })
    .unwrap();
    rt.begin_op_group();
    chain(&rt, input(&rt), 10);
    rt.end_op_group(0).unwrap();
    rt.synchronize(0).unwrap();
    assert_eq!(rt.stats().pipelined_flushes, 0);
}

#[test]
fn strict_mode_never_pipelines() {
    let rt = Runtime::new(Config {
        mode: Some(Mode::Strict),
        pipeline_ops: Some(2),
        ..Default::default()
    })
    .unwrap();
    chain(&rt, input(&rt), 10);
    rt.synchronize(0).unwrap();
    assert_eq!(rt.stats().pipelined_flushes, 0);
}
