//! How far a stream's worker has come: the completed-job count that launches, syncs and events
//! wait on, and the first asynchronous error. Waiters spin briefly, then sleep; a completion
//! wakes only the sleepers whose job it is.

use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How far a stream's worker has come, and its first asynchronous error.
pub struct Progress {
    state: Mutex<ProgressState>,
    cv: Condvar,
    /// Mirror of `state.completed` for lock-free polling while spinning.
    pub(super) done: AtomicU64,
    /// How long [`Progress::wait`] polls before it sleeps (at least [`SPIN`]; see `Pacing`).
    wait_poll: Duration,
}

impl Default for Progress {
    /// Waits that poll for `SPIN` (50 us) before they sleep.
    fn default() -> Self {
        Progress::new(SPIN)
    }
}

/// How long a waiter (or an idle worker) spins before it sleeps: waking a sleeping thread costs
/// tens of microseconds here, more than most small programs take to run.
pub(super) const SPIN: Duration = Duration::from_micros(50);

struct ProgressState {
    completed: u64,
    /// The first error not yet reported, with the sequence number of the job that failed.
    error: Option<(u64, Error)>,
    /// Threads asleep on the condition variable: a completion wakes them only when there are
    /// some, since a wake is a system call (`futex`) even with no one to wake, and the worker
    /// completes a job per strict op.
    sleepers: u32,
    /// The fewest completed jobs any sleeper waits for (`u64::MAX` when none registered since
    /// the last wake): a completion short of it wakes no one. Waking a sleeper on every
    /// completion made a strict host, asleep in the throttle until 128 more jobs were done,
    /// wake and sleep again 128 times, and the worker pay a `futex` wake per job (6% of its
    /// time on Llama's strict step).
    wake_at: u64,
    /// Wakes so far (`notify_all` calls), for the tests.
    wakes: u64,
}

impl Default for ProgressState {
    fn default() -> Self {
        ProgressState {
            completed: 0,
            error: None,
            sleepers: 0,
            wake_at: u64::MAX,
            wakes: 0,
        }
    }
}

impl Progress {
    /// No job done yet; waits poll for `wait_poll` (or [`SPIN`], if longer) before they sleep.
    pub(super) fn new(wait_poll: Duration) -> Progress {
        Progress {
            state: Mutex::default(),
            cv: Condvar::new(),
            done: AtomicU64::new(0),
            wait_poll: wait_poll.max(SPIN),
        }
    }

    /// Counts one more job done (the worker calls it once per job, in order), keeps the first
    /// error, and wakes the sleepers whose job this was.
    pub(super) fn complete(&self, err: Option<Error>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.completed += 1;
        if s.error.is_none() {
            s.error = err.map(|e| (s.completed, e));
        }
        self.done.store(s.completed, Ordering::Release);
        let wake = s.sleepers > 0 && s.completed >= s.wake_at;
        if wake {
            // Every sleeper wakes; one still short of its count registers it again.
            s.wake_at = u64::MAX;
            s.wakes += 1;
        }
        drop(s);
        if wake {
            self.cv.notify_all();
        }
    }

    /// Waits until `seq` jobs have completed (polling for a while first: see `Pacing`).
    pub fn wait(&self, seq: u64) {
        self.wait_polling(seq, self.wait_poll);
    }

    /// [`Progress::wait`], polling for `poll` before it sleeps: a stream's worker that waits
    /// for another stream polls only [`SPIN`], since the other stream's worker and the host may
    /// need every CPU meanwhile.
    pub(super) fn wait_polling(&self, seq: u64, poll: Duration) {
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) < seq && start.elapsed() < poll {
            std::hint::spin_loop();
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.completed >= seq {
            return;
        }
        // Counted under the lock that `complete` takes, so a completion either comes before
        // the check above or sees this sleeper.
        s.sleepers += 1;
        while s.completed < seq {
            s.wake_at = s.wake_at.min(seq);
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.sleepers -= 1;
    }

    /// Jobs completed so far.
    pub fn completed(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .completed
    }

    #[cfg(test)]
    fn wakes(&self) -> u64 {
        self.state.lock().unwrap().wakes
    }

    #[cfg(test)]
    pub(super) fn sleepers(&self) -> u32 {
        self.state.lock().unwrap().sleepers
    }

    /// Takes the first error a job reported since the last call (errors surface at syncs).
    pub fn take_error(&self) -> Option<Error> {
        self.take_error_through(u64::MAX)
    }

    /// Takes the first unreported error if one of the first `seq` jobs reported it. A wait for
    /// job `seq` reports what happened up to it, never a later job's failure that merely
    /// finished first: which sync point reports an error does not depend on timing.
    pub fn take_error_through(&self, seq: u64) -> Option<Error> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &s.error {
            Some((at, _)) if *at <= seq => s.error.take().map(|(_, e)| e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Waits until `n` threads sleep on `p` (each past its spin).
    fn until_sleeping(p: &Progress, n: u32) {
        while p.sleepers() < n {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_sleeping_waiter_is_woken_when_its_job_completes_not_at_every_job() {
        let p = Arc::new(Progress::default());
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || p.wait(100))
        };
        until_sleeping(&p, 1);
        for _ in 0..99 {
            p.complete(None);
        }
        assert_eq!(p.wakes(), 0, "no wake before the 100th job");
        assert!(!waiter.is_finished());
        p.complete(None);
        waiter.join().unwrap();
        assert_eq!(p.wakes(), 1);
    }

    #[test]
    fn waiters_for_different_jobs_each_return_when_theirs_completes() {
        let p = Arc::new(Progress::default());
        let spawn = |seq| {
            let p = p.clone();
            std::thread::spawn(move || p.wait(seq))
        };
        let (first, second) = (spawn(10), spawn(20));
        until_sleeping(&p, 2);
        for _ in 0..10 {
            p.complete(None);
        }
        first.join().unwrap();
        assert!(!second.is_finished(), "10 of its 20 jobs are done");
        for _ in 0..10 {
            p.complete(None);
        }
        second.join().unwrap();
    }

    #[test]
    fn a_waiter_polls_for_its_wait_poll_before_it_sleeps() {
        let p = Arc::new(Progress::new(Duration::from_secs(30)));
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiter = {
            let (p, started) = (p.clone(), started.clone());
            std::thread::spawn(move || {
                started.store(true, Ordering::Release);
                p.wait(1)
            })
        };
        while !started.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(p.sleepers(), 0, "still polling 50 ms in");
        p.complete(None);
        waiter.join().unwrap();
        assert_eq!(p.wakes(), 0, "it never slept, so nothing woke it");
    }

    #[test]
    fn a_wait_poll_shorter_than_the_spin_still_spins() {
        assert_eq!(Progress::new(Duration::ZERO).wait_poll, SPIN);
    }
}
