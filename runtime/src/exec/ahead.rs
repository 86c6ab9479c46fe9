//! Running a host read's steps ahead of its stream's queued work.
//!
//! A defer-mode training step ends with `loss.item()`: the host waits for the forward, and the
//! backward and the optimizer step run on the stream's worker while the host records the next
//! step (the split at the read). A model that reads another value on the host early in its
//! forward would then wait for all of that work, though the value needs none of it: Hugging
//! Face's BERT and GPT-2 check their attention mask and input ids for padding, a boolean mask's
//! `nonzero` needs its count. Such a read's steps run on the host at once instead, when that
//! cannot be told apart from running them in stream order; the flush's other steps queue
//! behind the worker's work as usual.

use super::outputs_of;
use crate::buffer::{Buffer, Writer};
use crate::stream::{BufferLookup, Stream};
use deferfuse_fusion::{BufferId, Step};

// ahash, not std's SipHash: these sets are built on every host read of a small flush.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// Takes out of `steps` (a planned flush, in order) the ones a host read of `read` needs, when
/// they may run ahead of `stream`'s queued work; returns them in order, the others staying in
/// `steps` in order. `None` (and `steps` untouched) when `read` is not written here or a step
/// it needs touches what queued work touches.
///
/// The needed steps are `read`'s writer and, transitively, the writers of what they read.
/// They may run first when the stream's queue holds no wait for another stream (which
/// orders what follows it after that stream's work), and for each of them:
/// - every buffer it writes is newer than all that queued work reads or writes (buffer ids
///   only grow), so that work cannot see the write;
/// - every buffer it reads that no earlier step of this flush writes has no write still to
///   come, on any stream (its last writer finished);
/// - no step left behind that comes before it reads or writes what it writes.
pub(crate) fn split_ahead(
    steps: &mut Vec<Step>,
    read: BufferId,
    buffers: &impl BufferLookup,
    stream: &Stream,
) -> Option<Vec<Step>> {
    if stream.waits_for_other_streams() {
        return None;
    }
    let writer = steps
        .iter()
        .rposition(|s| outputs_of(s).any(|b| b == read))?;
    let fresh = |id: BufferId| stream.untouched_by_queued_work(id);
    // Where each buffer is first written in the flush: a step after that reads this flush's
    // value of it.
    let mut first_write: HashMap<BufferId, usize> = HashMap::default();
    for (i, s) in steps[..writer].iter().enumerate() {
        for b in outputs_of(s) {
            first_write.entry(b).or_insert(i);
        }
    }
    let mut needed: HashSet<BufferId> = HashSet::default();
    let mut ahead = vec![false; steps.len()];
    for i in (0..=writer).rev() {
        let s = &steps[i];
        if i != writer && !outputs_of(s).any(|b| needed.contains(&b)) {
            continue;
        }
        let (ins, outs) = s.binding.operands.split_at(s.binding.n_inputs);
        let safe = outs.iter().all(|t| fresh(t.buffer))
            && ins.iter().all(|t| {
                first_write.get(&t.buffer).is_some_and(|&w| w < i)
                    || buffers.find(t.buffer).is_some_and(|b| written(b))
            });
        if !safe {
            return None;
        }
        needed.extend(ins.iter().map(|t| t.buffer));
        ahead[i] = true;
    }
    // A step left behind must not read or write, before a step taken ahead, what that step
    // writes: it would see (or undo) the write early.
    let mut written_ahead: HashSet<BufferId> = HashSet::default();
    for (i, s) in steps.iter().enumerate().rev() {
        if ahead[i] {
            written_ahead.extend(outputs_of(s));
        } else if s
            .binding
            .operands
            .iter()
            .any(|t| written_ahead.contains(&t.buffer))
        {
            return None;
        }
    }
    let (first, rest): (Vec<_>, Vec<_>) = std::mem::take(steps)
        .into_iter()
        .zip(ahead)
        .partition(|(_, a)| *a);
    *steps = rest.into_iter().map(|(s, _)| s).collect();
    Some(first.into_iter().map(|(s, _)| s).collect())
}

/// Whether no write of `b` is still to come: never written, or its last writer finished.
fn written(b: &Buffer) -> bool {
    match b.writer() {
        None => true,
        Some(Writer {
            done: Some((progress, seq)),
            ..
        }) => progress.completed() >= seq,
        // Recorded and not launched: in another stream's trace.
        Some(Writer { done: None, .. }) => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Error, Handle, Input, Mode, Runtime};
    use deferfuse_fusion::ir::{BinaryOp, DType, KernelOp, Op, ReduceOp, Scalar};
    use std::sync::mpsc;
    use std::time::Duration;

    fn runtime() -> Runtime {
        Runtime::new(Config {
            mode: Some(Mode::Defer),
            num_threads: 1,
            ..Config::default()
        })
        .unwrap()
    }

    fn upload(rt: &Runtime, vals: &[f32]) -> Handle {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        rt.from_host(&bytes, DType::F32, &[vals.len()]).unwrap()
    }

    fn op(rt: &Runtime, op: Op, ins: &[Input], out: Option<Handle>) -> Handle {
        rt.op(rt.default_stream(), op, ins, out).unwrap()
    }

    fn mul(rt: &Runtime, x: Handle, k: f64) -> Handle {
        let ins = [Input::Tensor(x), Input::Scalar(Scalar::Float(k))];
        op(rt, Op::Binary(BinaryOp::Mul), &ins, None)
    }

    fn sum(rt: &Runtime, x: Handle) -> Handle {
        let r = Op::Reduce {
            op: ReduceOp::Sum,
            dims: Default::default(),
            keepdim: false,
        };
        op(rt, r, &[Input::Tensor(x)], None)
    }

    /// Holds the default stream's worker in a job until the returned sender is dropped or
    /// sent to, so that everything queued after it waits.
    fn block_worker(rt: &Runtime) -> mpsc::Sender<()> {
        let (tx, rx) = mpsc::channel::<()>();
        let s = rt.stream_by_id(0).expect("the default stream");
        s.launch(Box::new(move || {
            let _ = rx.recv();
            Ok(())
        }));
        tx
    }

    /// Reads `h` (an f32 tensor of `n` elements) on another thread; the values come back on
    /// the returned channel.
    fn read_async(
        rt: &std::sync::Arc<Runtime>,
        h: Handle,
        n: usize,
    ) -> mpsc::Receiver<Result<Vec<f32>, Error>> {
        let (tx, rx) = mpsc::channel();
        let rt = rt.clone();
        std::thread::spawn(move || {
            let mut out = vec![0u8; 4 * n];
            let r = rt.to_host(h, &mut out).map(|()| {
                out.chunks(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            });
            let _ = tx.send(r);
        });
        rx
    }

    const LONG: Duration = Duration::from_secs(20);
    const SHORT: Duration = Duration::from_millis(300);

    #[test]
    fn a_read_of_values_queued_work_does_not_touch_runs_while_that_work_waits() {
        let rt = std::sync::Arc::new(runtime());
        let x = upload(&rt, &[1.0, 2.0, 3.0]);
        let unblock = block_worker(&rt);
        let total = sum(&rt, mul(&rt, x, 2.0));
        let got = read_async(&rt, total, 1).recv_timeout(LONG);
        drop(unblock);
        assert_eq!(
            got.expect("the read did not wait for the blocked worker")
                .unwrap(),
            [12.0]
        );
    }

    #[test]
    fn a_read_that_needs_a_queued_write_waits_for_it_and_sees_it() {
        let rt = std::sync::Arc::new(runtime());
        let p = upload(&rt, &[1.0, 2.0]);
        let unblock = block_worker(&rt);
        // An optimizer-like update of p, flushed to the (blocked) worker by a synchronize of
        // nothing else: queued behind the block.
        let step = mul(&rt, p, 0.5);
        let ins = [Input::Tensor(p), Input::Tensor(step)];
        op(&rt, Op::Binary(BinaryOp::Sub), &ins, Some(p));
        let s = rt.stream_by_id(0).unwrap();
        rt.exec
            .flush(&s, crate::stats::SyncReason::Synchronize, None, &rt.spares)
            .ok();
        let total = sum(&rt, mul(&rt, p, 2.0));
        let reply = read_async(&rt, total, 1);
        assert!(
            reply.recv_timeout(SHORT).is_err(),
            "the read ran before the update"
        );
        drop(unblock);
        assert_eq!(reply.recv_timeout(LONG).unwrap().unwrap(), [3.0]);
    }

    #[test]
    fn a_failure_of_a_step_run_ahead_is_reported_once_by_its_read() {
        let rt = std::sync::Arc::new(runtime());
        let src = upload(&rt, &[1.0, 2.0]);
        let idx: Vec<u8> = 5i64.to_le_bytes().to_vec();
        let idx = rt.from_host(&idx, DType::I64, &[1]).unwrap();
        let unblock = block_worker(&rt);
        let gather = Op::Kernel(KernelOp::Gather { dim: 0 });
        let g = op(&rt, gather, &[Input::Tensor(src), Input::Tensor(idx)], None);
        let got = read_async(&rt, g, 1).recv_timeout(LONG);
        drop(unblock);
        let e = got
            .expect("the read did not wait for the blocked worker")
            .unwrap_err();
        assert!(matches!(e, Error::IndexOutOfBounds(_)), "{e:?}");
        rt.synchronize(rt.default_stream())
            .expect("the read reported it; a synchronize does not again");
    }

    #[test]
    fn a_value_read_before_an_in_place_write_keeps_the_old_value_when_its_read_goes_ahead() {
        let rt = std::sync::Arc::new(runtime());
        let x = upload(&rt, &[1.0, 2.0]);
        let q = upload(&rt, &[10.0, 20.0]);
        let unblock = block_worker(&rt);
        // q's update is queued behind the block.
        let q2 = mul(&rt, q, 2.0);
        op(
            &rt,
            Op::Binary(BinaryOp::Add),
            &[Input::Tensor(q), Input::Tensor(q2)],
            Some(q),
        );
        let s = rt.stream_by_id(0).unwrap();
        rt.exec
            .flush(&s, crate::stats::SyncReason::Synchronize, None, &rt.spares)
            .ok();
        // a is new; b reads it (and q, still being written), then a is scaled in place.
        let a = mul(&rt, x, 2.0);
        let b = op(
            &rt,
            Op::Binary(BinaryOp::Add),
            &[Input::Tensor(a), Input::Tensor(q)],
            None,
        );
        let three = [Input::Tensor(a), Input::Scalar(Scalar::Float(3.0))];
        op(&rt, Op::Binary(BinaryOp::Mul), &three, Some(a));
        let total = sum(&rt, a);
        let reply = read_async(&rt, total, 1);
        let early = reply.recv_timeout(SHORT);
        drop(unblock);
        let got = match early {
            Ok(r) => r,
            Err(_) => reply.recv_timeout(LONG).unwrap(),
        };
        assert_eq!(got.unwrap(), [18.0]);
        assert_eq!(
            read_async(&rt, b, 2).recv_timeout(LONG).unwrap().unwrap(),
            [32.0, 64.0]
        );
    }
}
