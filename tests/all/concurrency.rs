//! Concurrency: many threads recording on many streams of one runtime, switching modes, moving
//! their tensors between streams (with events, and without: the runtime orders a read after
//! another stream's pending write), sharing handles, and creating and destroying streams and
//! events while others work. Every result must equal a serial run, and every mid-run host read
//! must see exactly the writes issued before it. Each test runs under a timeout that fails
//! loudly, so a deadlock is a failure, not a hung CI job.
//!
//! Integer arithmetic (i64, `(acc * 7 + w + k) % P`) makes every lost, duplicated or reordered
//! write visible in the result.

use deferfuse::{BinaryOp, Config, DType, Handle, Input, Mode, Op, Runtime, Scalar};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const THREADS: usize = 12;
const STREAMS: usize = 6;
const ITERS: usize = 200;
const N: usize = 48;
const P: i64 = 1_000_003;
const MODES: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::Defer];

/// Runs `f` on its own thread and returns its result, failing if it takes longer than `secs`
/// (a deadlock) or panics.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("no result within {secs} s: the runtime deadlocked")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let e = worker
                .join()
                .expect_err("the worker ended without a result");
            std::panic::resume_unwind(e)
        }
    }
}

fn runtime() -> Arc<Runtime> {
    Arc::new(
        Runtime::new(Config {
            mode: Some(Mode::Strict),
            // Small enough that deferred traces also flush by themselves now and then.
            max_pending_ops: 16,
            ..Default::default()
        })
        .unwrap(),
    )
}

fn i64s(rt: &Runtime, h: Handle) -> Vec<i64> {
    let mut b = vec![0u8; N * 8];
    rt.to_host(h, &mut b).unwrap();
    b.chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn upload(rt: &Runtime, v: &[i64]) -> Handle {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    rt.from_host(&b, DType::I64, &[v.len()]).unwrap()
}

fn shared_w() -> Vec<i64> {
    (0..N as i64).map(|i| i * 13 % 17).collect()
}

/// What thread `t`'s accumulator holds after `iters` iterations, computed without the runtime.
fn model(t: usize, iters: usize) -> Vec<i64> {
    let w = shared_w();
    (0..N)
        .map(|i| {
            (0..iters).fold((t * 1000 + i) as i64, |acc, k| {
                (acc * 7 + w[i] + (k + t) as i64) % P
            })
        })
        .collect()
}

/// One iteration of thread `t` on `stream`: `acc = (acc * 7 + w + (k + t)) % P`, in place.
fn iteration(rt: &Runtime, stream: Handle, acc: Handle, w: Handle, t: usize, k: usize) {
    let int = |v: i64| Input::Scalar(Scalar::Int(v));
    let ops = [
        (BinaryOp::Mul, int(7)),
        (BinaryOp::Add, Input::Tensor(w)),
        (BinaryOp::Add, int((k + t) as i64)),
        (BinaryOp::Remainder, int(P)),
    ];
    for (op, other) in ops {
        rt.op(
            stream,
            Op::Binary(op),
            &[Input::Tensor(acc), other],
            Some(acc),
        )
        .unwrap_or_else(|e| panic!("thread {t} iteration {k}: {op:?}: {e}"));
    }
}

/// Thread `t`'s whole program: each iteration in another mode, on another stream; a move to a
/// new stream is ordered by an event, except every fifth, which relies on the runtime ordering
/// a read after another stream's write. Checks a host read against the model every 10
/// iterations; returns the final values.
fn thread_program(rt: &Runtime, streams: &[Handle], acc: Handle, w: Handle, t: usize) -> Vec<i64> {
    let ev = rt.create_event().unwrap();
    let mut prev: Option<Handle> = None;
    for k in 0..ITERS {
        rt.set_mode(MODES[(t + k) % 3]);
        let s = streams[(t + k) % streams.len()];
        if let Some(p) = prev.filter(|&p| p != s && k % 5 != 0) {
            rt.record_event(ev, p).unwrap();
            rt.wait_event(s, ev).unwrap();
        }
        iteration(rt, s, acc, w, t, k);
        prev = Some(s);
        if k % 10 == 9 {
            assert_eq!(i64s(rt, acc), model(t, k + 1), "thread {t} after {k}");
        }
    }
    rt.destroy_event(ev).unwrap();
    rt.set_mode(Mode::Strict);
    i64s(rt, acc)
}

fn initial(t: usize) -> Vec<i64> {
    (0..N).map(|i| (t * 1000 + i) as i64).collect()
}

#[test]
fn threads_on_shared_streams_equal_a_serial_run() {
    let concurrent = within(120, || {
        let rt = runtime();
        let streams: Vec<Handle> = (0..STREAMS).map(|_| rt.create_stream().unwrap()).collect();
        let w = upload(&rt, &shared_w());
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (rt, streams) = (rt.clone(), streams.clone());
                // The accumulator is made here and handed over; `w` is shared by every thread,
                // each of which takes and drops its own reference.
                let acc = upload(&rt, &initial(t));
                std::thread::spawn(move || {
                    rt.retain(w).unwrap();
                    let out = thread_program(&rt, &streams, acc, w, t);
                    rt.release(w).unwrap();
                    rt.release(acc).unwrap();
                    out
                })
            })
            .collect();
        let outs: Vec<Vec<i64>> = workers.into_iter().map(|h| h.join().unwrap()).collect();
        rt.release(w).unwrap();
        assert_eq!(rt.live_tensors(), 0, "every handle was released");
        for s in streams {
            rt.destroy_stream(s).unwrap();
        }
        outs
    });
    // The same programs one after another on one thread and the default stream.
    let rt = runtime();
    let w = upload(&rt, &shared_w());
    for (t, got) in concurrent.iter().enumerate() {
        let acc = upload(&rt, &initial(t));
        let serial = thread_program(&rt, &[0], acc, w, t);
        assert_eq!(
            got, &serial,
            "thread {t}: concurrent run differs from the serial run"
        );
        assert_eq!(got, &model(t, ITERS), "thread {t}: differs from the model");
    }
}

#[test]
fn an_event_hands_a_write_from_one_thread_and_stream_to_another() {
    within(60, || {
        let rt = runtime();
        let (a, b) = (rt.create_stream().unwrap(), rt.create_stream().unwrap());
        let x = upload(&rt, &[0; N]);
        let ev = rt.create_event().unwrap();
        let (to_consumer, rounds) = mpsc::channel::<i64>();
        let (to_producer, acks) = mpsc::channel::<()>();
        let consumer = {
            let rt = rt.clone();
            std::thread::spawn(move || {
                for (k, r) in rounds.iter().enumerate() {
                    rt.set_mode(MODES[k % 3]);
                    rt.wait_event(b, ev).unwrap();
                    let y = rt.op(b, Op::Copy, &[Input::Tensor(x)], None).unwrap();
                    assert_eq!(i64s(&rt, y), vec![r; N], "round {r} read a stale value");
                    rt.release(y).unwrap();
                    to_producer.send(()).unwrap();
                }
            })
        };
        for r in 1..=60i64 {
            rt.set_mode(MODES[(r as usize + 1) % 3]);
            let fill = Op::Full {
                sizes: [N].into_iter().collect(),
                dtype: DType::I64,
            };
            rt.op(a, fill, &[Input::Scalar(Scalar::Int(r))], Some(x))
                .unwrap();
            rt.record_event(ev, a).unwrap();
            to_consumer.send(r).unwrap();
            acks.recv().unwrap();
        }
        drop(to_consumer);
        consumer.join().unwrap();
        rt.set_mode(Mode::Strict);
    });
}

#[test]
fn streams_and_events_come_and_go_while_others_record() {
    within(120, || {
        let rt = runtime();
        let w = upload(&rt, &shared_w());
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let rt = rt.clone();
                std::thread::spawn(move || {
                    let acc = upload(&rt, &initial(t));
                    // A fresh stream every few iterations; the old one is destroyed, which
                    // must first run its pending work.
                    let mut s = rt.create_stream().unwrap();
                    for k in 0..ITERS / 2 {
                        rt.set_mode(MODES[(t * 7 + k) % 3]);
                        if k % 4 == 3 {
                            let next = rt.create_stream().unwrap();
                            rt.destroy_stream(s).unwrap();
                            s = next;
                        }
                        iteration(&rt, s, acc, w, t, k);
                    }
                    rt.destroy_stream(s).unwrap();
                    rt.set_mode(Mode::Strict);
                    let out = i64s(&rt, acc);
                    rt.release(acc).unwrap();
                    (t, out)
                })
            })
            .collect();
        for h in workers {
            let (t, out) = h.join().unwrap();
            assert_eq!(out, model(t, ITERS / 2), "thread {t}");
        }
    });
}

#[test]
fn dropping_the_runtime_with_work_pending_on_every_stream_finishes() {
    within(60, || {
        let rt = runtime();
        let streams: Vec<Handle> = (0..STREAMS).map(|_| rt.create_stream().unwrap()).collect();
        let w = upload(&rt, &shared_w());
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (rt, streams) = (rt.clone(), streams.clone());
                std::thread::spawn(move || {
                    rt.set_mode(if t % 2 == 0 {
                        Mode::Defer
                    } else {
                        Mode::Strict
                    });
                    let acc = upload(&rt, &initial(t));
                    for k in 0..20 {
                        iteration(&rt, streams[(t + k) % STREAMS], acc, w, t, k);
                    }
                    // Leaves deferred traces and queued programs behind, and its handles.
                })
            })
            .collect();
        for h in workers {
            h.join().unwrap();
        }
        let sync_points = rt.stats().sync_points;
        assert!(Arc::strong_count(&rt) == 1);
        // The last reference: Drop runs the pending work, then stops every worker.
        drop(rt);
        sync_points
    });
}
