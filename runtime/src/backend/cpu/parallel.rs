//! Splitting one program run over cores. A loop's work is cut into chunks of whole rows (or, for
//! a single long row, of cache-line-aligned pieces of it) that run on a persistent thread pool;
//! the calling stream worker runs chunks too. Every element is computed by the same vector code
//! whichever chunk it falls in, and a reduced row is never split, so results do not depend on
//! the number of threads.

use crate::error::Error;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Elements below which a loop runs on the calling thread: waking workers costs a few
/// microseconds, about what one core needs to stream this many elements.
pub const SERIAL_BELOW: usize = 1 << 15;

/// Inner-dim pieces are multiples of this many elements, so that (with 64-byte aligned buffers)
/// no two threads write the same cache line of a contiguous operand, whatever its dtype.
pub const CHUNK_ALIGN: usize = 64;

/// Chunks per thread: more than one so that a thread slowed by a noisy neighbour leaves its
/// remaining chunks to the others.
const CHUNKS_PER_THREAD: usize = 4;

/// The threads one backend splits its programs over.
pub struct Pool {
    threads: usize,
    /// `threads - 1` workers; the caller is the last thread. `None` when single-threaded.
    pool: Option<rayon::ThreadPool>,
}

impl Pool {
    /// A pool for `threads` threads in all (the caller included); at least 1.
    pub fn new(threads: usize) -> Result<Pool, Error> {
        let threads = threads.max(1);
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads - 1)
                    .thread_name(|i| format!("deferfuse-cpu-{i}"))
                    .build()
                    .map_err(|e| Error::Backend(format!("starting {threads} CPU threads: {e}")))?,
            )
        } else {
            None
        };
        Ok(Pool { threads, pool })
    }

    /// Threads programs may use, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` over `0..units` in contiguous chunks, on several threads when there is enough
    /// work: `elems_per_unit` elements per unit, chunk bounds multiples of `align` units (the
    /// last chunk excepted). Returns once every chunk ran; the first error wins.
    pub fn for_chunks<E: Send>(
        &self,
        units: usize,
        elems_per_unit: usize,
        align: usize,
        f: &(dyn Fn(Range<usize>) -> Result<(), E> + Sync),
    ) -> Result<(), E> {
        let work = units.saturating_mul(elems_per_unit);
        if work < SERIAL_BELOW || units < 2 * align || IN_WAVE.get() {
            return f(0..units);
        }
        // Each chunk keeps at least half the serial threshold of work.
        let min_units = (SERIAL_BELOW / 2).div_ceil(elems_per_unit.max(1)).max(1);
        self.split(units, min_units, self.threads * CHUNKS_PER_THREAD, align, f)
    }

    /// Runs `f` over `0..units` in at most `chunks` contiguous chunks of at least `min_units`
    /// units each (bounds multiples of `align`), on the pool when there are two or more.
    pub fn split<E: Send>(
        &self,
        units: usize,
        min_units: usize,
        chunks: usize,
        align: usize,
        f: &(dyn Fn(Range<usize>) -> Result<(), E> + Sync),
    ) -> Result<(), E> {
        let per = units
            .div_ceil(chunks.max(1))
            .max(min_units)
            .next_multiple_of(align);
        let pool = match &self.pool {
            Some(p) if per < units => p,
            _ => return f(0..units),
        };
        let first_error = std::sync::Mutex::new(None);
        let run = |r: Range<usize>| {
            if let Err(e) = f(r) {
                first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        };
        let chunks = units.div_ceil(per);
        let body = |c: usize| run(c * per..((c + 1) * per).min(units));
        run_split(pool, self.threads.min(chunks) - 1, chunks, &body);
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// How long a split's caller spins for a helper's last chunk before it sleeps: chunks are
/// tens of microseconds, and a sleeping thread takes about as long to wake.
const FINISH_SPIN: Duration = Duration::from_micros(10);

/// How long it then yields its core between checks before it sleeps: a parked caller took
/// ~50-100 us to wake on this VM after the helper's last chunk, as long as a GEMM's half.
const FINISH_YIELD: Duration = Duration::from_micros(300);

/// Runs chunks `0..chunks` of `body` on the calling thread and on up to `helpers` pool threads.
///
/// Every thread, the caller included, claims chunks from one counter until none are left (a
/// caller outside the pool cannot steal rayon jobs, so handing it one fixed chunk left it idle
/// while the workers ran the rest). The caller waits only for
/// chunks a helper has claimed, never for a helper to start: on a machine where every core is
/// busy (the Python thread recording, the stream worker running programs) a woken pool thread
/// often gets no core until the caller has run every chunk itself, and waiting for it to
/// arrive and find nothing to do cost strict mode ~30 us per split (two threads were slower
/// than one on the small MLP). A helper that starts after the split ended claims nothing and
/// returns.
fn run_split(
    pool: &rayon::ThreadPool,
    helpers: usize,
    chunks: usize,
    body: &(dyn Fn(usize) + Sync),
) {
    // SAFETY: the lifetime is erased so that helper jobs, which may outlive this call, can
    // hold the split; `Split::claim` dereferences `body` only for a chunk it claimed below
    // `chunks`, and this function returns (or unwinds) only once all `chunks` claimed chunks
    // are done (`WaitOnDrop`), so no dereference happens after `body`'s borrow ends.
    let body: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(body) };
    let split = Arc::new(Split {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        chunks,
        caller: std::thread::current(),
        panic: Mutex::new(None),
        body: ChunkBody(body as *const _),
    });
    for _ in 0..helpers {
        let s = Arc::clone(&split);
        pool.spawn(move || s.claim(true));
    }
    {
        let _wait = WaitOnDrop(&split);
        split.claim(false);
    }
    let payload = split.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(p) = payload {
        std::panic::resume_unwind(p);
    }
}

/// Waits for every chunk of the split when dropped, so that the caller leaves `run_split` only
/// after its helpers stopped using the borrowed body, even if it unwinds.
struct WaitOnDrop<'a>(&'a Split);

impl Drop for WaitOnDrop<'_> {
    fn drop(&mut self) {
        self.0.wait_done();
    }
}

/// One split's shared state; helper jobs hold it by `Arc` because they may start after the
/// split returned.
struct Split {
    /// The next chunk to claim (claims past `chunks` find nothing).
    next: AtomicUsize,
    /// Chunks finished, by any thread.
    done: AtomicUsize,
    chunks: usize,
    /// Woken by the helper that finishes the last chunk.
    caller: std::thread::Thread,
    /// The first panic in a chunk, re-raised on the caller once every chunk is done.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    body: ChunkBody,
}

/// The split's chunk body, borrowed from the caller's stack (see the safety note in
/// `run_split`): a pointer, not a reference, since the `Split` may outlive the borrow.
struct ChunkBody(*const (dyn Fn(usize) + Sync));

// SAFETY: the body is `Sync` (callable from any thread) and only called while the caller's
// borrow lives (see `run_split`).
unsafe impl Send for ChunkBody {}
unsafe impl Sync for ChunkBody {}

impl Split {
    /// Runs chunks until none are left. A panic in a chunk is kept (and the chunk counted as
    /// done) so that the caller never waits forever nor unwinds while a helper still runs.
    fn claim(&self, helper: bool) {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return;
            }
            // SAFETY: chunk `c` is claimed, so the caller is still waiting (see `run_split`).
            let body = unsafe { &*self.body.0 };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(c))) {
                self.panic
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(p);
            }
            let finished = self.done.fetch_add(1, Ordering::AcqRel) + 1;
            if helper && finished == self.chunks {
                self.caller.unpark();
            }
        }
    }

    /// Returns once every chunk is done (called by the caller after its own claims).
    fn wait_done(&self) {
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) < self.chunks {
            if start.elapsed() < FINISH_SPIN {
                std::hint::spin_loop();
            } else if start.elapsed() < FINISH_YIELD {
                std::thread::yield_now();
            } else {
                // The helper finishing the last chunk unparks this thread; a wake-up for any
                // other reason loops back to the check.
                std::thread::park();
            }
        }
    }
}

thread_local! {
    /// Set while this thread runs one program of a wave: its loops run whole, on this thread.
    /// The wave's other programs already keep every thread busy, and a split's helper jobs
    /// would queue behind them, so splitting one program would only add hand-offs.
    static IN_WAVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as running a wave's program until dropped, then restores the mark it
/// found (also when the program panics: the stream worker survives a panic, and a mark left
/// set would keep its later loops on one thread).
struct InWave(bool);

impl InWave {
    fn enter() -> InWave {
        InWave(IN_WAVE.replace(true))
    }
}

impl Drop for InWave {
    fn drop(&mut self) {
        IN_WAVE.set(self.0);
    }
}

/// Independent programs, one per chunk: every thread claims the next program until none are
/// left, and runs it whole.
impl crate::backend::SideBySide for Pool {
    fn run_all(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> crate::error::Result<()> + Sync),
    ) -> crate::error::Result<()> {
        self.split(n, 1, n, 1, &|r| {
            r.into_iter().try_for_each(|k| {
                let _in_wave = InWave::enter();
                job(k)
            })
        })
    }

    fn threads(&self) -> usize {
        self.threads
    }

    /// As for one loop (`SERIAL_BELOW`): a policy loop's sampling step ran its 2 small
    /// programs side by side at each read, and the pool thread it woke then spun on the other
    /// core beside the Python thread (98-100 us a step at 2 threads, 75 at 1; 75-77 now).
    fn worth_sharing(&self, elems: usize) -> bool {
        elems >= SERIAL_BELOW
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn chunks_of(pool: &Pool, units: usize, per_unit: usize, align: usize) -> Vec<Range<usize>> {
        let seen = Mutex::new(Vec::new());
        pool.for_chunks::<()>(units, per_unit, align, &|r| {
            seen.lock().unwrap().push(r);
            Ok(())
        })
        .unwrap();
        let mut v = seen.into_inner().unwrap();
        v.sort_by_key(|r| r.start);
        v
    }

    #[test]
    fn chunks_cover_every_unit_once_in_order() {
        let pool = Pool::new(3).unwrap();
        let v = chunks_of(&pool, 1_000_003, 1, CHUNK_ALIGN);
        assert!(v.len() > 1);
        let mut next = 0;
        for r in &v {
            assert_eq!(r.start, next);
            next = r.end;
        }
        assert_eq!(next, 1_000_003);
    }

    #[test]
    fn chunk_starts_are_aligned() {
        let pool = Pool::new(2).unwrap();
        for r in chunks_of(&pool, 999_999, 1, CHUNK_ALIGN) {
            assert_eq!(r.start % CHUNK_ALIGN, 0, "{r:?}");
        }
    }

    #[test]
    fn small_work_runs_as_one_chunk() {
        let pool = Pool::new(4).unwrap();
        assert_eq!(chunks_of(&pool, 1000, 8, 1), vec![0..1000]);
    }

    #[test]
    fn one_thread_runs_as_one_chunk() {
        let pool = Pool::new(1).unwrap();
        assert_eq!(chunks_of(&pool, 1 << 24, 1, 1), vec![0..1 << 24]);
    }

    #[test]
    fn an_error_in_any_chunk_is_returned() {
        let pool = Pool::new(2).unwrap();
        let r = pool.for_chunks(1 << 20, 1, 1, &|r| {
            if r.start > 0 {
                Err("late chunk failed")
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err("late chunk failed"));
    }

    #[test]
    fn a_split_does_not_wait_for_a_helper_that_never_starts() {
        use std::sync::mpsc;
        let pool = std::sync::Arc::new(Pool::new(2).unwrap());
        // Keep the only pool thread busy until the split is over.
        let (release, blocked) = mpsc::channel::<()>();
        let (started, is_started) = mpsc::channel();
        pool.pool.as_ref().unwrap().spawn(move || {
            started.send(()).unwrap();
            let _ = blocked.recv();
        });
        is_started.recv().unwrap();
        let (done, is_done) = mpsc::channel();
        let p = std::sync::Arc::clone(&pool);
        std::thread::spawn(move || done.send(chunks_of(&p, 1 << 20, 1, CHUNK_ALIGN)).unwrap());
        let chunks = is_done
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the caller ran every chunk but kept waiting for the busy helper");
        assert!(chunks.len() > 1);
        release.send(()).unwrap();
    }

    #[test]
    fn the_caller_waits_for_a_chunk_a_helper_is_still_running() {
        use std::sync::atomic::AtomicBool;
        let pool = Pool::new(2).unwrap();
        let caller = std::thread::current().id();
        let helper_claimed = AtomicBool::new(false);
        let (started, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
        pool.for_chunks::<()>(1 << 20, 1, CHUNK_ALIGN, &|_| {
            if std::thread::current().id() == caller {
                // Let the helper claim a chunk before the caller runs out of them.
                let start = Instant::now();
                while !helper_claimed.load(Ordering::SeqCst)
                    && start.elapsed() < Duration::from_secs(10)
                {
                    std::thread::yield_now();
                }
            } else {
                helper_claimed.store(true, Ordering::SeqCst);
                started.fetch_add(1, Ordering::SeqCst);
                // Far longer than the caller's spin: it sleeps until this chunk is done.
                std::thread::sleep(Duration::from_millis(30));
                finished.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        })
        .unwrap();
        assert!(
            started.load(Ordering::SeqCst) > 0,
            "the helper never ran a chunk"
        );
        assert_eq!(finished.into_inner(), started.into_inner());
    }

    #[test]
    fn a_panicking_wave_program_leaves_the_thread_free_to_split_again() {
        use crate::backend::SideBySide;
        let pool = Pool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run_all(1, &|_| panic!("a program of the wave fails"))
        }));
        assert!(r.is_err());
        assert!(!IN_WAVE.get());
        assert!(chunks_of(&pool, 1 << 20, 1, CHUNK_ALIGN).len() > 1);
    }

    #[test]
    fn a_panic_in_a_chunk_reaches_the_caller_after_every_chunk_ran() {
        let pool = Pool::new(2).unwrap();
        let ran = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.for_chunks::<()>(1 << 20, 1, 1, &|r| {
                ran.fetch_add(r.len(), Ordering::Relaxed);
                assert!(r.start != 0, "first chunk fails");
                Ok(())
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.into_inner(), 1 << 20);
        // The pool still splits work afterwards.
        assert!(chunks_of(&pool, 1 << 20, 1, CHUNK_ALIGN).len() > 1);
    }

    #[test]
    fn side_by_side_runs_every_job_once() {
        use crate::backend::SideBySide;
        let pool = Pool::new(2).unwrap();
        let runs = Mutex::new(vec![0; 50]);
        pool.run_all(50, &|k| {
            runs.lock().unwrap()[k] += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(runs.into_inner().unwrap(), vec![1; 50]);
    }

    #[test]
    fn side_by_side_returns_a_failing_jobs_error() {
        use crate::backend::SideBySide;
        let pool = Pool::new(2).unwrap();
        let r = pool.run_all(20, &|k| {
            if k == 13 {
                Err(crate::error::Error::Internal("job 13 failed".into()))
            } else {
                Ok(())
            }
        });
        assert!(format!("{:?}", r.unwrap_err()).contains("job 13 failed"));
    }
}
