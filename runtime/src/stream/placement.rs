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
//!   CPU as it takes the job leaves it: its affinity becomes the CPUs it was allowed at its
//!   start less that one. It moves only when the two meet, so where the scheduler keeps them
//!   apart (a usual Linux host) nothing changes, and a process confined to one CPU
//!   (`taskset -c 0`) stays as it is. A host that later lands on the worker's CPU makes the
//!   worker move again.
//!
//! Both together: the MLP's step 0.72-0.73 ms in `bench_models.py`; either alone left it at
//! 0.84-2.03 ms from run to run.

use super::progress::SPIN;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a host with a CPU to itself polls for its stream's jobs before it sleeps: longer
/// than the waits at a small model's host reads (a few hundred microseconds), short enough
/// that a long wait (a large step's tail) mostly sleeps. CUDA's default wait polls without
/// limit while a process has fewer contexts than CPUs.
pub const LONG_WAIT_POLL: Duration = Duration::from_millis(1);

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

/// A worker's side of the rule above: the CPUs it may use and how often it moved.
pub(crate) struct Placement {
    /// The CPUs the worker was allowed at its start; `None` when it is not to move.
    #[cfg(target_os = "linux")]
    allowed: Option<libc::cpu_set_t>,
    moves: AtomicU64,
}

impl Placement {
    /// The placement of a worker spawned by the calling thread (which inherits its CPUs); it
    /// moves only when `keep_apart`.
    pub(crate) fn for_worker_of_this_thread(keep_apart: bool) -> Placement {
        Placement {
            #[cfg(target_os = "linux")]
            allowed: keep_apart.then(allowed_cpus).flatten(),
            moves: AtomicU64::new(0),
        }
    }

    /// Called by the worker as it takes a job submitted from CPU `from`: moves off that CPU
    /// when the worker runs on it and may run elsewhere.
    pub(crate) fn leave_cpu_of(&self, from: i32) {
        #[cfg(target_os = "linux")]
        if let Some(allowed) = &self.allowed {
            if from < 0 || current_cpu() != from {
                return;
            }
            let mut set = *allowed;
            let cpu = from as usize;
            // SAFETY: CPU_CLR and CPU_COUNT only touch the set they are given, within its size
            // (checked for CPU_CLR).
            let others = unsafe {
                if cpu < 8 * std::mem::size_of::<libc::cpu_set_t>() {
                    libc::CPU_CLR(cpu, &mut set);
                }
                libc::CPU_COUNT(&set)
            };
            if others == 0 {
                return;
            }
            // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
            let r =
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
            if r == 0 {
                self.moves.fetch_add(1, Ordering::Relaxed);
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = from;
    }

    /// How many times the worker moved off its host's CPU.
    pub(crate) fn moves(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }
}

/// The CPUs the calling thread may run on, or `None` when that cannot be read.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Option<libc::cpu_set_t> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and of the size passed; 0 is the calling thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
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
}
