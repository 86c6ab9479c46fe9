//! A stream's worker leaves the CPU of the thread that hands it work, when it may run
//! elsewhere (`stream::placement`). Each test pins the submitting thread (and, through a job,
//! the worker) to chosen CPUs, so where the scheduler would put them does not matter; on a
//! machine that lets this process use fewer than two CPUs they have nothing to show and say so.
#![cfg(target_os = "linux")]

use deferfuse_runtime::stream::{Pacing, Stream};
use std::sync::mpsc;

/// The CPUs this thread may use.
fn allowed() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set, filled by sched_getaffinity.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is writable and `size` bytes long; 0 is the calling thread.
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
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

/// Runs a job on the worker that confines it to `cpus`, and waits for it.
fn pin_worker(s: &Stream, cpus: Vec<usize>) {
    s.launch(Box::new(move || {
        pin(&cpus);
        Ok(())
    }));
    s.synchronize().unwrap();
}

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

#[test]
fn a_worker_on_the_submitting_threads_cpu_moves_off_it() {
    let Some((a, _)) = two_cpus() else { return };
    let everything = allowed();
    let s = Stream::new(1, APART).unwrap();
    pin(&[a]);
    pin_worker(&s, vec![a]);
    let moves_before = s.worker_moves();
    let ran_on = worker_cpu(&s);
    pin(&everything);
    assert_ne!(ran_on, a, "the job ran on its submitter's CPU");
    assert_eq!(s.worker_moves(), moves_before + 1);
}

#[test]
fn a_worker_on_another_cpu_stays_where_it_is() {
    let Some((a, b)) = two_cpus() else { return };
    let everything = allowed();
    let s = Stream::new(1, APART).unwrap();
    pin(&[a]);
    pin_worker(&s, vec![b]);
    let moves_before = s.worker_moves();
    let ran_on = worker_cpu(&s);
    pin(&everything);
    assert_eq!(ran_on, b);
    assert_eq!(s.worker_moves(), moves_before);
}

#[test]
fn a_worker_of_shared_pacing_never_moves() {
    let Some((a, _)) = two_cpus() else { return };
    let everything = allowed();
    let s = Stream::new(1, Pacing::SHARED).unwrap();
    pin(&[a]);
    pin_worker(&s, vec![a]);
    let ran_on = worker_cpu(&s);
    pin(&everything);
    assert_eq!(ran_on, a);
    assert_eq!(s.worker_moves(), 0);
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
