//! Defer mode's pipelining: a stream that has deferred enough ops hands them to its worker
//! without waiting, so their programs run while the host records the next ones.
//!
//! Without it a defer-mode trace runs only at a sync point, and the ops recorded before it
//! (a training step's forward, a generated token's layers) wait there while the host's second
//! core sits idle: strict mode overlapped them, defer did not. A pipelined flush is planned and
//! fused like any flush but is not a sync point: nothing waits for it (as a strict op group's
//! flush), and it is counted in [`crate::stats::Stats::pipelined_flushes`].
//!
//! The cut is by op count alone, never by timing (whether the worker is idle), so the same
//! program cuts its traces at the same ops every time: its plans and programs are reused, and
//! its regions do not change from one step to the next. Cutting costs the fusion across the
//! cut (a value used on both sides is written), which 64 ops keep small
//! ([`crate::config::DEFAULT_PIPELINE_OPS`]). Never inside an op group: the cut waits for the
//! first op after the group, so one ATen op's pieces (a layer norm's 9 ops, a foreach update)
//! stay in one flush, and a strict op group is never split. Off while a graph is captured (its
//! trace is the whole graph) and on backends that compile whole flushes
//! (`fuses_whole_programs`: PJRT's whole-flush mode, where the point is one program per step).

use crate::error::Result;
use crate::mode;
use crate::runtime::Runtime;
use crate::stream::Stream;
use std::sync::atomic::Ordering;

impl Runtime {
    /// Sets the deferred ops after which a stream starts running them on its worker (0: only
    /// at sync points and bounds) and returns the previous value. Takes effect at the next
    /// recorded op; `DEFERFUSE_PIPELINE_OPS` or `Config::pipeline_ops` set it at creation.
    pub fn set_pipeline_ops(&self, ops: usize) -> usize {
        self.pipeline_ops.swap(ops, Ordering::Relaxed)
    }

    /// The deferred ops after which a stream starts running them (0: pipelining is off).
    pub fn pipeline_ops(&self) -> usize {
        self.pipeline_ops.load(Ordering::Relaxed)
    }

    /// Whether a deferred trace of `len` ops, not part of a capture, is handed to the worker
    /// now (by the calling thread, which just recorded its last op).
    pub(crate) fn pipelines_at(&self, len: usize) -> bool {
        let every = self.pipeline_ops.load(Ordering::Relaxed);
        every > 0
            && len >= every
            && !mode::in_op_group(self.id)
            && !self.exec.fuses_whole_programs()
    }

    /// Hands `s`'s pending trace to its worker (see the module doc).
    pub(crate) fn flush_pipelined(&self, s: &Stream) -> Result<bool> {
        self.exec.flush_pipelined(s, &self.spares)
    }
}
