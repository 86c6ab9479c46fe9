//! The runtime's timeline and profiler calls: start and stop a trace, add a host backend's
//! marks, and read the device clock a profiler differences around each op.

use super::{Arg, CapturedRun, Timeline, TraceSummary, Track};
use crate::error::Result;
use crate::handle::Handle;
use crate::runtime::Runtime;

impl Runtime {
    /// Starts recording the timeline into `path` (Chrome trace / Perfetto JSON, written when
    /// the trace stops), keeping at most `max_events` events (0: `DEFERFUSE_TRACE_EVENTS` or
    /// the default). An error when a trace is running or the file cannot be created.
    pub fn trace_start(&self, path: &std::path::Path, max_events: usize) -> Result<()> {
        let n = if max_events == 0 {
            self.trace_events
        } else {
            max_events
        };
        self.timeline.start(path, n)
    }

    /// Stops the running trace and writes its file. Work still running on the streams is
    /// recorded only as far as it got: synchronize first to see all of it.
    pub fn trace_stop(&self) -> Result<TraceSummary> {
        self.timeline.stop()
    }

    /// Whether a trace is running.
    pub fn tracing(&self) -> bool {
        self.timeline.tracing()
    }

    /// Adds an instant event a host backend knows about (a sync point's source line, an op
    /// that fell back to the host) on `stream`'s host track; nothing when no trace runs.
    pub fn trace_mark(&self, stream: Handle, name: &str, detail: &str) -> Result<()> {
        // The stream is checked either way: a bad handle is an error whether or not a trace
        // runs.
        let s = self.stream(stream)?;
        if !self.timeline.tracing() {
            return Ok(());
        }
        self.timeline.instant(
            Track::StreamHost(s.id),
            "mark",
            name,
            vec![("detail", Arg::S(detail.to_string()))],
        );
        Ok(())
    }

    /// Starts or stops timing program runs for [`Runtime::profiler_point`] (a profiler's
    /// device clock). While on, each program costs two clock reads more.
    pub fn profiler_enable(&self, on: bool) {
        self.timeline.set_profiling(on);
    }

    /// Waits for the work already launched on every stream, without flushing deferred ops
    /// (that would change what fuses) and without taking their errors (the next sync point
    /// reports them), then returns the nanoseconds programs have run while profiling. A
    /// profiler reads it before and after an op: the difference is the device time of the
    /// programs that op launched (strict, debug) or ran at its sync point (defer).
    pub fn profiler_point(&self) -> u64 {
        for s in self.streams.values() {
            s.progress.wait(s.last_seq());
        }
        self.timeline.busy_ns()
    }

    /// Starts (`max_runs` > 0: keeping at most that many, the oldest dropped) or stops (0)
    /// collecting program runs for a profiler's device activities; returns the runs dropped
    /// so far. Runs stay collected after a stop until [`Runtime::profiler_take`].
    pub fn profiler_capture(&self, max_runs: usize) -> u64 {
        if max_runs > 0 {
            self.timeline.capture_start(max_runs);
            0
        } else {
            self.timeline.capture_stop()
        }
    }

    /// Removes and returns up to `max` collected runs, oldest first.
    pub fn profiler_take(&self, max: usize) -> Vec<CapturedRun> {
        self.timeline.capture_take(max)
    }

    /// Whether the log prints fusion cuts (`DEFERFUSE_LOG` at debug): a host backend then
    /// tags each op it records with its source ([`Runtime::profiler_tag`], the source id in the
    /// high 32 bits) and names each source id ([`Runtime::name_source`]), so that each cut line
    /// is followed by the user's source line of the op it cut at.
    pub fn logs_cuts(&self) -> bool {
        self.timeline.logs_cuts()
    }

    /// Names source id `id` (the high 32 bits of a host's tag) for the log's cut lines.
    pub fn name_source(&self, id: u32, text: &str) {
        self.timeline.name_source(id, text)
    }

    /// Sets the calling thread's tag, carried by the runs prepared on it from now on: a
    /// profiler's correlation id of the op it is in.
    pub fn profiler_tag(&self, tag: u64) {
        Timeline::set_tag(tag);
    }
}
