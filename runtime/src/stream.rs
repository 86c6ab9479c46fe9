//! Streams: each owns a trace buffer and a worker thread that runs launched programs in order,
//! so the host returns from a launch before the work is done (like a CUDA stream). Events order
//! streams against each other.

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use deferfuse_fusion::plan_cache::PlanCache;
use deferfuse_fusion::{BufferId, Trace};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Work a stream's worker runs.
pub type Work = Box<dyn FnOnce() -> Result<()> + Send>;

enum Job {
    Run(Work),
    /// Block until `stream` has completed `seq` jobs (a cross-stream event wait).
    Wait(Arc<Progress>, u64),
    Stop,
}

/// How far a stream's worker has come, and its first asynchronous error.
#[derive(Default)]
pub struct Progress {
    state: Mutex<ProgressState>,
    cv: Condvar,
    /// Mirror of `state.completed` for lock-free polling while spinning.
    done: AtomicU64,
}

/// How long a waiter (or an idle worker) spins before it sleeps: waking a sleeping thread costs
/// tens of microseconds here, more than most small programs take to run.
const SPIN: Duration = Duration::from_micros(50);

#[derive(Default)]
struct ProgressState {
    completed: u64,
    error: Option<Error>,
}

impl Progress {
    fn complete(&self, err: Option<Error>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.completed += 1;
        if s.error.is_none() {
            s.error = err;
        }
        self.done.store(s.completed, Ordering::Release);
        self.cv.notify_all();
    }

    /// Waits until `seq` jobs have completed (spinning briefly first).
    pub fn wait(&self, seq: u64) {
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) < seq && start.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.completed < seq {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn completed(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .completed
    }

    /// Takes the first error a job reported since the last call (errors surface at syncs).
    pub fn take_error(&self) -> Option<Error> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .error
            .take()
    }
}

/// Buffers by id, hashed by [`IdHasher`]: these maps are touched on every recorded op.
pub type BufferMap = HashMap<BufferId, Arc<Buffer>, BuildHasherDefault<IdHasher>>;

/// One multiply per buffer id: ids are counters the runtime makes, so there is no adversary
/// to resist, and ahash's keyed mixing cost several times more per lookup.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The few buffers one op touches (its inputs, its output, a snapshot copy): a small inline
/// list, because building a hash map for every recorded op cost more than the rest of
/// recording.
#[derive(Clone, Default)]
pub struct OpBuffers(smallvec::SmallVec<[Arc<Buffer>; 4]>);

impl OpBuffers {
    /// Adds `b` unless a buffer with its id is already listed.
    pub fn insert(&mut self, b: Arc<Buffer>) {
        if self.get(b.id).is_none() {
            self.0.push(b);
        }
    }

    pub fn get(&self, id: BufferId) -> Option<&Arc<Buffer>> {
        self.0.iter().find(|b| b.id == id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Buffer>> {
        self.0.iter()
    }

    /// Moves every buffer into `map` (a stream's pending buffers).
    pub fn move_into(self, map: &mut BufferMap) {
        for b in self.0 {
            map.entry(b.id).or_insert(b);
        }
    }
}

/// Finding the buffer behind a step operand: a flush looks in the stream's pending map, an op
/// run at once in its own short list.
pub trait BufferLookup {
    fn find(&self, id: BufferId) -> Option<&Arc<Buffer>>;
}

impl BufferLookup for BufferMap {
    fn find(&self, id: BufferId) -> Option<&Arc<Buffer>> {
        self.get(&id)
    }
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
    pub trace: Trace,
    pub buffers: BufferMap,
    /// Bytes of the buffers deferred ops create (bounded by `Config::max_pending_bytes`).
    pub bytes: usize,
    /// Plans of this stream's recent trace structures (steady-state loops reuse them).
    pub plans: PlanCache,
}

/// One stream: its pending trace, its queue and its worker.
pub struct Stream {
    pub id: u64,
    pub pending: Mutex<Pending>,
    sender: Sender<Job>,
    /// Jobs submitted so far (the sequence number of the last one).
    submitted: Mutex<u64>,
    pub progress: Arc<Progress>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Stream {
    pub fn new(id: u64) -> Result<Stream> {
        let (sender, receiver) = unbounded();
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        let worker = std::thread::Builder::new()
            .name(format!("deferfuse-stream-{id}"))
            .spawn(move || worker_loop(receiver, p))
            .map_err(|e| Error::Internal(format!("spawning stream worker: {e}")))?;
        Ok(Stream {
            id,
            pending: Mutex::new(Pending::default()),
            sender,
            submitted: Mutex::new(0),
            progress,
            worker: Mutex::new(Some(worker)),
        })
    }

    fn submit(&self, job: Job) -> u64 {
        let mut n = self.submitted.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        // The worker only exits after Stop, which is sent from Drop; sending cannot fail before.
        let _ = self.sender.send(job);
        *n
    }

    /// Queues `work`; returns its sequence number.
    pub fn launch(&self, work: Work) -> u64 {
        self.submit(Job::Run(work))
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
            let _ = self.sender.send(Job::Run(work));
            return *n;
        }
        *n += 1;
        self.progress.complete(run_work(work));
        *n
    }

    /// Makes this stream wait until `other` has completed `seq` jobs.
    pub fn wait_for(&self, other: &Arc<Progress>, seq: u64) {
        self.submit(Job::Wait(other.clone(), seq));
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
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(Error::Internal("a program panicked on its stream".into())),
    }
}

fn worker_loop(rx: Receiver<Job>, progress: Arc<Progress>) {
    while let Some(job) = next_job(&rx) {
        match job {
            Job::Run(work) => progress.complete(run_work(work)),
            Job::Wait(other, seq) => {
                other.wait(seq);
                progress.complete(None);
            }
            Job::Stop => return,
        }
    }
}

/// A recorded point in a stream: "the first `seq` jobs of that stream".
#[derive(Clone)]
pub struct EventPoint {
    pub stream: u64,
    pub progress: Arc<Progress>,
    pub seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread::ThreadId;

    fn note_thread(tx: mpsc::Sender<ThreadId>) -> Work {
        Box::new(move || {
            let _ = tx.send(std::thread::current().id());
            Ok(())
        })
    }

    #[test]
    fn launch_or_run_runs_on_the_caller_when_the_stream_is_idle() {
        let s = Stream::new(1).unwrap();
        let (tx, rx) = mpsc::channel();
        let seq = s.launch_or_run(note_thread(tx));
        assert_eq!(rx.recv().unwrap(), std::thread::current().id());
        assert_eq!(s.progress.completed(), seq);
    }

    #[test]
    fn launch_or_run_queues_behind_unfinished_work_in_order() {
        let s = Stream::new(1).unwrap();
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
        let s = Stream::new(1).unwrap();
        s.launch_or_run(Box::new(|| Err(Error::Backend("boom".into()))));
        assert!(matches!(s.synchronize(), Err(Error::Backend(m)) if m == "boom"));
        assert!(s.synchronize().is_ok(), "an error is reported once");
    }
}
