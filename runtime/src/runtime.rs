//! The runtime: owns the handle tables, the streams, the modes and recording, and is the one
//! entry point the C ABI calls; flushing and launching belong to its [`Executor`].

use crate::alloc::HostAllocator;
use crate::buffer::{Buffer, BufferState, Spares};
use crate::config::{
    resolve_dump_dir, resolve_memory_limit, resolve_mode, resolve_pacing, resolve_pipeline_ops,
    resolve_threads, resolve_trace, resolve_trace_events, Config,
};
use crate::error::{Error, Result};
use crate::event::EventState;
use crate::exec::{Executor, ExecutorParts};
use crate::handle::{Handle, HandleTable};
use crate::mode::{self, Mode};
use crate::stats::{Counters, Stats, SyncReason};
use crate::stream::{Pacing, Stream};
use crate::timeline::{Arg, Timeline, Track};
use deferfuse_fusion::ir::layout::checked_numel;
use deferfuse_fusion::ir::{DType, Dims, Layout};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};

mod streams_and_events;

/// What a tensor handle names: a view of a buffer.
#[derive(Clone)]
pub struct Tensor {
    /// The buffer the view reads and writes, shared with the buffer's other views.
    pub buffer: Arc<Buffer>,
    /// How the view's elements map into the buffer (sizes, strides, offset).
    pub layout: Layout,
    /// The element type.
    pub dtype: DType,
}

/// A deferfuse runtime. Safe to share between threads.
pub struct Runtime {
    /// Flushes traces and launches programs (backend, program cache, dumps, waves).
    pub(crate) exec: Executor,
    pub(crate) tensors: HandleTable<Tensor>,
    pub(crate) streams: HandleTable<Arc<Stream>>,
    pub(crate) events: HandleTable<EventState>,
    /// Captured graphs ([`crate::graph`]).
    pub(crate) graphs: HandleTable<Arc<crate::graph::Graph>>,
    /// Streams capturing a graph now: while zero, recording and host reads skip every
    /// capture check (one relaxed load).
    pub(crate) captures_active: AtomicUsize,
    pub(crate) counters: Arc<Counters>,
    pub(crate) config: Config,
    /// Host memory, with the cache of freed blocks.
    pub(crate) host: Arc<HostAllocator>,
    /// Emptied buffer records for new outputs (no allocation per recorded op).
    pub(crate) spares: Spares,
    default_mode: Mode,
    /// The key of each thread's modes on this runtime (see [`mode`]).
    pub(crate) id: u64,
    default_stream: Handle,
    /// The default stream itself (it is never destroyed): most ops name it, and this spares
    /// them a handle-table lookup.
    default_stream_ref: Arc<Stream>,
    /// Buffer ids (the trace's and the planner's name for a buffer); increasing, so a graph
    /// capture tells the buffers its ops made from older ones.
    pub(crate) next_buffer: AtomicU64,
    /// Stream ids (what a buffer's writer and the timeline name a stream by); the default
    /// stream is 0.
    next_stream: AtomicU64,
    threads: usize,
    /// How each stream's host and worker share the CPUs.
    pacing: Pacing,
    /// The opt-in timeline (`DEFERFUSE_TRACE`, [`Runtime::trace_start`]); shared with the
    /// programs a flush launches, which record their own runs.
    pub(crate) timeline: Arc<Timeline>,
    /// Events a trace keeps unless its start says otherwise.
    pub(crate) trace_events: usize,
    /// Deferred ops after which a stream hands them to its worker (`pipeline`); 0: off.
    pub(crate) pipeline_ops: AtomicUsize,
}

static BOTH_FLAGS_WARNING: Once = Once::new();

impl Runtime {
    /// Creates a runtime with the backend the config or environment selects. Invalid env values are an error here.
    pub fn new(config: Config) -> Result<Runtime> {
        crate::log::init_from_env();
        let (default_mode, both) = resolve_mode(&config)?;
        if both {
            BOTH_FLAGS_WARNING.call_once(|| {
                tracing::warn!("TORCH_TPU_DEFER_AND_FUSE and TORCH_TPU_LAUNCH_BLOCKING are both on; debug mode wins")
            });
        }
        if config.max_pending_ops == 0 {
            return Err(Error::Config("max_pending_ops must be at least 1".into()));
        }
        let pipeline_ops = resolve_pipeline_ops(&config)?;
        let tag = HandleTable::<()>::new_tag();
        let streams = HandleTable::new("stream", tag);
        let dump_dir = resolve_dump_dir(&config);
        let threads = resolve_threads(&config)?;
        let pacing = resolve_pacing(&config, threads)?;
        let default_stream_ref = Arc::new(Stream::new(0, pacing)?);
        let default_stream = streams.insert(default_stream_ref.clone())?;
        let host = HostAllocator::new(config.host_cache_bytes);
        host.set_live_limit(resolve_memory_limit(&config)?);
        let trace_events = resolve_trace_events(&config)?;
        let timeline = Arc::new(Timeline::default());
        timeline.log_cuts_if_enabled();
        if let Some(path) = resolve_trace(&config) {
            timeline.start(&path, trace_events).map_err(|e| {
                Error::Config(format!(
                    "DEFERFUSE_TRACE = {:?}: {e}",
                    path.display().to_string()
                ))
            })?;
        }
        let counters = Arc::new(Counters::default());
        let exec = Executor::new(ExecutorParts {
            backend: crate::backend::create(&config, dump_dir.clone(), threads)?,
            cache_capacity: config.cache_capacity,
            dump_dir,
            counters: counters.clone(),
            timeline: timeline.clone(),
            threads,
            max_ops_per_region: config.max_ops_per_region,
        });
        Ok(Runtime {
            exec,
            tensors: HandleTable::new("tensor", tag),
            streams,
            events: HandleTable::new("event", tag),
            graphs: HandleTable::new("graph", tag),
            captures_active: AtomicUsize::new(0),
            counters,
            host,
            spares: Spares::default(),
            config,
            default_mode,
            id: mode::new_runtime_id(),
            default_stream,
            default_stream_ref,
            next_buffer: AtomicU64::new(1),
            next_stream: AtomicU64::new(1),
            threads,
            pacing,
            timeline,
            trace_events,
            pipeline_ops: AtomicUsize::new(pipeline_ops),
        })
    }

    /// The mode threads start in (from the config or the environment).
    pub fn default_mode(&self) -> Mode {
        self.default_mode
    }

    /// The calling thread's mode on this runtime.
    pub fn mode(&self) -> Mode {
        mode::current(self.id, self.default_mode)
    }

    /// The mode the calling thread's next recorded op runs in: [`Runtime::mode`], except that
    /// strict ops inside an op group are deferred (see [`Runtime::begin_op_group`]).
    pub(crate) fn recording_mode(&self) -> Mode {
        mode::recording(self.id, self.default_mode)
    }

    /// Replaces the calling thread's mode on this runtime: the top of its pushed modes, or
    /// its base mode when nothing is pushed.
    pub fn set_mode(&self, m: Mode) {
        mode::set(self.id, m)
    }

    /// Makes `m` the calling thread's mode on this runtime until the matching
    /// [`Runtime::pop_mode`].
    pub fn push_mode(&self, m: Mode) {
        mode::push(self.id, m)
    }

    /// Undoes the calling thread's last [`Runtime::push_mode`], returning the mode it ends; an
    /// error if nothing is pushed on this thread (a set is not a push).
    pub fn pop_mode(&self) -> Result<Mode> {
        mode::pop(self.id)
    }

    /// Threads one program may split its loops over (`Config::num_threads`).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The backend's short name, as in logs and stats.
    pub fn backend_name(&self) -> &'static str {
        self.exec.backend.name()
    }

    /// Runs every op pending on `stream` (see [`Executor::flush`]); whether there was work.
    pub(crate) fn flush(&self, stream: &Stream, reason: SyncReason) -> Result<bool> {
        self.exec.flush(stream, reason, None, &self.spares)
    }

    // ---- tensors ----

    /// A new buffer for `sizes` of `dtype`; `op` names the caller in an error (only then, so
    /// recording an op does not look its name up).
    pub(crate) fn new_buffer(
        &self,
        dtype: DType,
        sizes: &[usize],
        op: impl FnOnce() -> &'static str,
    ) -> Result<Arc<Buffer>> {
        let bytes = checked_numel(sizes)
            .and_then(|n| n.checked_mul(dtype.size()))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{}: sizes {sizes:?} of {dtype} overflow the address space",
                    op()
                ))
            })?;
        Ok(self.new_buffer_bytes(bytes))
    }

    /// A new buffer of `bytes` bytes (a spare record when there is one).
    pub(crate) fn new_buffer_bytes(&self, bytes: usize) -> Arc<Buffer> {
        let id = self.next_buffer.fetch_add(1, Ordering::Relaxed);
        self.spares
            .take(id, bytes)
            .unwrap_or_else(|| Arc::new(Buffer::new(id, bytes, self.host.clone())))
    }

    #[inline(always)]
    pub(crate) fn tensor(&self, h: Handle) -> Result<Tensor> {
        self.tensors.get(h)
    }

    /// A new tensor holding a copy of `data` (row-major, `dtype`, `sizes`).
    pub fn from_host(&self, data: &[u8], dtype: DType, sizes: &[usize]) -> Result<Handle> {
        let buffer = self.new_buffer(dtype, sizes, || "from_host")?;
        if data.len() != buffer.len {
            return Err(Error::InvalidArgument(format!(
                "from_host: data has {} bytes but {sizes:?} of {dtype} needs {}; pass exactly numel * element size bytes",
                data.len(),
                buffer.len
            )));
        }
        let t0 = self.timeline.on().then(|| self.timeline.now());
        let s = buffer.storage_for_overwrite()?;
        self.counters
            .bytes_allocated
            .fetch_add(buffer.len as u64, Ordering::Relaxed);
        // SAFETY: the storage was just allocated with exactly `data.len()` bytes (or 1 if 0).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.ptr(), data.len()) };
        if let Some(t0) = t0 {
            let args = vec![("bytes", Arg::U(data.len() as u64))];
            self.timeline
                .span(Track::Host, "copy", "copy from host", t0, args);
        }
        self.tensors.insert(Tensor {
            buffer,
            layout: Layout::contiguous(sizes),
            dtype,
        })
    }

    /// A new tensor, like `torch.empty`: storage is allocated on first use, and what nothing
    /// wrote reads as zeros.
    pub fn empty(&self, dtype: DType, sizes: &[usize]) -> Result<Handle> {
        let buffer = self.new_buffer(dtype, sizes, || "empty")?;
        self.tensors.insert(Tensor {
            buffer,
            layout: Layout::contiguous(sizes),
            dtype,
        })
    }

    /// The tensor's sizes.
    pub fn sizes(&self, h: Handle) -> Result<Dims> {
        self.tensors.read(h, |t| t.layout.sizes.clone())
    }

    /// The tensor's dtype and sizes in one lookup: what a front end reads of each op's result
    /// to wrap it (one call instead of two on the per-op path).
    pub fn dtype_and_sizes(&self, h: Handle) -> Result<(DType, Dims)> {
        self.tensors.read(h, |t| (t.dtype, t.layout.sizes.clone()))
    }

    /// The tensor's strides, in elements.
    pub fn strides(&self, h: Handle) -> Result<Vec<isize>> {
        Ok(self.tensor(h)?.layout.strides.to_vec())
    }

    /// The tensor's element type.
    pub fn dtype(&self, h: Handle) -> Result<DType> {
        self.tensors.read(h, |t| t.dtype)
    }

    /// Where the tensor's buffer is in its lifecycle.
    pub fn state(&self, h: Handle) -> Result<BufferState> {
        Ok(self.tensor(h)?.buffer.state())
    }

    /// Adds one reference to the tensor handle.
    pub fn retain(&self, h: Handle) -> Result<()> {
        self.tensors.retain(h)
    }

    /// Drops one reference; pending work that reads the buffer keeps it alive.
    pub fn release(&self, h: Handle) -> Result<()> {
        self.tensors.release(h)
    }

    /// Live tensor handles (for leak checks).
    pub fn live_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Makes sure everything that writes `buffer` has run, flushing its stream if needed.
    /// Returns whether it ran deferred work (a sync point, counted under `reason`).
    /// A buffer whose writer failed reports that failure; when the writer failed as it ran
    /// (an index out of bounds), the stream's error is the same one and is taken here, so a
    /// later unrelated sync point does not report it again.
    pub(crate) fn wait_written(&self, buffer: &Buffer, reason: SyncReason) -> Result<bool> {
        let Some(w) = buffer.writer() else {
            buffer.resolve_checks()?;
            return Ok(false);
        };
        let mut flushed = false;
        if w.done.is_none() {
            let s = self.stream_by_id(w.stream);
            if let Some(s) = s {
                flushed = self.exec.flush(&s, reason, Some(buffer.id), &self.spares)?;
            }
        }
        if let Some(Some((progress, seq))) = buffer.writer().map(|w| w.done) {
            let t0 = self.timeline.on().then(|| self.timeline.now());
            progress.wait(seq);
            if let Some(t0) = t0 {
                let args = vec![("reason", Arg::S(reason.name().into()))];
                self.timeline
                    .span(Track::Host, "wait", "wait for producer", t0, args);
            }
            if let Some(e) = progress.take_error_through(seq) {
                return Err(e);
            }
        }
        // The flush run above may have failed before launching this buffer's writer, or the
        // writer failed in an earlier sync point's wait, or a device check the value depends
        // on failed (read here, the sync point, not after its launch).
        buffer.resolve_checks()?;
        Ok(flushed)
    }

    /// Copies the tensor (any view) to `out` in row-major order; waits for its producer.
    pub fn to_host(&self, h: Handle, out: &mut [u8]) -> Result<()> {
        self.read_to_host(h, out, SyncReason::HostRead)
    }

    /// [`Runtime::to_host`] for a read whose values decide the size of an op's output
    /// (nonzero, boolean masks, unique): the sync point is counted as
    /// [`SyncReason::DataDependentSize`].
    pub fn to_host_for_size(&self, h: Handle, out: &mut [u8]) -> Result<()> {
        self.read_to_host(h, out, SyncReason::DataDependentSize)
    }

    fn read_to_host(&self, h: Handle, out: &mut [u8], reason: SyncReason) -> Result<()> {
        let t = self.tensor(h)?;
        let es = t.dtype.size();
        let n = t.layout.numel();
        if out.len() != n * es {
            return Err(Error::InvalidArgument(format!(
                "to_host: tensor {:?} of {} has {} bytes but the destination has {}; size it numel * element size",
                t.layout.sizes.as_slice(),
                t.dtype,
                n * es,
                out.len()
            )));
        }
        // A value read on the host would be baked into what the capture records next.
        self.break_captures("a host read");
        // Every host read is a sync point, counted once: by the flush if it ran deferred work.
        if !self.wait_written(&t.buffer, reason)? {
            self.counters.sync(reason);
        }
        let t0 = self.timeline.on().then(|| self.timeline.now());
        // The value may live on a device (its writer ran there): copy it out first.
        t.buffer.host_coherent()?;
        let base = t.buffer.storage()?.ptr();
        let l = &t.layout;
        // Copy runs of elements that are contiguous in both: the trailing dims whose strides
        // are row-major (a dense tensor is one run). Element by element, a 16 MB read cost
        // ~55 instructions per element.
        let mut run = 1usize;
        let mut outer = l.rank();
        while outer > 0 && (l.sizes[outer - 1] == 1 || l.strides[outer - 1] == run as isize) {
            run *= l.sizes[outer - 1];
            outer -= 1;
        }
        let run_bytes = run * es;
        let mut idx = vec![0usize; outer];
        for k in 0..n / run.max(1) {
            let off = l.offset as isize
                + idx
                    .iter()
                    .zip(&l.strides)
                    .map(|(&i, &s)| i as isize * s)
                    .sum::<isize>();
            // SAFETY: views are bounds-checked against their buffer when made; the run's
            // elements are adjacent in the buffer (their strides say so).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.offset(off * es as isize),
                    out.as_mut_ptr().add(k * run_bytes),
                    run_bytes,
                )
            };
            for d in (0..outer).rev() {
                idx[d] += 1;
                if idx[d] < l.sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        if let Some(t0) = t0 {
            let args = vec![("bytes", Arg::U(out.len() as u64))];
            self.timeline
                .span(Track::Host, "copy", "copy to host", t0, args);
        }
        Ok(())
    }

    /// Returns every cached free host block to the system; the bytes freed. Live tensors keep
    /// their memory.
    pub fn release_cached_memory(&self) -> u64 {
        self.host.release_cached() as u64
    }

    /// The host memory in use, its peak, the cap and the cached free blocks.
    pub fn memory(&self) -> crate::alloc::AllocStats {
        self.host.stats()
    }

    /// Caps the bytes of buffers in use (0: no cap): an allocation past it fails with
    /// `Error::OutOfMemory` naming the limit, and buffers already in use stay.
    pub fn set_memory_limit(&self, bytes: u64) {
        self.host
            .set_live_limit(usize::try_from(bytes).unwrap_or(usize::MAX));
    }

    /// Restarts the peak of memory in use from the current value.
    pub fn reset_memory_peak(&self) {
        self.host.reset_peak();
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let host = self.host.stats();
        let c = self.exec.cache.stats();
        let backend = self.exec.backend.counters();
        // On a backend that compiles when a program first runs, the cache's compiles are only
        // the wrappers; the real ones are the backend's.
        let lazy = self.exec.backend.compiles_on_first_run();
        let sync_points =
            std::array::from_fn(|k| self.counters.sync_points[k].load(Ordering::Relaxed));
        Stats {
            ops_recorded: self.counters.ops_recorded.load(Ordering::Relaxed),
            programs_compiled: if lazy {
                backend.shape_compiles
            } else {
                c.compiles
            },
            programs_run: self.counters.programs_run.load(Ordering::Relaxed),
            programs_side_by_side: self.counters.programs_side_by_side.load(Ordering::Relaxed),
            cache_hits: c.hits,
            cache_misses: c.misses,
            cache_evictions: c.evictions,
            compile_ns: if lazy {
                backend.shape_compile_ns
            } else {
                c.compile_ns
            },
            sync_points,
            bytes_allocated: self.counters.bytes_allocated.load(Ordering::Relaxed),
            cuts: std::array::from_fn(|k| self.counters.cuts[k].load(Ordering::Relaxed)),
            dead_nodes: self.counters.dead_nodes.load(Ordering::Relaxed),
            unmaterialized: self.counters.unmaterialized.load(Ordering::Relaxed),
            plans_reused: self.counters.plans_reused.load(Ordering::Relaxed),
            strict_plans_reused: self.counters.strict_plans_reused.load(Ordering::Relaxed),
            host_cache_hits: host.hits,
            host_cache_misses: host.misses,
            host_cached_bytes: host.cached_bytes,
            pipelined_flushes: self.counters.pipelined_flushes.load(Ordering::Relaxed),
            backend,
        }
    }

    /// The stream's pending (deferred, not yet run) ops as text, one per line, for debugging
    /// from a host backend (e.g. the PyTorch device's `dump_pending()`); "" when none are pending.
    pub fn pending_text(&self, stream: Handle) -> Result<String> {
        let s = self.stream(stream)?;
        let pending = s.pending.lock().unwrap_or_else(|e| e.into_inner());
        Ok(pending.trace.to_string())
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("backend", &self.exec.backend.identity())
            .field("default_mode", &self.default_mode)
            .field("live_tensors", &self.tensors.len())
            .field("streams", &self.streams.len())
            .finish()
    }
}

impl Drop for Runtime {
    /// Pending work is run (nothing a user wrote is lost), then the workers stop.
    fn drop(&mut self) {
        let _ = self.synchronize_all();
        // Other threads' entries stay (a few bytes each): ids are never reused.
        mode::forget(self.id);
        // A trace started by DEFERFUSE_TRACE (or never stopped) is written now.
        if self.timeline.tracing() {
            if let Err(e) = self.timeline.stop() {
                tracing::warn!(error = %e, "could not write the timeline");
            }
        }
    }
}
