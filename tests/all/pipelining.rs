//! Defer mode's pipelining: once a stream holds `pipeline_ops` deferred ops, the next matmul
//! or kernel op hands them to its worker without waiting, so they run while the host records
//! on; a run of other ops is cut at 8 times as many, outside op groups. Such a flush is not a
//! sync point, cuts the trace at the same ops every time, changes no bits, and is skipped
//! while a graph is captured and in strict mode.

use crate::harness::flush_spans::flush_args;
use crate::harness::*;
use deferfuse::{
    BackendKind, BinaryOp, BufferState, Config, DType, Handle, Mode, Op, ReduceOp, Runtime, UnaryOp,
};
use std::time::{Duration, Instant};

/// A runtime on the CPU backend whatever `DEFERFUSE_BACKEND` says: PJRT's whole-flush mode
/// does not pipeline (the last test).
fn runtime_with(mode: Mode, pipeline_ops: usize) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        pipeline_ops: Some(pipeline_ops),
        backend: Some(BackendKind::Cpu),
        ..Default::default()
    })
    .expect("runtime")
}

fn defer_runtime(pipeline_ops: usize) -> Runtime {
    runtime_with(Mode::Defer, pipeline_ops)
}

/// `n` dependent elementwise ops from `x`: an add, a multiply and an exp in turn.
fn chain(rt: &Runtime, x: Handle, n: usize) -> Vec<Handle> {
    let mut out = vec![x];
    for i in 0..n {
        let last = *out.last().unwrap();
        let next = match i % 3 {
            0 => bin(rt, BinaryOp::Add, tt(last), fs(0.25)),
            1 => bin(rt, BinaryOp::Mul, tt(last), fs(0.5)),
            _ => un(rt, UnaryOp::Tanh, last),
        };
        out.push(next);
    }
    out
}

/// `x @ w` for the `[4, 25]` inputs and a `[25, 25]` weight.
fn matmul(rt: &Runtime, x: Handle, w: Handle) -> Handle {
    run(rt, Op::Matmul, &[tt(x), tt(w)])
}

fn input(rt: &Runtime) -> Handle {
    let vals: Vec<f64> = (0..100).map(|i| (i as f64 - 50.0) / 40.0).collect();
    tensor(rt, DType::F32, &[4, 25], &vals)
}

fn weight(rt: &Runtime) -> Handle {
    let vals: Vec<f64> = (0..625)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 300.0)
        .collect();
    tensor(rt, DType::F32, &[25, 25], &vals)
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
fn a_matmul_after_pipeline_ops_ops_runs_them_without_a_sync_point() {
    let rt = defer_runtime(8);
    let (x, w) = (input(&rt), weight(&rt));
    let before = sync_points(&rt);
    let hs = chain(&rt, x, 8);
    assert_eq!(
        rt.stats().pipelined_flushes,
        0,
        "no cut before an op to cut at"
    );
    let y = matmul(&rt, hs[8], w);
    assert_eq!(rt.stats().pipelined_flushes, 1);
    assert!(materializes_by_itself(&rt, hs[8]));
    assert_eq!(
        rt.state(y).unwrap(),
        BufferState::Deferred,
        "the matmul starts the next trace"
    );
    assert_eq!(
        sync_points(&rt),
        before,
        "a pipelined flush is not a sync point"
    );
}

/// Whether each pipelined flush `f` makes runs on the host's thread when the worker is idle
/// (its timeline span's `here_if_idle`), rather than being handed to the worker.
fn pipelined_here(rt: &Runtime, f: impl FnOnce()) -> Vec<bool> {
    flush_args(rt, f)
        .iter()
        .filter(|a| a["reason"] == "pipelined")
        .map(|a| a["here_if_idle"].as_bool().unwrap())
        .collect()
}

#[test]
fn a_pipelined_flush_too_small_to_hand_over_runs_on_the_recording_thread() {
    // 8 ops on [4, 25]: less work than waking the worker costs.
    let rt = defer_runtime(8);
    let (x, w) = (input(&rt), weight(&rt));
    let here = pipelined_here(&rt, || {
        matmul(&rt, *chain(&rt, x, 8).last().unwrap(), w);
    });
    assert_eq!(here, [true]);
}

#[test]
fn a_pipelined_flush_that_computes_enough_goes_to_the_worker() {
    // 8 ops on [4096, 64]: 4 M elements.
    let rt = defer_runtime(8);
    let vals: Vec<f64> = (0..4096 * 64).map(|i| (i % 7) as f64 / 7.0).collect();
    let x = tensor(&rt, DType::F32, &[4096, 64], &vals);
    let wv: Vec<f64> = (0..64 * 64).map(|i| (i % 5) as f64 / 50.0).collect();
    let w = tensor(&rt, DType::F32, &[64, 64], &wv);
    let here = pipelined_here(&rt, || {
        matmul(&rt, *chain(&rt, x, 8).last().unwrap(), w);
    });
    assert_eq!(here, [false]);
}

#[test]
fn a_matmul_before_pipeline_ops_ops_cuts_nothing() {
    let rt = defer_runtime(8);
    let (x, w) = (input(&rt), weight(&rt));
    let hs = chain(&rt, x, 7);
    let y = matmul(&rt, hs[7], w);
    assert_eq!(rt.stats().pipelined_flushes, 0);
    assert_eq!(rt.state(y).unwrap(), BufferState::Deferred);
}

#[test]
fn a_run_without_matmuls_is_cut_at_eight_times_pipeline_ops() {
    let rt = defer_runtime(4);
    let x = input(&rt);
    let hs = chain(&rt, x, 31);
    assert_eq!(rt.stats().pipelined_flushes, 0);
    chain(&rt, hs[31], 1);
    assert_eq!(rt.stats().pipelined_flushes, 1);
}

#[test]
fn zero_pipeline_ops_keeps_the_whole_trace_until_a_sync_point() {
    let rt = defer_runtime(0);
    let (x, w) = (input(&rt), weight(&rt));
    let hs = chain(&rt, x, 300);
    let y = matmul(&rt, hs[300], w);
    assert_eq!(rt.stats().pipelined_flushes, 0);
    assert_eq!(rt.state(hs[300]).unwrap(), BufferState::Deferred);
    assert_eq!(rt.state(y).unwrap(), BufferState::Deferred);
}

#[test]
fn pipelined_results_have_the_bits_of_one_flush() {
    // Small thresholds cut before most matmuls and inside long elementwise runs.
    let results = [0, 1, 3, 48].map(|ops| {
        let rt = defer_runtime(ops);
        let (mut x, w) = (input(&rt), weight(&rt));
        let mut kept = Vec::new();
        for i in 0..12 {
            x = *chain(&rt, matmul(&rt, x, w), 2 + i % 5).last().unwrap();
            kept.push(x);
        }
        let s = run(&rt, red(ReduceOp::Sum, &[1], false), &[tt(x)]);
        let pipelined = rt.stats().pipelined_flushes;
        let bits: Vec<Raw> = kept.iter().chain([&s]).map(|&h| read_raw(&rt, h)).collect();
        (bits, pipelined)
    });
    assert_eq!(results[0].1, 0);
    assert!(results[2].1 > 1, "the test cuts the trace");
    for r in &results[1..] {
        assert_eq!(r.0, results[0].0);
    }
}

#[test]
fn pipeline_ops_can_change_at_run_time() {
    let rt = defer_runtime(0);
    let (x, w) = (input(&rt), weight(&rt));
    assert_eq!(rt.set_pipeline_ops(5), 0);
    assert_eq!(rt.pipeline_ops(), 5);
    matmul(&rt, *chain(&rt, x, 5).last().unwrap(), w);
    assert_eq!(rt.stats().pipelined_flushes, 1);
    assert_eq!(rt.set_pipeline_ops(0), 5);
    matmul(&rt, *chain(&rt, x, 50).last().unwrap(), w);
    assert_eq!(rt.stats().pipelined_flushes, 1);
}

#[test]
fn a_graph_capture_is_not_pipelined() {
    let rt = defer_runtime(2);
    let (x, w) = (input(&rt), weight(&rt));
    let body = |x: Handle| matmul(&rt, *chain(&rt, matmul(&rt, x, w), 20).last().unwrap(), w);
    rt.graph_capture_begin(0).unwrap();
    let captured = body(x);
    let g = rt.graph_capture_end(0, &[x], &[captured]).unwrap();
    assert_eq!(rt.stats().pipelined_flushes, 0);
    rt.set_pipeline_ops(0);
    let y = input(&rt);
    let launched = rt.graph_launch(0, g, &[y]).unwrap();
    assert_eq!(read_raw(&rt, launched[0]), read_raw(&rt, body(y)));
}

#[test]
fn a_long_run_is_not_cut_inside_an_op_group_but_a_matmul_is() {
    let rt = defer_runtime(2);
    let (x, w) = (input(&rt), weight(&rt));
    rt.begin_op_group();
    let hs = chain(&rt, x, 40);
    assert_eq!(
        rt.stats().pipelined_flushes,
        0,
        "one ATen op's elementwise pieces stay together"
    );
    matmul(&rt, hs[40], w);
    assert_eq!(
        rt.stats().pipelined_flushes,
        1,
        "a matmul never fuses with what comes before"
    );
    rt.end_op_group(0).unwrap();
}

#[test]
fn strict_mode_and_its_op_groups_never_pipeline() {
    let rt = runtime_with(Mode::Strict, 1);
    let (x, w) = (input(&rt), weight(&rt));
    matmul(&rt, *chain(&rt, x, 20).last().unwrap(), w);
    rt.begin_op_group();
    matmul(&rt, *chain(&rt, x, 20).last().unwrap(), w);
    rt.end_op_group(0).unwrap();
    rt.synchronize(0).unwrap();
    assert_eq!(rt.stats().pipelined_flushes, 0);
}

#[test]
fn pjrt_whole_flush_mode_never_pipelines() {
    let Some(plugin) = plugin() else { return };
    let rt = Runtime::new(Config {
        mode: Some(Mode::Defer),
        pipeline_ops: Some(1),
        backend: Some(BackendKind::Pjrt),
        pjrt_plugin: Some(plugin),
        ..Default::default()
    })
    .expect("runtime");
    let (x, w) = (input(&rt), weight(&rt));
    let y = matmul(&rt, *chain(&rt, matmul(&rt, x, w), 20).last().unwrap(), w);
    assert_eq!(rt.stats().pipelined_flushes, 0, "one XLA program per flush");
    read_raw(&rt, y);
}
