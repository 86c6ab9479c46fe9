//! Waves: consecutive steps of a flush that share no written buffer, launched as one unit of
//! stream work whose programs run side by side on the backend's threads. An optimizer step
//! is a hundred small independent updates: one at a time, each too small to split, they leave
//! every core but one idle.

use crate::backend::{Program, SideBySide};
use crate::buffer::Buffer;
use crate::error::Result;
use crate::timeline::{RunTrace, Timeline, Track};
use deferfuse_fusion::{Binding, BufferId};
use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

/// Most steps one wave holds: bounds the work handed over at once (and the sets below).
const MAX_WAVE: usize = 64;

/// Steps with more elements than this run alone, their loops split over every thread: in a
/// wave each program runs whole on one thread, which would leave a big one to one core.
const MAX_WAVE_ELEMS: usize = 1 << 18;

/// A step ready to run: its program, binding and resolved buffers (inputs then outputs).
pub(crate) struct Job {
    pub program: Arc<dyn Program>,
    /// Shared: a captured graph's launches all run the binding it planned once.
    pub binding: Arc<Binding>,
    pub bufs: Vec<Arc<Buffer>>,
    /// Whether a failure marks the outputs failed (strict and defer, where the error surfaces
    /// later); in debug mode it surfaces at the op itself, and a kernel that failed wrote
    /// nothing, so an in-place target keeps its value, as in torch.
    pub poison: bool,
    /// Set while a timeline trace runs: the run records itself.
    pub trace: Option<Box<RunTrace>>,
}

impl Job {
    fn reads(&self) -> impl Iterator<Item = BufferId> + '_ {
        self.binding.operands[..self.binding.n_inputs]
            .iter()
            .map(|t| t.buffer)
    }

    fn writes(&self) -> impl Iterator<Item = BufferId> + '_ {
        self.binding.operands[self.binding.n_inputs..]
            .iter()
            .map(|t| t.buffer)
    }

    /// Elements the job's operands hold: what it costs, roughly, to run.
    fn elems(&self) -> usize {
        self.binding
            .operands
            .iter()
            .map(|t| t.layout.numel())
            .fold(0, usize::saturating_add)
    }

    /// Small enough to run whole on one thread of a wave.
    fn small(&self) -> bool {
        self.binding
            .operands
            .iter()
            .all(|t| t.layout.numel() <= MAX_WAVE_ELEMS)
    }

    /// The outputs, in binding order.
    pub fn outputs(&self) -> &[Arc<Buffer>] {
        &self.bufs[self.binding.n_inputs..]
    }

    /// Runs the job; a traced one records its run on `track`.
    fn run(&self, track: impl FnOnce() -> Track) -> Result<()> {
        let Some(t) = &self.trace else {
            return self.run_untraced();
        };
        let t0 = t.timeline.now();
        let r = self.run_untraced();
        t.finish(track(), t0, r.is_ok());
        r
    }

    fn run_untraced(&self) -> Result<()> {
        // Unread device checks pass on to what is computed from their values, ahead of any
        // the program adds itself (see `checks`).
        let carried: Vec<_> = self.bufs[..self.binding.n_inputs]
            .iter()
            .flat_map(|b| b.carried_checks())
            .collect();
        for b in self.outputs() {
            b.carry_checks(&carried);
        }
        // An input whose producer failed at run time (an index out of bounds) holds no value:
        // its failure passes on to what this job would have computed from it.
        let r = match self.bufs[..self.binding.n_inputs]
            .iter()
            .try_for_each(|b| b.failure())
        {
            // SAFETY: every buffer is allocated, kept alive by `bufs`, large enough for its
            // layout (checked when views are made), and ordered by the stream; no other job
            // of the wave writes a buffer this one touches.
            Ok(()) => unsafe { self.program.run(&self.binding, &self.bufs) },
            Err(e) => Err(e),
        };
        let mut carried = false;
        for b in self.outputs() {
            if let (Err(e), true) = (&r, self.poison) {
                // Every later use of the value reports the failure instead of reading what
                // the buffer happened to hold.
                b.fail(e);
                carried = true;
            }
            b.mark_done();
        }
        // A failure the outputs carry is reported where they are used; reporting it as the
        // stream's error too would raise it once more at the next unrelated sync point, after
        // the user had already seen (and handled) it.
        if carried {
            Ok(())
        } else {
            r
        }
    }
}

/// Jobs gathered for one launch, and the buffers they read and write. Every job of a wave of
/// two or more is small (see [`MAX_WAVE_ELEMS`]).
#[derive(Default)]
pub(crate) struct Wave {
    pub jobs: Vec<Job>,
    /// The buffers the first `noted` jobs read and write. Filled when a job asks to join, not
    /// when one is pushed: a strict op's wave of one never hashes its buffers (a fixed-key
    /// hasher, too: a seeded one drew its seed for every op).
    reads: BufferSet,
    writes: BufferSet,
    noted: usize,
    /// A job too big for a wave is here: it runs alone.
    has_big: bool,
}

/// A set of buffer ids, hashed with fixed keys (ids are ours, not an attacker's).
type BufferSet = HashSet<BufferId, BuildHasherDefault<ahash::AHasher>>;

impl Wave {
    /// True when `job` may run at the same time as every job already here: it writes nothing
    /// they read or write, and reads nothing they write.
    pub fn admits(&mut self, job: &Job) -> bool {
        if self.jobs.len() >= MAX_WAVE || self.has_big || !job.small() {
            return false;
        }
        for j in &self.jobs[self.noted..] {
            self.reads.extend(j.reads());
            self.writes.extend(j.writes());
        }
        self.noted = self.jobs.len();
        self.independent(job.reads(), job.writes())
    }

    /// True when a step reading `reads` and writing `writes` conflicts with no job here.
    fn independent(
        &self,
        mut reads: impl Iterator<Item = BufferId>,
        mut writes: impl Iterator<Item = BufferId>,
    ) -> bool {
        writes.all(|b| !self.writes.contains(&b) && !self.reads.contains(&b))
            && reads.all(|b| !self.writes.contains(&b))
    }

    pub fn push(&mut self, job: Job) {
        self.has_big |= !job.small();
        self.jobs.push(job);
    }

    /// The threads the wave's jobs will share: `side`'s, when there are two jobs or more and
    /// enough work to wake another thread for; else none, and they run one after another.
    pub fn sharing(&self, side: &Option<Arc<dyn SideBySide>>) -> Option<Arc<dyn SideBySide>> {
        let elems = || {
            self.jobs
                .iter()
                .map(Job::elems)
                .fold(0, usize::saturating_add)
        };
        side.as_ref()
            .filter(|s| self.jobs.len() > 1 && s.worth_sharing(elems()))
            .cloned()
    }

    /// The wave's work, leaving the wave empty: one job runs on the stream's thread, several
    /// side by side on `side`'s threads (as `sharing` chose them) or else one by one there.
    /// `stream` names the stream's program track, where a traced job run alone is drawn.
    pub fn take_work(
        &mut self,
        side: Option<Arc<dyn SideBySide>>,
        stream: u64,
    ) -> crate::stream::Work {
        self.reads.clear();
        self.writes.clear();
        self.noted = 0;
        self.has_big = false;
        let jobs = std::mem::take(&mut self.jobs);
        let on_stream = move || Track::StreamDevice(stream);
        Box::new(move || match (jobs.len(), side) {
            (2.., Some(side)) => {
                let run = || side.run_all(jobs.len(), &|k| jobs[k].run(Timeline::worker_track));
                match &jobs[0].trace {
                    None => run(),
                    Some(t) => {
                        let t0 = t.timeline.now();
                        let r = run();
                        let args = vec![("programs", crate::timeline::Arg::U(jobs.len() as u64))];
                        t.timeline.span(on_stream(), "wave", "wave", t0, args);
                        r
                    }
                }
            }
            // Every job runs (they are independent of each other) and fails its own outputs;
            // the first error is the wave's.
            _ => {
                let mut first = Ok(());
                for j in &jobs {
                    let r = j.run(on_stream);
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wave that has noted one step reading buffers 1, 2 and writing 3.
    fn wave() -> Wave {
        let mut w = Wave::default();
        w.reads.extend([1, 2]);
        w.writes.extend([3]);
        w
    }

    #[test]
    fn a_step_on_other_buffers_joins() {
        assert!(wave().independent([4, 5].into_iter(), [6].into_iter()));
    }

    #[test]
    fn steps_reading_the_same_input_join() {
        assert!(wave().independent([1].into_iter(), [7].into_iter()));
    }

    #[test]
    fn a_step_reading_a_written_buffer_waits() {
        assert!(!wave().independent([3].into_iter(), [8].into_iter()));
    }

    #[test]
    fn a_step_writing_a_read_buffer_waits() {
        assert!(!wave().independent([9].into_iter(), [1].into_iter()));
    }

    #[test]
    fn a_step_writing_a_written_buffer_waits() {
        assert!(!wave().independent([9].into_iter(), [3].into_iter()));
    }
}
