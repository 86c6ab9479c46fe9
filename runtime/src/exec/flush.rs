//! Flushes: a stream's pending trace planned, its dead values dropped, and its steps launched,
//! at a sync point or at the end of a strict-mode op group.

use super::ahead::split_ahead;
use super::{fail_outputs, inline_cost, outputs_of, Executor, Launch, STRICT_INLINE_MAX_ELEMS};
use crate::buffer::Spares;
use crate::error::Result;
use crate::stats::SyncReason;
use crate::stream::Stream;
use crate::timeline::{Arg, Track};
use deferfuse_fusion::{BufferId, Step};
use std::sync::atomic::Ordering;

/// A pipelined flush whose steps cost at most this many elements in all (`inline_cost`) runs
/// on the recording thread when the stream's worker is idle, not handed to it: waking the
/// worker cost the recording thread ~15 us on this 2-core VM (the futex wake's share of its
/// `perf` samples), more than such a trace takes to run. A 2-layer GPT-2 (hidden 64) cuts each
/// token's 146 ops twice; its `generate` ran 719-744 -> 672-688 us a token (pipelining off:
/// 647-668, CPU eager 453-471). The cuts stay where the op counts put them, so a program's
/// plans and programs are the same step after step (not cutting small traces at all was
/// faster still, but moved the cuts of a trace spanning steps from one step to the next: a
/// MAML loop compiled new programs long after its warm-up).
const PIPELINED_INLINE_MAX_ELEMS: usize = 1 << 18;

/// Why a stream's pending trace runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flush {
    /// A sync point (counted in `Stats::sync_points`).
    Sync(SyncReason),
    /// The end of a strict-mode op group: one ATen op's recorded ops, run as that op's
    /// programs. Nothing waits for them, so it is not a sync point.
    OpGroup,
    /// A defer-mode trace long enough to start running while the host records on (see
    /// `crate::pipeline`). Nothing waits for it either.
    Pipelined,
}

impl Flush {
    /// The name logs and the timeline give it: the sync reason's, or `op_group`.
    fn name(self) -> &'static str {
        match self {
            Flush::Sync(r) => r.name(),
            Flush::OpGroup => "op_group",
            Flush::Pipelined => "pipelined",
        }
    }
}

impl Executor {
    /// Runs every op pending on `stream`; counts the sync point when there was work.
    /// Returns whether there was work (and so a sync point was counted). Buffers only this
    /// flush held go to `spares`, for the next recorded ops' outputs. `read`: the buffer a
    /// host read waits for, if any; on a backend that [splits at host
    /// reads](deferfuse_fusion::plan::Capabilities::splits_at_host_read) the caller waits
    /// only for the steps up to its writer (see [`split_at_read`]).
    pub(crate) fn flush(
        &self,
        stream: &Stream,
        reason: SyncReason,
        read: Option<BufferId>,
        spares: &Spares,
    ) -> Result<bool> {
        self.flush_trace(stream, Flush::Sync(reason), read, spares)
    }

    /// Runs the ops a strict-mode op group deferred on `stream` (see
    /// [`crate::Runtime::end_op_group`]), planned and fused as a flush but not counted as a
    /// sync point, and launched like a strict op: on the calling thread when small and the
    /// stream is idle, else on the worker while the host goes on. A graph capture's trace is
    /// left alone (it runs when the capture ends).
    pub(crate) fn flush_op_group(&self, stream: &Stream, spares: &Spares) -> Result<bool> {
        self.flush_trace(stream, Flush::OpGroup, None, spares)
    }

    /// Hands `stream`'s pending trace to its worker, planned and fused as a flush but not
    /// counted as a sync point (see `crate::pipeline`). A graph capture's trace is left alone.
    pub(crate) fn flush_pipelined(&self, stream: &Stream, spares: &Spares) -> Result<bool> {
        self.flush_trace(stream, Flush::Pipelined, None, spares)
    }

    fn flush_trace(
        &self,
        stream: &Stream,
        cause: Flush,
        read: Option<BufferId>,
        spares: &Spares,
    ) -> Result<bool> {
        let mut pending = stream.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.trace.is_empty() {
            return Ok(false);
        }
        // A capture's trace is the whole graph: only a sync point runs (and breaks) it.
        if !matches!(cause, Flush::Sync(_)) && pending.capture.is_some() {
            return Ok(false);
        }
        let nodes = pending.trace.take();
        let tags = std::mem::take(&mut pending.tags);
        if let Some(c) = &mut pending.capture {
            // The trace runs now, so the capture would miss its first ops.
            c.break_with(format!("a sync point ({}) ran the trace", cause.name()));
        }
        let mut buffers = std::mem::take(&mut pending.buffers);
        pending.bytes = 0;
        match cause {
            Flush::Sync(reason) => self.counters.sync(reason),
            Flush::Pipelined => {
                self.counters
                    .pipelined_flushes
                    .fetch_add(1, Ordering::Relaxed);
            }
            Flush::OpGroup => {}
        }
        let mut opts = self.plan_options();
        // A read (of a value or for a size) on a loop backend whose stream is still busy.
        let read_while_busy = read.filter(|_| {
            matches!(
                cause,
                Flush::Sync(SyncReason::HostRead | SyncReason::DataDependentSize)
            ) && !opts.capabilities.fuses_whole_programs
                && stream.busy()
        });
        let read = read.filter(|_| {
            cause == Flush::Sync(SyncReason::HostRead) && opts.capabilities.splits_at_host_read
        });
        opts.read_node = read.and_then(|b| nodes.iter().rposition(|n| n.output.buffer == b));
        // The key was built as the nodes were recorded: only liveness is added here.
        let t0 = self.timeline.on().then(|| self.timeline.now());
        let hash = buffers.finish_key();
        // A buffer is live when something besides this flush holds it (a tensor handle).
        let live = |b: BufferId| buffers.is_live(b);
        let (p, reused) = pending
            .plans
            .plan_keyed(&nodes, buffers.key(), hash, &live, &opts);
        if reused {
            self.counters.plans_reused.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t0) = t0 {
            let name = if reused { "plan (hit)" } else { "plan (miss)" };
            let args = vec![
                ("hit", Arg::B(reused)),
                ("ops", Arg::U(nodes.len() as u64)),
                ("steps", Arg::U(p.steps.len() as u64)),
            ];
            self.timeline
                .span(Track::StreamHost(stream.id), "plan", name, t0, args);
        }
        let n_steps = p.steps.len() as u64;
        tracing::debug!(
            stream = stream.id,
            ops = nodes.len(),
            steps = p.steps.len(),
            dead = p.dead_nodes,
            unmaterialized = p.unmaterialized,
            reason = cause.name(),
            last_op = %nodes.last().expect("a flushed trace is not empty"),
            "flush"
        );
        for &(i, why) in &p.cut_log {
            tracing::debug!(op = %nodes[i], reason = why.name(), "cut");
            if t0.is_some() {
                let mut args = vec![("op", Arg::S(nodes[i].to_string()))];
                if let Ok(k) = tags.binary_search_by_key(&i, |t| t.0) {
                    args.push(("tag", Arg::U(tags[k].1)));
                }
                let name = format!("cut ({})", why.name());
                self.timeline
                    .instant(Track::StreamHost(stream.id), "cut", name, args);
            }
        }
        for (k, c) in p.cuts.iter().enumerate() {
            self.counters.cuts[k].fetch_add(*c, Ordering::Relaxed);
        }
        self.counters
            .dead_nodes
            .fetch_add(p.dead_nodes as u64, Ordering::Relaxed);
        self.counters
            .unmaterialized
            .fetch_add(p.unmaterialized as u64, Ordering::Relaxed);
        // The caller waits right after these: run on its thread if the stream is idle. A host
        // read on a backend that splits there waits only for the steps up to its buffer's
        // writer; the rest run on the worker while the host goes on (see `split_at_read`),
        // handed over as one unit. A read on a busy stream whose value needs nothing the
        // queued work touches runs the steps it needs at once, and queues the others behind
        // that work (see `ahead::split_ahead`). An op group runs like a strict op: inline
        // only when small.
        let mut steps = p.steps;
        let ahead = read_while_busy.and_then(|b| split_ahead(&mut steps, b, &buffers, stream));
        let inline = match cause {
            Flush::Sync(r) => matches!(r, SyncReason::Synchronize | SyncReason::HostRead),
            Flush::OpGroup => steps
                .iter()
                .all(|s| inline_cost(s) <= STRICT_INLINE_MAX_ELEMS),
            // The point is to run while the host goes on, unless the trace computes less than
            // handing it over costs: then it runs here if the worker is idle (see
            // PIPELINED_INLINE_MAX_ELEMS).
            Flush::Pipelined => {
                steps.iter().map(inline_cost).fold(0, usize::saturating_add)
                    <= PIPELINED_INLINE_MAX_ELEMS
            }
        };
        let (first, rest, launch) = match ahead {
            Some(ahead) => (ahead, steps, Launch::Ahead),
            None => {
                let rest = match read {
                    Some(b) => split_at_read(&mut steps, b),
                    None => Vec::new(),
                };
                (steps, rest, Launch::waited_for(inline))
            }
        };
        let after_read = rest.len();
        // A small rest (what a policy's `log_prob` leaves after `action.item()`) costs less to
        // run here than to hand to the worker and wait for at the next sync (a REINFORCE-style
        // step's read 26 -> 16.7 us). Either way it runs after the read's value, as its own
        // jobs: a failure there is reported by a later read, not by this one.
        let rest_launch = match rest.iter().map(inline_cost).sum::<usize>() {
            cost if cost <= STRICT_INLINE_MAX_ELEMS => Launch::RunIfIdle,
            _ => Launch::Queue,
        };
        let mut result = self.launch_steps(stream, first, &buffers, launch, false);
        if !rest.is_empty() {
            result = match result {
                Ok(()) => self.launch_steps(stream, rest, &buffers, rest_launch, true),
                Err(e) => {
                    // As within one launch: what comes after a failed step fails with it.
                    fail_outputs(&rest, &buffers, &e);
                    Err(e)
                }
            };
        }
        if let Some(t0) = t0 {
            let args = vec![
                ("reason", Arg::S(cause.name().into())),
                ("ops", Arg::U(nodes.len() as u64)),
                ("steps", Arg::U(n_steps)),
                ("dead", Arg::U(p.dead_nodes as u64)),
                ("plan_hit", Arg::B(reused)),
                // Steps the host did not wait for: they run after the read's value.
                ("after_read", Arg::U(after_read as u64)),
                // Those steps were not handed to the worker: run on the host's thread (where
                // the stream was idle, as after the read's own steps).
                (
                    "after_read_here",
                    Arg::B(after_read > 0 && rest_launch == Launch::RunIfIdle),
                ),
                // Run at once, ahead of the stream's queued work.
                ("ahead", Arg::B(launch == Launch::Ahead)),
                // Run on the host's thread if the stream was idle, not handed to the worker (a
                // sync point, a small op group, a pipelined flush that computes little).
                ("here_if_idle", Arg::B(launch == Launch::RunIfIdle)),
                ("last_op", Arg::S(nodes[nodes.len() - 1].to_string())),
            ];
            let name = format!("flush ({})", cause.name());
            self.timeline
                .span(Track::StreamHost(stream.id), "flush", name, t0, args);
        }
        // Per buffer, not per node: a count for each, not a lookup for each node's output.
        for (b, writes) in buffers.written() {
            b.mark_flushed(writes);
        }
        // The next trace reuses both allocations instead of growing them again op by op.
        pending.trace.recycle(nodes);
        // Buffers only this flush held (fused-away intermediates, released results) become
        // spares for the next ops' outputs.
        spares.give(buffers.drain());
        // Nothing was recorded meanwhile (the lock is held): the set goes back, emptied, with
        // its allocations.
        pending.buffers = buffers;
        result.map(|()| true)
    }
}

/// Splits a host read's flush after the last step that writes `read`, returning the steps
/// after it. The caller runs the first part on its own thread and hands the rest to the
/// stream's worker, so the host goes on (a training loop records its next step) while the
/// worker runs what the read does not need (`loss.item()` needs the forward, not the backward
/// and the optimizer). Stream order is unchanged: later work queues behind the rest, and a
/// read of any of its outputs waits for its writer. Empty when `read` is not written here or
/// its writer is the last step.
fn split_at_read(steps: &mut Vec<Step>, read: BufferId) -> Vec<Step> {
    match steps.iter().rposition(|s| outputs_of(s).any(|b| b == read)) {
        Some(i) if i + 1 < steps.len() => steps.split_off(i + 1),
        _ => Vec::new(),
    }
}
