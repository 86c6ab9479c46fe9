//! Modes, sync points, buffer lifecycles and streams.

use crate::harness;

use deferfuse::{
    BinaryOp, BufferState, Config, DType, Handle, Mode, Op, ReduceOp, Runtime, SyncReason, UnaryOp,
};
use harness::*;
use std::time::Duration;

fn with(mode: Mode, f: impl FnOnce(Config) -> Config) -> Runtime {
    Runtime::new(f(Config {
        mode: Some(mode),
        ..Default::default()
    }))
    .unwrap()
}

fn syncs(rt: &Runtime, r: SyncReason) -> u64 {
    rt.stats().sync_points[r as usize]
}

fn vals(rt: &Runtime, h: Handle) -> Vec<f64> {
    download(rt, h).data
}

#[test]
fn defer_records_without_running_until_a_host_read() {
    let rt = runtime(Mode::Defer);
    let x = tensor(&rt, DType::F32, &[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let y = bin(&rt, BinaryOp::Add, tt(x), fs(1.0));
    let z = bin(&rt, BinaryOp::Mul, tt(y), fs(2.0));
    let s = run(&rt, red(ReduceOp::Sum, &[], false), &[tt(z)]);
    let st = rt.stats();
    assert_eq!((st.ops_recorded, st.programs_run), (3, 0), "{st:?}");
    assert_eq!(st.sync_points, [0; SyncReason::COUNT]);
    for h in [y, z, s] {
        assert_eq!(rt.state(h).unwrap(), BufferState::Deferred);
    }
    assert_eq!(rt.state(x).unwrap(), BufferState::Materialized);
    assert_eq!(vals(&rt, s), [40.0]);
    let st = rt.stats();
    assert!(st.programs_run >= 1, "{st:?}");
    assert!(syncs(&rt, SyncReason::HostRead) >= 1);
    for h in [y, z, s] {
        assert_eq!(rt.state(h).unwrap(), BufferState::Materialized);
    }
    assert_eq!(vals(&rt, z), [4.0, 6.0, 8.0, 10.0, 12.0]);
    // Nothing new was recorded, so reading again runs nothing.
    let runs = rt.stats().programs_run;
    assert_eq!(vals(&rt, y), [2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(rt.stats().programs_run, runs);
}

#[test]
fn a_read_for_an_output_size_is_its_own_sync_reason() {
    let rt = runtime(Mode::Defer);
    let x = tensor(&rt, DType::F32, &[3], &[1.0, 0.0, 2.0]);
    let y = bin(&rt, BinaryOp::Ne, tt(x), fs(0.0));
    let mut out = [0u8; 3];
    rt.to_host_for_size(y, &mut out).unwrap();
    assert_eq!(out, [1, 0, 1]);
    assert_eq!(syncs(&rt, SyncReason::DataDependentSize), 1);
    assert_eq!(syncs(&rt, SyncReason::HostRead), 0);
    assert_eq!(SyncReason::DataDependentSize.name(), "data_dependent_size");
}

#[test]
fn strict_and_debug_run_each_op_when_recorded() {
    for mode in [Mode::Strict, Mode::Debug] {
        let rt = runtime(mode);
        let x = tensor(&rt, DType::F32, &[3], &[1.0, -2.0, 3.0]);
        let mut h = x;
        for k in 1..=4u64 {
            h = un(&rt, UnaryOp::Neg, h);
            assert_eq!(rt.stats().programs_run, k, "{mode:?}");
            if mode == Mode::Debug {
                // Debug waits for every op: its output is final right away.
                assert_eq!(rt.state(h).unwrap(), BufferState::Materialized);
            }
        }
        rt.synchronize(0).unwrap();
        assert_eq!(rt.state(h).unwrap(), BufferState::Materialized, "{mode:?}");
        assert_eq!(vals(&rt, h), [1.0, -2.0, 3.0]);
        assert_eq!(
            syncs(&rt, SyncReason::Synchronize),
            0,
            "nothing was pending"
        );
    }
}

#[test]
fn every_sync_reason_is_counted() {
    use SyncReason::*;
    let setup = |rt: &Runtime| {
        let x = tensor(rt, DType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
        bin(rt, BinaryOp::Add, tt(x), fs(1.0))
    };
    // An explicit synchronize.
    let rt = runtime(Mode::Defer);
    let y = setup(&rt);
    rt.synchronize(0).unwrap();
    assert_eq!(syncs(&rt, Synchronize), 1);
    assert_eq!(rt.state(y).unwrap(), BufferState::Materialized);
    assert!(rt.stats().programs_run >= 1);
    // Recording an event flushes the stream.
    let rt = runtime(Mode::Defer);
    let y = setup(&rt);
    let e = rt.create_event().unwrap();
    rt.record_event(e, 0).unwrap();
    assert_eq!(syncs(&rt, Event), 1);
    rt.synchronize_event(e).unwrap();
    assert!(rt.query_event(e).unwrap());
    assert_eq!(rt.state(y).unwrap(), BufferState::Materialized);
    // The trace reaching max_pending_ops.
    let rt = with(Mode::Defer, |c| Config {
        max_pending_ops: 3,
        ..c
    });
    let y = setup(&rt);
    let z = bin(&rt, BinaryOp::Mul, tt(y), tt(y));
    assert_eq!((rt.stats().programs_run, syncs(&rt, MaxPending)), (0, 0));
    let w = un(&rt, UnaryOp::Neg, z);
    assert_eq!(syncs(&rt, MaxPending), 1);
    assert!(rt.stats().programs_run >= 1);
    assert_eq!(vals(&rt, w), [-4.0, -9.0, -16.0, -25.0]);
    // Deferred buffers exceeding max_pending_bytes.
    let rt = with(Mode::Defer, |c| Config {
        max_pending_bytes: 40,
        ..c
    });
    let y = setup(&rt); // 16 bytes pending
    let z = bin(&rt, BinaryOp::Mul, tt(y), tt(y)); // 32
    assert_eq!(syncs(&rt, MemoryBound), 0);
    let w = un(&rt, UnaryOp::Neg, z); // 48 > 40
    assert_eq!(syncs(&rt, MemoryBound), 1);
    assert_eq!(vals(&rt, w), [-4.0, -9.0, -16.0, -25.0]);
    // Another stream reading a value this stream has not produced yet.
    let rt = runtime(Mode::Defer);
    let y = setup(&rt);
    let s2 = rt.create_stream().unwrap();
    let z = rt
        .op(s2, Op::Binary(BinaryOp::Mul), &[tt(y), fs(10.0)], None)
        .unwrap();
    assert_eq!(syncs(&rt, CrossStream), 1);
    assert_eq!(vals(&rt, z), [20.0, 30.0, 40.0, 50.0]);
    // A strict op on a thread whose deferred ops are pending: they run first.
    let rt = runtime(Mode::Defer);
    let y = setup(&rt);
    rt.push_mode(Mode::Strict);
    let z = bin(&rt, BinaryOp::Mul, tt(y), fs(3.0));
    rt.pop_mode().unwrap();
    assert_eq!(syncs(&rt, ModeSwitch), 1);
    assert_eq!(vals(&rt, z), [6.0, 9.0, 12.0, 15.0]);
    // A host read of a deferred value.
    let rt = runtime(Mode::Defer);
    let y = setup(&rt);
    let before = syncs(&rt, HostRead);
    assert_eq!(vals(&rt, y), [2.0, 3.0, 4.0, 5.0]);
    assert_eq!(
        syncs(&rt, HostRead),
        before + 1,
        "one host read is one sync point"
    );
    // Sync points with nothing pending are not counted as flushes.
    let rt = runtime(Mode::Defer);
    rt.synchronize(0).unwrap();
    let e = rt.create_event().unwrap();
    rt.record_event(e, 0).unwrap();
    assert_eq!((syncs(&rt, Synchronize), syncs(&rt, Event)), (0, 0));
}

#[test]
fn the_mode_is_thread_local_and_nests() {
    let rt = runtime(Mode::Strict);
    assert_eq!((rt.default_mode(), rt.mode()), (Mode::Strict, Mode::Strict));
    rt.push_mode(Mode::Defer);
    assert_eq!(rt.mode(), Mode::Defer);
    let x = tensor(&rt, DType::F32, &[2], &[1.0, 2.0]);
    let y = un(&rt, UnaryOp::Neg, x);
    assert_eq!(rt.state(y).unwrap(), BufferState::Deferred);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Another thread starts in the runtime's default mode and runs its ops at once.
            assert_eq!(rt.mode(), Mode::Strict);
            let runs = rt.stats().programs_run;
            let z = un(&rt, UnaryOp::Abs, x);
            // It ran now (after the pending deferred op of the same stream, see below).
            assert!(rt.stats().programs_run > runs);
            assert_eq!(vals(&rt, z), [1.0, 2.0]);
            assert!(rt.pop_mode().is_err(), "nothing was pushed on this thread");
        });
    });
    // Its strict op went to the same stream, so the pending deferred op ran first (stream order).
    assert_eq!(syncs(&rt, SyncReason::ModeSwitch), 1);
    assert_eq!(rt.state(y).unwrap(), BufferState::Materialized);
    rt.push_mode(Mode::Debug);
    assert_eq!(rt.mode(), Mode::Debug);
    rt.set_mode(Mode::Strict);
    assert_eq!(rt.mode(), Mode::Strict);
    assert_eq!(rt.pop_mode().unwrap(), Mode::Strict);
    assert_eq!(rt.mode(), Mode::Defer);
    assert_eq!(rt.pop_mode().unwrap(), Mode::Defer);
    assert_eq!(rt.mode(), Mode::Strict);
    assert!(rt.pop_mode().is_err());
    assert_eq!(vals(&rt, y), [-1.0, -2.0]);
}

#[test]
fn a_released_temporary_still_computes_in_defer() {
    let rt = runtime(Mode::Defer);
    let live = rt.live_tensors();
    let x = tensor(
        &rt,
        DType::F32,
        &[1000],
        &(0..1000).map(|i| i as f64).collect::<Vec<_>>(),
    );
    let t = bin(&rt, BinaryOp::Add, tt(x), fs(1.0));
    let u = bin(&rt, BinaryOp::Mul, tt(t), tt(x));
    let v = run(&rt, red(ReduceOp::Sum, &[], false), &[tt(t)]);
    rt.release(t).unwrap();
    rt.release(x).unwrap();
    assert_eq!(rt.live_tensors(), live + 2);
    let u = download(&rt, u);
    assert_eq!(u.data[..3], [0.0, 2.0, 6.0]);
    assert_eq!(u.data[999], 1000.0 * 999.0);
    assert_eq!(vals(&rt, v), [500_500.0]);
    // Work whose result nobody can read any more is dropped, not run.
    let a = tensor(&rt, DType::F32, &[4], &[1.0; 4]);
    let dead = un(&rt, UnaryOp::Exp, a);
    let kept = un(&rt, UnaryOp::Neg, a);
    rt.release(dead).unwrap();
    assert_eq!(vals(&rt, kept), [-1.0; 4]);
    assert!(rt.stats().dead_nodes >= 1, "{:?}", rt.stats());
}

#[test]
fn streams_ordered_by_events_give_the_right_result() {
    for mode in MODES {
        let rt = runtime(mode);
        let s2 = rt.create_stream().unwrap();
        let n = 4096;
        let x = tensor(&rt, DType::F32, &[n], &vec![1.0; n]);
        // Producer on the default stream, consumer on s2, ordered by an event.
        let mut y = x;
        for _ in 0..8 {
            y = bin(&rt, BinaryOp::Add, tt(y), fs(1.0));
        }
        let e = rt.create_event().unwrap();
        rt.record_event(e, 0).unwrap();
        rt.wait_event(s2, e).unwrap();
        let z = rt
            .op(s2, Op::Binary(BinaryOp::Mul), &[tt(y), fs(2.0)], None)
            .unwrap();
        // And back: s2 writes in place, the default stream waits for it, then reads.
        rt.op(s2, Op::Binary(BinaryOp::Add), &[tt(z), fs(0.5)], Some(z))
            .unwrap();
        let e2 = rt.create_event().unwrap();
        rt.record_event(e2, s2).unwrap();
        rt.wait_event(0, e2).unwrap();
        let w = run(&rt, red(ReduceOp::Sum, &[], false), &[tt(z)]);
        assert_eq!(vals(&rt, w), [18.5 * n as f64], "{mode:?}");
        rt.synchronize_all().unwrap();
        assert!(rt.query_event(e).unwrap() && rt.query_event(e2).unwrap());
        rt.destroy_event(e).unwrap();
        rt.destroy_stream(s2).unwrap();
        assert!(rt.destroy_stream(0).is_err(), "the default stream stays");
        assert!(
            rt.op(s2, Op::Unary(UnaryOp::Neg), &[tt(x)], None).is_err(),
            "destroyed stream"
        );
    }
}

#[test]
fn dropping_a_runtime_with_pending_deferred_work_runs_it_and_returns() {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let rt = runtime(Mode::Defer);
        let x = tensor(&rt, DType::F32, &[1 << 16], &vec![2.0; 1 << 16]);
        let s2 = rt.create_stream().unwrap();
        let mut y = x;
        for _ in 0..20 {
            y = un(&rt, UnaryOp::Sqrt, y);
        }
        let _z = rt.op(s2, Op::Unary(UnaryOp::Exp), &[tt(x)], None).unwrap();
        let stats = rt.stats();
        assert_eq!(stats.programs_run, 0, "{stats:?}");
        drop(rt);
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(60)).is_ok(),
        "dropping the runtime hung or panicked"
    );
    worker.join().unwrap();
}
