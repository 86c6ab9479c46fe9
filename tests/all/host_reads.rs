//! A host read in defer mode: it reads the value its flush computed, reports the failures of
//! the work it waited for and not those of later work, and later reads see what the flush
//! wrote in place after the value, in stream order. The read waits only for the steps that
//! compute its value (on PJRT one program), and the rest of the flush runs after it while the
//! host goes on.

use crate::harness::flush_spans::flush_args;
use crate::harness::*;
use deferfuse::{BinaryOp, DType, Error, Handle, Mode, Op, ReduceOp, Runtime, UnaryOp};

/// x (8x8, values k/64), its sum of squares `loss`, then `tail = exp(x @ x)`: a matmul and a
/// loop after the loss, as a training step's backward follows its loss.
fn loss_then_tail(rt: &Runtime) -> (Handle, Handle, Vec<f64>) {
    let xs: Vec<f64> = (0..64).map(|k| k as f64 / 64.0).collect();
    let x = tensor(rt, DType::F32, &[8, 8], &xs);
    let sq = bin(rt, BinaryOp::Mul, tt(x), tt(x));
    let loss = run(rt, red(ReduceOp::Sum, &[], false), &[tt(sq)]);
    let mm = run(rt, Op::Matmul, &[tt(x), tt(x)]);
    let tail = un(rt, UnaryOp::Exp, mm);
    (loss, tail, xs)
}

/// The reference of `tail` for x = `xs`, in f64.
fn tail_ref(xs: &[f64]) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..8 {
        for j in 0..8 {
            let dot: f64 = (0..8).map(|k| xs[i * 8 + k] * xs[k * 8 + j]).sum();
            out.push(dot.exp());
        }
    }
    out
}

#[test]
fn a_read_gets_its_value_and_a_later_read_the_work_recorded_after_it() {
    let rt = runtime(Mode::Defer);
    let (loss, tail, xs) = loss_then_tail(&rt);
    let want: f64 = xs.iter().map(|v| v * v).sum();
    let got = download(&rt, loss).data[0];
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    let got = download(&rt, tail).data;
    for (g, w) in got.iter().zip(tail_ref(&xs)) {
        assert!((g - w).abs() <= 1e-5 * w, "{g} vs {w}");
    }
}

/// The steps each flush `f` makes ran after the value the host read.
fn after_read_of_flushes(rt: &Runtime, f: impl FnOnce()) -> Vec<u64> {
    let args = flush_args(rt, f);
    args.iter()
        .map(|a| a["after_read"].as_u64().unwrap())
        .collect()
}

/// Whether each flush `f` makes ran those steps on the host's thread.
fn after_read_here(rt: &Runtime, f: impl FnOnce()) -> Vec<bool> {
    let args = flush_args(rt, f);
    args.iter()
        .map(|a| a["after_read_here"].as_bool().unwrap())
        .collect()
}

#[test]
fn a_read_waits_only_for_the_steps_up_to_its_value() {
    let rt = runtime(Mode::Defer);
    let (loss, tail, xs) = loss_then_tail(&rt);
    let want: f64 = xs.iter().map(|v| v * v).sum();
    let after = after_read_of_flushes(&rt, || {
        let got = download(&rt, loss).data[0];
        assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    });
    // The loss's step, then the matmul and the exp (PJRT: one program; CPU: the exp is the
    // matmul's epilogue) after the read.
    assert_eq!(after, [1], "steps run after the read, per flush");
    let got = download(&rt, tail).data;
    for (g, w) in got.iter().zip(tail_ref(&xs)) {
        assert!((g - w).abs() <= 1e-5 * w, "{g} vs {w}");
    }
}

#[test]
fn a_read_of_the_flush_s_last_value_waits_for_all_of_it() {
    let rt = runtime(Mode::Defer);
    let (_, tail, _) = loss_then_tail(&rt);
    let after = after_read_of_flushes(&rt, || {
        download(&rt, tail);
    });
    assert_eq!(after, [0]);
}

#[test]
fn a_synchronize_waits_for_the_whole_flush() {
    let rt = runtime(Mode::Defer);
    let (loss, tail, _) = loss_then_tail(&rt);
    let after = after_read_of_flushes(&rt, || rt.synchronize(0).unwrap());
    assert_eq!(after, [0]);
    for h in [loss, tail] {
        assert_eq!(
            rt.state(h).unwrap(),
            deferfuse::BufferState::Materialized,
            "a synchronize leaves nothing running"
        );
    }
}

#[test]
fn a_failure_after_the_read_value_fails_its_own_value_not_the_read() {
    let rt = runtime(Mode::Defer);
    let (loss, _, xs) = loss_then_tail(&rt);
    // A gather with an index out of bounds: it fails when it runs, after the loss.
    let src = tensor(&rt, DType::F32, &[2, 5], &[1.0; 10]);
    let idx = tensor(&rt, DType::I64, &[2, 2], &[0.0, 4.0, 7.0, 1.0]);
    let bad = run(&rt, gather(1), &[tt(src), tt(idx)]);
    let want: f64 = xs.iter().map(|v| v * v).sum();
    let got = download(&rt, loss).data[0];
    assert!((got - want).abs() <= 1e-5 * want, "the loss reads fine");
    let msg = "gather: index 7 is out of bounds for dim 1 with size 5";
    let mut out = vec![0u8; 16];
    let e = rt.to_host(bad, &mut out).unwrap_err();
    assert!(matches!(e, Error::IndexOutOfBounds(_)), "{e:?}");
    assert_eq!(e.to_string(), msg);
}

#[test]
fn a_later_read_sees_the_values_the_steps_after_a_read_wrote_in_place() {
    // An optimizer-like in-place update after the loss, then the next step reads the
    // updated parameter: stream order holds across the split.
    let rt = runtime(Mode::Defer);
    let p = tensor(&rt, DType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
    for step in 0..3 {
        let sq = bin(&rt, BinaryOp::Mul, tt(p), tt(p));
        let loss = run(&rt, red(ReduceOp::Sum, &[], false), &[tt(sq)]);
        let upd = bin(&rt, BinaryOp::Mul, tt(p), fs(0.5));
        rt.op(0, Op::Binary(BinaryOp::Sub), &[tt(p), tt(upd)], Some(p))
            .unwrap();
        let scale = 0.25f64.powi(step);
        let want = 30.0 * scale;
        assert_eq!(download(&rt, loss).data, [want], "step {step}");
        for h in [sq, loss, upd] {
            rt.release(h).unwrap();
        }
    }
    assert_eq!(download(&rt, p).data, [0.125, 0.25, 0.375, 0.5]);
}

#[test]
fn a_small_rest_after_a_read_runs_on_the_host_s_thread() {
    // The steps after the loss (an 8x8 product and its exp) cost less to run on the host's
    // thread than to hand to the worker and wait for at the next sync.
    let rt = runtime(Mode::Defer);
    let (loss, tail, _) = loss_then_tail(&rt);
    assert_eq!(after_read_here(&rt, || drop(download(&rt, loss))), [true]);
    assert_eq!(
        rt.state(tail).unwrap(),
        deferfuse::BufferState::Materialized
    );
}

#[test]
fn a_large_rest_after_a_read_goes_to_the_worker() {
    // A training step's backward after `loss.item()`: the host goes on meanwhile.
    let rt = runtime(Mode::Defer);
    let x = tensor(&rt, DType::F32, &[128, 128], &vec![0.01; 128 * 128]);
    let loss = run(&rt, red(ReduceOp::Sum, &[], false), &[tt(x)]);
    let _tail = run(&rt, Op::Matmul, &[tt(x), tt(x)]);
    assert_eq!(after_read_here(&rt, || drop(download(&rt, loss))), [false]);
}
