//! Defer mode's pipelining: a stream that has deferred enough ops hands them to its worker
//! without waiting, so their programs run while the host records the next ones.
//!
//! Without it a defer-mode trace runs only at a sync point, and the ops recorded before it
//! (a training step's forward, a generated token's layers) wait there while the host's second
//! core sits idle: strict mode overlapped them, defer did not. A pipelined flush is planned and
//! fused like any flush but is not a sync point: nothing waits for it (as a strict op group's
//! flush), and it is counted in [`crate::stats::Stats::pipelined_flushes`].
//!
//! Where the trace is cut: once it holds `pipeline_ops` ops, before the next op that starts a
//! program of its own anyway (a matmul, addmm or kernel op: nothing before it fuses with it, so
//! the cut costs no fusion); a trace with no such op is cut once it holds
//! [`ELEMENTWISE_RUN_FACTOR`] times as many, and then never inside an op group (one ATen op's
//! pieces, a layer norm's 9 ops or a foreach update, stay together). Cutting a run of
//! elementwise ops writes the values used on both sides, and an optimizer's op-major foreach
//! updates lose the loop each parameter's chain fuses into: the 784-1024-1024-10 MLP's defer
//! step was ~2-6% slower when its AdamW update was cut every 64 ops.
//!
//! The cut depends on op counts and kinds alone, never on timing (whether the worker is idle),
//! so a program cuts its traces at the same ops every time: its plans and programs are reused
//! and its regions do not change from one step to the next. Only a thread in defer mode
//! pipelines (a strict op group defers its ops too, and is never split); off while a graph is
//! captured (its trace is the whole graph) and on backends that compile whole flushes
//! (`fuses_whole_programs`: PJRT's whole-flush mode, where the point is one program per step).

use crate::error::Result;
use crate::mode::{self, Mode};
use crate::runtime::Runtime;
use crate::stream::Stream;
use deferfuse_fusion::ir::Op;
use std::sync::atomic::Ordering;

/// How many times `pipeline_ops` a trace holds before it is cut without a matmul or kernel op
/// to cut before: an optimizer step's op-major updates (the MLPs': 90 ops) stay in one flush.
pub const ELEMENTWISE_RUN_FACTOR: usize = 8;

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

    /// Whether the `held` deferred ops (not a capture's) go to the worker before `op` is
    /// recorded: `op` starts a program of its own and enough are held.
    pub(crate) fn pipelines_before(&self, op: &Op, held: usize) -> bool {
        let every = self.pipeline_ops.load(Ordering::Relaxed);
        every > 0
            && held >= every
            && matches!(op, Op::Matmul | Op::Addmm | Op::Kernel(_))
            && self.pipelines_here()
    }

    /// Whether the `held` deferred ops (not a capture's), the last just recorded, go to the
    /// worker now: a run without an op to cut before has grown long, and no op group is open.
    pub(crate) fn pipelines_after(&self, held: usize) -> bool {
        let every = self.pipeline_ops.load(Ordering::Relaxed);
        every > 0
            && held >= every.saturating_mul(ELEMENTWISE_RUN_FACTOR)
            && !mode::in_op_group(self.id)
            && self.pipelines_here()
    }

    /// The calling thread chose defer mode (not a strict op group's deferral) and the backend
    /// runs flushes as loops.
    fn pipelines_here(&self) -> bool {
        self.mode() == Mode::Defer && !self.exec.fuses_whole_programs()
    }

    /// Hands `s`'s pending trace to its worker (see the module doc).
    pub(crate) fn flush_pipelined(&self, s: &Stream) -> Result<bool> {
        self.exec.flush_pipelined(s, &self.spares)
    }
}
