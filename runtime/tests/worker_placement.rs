//! A stream's worker leaves the CPU of the thread that hands it work, when it may run
//! elsewhere (`stream::placement`). Each test pins the submitting thread (and, through a job,
//! the worker) to chosen CPUs, so where the scheduler would put them does not matter; on a
//! machine that lets this process use fewer than two CPUs they have nothing to show and say so.
#![cfg(target_os = "linux")]

use deferfuse_runtime::stream::{Pacing, Stream, MOVE_LASTS_IDLE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

/// The CPUs this thread may use.
fn allowed() -> Vec<usize> {
    allowed_of(0)
}

/// The CPUs thread `tid` may use (0: this one).
fn allowed_of(tid: libc::pid_t) -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set, filled by sched_getaffinity.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is writable and `size` bytes long.
    assert_eq!(unsafe { libc::sched_getaffinity(tid, size, &mut set) }, 0);
    // SAFETY: CPU_ISSET reads the set within its size.
    (0..8 * size)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Confines the calling thread to `cpus`.
fn pin(cpus: &[usize]) {
    // SAFETY: as in `allowed`; CPU_SET writes within the set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid set of `size` bytes; 0 is the calling thread.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &set) }, 0);
}

fn cpu() -> usize {
    // SAFETY: no arguments.
    unsafe { libc::sched_getcpu() as usize }
}

/// Two CPUs this test may use, or `None` (with a note) where it has fewer.
fn two_cpus() -> Option<(usize, usize)> {
    let cpus = allowed();
    if cpus.len() < 2 {
        eprintln!("skipped: this process may use {} CPU(s)", cpus.len());
        return None;
    }
    Some((cpus[0], cpus[1]))
}

const APART: Pacing = Pacing {
    wait_poll: deferfuse_runtime::stream::LONG_WAIT_POLL,
    keep_apart: true,
};

/// The CPU the worker runs the next job on, launched from the calling thread.
fn worker_cpu(s: &Stream) -> usize {
    let (tx, rx) = mpsc::channel();
    s.launch(Box::new(move || {
        tx.send(cpu()).unwrap();
        Ok(())
    }));
    s.synchronize().unwrap();
    rx.recv().unwrap()
}

/// Queues, from this thread (pinned to `a`), a job that keeps the worker on `a` until the next
/// job is queued and then lets it use `a` and `b`; returns the CPU that next job runs on. The
/// worker takes the next job at once, still on `a`: no balancer has had time to move it.
fn next_job_cpu_after_holding_on(s: &Stream, a: usize, b: usize) -> usize {
    let queued = Arc::new(AtomicBool::new(false));
    let q = queued.clone();
    s.launch(Box::new(move || {
        pin(&[a]);
        while !q.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        pin(&[a, b]);
        Ok(())
    }));
    let (tx, rx) = mpsc::channel();
    s.launch(Box::new(move || {
        tx.send(cpu()).unwrap();
        Ok(())
    }));
    queued.store(true, Ordering::Release);
    s.synchronize().unwrap();
    rx.recv().unwrap()
}

#[test]
fn a_worker_on_the_submitting_threads_cpu_moves_off_it() {
    let Some((a, b)) = two_cpus() else { return };
    let everything = allowed();
    let s = Stream::new(1, APART).unwrap();
    pin(&[a]);
    let ran_on = next_job_cpu_after_holding_on(&s, a, b);
    let moves = s.worker_moves();
    drop(s);
    pin(&everything);
    assert_eq!(ran_on, b, "the job ran on its submitter's CPU");
    assert!(moves >= 1);
}

#[test]
fn a_worker_of_shared_pacing_stays_on_the_submitting_threads_cpu() {
    let Some((a, b)) = two_cpus() else { return };
    let everything = allowed();
    let s = Stream::new(1, Pacing::SHARED).unwrap();
    pin(&[a]);
    let ran_on = next_job_cpu_after_holding_on(&s, a, b);
    let moves = s.worker_moves();
    drop(s);
    pin(&everything);
    assert_eq!(ran_on, a);
    assert_eq!(moves, 0);
}

#[test]
fn a_moved_worker_takes_its_cpu_back_at_its_first_job_after_an_idle_spell() {
    let Some((a, b)) = two_cpus() else { return };
    let everything = allowed();
    let s = Stream::new(1, APART).unwrap();
    let (tx, rx) = mpsc::channel();
    s.launch(Box::new(move || {
        // SAFETY: no arguments.
        tx.send(unsafe { libc::gettid() }).unwrap();
        Ok(())
    }));
    let worker = rx.recv().unwrap();
    pin(&[a]);
    let ran_on = next_job_cpu_after_holding_on(&s, a, b);
    let while_busy = allowed_of(worker);
    std::thread::sleep(MOVE_LASTS_IDLE + MOVE_LASTS_IDLE / 5);
    // From `a`, where the worker (kept on `b`) does not run: this job makes no new move.
    s.launch(Box::new(|| Ok(())));
    s.synchronize().unwrap();
    let after_idle = allowed_of(worker);
    drop(s);
    pin(&everything);
    assert_eq!(ran_on, b, "the worker moved off {a}");
    assert!(
        !while_busy.contains(&a),
        "kept off {a} while busy: {while_busy:?}"
    );
    assert!(
        after_idle.contains(&a) && after_idle.contains(&b),
        "after idle: {after_idle:?}"
    );
}

#[test]
fn a_worker_started_on_one_cpu_stays_on_it() {
    let Some((a, _)) = two_cpus() else { return };
    let everything = allowed();
    // The worker inherits this thread's one CPU, as in a process run under `taskset -c a`.
    pin(&[a]);
    let s = Stream::new(1, APART).unwrap();
    let ran_on = worker_cpu(&s);
    let moves = s.worker_moves();
    drop(s);
    pin(&everything);
    assert_eq!(ran_on, a);
    assert_eq!(moves, 0);
}
