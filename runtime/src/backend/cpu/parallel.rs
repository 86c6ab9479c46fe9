//! Splitting one program run over cores. A loop's work is cut into chunks of whole rows (or, for
//! a single long row, of cache-line-aligned pieces of it) that run on a persistent thread pool;
//! the calling stream worker runs chunks too. Every element is computed by the same vector code
//! whichever chunk it falls in, and a reduced row is never split, so results do not depend on
//! the number of threads.

use crate::error::Error;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

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
        // Every thread, the caller included, claims chunks from one counter until none are left:
        // a caller outside the pool cannot steal rayon jobs, so handing it one fixed chunk
        // left it idle while the workers ran the rest (two threads were no faster than one).
        let chunks = units.div_ceil(per);
        let next = AtomicUsize::new(0);
        let claim = || loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= chunks {
                break;
            }
            run(c * per..((c + 1) * per).min(units));
        };
        pool.in_place_scope(|s| {
            for _ in 1..self.threads.min(chunks) {
                s.spawn(|_| claim());
            }
            claim();
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

thread_local! {
    /// Set while this thread runs one program of a wave: its loops run whole, on this thread.
    /// A split inside would wait for helper jobs queued behind the wave's other programs,
    /// and a caller outside the pool cannot run them meanwhile.
    static IN_WAVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
                let outer = IN_WAVE.replace(true);
                let res = job(k);
                IN_WAVE.set(outer);
                res
            })
        })
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
