//! Op groups: one host-level op recorded as several runtime ops runs in strict mode as its own
//! fused program(s), with the bits its pieces give when run one by one.

use crate::harness::*;
use deferfuse::{
    BinaryOp, BufferState, DType, Handle, Mode, ReduceOp, Runtime, SyncReason, UnaryOp,
};

fn programs(rt: &Runtime) -> u64 {
    rt.stats().programs_run
}

/// A layer norm over the last dim of `x` ([rows, 64]) as a PyTorch kernel records it: mean,
/// centre, variance, rsqrt, scale; the intermediates are released as the kernel returns.
fn layer_norm(rt: &Runtime, x: Handle) -> Handle {
    let mean = run(rt, red(ReduceOp::Mean, &[1], true), &[tt(x)]);
    let xc = bin(rt, BinaryOp::Sub, tt(x), tt(mean));
    let sq = bin(rt, BinaryOp::Mul, tt(xc), tt(xc));
    let var = run(rt, red(ReduceOp::Mean, &[1], true), &[tt(sq)]);
    let eps = bin(rt, BinaryOp::Add, tt(var), fs(1e-5));
    let rstd = un(rt, UnaryOp::Rsqrt, eps);
    let out = bin(rt, BinaryOp::Mul, tt(xc), tt(rstd));
    for h in [mean, xc, sq, var, eps, rstd] {
        rt.release(h).unwrap();
    }
    out
}

fn input(rt: &Runtime) -> Handle {
    let vals: Vec<f64> = (0..32 * 64)
        .map(|i| ((i * 37 % 101) as f64) * 0.173 - 8.0)
        .collect();
    tensor(rt, DType::F32, &[32, 64], &vals)
}

fn grouped(rt: &Runtime, f: impl FnOnce() -> Handle) -> Handle {
    rt.begin_op_group();
    let h = f();
    rt.end_op_group(0).unwrap();
    h
}

#[test]
fn a_strict_op_group_runs_as_fewer_programs_than_its_ops() {
    let rt = runtime(Mode::Strict);
    let x = input(&rt);
    let before = programs(&rt);
    let out = grouped(&rt, || layer_norm(&rt, x));
    let ran = programs(&rt) - before;
    assert!(ran <= 2, "7 ops ran as {ran} programs");
    assert!(rt.stats().unmaterialized > 0, "{:?}", rt.stats());
    assert_eq!(download(&rt, out).data.len(), 32 * 64);
}

#[test]
fn a_strict_op_group_gives_the_bits_of_its_ops_run_one_by_one() {
    let rt = runtime(Mode::Strict);
    let x = input(&rt);
    let alone = read_raw(&rt, layer_norm(&rt, x));
    let together = read_raw(&rt, grouped(&rt, || layer_norm(&rt, x)));
    assert_eq!(alone, together);
}

#[test]
fn a_strict_op_group_is_launched_at_its_end_and_is_not_a_sync_point() {
    let rt = runtime(Mode::Strict);
    let x = input(&rt);
    rt.begin_op_group();
    let y = bin(&rt, BinaryOp::Add, tt(x), fs(1.0));
    assert_eq!(rt.state(y).unwrap(), BufferState::Deferred);
    rt.end_op_group(0).unwrap();
    assert_ne!(rt.state(y).unwrap(), BufferState::Deferred);
    assert_eq!(rt.stats().sync_points, [0; SyncReason::COUNT]);
}

#[test]
fn nested_op_groups_run_at_the_outermost_end() {
    let rt = runtime(Mode::Strict);
    let x = input(&rt);
    rt.begin_op_group();
    let y = grouped(&rt, || bin(&rt, BinaryOp::Mul, tt(x), fs(2.0)));
    assert_eq!(rt.state(y).unwrap(), BufferState::Deferred);
    let z = bin(&rt, BinaryOp::Add, tt(y), fs(1.0));
    rt.end_op_group(0).unwrap();
    assert_eq!(programs(&rt), 1);
    assert_eq!(
        download(&rt, z).data[0],
        download(&rt, x).data[0] * 2.0 + 1.0
    );
}

#[test]
fn debug_mode_runs_each_op_of_a_group_at_once() {
    let rt = runtime(Mode::Debug);
    let x = input(&rt);
    rt.begin_op_group();
    let y = bin(&rt, BinaryOp::Mul, tt(x), fs(2.0));
    let _z = bin(&rt, BinaryOp::Add, tt(y), fs(1.0));
    assert_eq!(programs(&rt), 2);
    assert_eq!(rt.state(y).unwrap(), BufferState::Materialized);
    rt.end_op_group(0).unwrap();
    assert_eq!(programs(&rt), 2);
}

#[test]
fn defer_mode_keeps_a_groups_ops_pending_past_its_end() {
    let rt = runtime(Mode::Defer);
    let x = input(&rt);
    let y = grouped(&rt, || bin(&rt, BinaryOp::Mul, tt(x), fs(2.0)));
    assert_eq!(programs(&rt), 0);
    assert_eq!(rt.state(y).unwrap(), BufferState::Deferred);
}

#[test]
fn an_op_group_end_without_a_begin_is_an_error() {
    let rt = runtime(Mode::Strict);
    let e = rt.end_op_group(0).unwrap_err().to_string();
    assert!(e.contains("without a matching begin"), "{e}");
}

#[test]
fn a_bad_op_inside_a_group_fails_at_its_call_and_the_ops_before_it_still_run() {
    let rt = runtime(Mode::Strict);
    let x = input(&rt);
    let other = tensor(&rt, DType::F32, &[3], &[1.0, 2.0, 3.0]);
    rt.begin_op_group();
    let y = bin(&rt, BinaryOp::Add, tt(x), fs(1.0));
    let bad = rt.op(
        0,
        deferfuse::Op::Binary(BinaryOp::Add),
        &[tt(x), tt(other)],
        None,
    );
    assert!(bad.is_err());
    rt.end_op_group(0).unwrap();
    assert_eq!(download(&rt, y).data[0], download(&rt, x).data[0] + 1.0);
}
