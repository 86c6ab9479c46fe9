//! How a stream's host thread and its worker share the CPUs.
//!
//! Defer and strict mode overlap two things: the host thread records ops while the stream's
//! worker runs the programs of earlier ones. That pays only while they run on different CPUs.
//! A scheduler that packs threads onto few CPUs (the 2-vCPU Firecracker guests this project is
//! built on do, `sched_vcpu_pack`) put them on one CPU after any pause, where they took turns
//! while the other CPU idled, and its load balancer took many milliseconds to part them: the
//! 784-256-256-10 MLP's defer step went from 0.68 ms to 1.1-1.4 ms for at least eight steps
//! after a 20 ms pause (a data loader's wait, a benchmark's settle), and in
//! `bench_models.py` it measured 1.2-1.6 ms. Two things keep them apart, while the host has a
//! CPU to itself (see [`Pacing::for_threads`]):
//! - a host that waits for its stream (a host read, a synchronize) polls for up to
//!   [`LONG_WAIT_POLL`] before it sleeps. Asleep through its step's last programs, it was woken
//!   by the worker and run on the worker's CPU. Polling with `sched_yield` was tried: the same
//!   MLP 0.87-1.31 ms, where plain polling gives 0.72.
//! - each job carries the CPU it was submitted from, and a worker that finds itself on that
//!   CPU as it takes the job leaves it: its affinity becomes what it is now, with the CPU it
//!   left before (if any) given back and this one taken out. It moves only when the two meet,
//!   so where the scheduler keeps them apart (a usual Linux host) nothing changes, and a
//!   process confined to one CPU (`taskset -c 0`) stays as it is. A host that later lands on
//!   the worker's CPU makes the worker move again. The move lasts while the worker is busy:
//!   its first job after [`MOVE_LASTS_IDLE`] without one takes the CPU back first, so a
//!   worker is not left confined (on two CPUs, to one) from one busy stretch to the next, when
//!   another stream's worker or another process may need the CPU it left.
//!
//! Only the stream's worker moves; the CPU backend's pool threads (`DEFERFUSE_NUM_THREADS` > 1)
//! are left to the scheduler, and at that thread count on two cores neither rule applies. With
//! several busy streams each worker leaves the host's CPU, so they share the others.
//!
//! Both together: the MLP's step 0.72-0.73 ms in `bench_models.py`; either alone left it at
//! 0.84-2.03 ms from run to run.

use super::progress::SPIN;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

/// How long a host with a CPU to itself polls for its stream's jobs before it sleeps: longer
/// than the waits at a small model's host reads (a few hundred microseconds), short enough
/// that a long wait (a large step's tail) mostly sleeps. CUDA's default wait polls without
/// limit while a process has fewer contexts than CPUs.
pub const LONG_WAIT_POLL: Duration = Duration::from_millis(1);

/// How long a worker that moved off its host's CPU may go without a job and still keep away
/// from it: the move lasts a busy stretch (a training loop's steps with their pauses), not the
/// process. On two CPUs a moved worker is confined to one, and kept so it could not use the
/// other while its own was busy (another stream's worker, another process). It takes the CPU
/// back as it takes its first job after such a gap. Not shorter: a worker that came back after
/// each 20 ms pause met the host again and again, and the small MLP's steps after a pause took
/// 2.3 ms in some runs (0.6-0.8 without coming back); waiting for a job with a timeout, to come
/// back while idle, made each wake slow (2.3-2.8 ms).
pub const MOVE_LASTS_IDLE: Duration = Duration::from_secs(1);

/// How a stream's host and worker share the CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// How long a wait for the stream's jobs polls before it sleeps.
    pub wait_poll: Duration,
    /// Whether the worker leaves the CPU of the thread that submitted its job.
    pub keep_apart: bool,
}

impl Pacing {
    /// Short waits and a worker left where the scheduler puts it: for a host whose programs
    /// may take every CPU, where a polling host would take one from them (two-thread steps
    /// 3-10% longer with [`LONG_WAIT_POLL`] on two cores).
    pub const SHARED: Pacing = Pacing {
        wait_poll: SPIN,
        keep_apart: false,
    };

    /// The pacing for programs that use `program_threads` threads on a machine with `cores`
    /// CPUs: the host and the worker are kept apart when that leaves the host a CPU of its own.
    pub fn for_threads(program_threads: usize, cores: usize) -> Pacing {
        if program_threads < cores {
            Pacing {
                wait_poll: LONG_WAIT_POLL,
                keep_apart: true,
            }
        } else {
            Pacing::SHARED
        }
    }
}

/// The CPU the calling thread runs on, or -1 where that cannot be told (not Linux).
pub(crate) fn current_cpu() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: no arguments; returns -1 on failure.
        unsafe { libc::sched_getcpu() }
    }
    #[cfg(not(target_os = "linux"))]
    {
        -1
    }
}

/// A worker's side of the rule above: whether it may move, the CPU it left and how often it
/// moved. Only the worker calls [`Placement::take_job_from`].
pub(crate) struct Placement {
    keep_apart: bool,
    /// The CPU the worker took out of its affinity, or -1.
    left: AtomicI32,
    moves: AtomicU64,
}

impl Placement {
    /// The placement of a worker that moves only when `keep_apart`.
    pub(crate) fn new(keep_apart: bool) -> Placement {
        Placement {
            keep_apart,
            left: AtomicI32::new(-1),
            moves: AtomicU64::new(0),
        }
    }

    /// Whether the worker moves at all (see [`Pacing::keep_apart`]).
    pub(crate) fn keeps_apart(&self) -> bool {
        self.keep_apart
    }

    /// Called by the worker as it takes a job submitted from CPU `from`, `idle` after its last
    /// one: takes back the CPU it left when it was idle [`MOVE_LASTS_IDLE`] or more, then
    /// leaves `from` if it runs there.
    pub(crate) fn take_job_from(&self, from: i32, idle: Duration) {
        if idle >= MOVE_LASTS_IDLE {
            self.come_back();
        }
        self.leave_cpu_of(from);
    }

    /// Moves off CPU `from` when the worker runs on it and may run elsewhere. Its affinity
    /// becomes what it is now (so a restriction made from outside since holds), with the CPU it
    /// left before given back and `from` taken out.
    fn leave_cpu_of(&self, from: i32) {
        if !self.keep_apart || from < 0 || current_cpu() != from {
            return;
        }
        let before = self.left.load(Ordering::Relaxed);
        let Some(set) = affinity::get().and_then(|now| {
            affinity::leaving(now, (before >= 0).then_some(before as usize), from as usize)
        }) else {
            return;
        };
        if affinity::set(&set) {
            self.left.store(from, Ordering::Relaxed);
            self.moves.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives back the CPU the worker left, if any.
    fn come_back(&self) {
        let left = self.left.swap(-1, Ordering::Relaxed);
        if left < 0 {
            return;
        }
        if let Some(mut set) = affinity::get() {
            affinity::add(&mut set, left as usize);
            affinity::set(&set);
        }
    }

    /// How many times the worker moved off its host's CPU.
    pub(crate) fn moves(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }
}

/// The calling thread's CPU affinity, on Linux; elsewhere nothing is read or changed.
mod affinity {
    #[cfg(target_os = "linux")]
    pub(super) type Set = libc::cpu_set_t;
    #[cfg(not(target_os = "linux"))]
    pub(super) type Set = ();

    #[cfg(target_os = "linux")]
    const SIZE: usize = std::mem::size_of::<libc::cpu_set_t>();

    /// The CPUs the calling thread may run on, or `None` when that cannot be read (not Linux,
    /// or more CPUs than a `cpu_set_t` holds: then nothing moves).
    pub(super) fn get() -> Option<Set> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity fills it.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `set` is writable and SIZE bytes long; 0 is the calling thread.
            let r = unsafe { libc::sched_getaffinity(0, SIZE, &mut set) };
            (r == 0).then_some(set)
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// Makes `set` the calling thread's affinity; whether that worked.
    pub(super) fn set(set: &Set) -> bool {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `set` is a valid cpu_set_t of SIZE bytes; 0 is the calling thread.
            unsafe { libc::sched_setaffinity(0, SIZE, set) == 0 }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = set;
            false
        }
    }

    /// Adds `cpu` to `set` (a CPU past what a set holds is ignored).
    pub(super) fn add(set: &mut Set, cpu: usize) {
        #[cfg(target_os = "linux")]
        if cpu < 8 * SIZE {
            // SAFETY: `cpu` is within the set, checked above.
            unsafe { libc::CPU_SET(cpu, set) };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (set, cpu);
    }

    /// Takes `cpu` out of `set` (a CPU past what a set holds is ignored).
    pub(super) fn remove(set: &mut Set, cpu: usize) {
        #[cfg(target_os = "linux")]
        if cpu < 8 * SIZE {
            // SAFETY: `cpu` is within the set, checked above.
            unsafe { libc::CPU_CLR(cpu, set) };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (set, cpu);
    }

    /// The affinity that leaves CPU `from`: `now`, with the CPU left before (`before`) given
    /// back and `from` taken out; `None` when that leaves no CPU.
    pub(super) fn leaving(mut now: Set, before: Option<usize>, from: usize) -> Option<Set> {
        if let Some(b) = before {
            add(&mut now, b);
        }
        remove(&mut now, from);
        (count(&now) > 0).then_some(now)
    }

    /// How many CPUs `set` holds.
    pub(super) fn count(set: &Set) -> usize {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: CPU_COUNT reads the set within its size.
            unsafe { libc::CPU_COUNT(set) as usize }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = set;
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_and_worker_are_kept_apart_when_the_programs_leave_a_cpu_spare() {
        let apart = Pacing::for_threads(1, 2);
        assert!(apart.keep_apart);
        assert_eq!(apart.wait_poll, LONG_WAIT_POLL);
        assert_eq!(Pacing::for_threads(3, 8), apart);
    }

    #[test]
    fn programs_that_may_take_every_cpu_share_them_with_the_host() {
        assert_eq!(Pacing::for_threads(2, 2), Pacing::SHARED);
        assert_eq!(Pacing::for_threads(1, 1), Pacing::SHARED);
    }

    #[cfg(target_os = "linux")]
    fn set_of(cpus: &[usize]) -> affinity::Set {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut s = unsafe { std::mem::zeroed() };
        for &c in cpus {
            affinity::add(&mut s, c);
        }
        s
    }

    #[cfg(target_os = "linux")]
    fn cpus_of(s: &affinity::Set) -> Vec<usize> {
        // SAFETY: CPU_ISSET reads the set within its size.
        (0..1024)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, s) })
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn leaving_a_cpu_takes_it_out_of_what_the_thread_may_use_now() {
        let s = affinity::leaving(set_of(&[0, 1, 3]), None, 1).unwrap();
        assert_eq!(cpus_of(&s), [0, 3]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn leaving_a_second_cpu_gives_the_first_back() {
        let s = affinity::leaving(set_of(&[1]), Some(0), 1).unwrap();
        assert_eq!(cpus_of(&s), [0]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_allowed_one_cpu_cannot_leave_it() {
        assert!(affinity::leaving(set_of(&[2]), None, 2).is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_cpu_past_what_a_set_holds_is_ignored() {
        let s = affinity::leaving(set_of(&[0, 1]), Some(1 << 20), 1 << 21).unwrap();
        assert_eq!(cpus_of(&s), [0, 1]);
    }
}
