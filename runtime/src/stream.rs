//! Streams: each owns a trace buffer and a worker thread that runs launched programs in order,
//! so the host returns from a launch before the work is done (like a CUDA stream). Events order
//! streams against each other.

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::exec::OpPlans;
use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use deferfuse_fusion::plan_cache::PlanCache;
use deferfuse_fusion::{BufferId, Node, Trace, TraceKey};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

mod placement;
mod progress;
use placement::{current_cpu, Placement};
pub use placement::{Pacing, LONG_WAIT_POLL, MOVE_LASTS_IDLE};
pub use progress::Progress;
use progress::SPIN;

/// Work a stream's worker runs.
pub type Work = Box<dyn FnOnce() -> Result<()> + Send>;

enum Job {
    /// Work, and the CPU of the thread that submitted it (see [`placement`]).
    Run(Work, i32),
    /// Block until `stream` has completed `seq` jobs (a cross-stream event wait).
    Wait(Arc<Progress>, u64),
    Stop,
}

/// Most jobs a stream's host may queue ahead of its worker (see [`Stream::throttle`]): more
/// than a training step of a small model launches in strict mode (a bound of 32 made the
/// 784-256-256-10 MLP's strict step slower: its host waited several times a step), few
/// enough that a loop with no sync point holds a bounded number of outputs.
pub const MAX_QUEUED: u64 = 256;

/// The few buffers one op touches (its inputs, its output, a snapshot copy): a small inline
/// list, because building a hash map for every recorded op cost more than the rest of
/// recording. A long list (a cat of many tensors) also keeps positions by id: a search per
/// insert and per lookup made recording a cat of n tensors O(n^2).
#[derive(Clone, Default)]
pub struct OpBuffers {
    list: smallvec::SmallVec<[Arc<Buffer>; 4]>,
    index: Option<Box<IdPositions>>,
}

type IdPositions = HashMap<BufferId, usize, BuildHasherDefault<ahash::AHasher>>;

/// How many buffers a list holds before it keeps positions by id.
const INDEXED_FROM: usize = 32;

impl OpBuffers {
    /// Adds `b` unless a buffer with its id is already listed.
    pub fn insert(&mut self, b: Arc<Buffer>) {
        if self.get(b.id).is_none() {
            self.push(b);
        }
    }

    /// Adds a buffer just made, which cannot be listed yet (no search for its id).
    pub fn insert_new(&mut self, b: Arc<Buffer>) {
        debug_assert!(self.get(b.id).is_none(), "a new buffer is listed already");
        self.push(b);
    }

    fn push(&mut self, b: Arc<Buffer>) {
        if let Some(ix) = &mut self.index {
            ix.insert(b.id, self.list.len());
        }
        self.list.push(b);
        if self.index.is_none() && self.list.len() > INDEXED_FROM {
            let ix = self
                .list
                .iter()
                .enumerate()
                .map(|(i, b)| (b.id, i))
                .collect();
            self.index = Some(Box::new(ix));
        }
    }

    /// The listed buffer with id `id`, if any.
    pub fn get(&self, id: BufferId) -> Option<&Arc<Buffer>> {
        match &self.index {
            Some(ix) => ix.get(&id).map(|&i| &self.list[i]),
            None => self.list.iter().find(|b| b.id == id),
        }
    }

    /// The listed buffers, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Buffer>> {
        self.list.iter()
    }

    /// Takes the buffer with id `id` out of the list.
    fn take(&mut self, id: BufferId) -> Option<Arc<Buffer>> {
        let i = match &self.index {
            Some(ix) => *ix.get(&id)?,
            None => self.list.iter().position(|b| b.id == id)?,
        };
        let b = self.list.swap_remove(i);
        if let Some(ix) = &mut self.index {
            ix.remove(&id);
            if let Some(moved) = self.list.get(i) {
                ix.insert(moved.id, i);
            }
        }
        Some(b)
    }
}

/// A stream's pending buffers: every buffer its pending nodes name, numbered in order of first
/// appearance by the trace's structural key (which the stream builds as it records, see
/// [`TraceKey`]), plus any an op listed that no node names yet. Held until the flush so a
/// handle released meanwhile cannot free them.
///
/// The key's numbering is the index: a recorded op numbers its buffers once, for the key and
/// for this set together (a separate map cost ~170 instructions per op).
#[derive(Default)]
pub struct PendingBuffers {
    key: TraceKey,
    /// By number.
    named: Vec<Arc<Buffer>>,
    /// By number: how many pending nodes write the buffer (each recorded write is counted on
    /// the buffer until its flush).
    writes: Vec<u32>,
    /// Listed by an op, named by no pending node (a cat's later inputs while its first copy
    /// is recorded); almost always empty.
    extra: Vec<Arc<Buffer>>,
}

impl PendingBuffers {
    /// Adds `node` (just appended to the trace) to the key and keeps its op's buffers; returns
    /// whether the node's output buffer is new to the set.
    pub fn record(&mut self, node: &Node, mut op: OpBuffers) -> bool {
        let out = node.output.buffer;
        let mut out_is_new = false;
        let known = self.named.len();
        let out_number = self.key.push(node);
        // The buffers the node named first were just numbered, in order, after the known ones.
        for &id in &self.key.buffers()[known..] {
            let b = op.take(id).expect("a node's buffers are in its op's list");
            self.named.push(b);
            self.writes.push(0);
            out_is_new |= id == out;
        }
        self.writes[out_number] += 1;
        if out_is_new && !self.extra.is_empty() {
            out_is_new = !self.extra.iter().any(|b| b.id == out);
        }
        // The rest are already numbered (dropped: the set holds them) or named by no node.
        for b in op.list {
            if self.key.number_of(b.id).is_none() {
                self.extra.push(b);
            }
        }
        out_is_new
    }

    /// The buffers the pending nodes name, by number.
    pub fn named(&self) -> &[Arc<Buffer>] {
        &self.named
    }

    /// Each named buffer that pending nodes write, with how many of them do.
    pub fn written(&self) -> impl Iterator<Item = (&Arc<Buffer>, u32)> {
        self.named
            .iter()
            .zip(&self.writes)
            .filter(|(_, &n)| n > 0)
            .map(|(b, &n)| (b, n))
    }

    /// Completes the key with each named buffer's liveness (held by something besides this
    /// set: a tensor handle); returns its hash, for the plan cache.
    pub fn finish_key(&mut self) -> u64 {
        // An extra copy of a named buffer would make it look held elsewhere.
        let key = &self.key;
        self.extra.retain(|b| key.number_of(b.id).is_none());
        let (named, writes) = (&self.named, &self.writes);
        self.key.finish(|i| live_by_number(named, writes, i))
    }

    /// The pending trace's key (complete after [`PendingBuffers::finish_key`]).
    pub fn key(&self) -> &TraceKey {
        &self.key
    }

    /// Whether the buffer with id `id` is held by something besides this set. A buffer the
    /// pending nodes only read counts as live, as one not in the set does: nothing in the
    /// flush can make it dead, and whether queued work on the worker still holds it (a
    /// pipelined flush's inputs, written by the one before) is timing, which must not reach
    /// the plan cache's key.
    pub fn is_live(&self, id: BufferId) -> bool {
        match self.key.number_of(id) {
            Some(i) => live_by_number(&self.named, &self.writes, i),
            None => self
                .extra
                .iter()
                .find(|b| b.id == id)
                .is_none_or(|b| Arc::strong_count(b) > 1),
        }
    }

    /// Every buffer of the set: the named ones by number, then the extra ones.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Buffer>> {
        self.named.iter().chain(&self.extra)
    }

    /// Empties the set, keeping its allocations; the buffers it held are returned.
    pub fn drain(&mut self) -> impl Iterator<Item = Arc<Buffer>> + '_ {
        self.key.clear();
        self.writes.clear();
        self.named.drain(..).chain(self.extra.drain(..))
    }
}

/// [`PendingBuffers::is_live`] for the named buffer number `i`.
fn live_by_number(named: &[Arc<Buffer>], writes: &[u32], i: usize) -> bool {
    writes[i] == 0 || Arc::strong_count(&named[i]) > 1
}

impl BufferLookup for PendingBuffers {
    #[inline]
    fn find(&self, id: BufferId) -> Option<&Arc<Buffer>> {
        match self.key.number_of(id) {
            Some(i) => Some(&self.named[i]),
            None => self.extra.iter().find(|b| b.id == id),
        }
    }
}

/// Finding the buffer behind a step operand: a flush looks in the stream's pending map, an op
/// run at once in its own short list.
pub trait BufferLookup {
    /// The buffer with id `id`, if this lookup holds it.
    fn find(&self, id: BufferId) -> Option<&Arc<Buffer>>;
}

impl BufferLookup for OpBuffers {
    fn find(&self, id: BufferId) -> Option<&Arc<Buffer>> {
        self.get(id)
    }
}

/// What a stream records while in defer mode: the trace, and the buffers it names (kept alive
/// until the flush so a handle released meanwhile cannot free them).
#[derive(Default)]
pub struct Pending {
    /// The ops recorded since the last flush.
    pub trace: Trace,
    /// The buffers the trace names.
    pub buffers: PendingBuffers,
    /// Bytes of the buffers deferred ops create (bounded by `Config::max_pending_bytes`).
    pub bytes: usize,
    /// Plans of this stream's recent trace structures (steady-state loops reuse them).
    pub plans: PlanCache,
    /// (node index, host tag) of the nodes recorded with a nonzero tag while a trace ran: a
    /// cut's timeline event names the tag of the op it cut at, which a host backend maps to
    /// the user's source line.
    pub tags: Vec<(usize, u64)>,
    /// Set between a graph capture's begin and end: the trace is being captured as a graph
    /// (see [`crate::graph`]), so it is not flushed for its length or bytes.
    pub capture: Option<crate::graph::Capture>,
}

/// One stream: its pending trace, its queue and its worker.
pub struct Stream {
    /// Internal id, unique in the runtime: what buffers record as their writer's stream.
    pub id: u64,
    /// What the stream recorded and has not flushed yet.
    pub pending: Mutex<Pending>,
    /// The lowered steps and programs of recent ops run alone here (strict, debug): an op of a
    /// structure seen before skips lowering and the program lookup. Apart from `pending`: an op
    /// run alone neither reads nor changes the trace.
    pub(crate) op_plans: Mutex<OpPlans>,
    sender: Sender<Job>,
    /// Jobs submitted so far (the sequence number of the last one).
    submitted: Mutex<u64>,
    /// Completion of the stream's jobs: what syncs and events wait on.
    pub progress: Arc<Progress>,
    /// One more than the newest buffer id that work handed to the worker reads or writes (0
    /// before any): ids only grow, so a buffer with a larger id is one no queued work touches
    /// (see `exec::Launch::Ahead`).
    queued_buffers_below: AtomicU64,
    /// The sequence number of the last wait for another stream queued here (0 before any).
    last_wait: AtomicU64,
    /// Where the worker runs relative to its host (see [`placement`]).
    placement: Arc<Placement>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Stream {
    /// Starts a stream with internal id `id` and spawns its worker thread; `pacing` says how
    /// the two share the CPUs.
    pub fn new(id: u64, pacing: Pacing) -> Result<Stream> {
        let (sender, receiver) = unbounded();
        let progress = Arc::new(Progress::new(pacing.wait_poll));
        let p = progress.clone();
        let placement = Arc::new(Placement::new(pacing.keep_apart));
        let place = placement.clone();
        let worker = std::thread::Builder::new()
            .name(format!("deferfuse-stream-{id}"))
            .spawn(move || worker_loop(receiver, p, &place))
            .map_err(|e| Error::Internal(format!("spawning stream worker: {e}")))?;
        Ok(Stream {
            id,
            pending: Mutex::new(Pending::default()),
            op_plans: Mutex::new(OpPlans::default()),
            sender,
            submitted: Mutex::new(0),
            progress,
            queued_buffers_below: AtomicU64::new(0),
            last_wait: AtomicU64::new(0),
            placement,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Notes that work about to be queued reads or writes buffers up to id `newest`.
    pub(crate) fn note_queued_buffer(&self, newest: BufferId) {
        self.queued_buffers_below
            .fetch_max(newest + 1, Ordering::AcqRel);
    }

    /// Whether no work this stream has queued, finished or not, reads or writes buffer `id`
    /// (it is newer than all of it).
    pub(crate) fn untouched_by_queued_work(&self, id: BufferId) -> bool {
        id >= self.queued_buffers_below.load(Ordering::Acquire)
    }

    /// Whether work handed to the worker has not finished yet.
    pub fn busy(&self) -> bool {
        self.progress.done.load(Ordering::Acquire) < self.last_seq()
    }

    fn submit(&self, job: Job) -> u64 {
        let mut n = self.submitted.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        // The worker only exits after Stop, which is sent from Drop; sending cannot fail before.
        let _ = self.sender.send(job);
        *n
    }

    /// Queues `work`; returns its sequence number. Waits first while more than
    /// [`MAX_QUEUED`] jobs are ahead of it.
    pub fn launch(&self, work: Work) -> u64 {
        let seq = self.submit(Job::Run(work, self.submitter_cpu()));
        self.throttle(seq);
        seq
    }

    /// Lets the host run ahead of the worker by at most [`MAX_QUEUED`] jobs: each queued job
    /// holds its outputs' memory from its launch, so an unbounded lead (strict mode's host
    /// records an op in microseconds, the worker may take a hundred to run it) would hold a
    /// fresh block per op, page-faulted in by the worker, instead of reusing the blocks the
    /// finished ops free; and it would count against the memory limit.
    /// Past the bound it waits until half of it is left, so a host that stays ahead waits
    /// once per [`MAX_QUEUED`] / 2 launches rather than at every one.
    fn throttle(&self, seq: u64) {
        if seq > MAX_QUEUED && self.progress.done.load(Ordering::Acquire) < seq - MAX_QUEUED {
            self.progress.wait(seq - MAX_QUEUED / 2);
        }
    }

    /// Runs `work` on the calling thread when the stream is idle (everything submitted has
    /// completed), else queues it like [`Stream::launch`]; returns its sequence number.
    ///
    /// For a caller about to wait for the work anyway (a synchronize, a host read): handing
    /// it to the worker and back costs a thread wake-up each way, microseconds when idle and
    /// tens of them on a loaded machine, more than a small program takes to run. Holding the
    /// submit lock while it runs keeps stream order: nothing can be queued ahead of it.
    pub fn launch_or_run(&self, work: Work) -> u64 {
        let mut n = self.submitted.lock().unwrap_or_else(|p| p.into_inner());
        if self.progress.done.load(Ordering::Acquire) < *n {
            *n += 1;
            let _ = self.sender.send(Job::Run(work, self.submitter_cpu()));
            let seq = *n;
            drop(n);
            self.throttle(seq);
            return seq;
        }
        *n += 1;
        self.progress.complete(run_work(work));
        *n
    }

    /// Makes this stream wait until `other` has completed `seq` jobs.
    pub fn wait_for(&self, other: &Arc<Progress>, seq: u64) {
        let at = self.submit(Job::Wait(other.clone(), seq));
        self.last_wait.fetch_max(at, Ordering::AcqRel);
    }

    /// Whether a wait for another stream is queued here and not over yet.
    pub(crate) fn waits_for_other_streams(&self) -> bool {
        self.progress.done.load(Ordering::Acquire) < self.last_wait.load(Ordering::Acquire)
    }

    /// The CPU a job submitted now comes from, for a worker that keeps apart from its host;
    /// else -1, and no CPU is read (a strict op launches a job per op).
    fn submitter_cpu(&self) -> i32 {
        if self.placement.keeps_apart() {
            current_cpu()
        } else {
            -1
        }
    }

    /// How many times the worker moved off the CPU of the thread that submitted its job.
    pub fn worker_moves(&self) -> u64 {
        self.placement.moves()
    }

    /// Sequence number of the last submitted job.
    pub fn last_seq(&self) -> u64 {
        *self.submitted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for every submitted job and returns the first error any of them reported.
    pub fn synchronize(&self) -> Result<()> {
        self.progress.wait(self.last_seq());
        match self.progress.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.sender.send(Job::Stop);
        if let Some(w) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = w.join();
        }
    }
}

/// The next job: polled for a short while after the last one (a launch usually follows soon),
/// then waited for.
fn next_job(rx: &Receiver<Job>) -> Option<Job> {
    let start = Instant::now();
    while start.elapsed() < SPIN {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Empty) => std::hint::spin_loop(),
            Err(TryRecvError::Disconnected) => return None,
        }
    }
    rx.recv().ok()
}

/// Runs one job's work; its error, or a panic turned into one.
fn run_work(work: Work) -> Option<Error> {
    run_caught(work).err()
}

/// Runs `work` on the calling thread, a panic turned into an error (work run ahead of a
/// stream's queue, outside its sequence: see `exec::Launch::Ahead`).
pub(crate) fn run_caught(work: Work) -> Result<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(r) => r,
        Err(_) => Err(Error::Internal("a program panicked on its stream".into())),
    }
}

fn worker_loop(rx: Receiver<Job>, progress: Arc<Progress>, placement: &Placement) {
    // Read only by a worker that keeps apart from its host: two clock reads a job otherwise.
    let apart = placement.keeps_apart();
    let mut last_job_end = Instant::now();
    while let Some(job) = next_job(&rx) {
        match job {
            Job::Run(work, from) => {
                if apart {
                    placement.take_job_from(from, last_job_end.elapsed());
                }
                progress.complete(run_work(work));
            }
            Job::Wait(other, seq) => {
                other.wait_polling(seq, SPIN);
                progress.complete(None);
            }
            Job::Stop => return,
        }
        if apart {
            last_job_end = Instant::now();
        }
    }
}

/// A recorded point in a stream: "the first `seq` jobs of that stream".
#[derive(Clone)]
pub struct EventPoint {
    /// The internal id of the stream.
    pub stream: u64,
    /// That stream's progress, to wait on.
    pub progress: Arc<Progress>,
    /// How many of that stream's jobs come before the point.
    pub seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::HostAllocator;
    use deferfuse_fusion::ir::{DType, Layout, Op, UnaryOp};
    use deferfuse_fusion::{Operand, TensorRef};
    use std::sync::mpsc;
    use std::thread::ThreadId;

    fn buffers(ids: &[BufferId]) -> OpBuffers {
        let pool = HostAllocator::new(1 << 20);
        let mut b = OpBuffers::default();
        for &id in ids {
            b.insert(Arc::new(Buffer::new(id, 16, pool.clone())));
        }
        b
    }

    /// `out = -x`
    fn neg(x: BufferId, out: BufferId) -> Node {
        let t = |buffer| TensorRef {
            buffer,
            layout: Layout::contiguous(&[4]),
            dtype: DType::F32,
        };
        Node {
            op: Op::Unary(UnaryOp::Neg),
            inputs: smallvec::smallvec![Operand::Tensor(t(x))],
            output: t(out),
            compute: DType::F32,
        }
    }

    #[test]
    fn recorded_buffers_are_found_by_id_and_an_output_is_new_once() {
        let mut p = PendingBuffers::default();
        assert!(p.record(&neg(1, 2), buffers(&[1, 2])));
        assert!(
            !p.record(&neg(1, 2), buffers(&[1, 2])),
            "b2 is pending already"
        );
        assert!(p.record(&neg(2, 3), buffers(&[2, 3])));
        let ids: Vec<BufferId> = p.named().iter().map(|b| b.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        let writes: Vec<(BufferId, u32)> = p.written().map(|(b, n)| (b.id, n)).collect();
        assert_eq!(
            writes,
            [(2, 2), (3, 1)],
            "b2 is written by two nodes, b1 by none"
        );
        assert_eq!(p.find(3).map(|b| b.id), Some(3));
        assert!(p.find(4).is_none());
        assert_eq!(p.drain().count(), 3);
        assert!(p.find(1).is_none() && p.named().is_empty());
    }

    #[test]
    fn a_buffer_an_op_lists_but_no_node_names_is_held_until_the_flush() {
        let mut p = PendingBuffers::default();
        let op = buffers(&[1, 2, 9]);
        let held = op.get(9).unwrap().clone();
        p.record(&neg(1, 2), op);
        assert_eq!(Arc::strong_count(&held), 2);
        assert_eq!(p.find(9).map(|b| b.id), Some(9));
        assert!(p.is_live(9), "held here too");
        assert_eq!(p.drain().count(), 3);
        assert_eq!(Arc::strong_count(&held), 1);
    }

    #[test]
    fn liveness_in_the_key_is_whether_anything_else_holds_a_buffer() {
        let mut p = PendingBuffers::default();
        let op = buffers(&[1, 2]);
        let x = op.get(1).unwrap().clone();
        p.record(&neg(1, 2), op);
        p.finish_key();
        let n = p.key().words().len();
        assert_eq!(
            p.key().words()[n - 2..],
            [1, 0],
            "b1 is held by `x`, b2 only here"
        );
        assert!(p.is_live(1) && !p.is_live(2));
        drop(x);
    }

    #[test]
    fn a_buffer_the_trace_only_reads_is_live_whoever_holds_it() {
        let key_with = |hold_input: bool| {
            let mut p = PendingBuffers::default();
            let op = buffers(&[1, 2]);
            // Queued work on the worker may or may not still hold the input when the host
            // flushes: that timing must not change the plan cache's key.
            let held = hold_input.then(|| op.get(1).unwrap().clone());
            p.record(&neg(1, 2), op);
            p.finish_key();
            assert!(p.is_live(1) && !p.is_live(2));
            drop(held);
            p.key().words().to_vec()
        };
        assert_eq!(key_with(true), key_with(false));
    }

    fn note_thread(tx: mpsc::Sender<ThreadId>) -> Work {
        Box::new(move || {
            let _ = tx.send(std::thread::current().id());
            Ok(())
        })
    }

    #[test]
    fn launch_or_run_runs_on_the_caller_when_the_stream_is_idle() {
        let s = Stream::new(1, Pacing::SHARED).unwrap();
        let (tx, rx) = mpsc::channel();
        let seq = s.launch_or_run(note_thread(tx));
        assert_eq!(rx.recv().unwrap(), std::thread::current().id());
        assert_eq!(s.progress.completed(), seq);
    }

    #[test]
    fn launch_or_run_queues_behind_unfinished_work_in_order() {
        let s = Stream::new(1, Pacing::SHARED).unwrap();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (tx, rx) = mpsc::channel();
        let first = tx.clone();
        s.launch(Box::new(move || {
            gate_rx.recv().unwrap();
            let _ = first.send(std::thread::current().id());
            Ok(())
        }));
        let seq = s.launch_or_run(note_thread(tx));
        gate_tx.send(()).unwrap();
        s.progress.wait(seq);
        let (a, b) = (rx.recv().unwrap(), rx.recv().unwrap());
        assert_eq!(a, b, "both ran on the worker, the blocked job first");
        assert_ne!(b, std::thread::current().id());
    }

    #[test]
    fn an_error_of_work_run_on_the_caller_surfaces_at_synchronize() {
        let s = Stream::new(1, Pacing::SHARED).unwrap();
        s.launch_or_run(Box::new(|| Err(Error::Backend("boom".into()))));
        assert!(matches!(s.synchronize(), Err(Error::Backend(m)) if m == "boom"));
        assert!(s.synchronize().is_ok(), "an error is reported once");
    }

    #[test]
    fn a_wait_for_a_job_reports_only_the_failures_up_to_it() {
        let s = Stream::new(1, Pacing::SHARED).unwrap();
        let ok = s.launch_or_run(Box::new(|| Ok(())));
        let failed = s.launch_or_run(Box::new(|| Err(Error::Backend("later".into()))));
        s.progress.wait(failed);
        assert!(
            s.progress.take_error_through(ok).is_none(),
            "the later job's failure is not the earlier job's"
        );
        assert!(
            matches!(s.progress.take_error_through(failed), Some(Error::Backend(m)) if m == "later")
        );
        assert!(s.synchronize().is_ok(), "taken once");
    }

    #[test]
    fn a_worker_waiting_for_another_stream_sleeps_after_a_short_spin() {
        let long = Pacing {
            wait_poll: std::time::Duration::from_secs(30),
            keep_apart: false,
        };
        let other = Stream::new(2, long).unwrap();
        let s = Stream::new(1, long).unwrap();
        // Made after the streams, so dropped first if an assertion fails: the blocked job then
        // ends and both workers can stop.
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let seq = other.launch(Box::new(move || {
            gate_rx
                .recv()
                .map_err(|_| Error::Internal("gate dropped".into()))
        }));
        s.wait_for(&other.progress, seq);
        let start = Instant::now();
        while other.progress.sleepers() == 0 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "the waiting worker still polls the other stream after 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        gate_tx.send(()).unwrap();
        s.synchronize().unwrap();
    }
}
