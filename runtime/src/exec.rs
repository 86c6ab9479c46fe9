//! Execution: turns a stream's pending trace into steps (through the planner), finds or compiles
//! each step's program, and launches it on the stream's worker.
//!
//! The [`Executor`] owns everything between a sync point and a launch (the backend, the program
//! cache, the dump directory, the waves); the runtime keeps handles, streams, modes and
//! recording, and calls in here. Nothing here calls back into the runtime.

use crate::backend::{Backend, Program, SideBySide};
use crate::buffer::{Buffer, Writer};
use crate::error::{Error, Result};
use crate::mode::Mode;
use crate::stats::Counters;
use crate::stream::{BufferLookup, OpBuffers, Stream};
use crate::timeline::{binding_args, region_label, Arg, RunTrace, Timeline, Track};
use crate::wave::{Job, Wave};
use deferfuse_cache::{fingerprint, Fingerprint, ProgramCache};
use deferfuse_fusion::node_cache::{Lookup, NodeCache};
use deferfuse_fusion::plan::PlanOptions;
use deferfuse_fusion::region::KeyMemo;
use deferfuse_fusion::{Binding, BufferId, Node, Region, Step};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod ahead;
mod flush;

/// The most elements (over all operands) a strict op may touch and still run on the calling
/// thread when its stream is idle: handing it to the stream's worker costs a thread wake-up
/// (microseconds; on a loaded machine a scheduler slice) that is more than such an op's whole
/// run, while a larger op gains from running while the host records the next one. The op's
/// result, errors and stream order are the same either way (`Stream::launch_or_run`).
const STRICT_INLINE_MAX_ELEMS: usize = 1 << 14;

/// A stream's cache of ops run alone (strict, debug): each structure's lowered steps, with
/// the program of each step (shared: a hit takes them with one reference count).
pub(crate) type OpPlans = NodeCache<Arc<[Arc<dyn Program>]>>;

/// A step's run time in the unit of [`STRICT_INLINE_MAX_ELEMS`]: a loop's elements over all
/// operands; a GEMM's multiply-adds / 4 (its kernel does several per element a loop moves),
/// since its operands' sizes say little about its work: a one-row `[1, 128] @ [128, 384]`
/// touches 49,000 elements in ~3 us, less than its hand-off to the worker costs. (A strict
/// step has no epilogue: its operands are a, b, out.)
fn inline_cost(step: &Step) -> usize {
    let ops = &step.binding.operands;
    match &*step.region {
        Region::Matmul { .. } => {
            let k = ops[0].layout.sizes.last().copied().unwrap_or(1);
            ops[2].layout.numel() * k / 4
        }
        _ => ops.iter().map(|t| t.layout.numel()).sum(),
    }
}

/// How launched work reaches its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Launch {
    /// Queued behind the stream's work, for its worker; the host goes on.
    Queue,
    /// The caller waits for it next: run on the calling thread when the stream is idle, else
    /// queued (see [`Stream::launch_or_run`]).
    RunIfIdle,
    /// Run on the calling thread now, ahead of the stream's queued work, and outside its
    /// sequence: only for work that touches nothing queued work touches (see
    /// `ahead::split_ahead`), so the order it runs in cannot be told apart. A launch error
    /// (a compile, an allocation) is returned at once; a run's failure marks its outputs
    /// failed, for the read to report.
    Ahead,
}

impl Launch {
    /// [`Launch::RunIfIdle`] when the caller waits for the work next, else [`Launch::Queue`].
    pub(crate) fn waited_for(inline: bool) -> Launch {
        if inline {
            Launch::RunIfIdle
        } else {
            Launch::Queue
        }
    }
}

/// Flush -> plan -> fingerprint -> program cache -> launch, for one runtime.
pub(crate) struct Executor {
    /// Compiles regions; says what a region may hold (the planner cuts by it).
    pub(crate) backend: Box<dyn Backend>,
    /// Compiled programs by region fingerprint.
    pub(crate) cache: ProgramCache<Arc<dyn Program>>,
    /// Where each newly compiled region is written (`Config::dump_dir`).
    dump_dir: Option<PathBuf>,
    /// The runtime's counters (shared: recording counts ops, execution counts the rest).
    counters: Arc<Counters>,
    /// The runtime's timeline; programs launched here record their runs into it.
    timeline: Arc<Timeline>,
    /// Threads one program may split its loops over (what a timed run reports).
    threads: usize,
    /// Most ops the planner puts in one loop region (`Config::max_ops_per_region`).
    max_ops_per_region: usize,
}

/// What an [`Executor`] is made of; the runtime builds them from its config.
pub(crate) struct ExecutorParts {
    pub backend: Box<dyn Backend>,
    pub cache_capacity: usize,
    pub dump_dir: Option<PathBuf>,
    pub counters: Arc<Counters>,
    pub timeline: Arc<Timeline>,
    pub threads: usize,
    pub max_ops_per_region: usize,
}

impl Executor {
    pub(crate) fn new(p: ExecutorParts) -> Executor {
        Executor {
            backend: p.backend,
            cache: ProgramCache::new(p.cache_capacity),
            dump_dir: p.dump_dir,
            counters: p.counters,
            timeline: p.timeline,
            threads: p.threads,
            max_ops_per_region: p.max_ops_per_region,
        }
    }

    /// How this runtime's flushes (and graph captures) are planned.
    /// Whether the backend compiles a whole flush as one program (PJRT's whole-flush mode).
    pub(crate) fn fuses_whole_programs(&self) -> bool {
        self.backend.capabilities().fuses_whole_programs
    }

    pub(crate) fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            fuse: true,
            max_ops_per_region: self.max_ops_per_region,
            capabilities: self.backend.capabilities(),
            read_node: None,
        }
    }

    /// Runs one node now (strict and debug modes). The stream's [`OpPlans`] give the steps
    /// and programs of a node whose structure ran before (re-bound to this node's buffers and
    /// scalars); a new structure is lowered and its programs found in the program cache, and
    /// kept there once every program was found.
    pub(crate) fn run_now(
        &self,
        stream: &Stream,
        node: Node,
        buffers: OpBuffers,
        mode: Mode,
    ) -> Result<()> {
        let mut plans = stream.op_plans.lock().unwrap_or_else(|p| p.into_inner());
        let (steps, reused, miss) = match plans.lower(&node) {
            Lookup::Hit { steps, payload } => (steps, Some(payload.clone()), None),
            Lookup::Miss { steps, miss } => (steps, None, Some(miss)),
        };
        drop(plans);
        if let Some(programs) = &reused {
            self.counters
                .strict_plans_reused
                .fetch_add(1, Ordering::Relaxed);
            // Found without a lookup, but found compiled all the same: `cache_hits` counts
            // them as before.
            self.cache.count_hits(programs.len() as u64);
        }
        // Debug mode waits for every op: it may as well run it on this thread. So does a
        // small strict op when its stream is idle (see STRICT_INLINE_MAX_ELEMS).
        let small = || {
            steps
                .iter()
                .all(|s| inline_cost(s) <= STRICT_INLINE_MAX_ELEMS)
        };
        let inline = mode == Mode::Debug || (mode == Mode::Strict && small());
        let n_steps = steps.len();
        let mut found = Vec::new();
        let jobs = steps.into_iter().enumerate().map(|(i, step)| {
            self.prepare(step, &buffers, mode, stream.id, |step| match &reused {
                Some(programs) => Ok(programs[i].clone()),
                None => {
                    let p = self.program(step, stream.id)?;
                    found.push(p.clone());
                    Ok(p)
                }
            })
        });
        // Strict and debug report a failure at the op: nothing to fail for later readers.
        let r = self.launch_each(
            stream,
            jobs,
            false,
            Launch::waited_for(inline),
            false,
            &mut 0,
        );
        if let Some(miss) = miss.filter(|_| found.len() == n_steps) {
            let mut plans = stream.op_plans.lock().unwrap_or_else(|p| p.into_inner());
            plans.insert(miss, found.into());
        }
        r?;
        if mode == Mode::Debug {
            stream.synchronize()?;
        }
        Ok(())
    }

    /// Launches a deferred flush's `steps` in order. A failure (an allocation, a compile) marks
    /// the outputs of the failing and every later step as failed, so reading them later
    /// reports the error instead of stale memory. `launch`: how they reach the stream; with
    /// `one_unit` all their waves are handed over as one unit of work (see
    /// [`Executor::launch_each`]).
    fn launch_steps(
        &self,
        stream: &Stream,
        steps: Vec<Step>,
        buffers: &impl BufferLookup,
        launch: Launch,
        one_unit: bool,
    ) -> Result<()> {
        let outputs: Vec<Vec<BufferId>> = steps.iter().map(|s| outputs_of(s).collect()).collect();
        let mut launched = 0;
        // Independent steps run side by side where the backend can.
        let side_by_side = steps.len() > 1;
        let jobs = steps.into_iter().map(|step| {
            let program = |step: &Step| self.program(step, stream.id);
            self.prepare(step, buffers, Mode::Defer, stream.id, program)
        });
        let r = self.launch_each(stream, jobs, side_by_side, launch, one_unit, &mut launched);
        if let Err(e) = &r {
            for id in outputs[launched..].iter().flatten() {
                if let Some(b) = buffers.find(*id) {
                    b.fail(e);
                }
            }
        }
        r
    }

    /// Launches `jobs` in order, consecutive independent ones as one wave when `side_by_side`
    /// and the backend can; `launched` counts the jobs launched (on an error, the ones before
    /// the failing job ran and the caller fails the rest's outputs). With `one_unit`, all the
    /// waves are handed to the stream as one unit of work: a captured graph's launch, or the
    /// part of a flush the host does not wait for, where handing each wave over (a channel
    /// send and a worker wake-up each, and the throttle's waits) cost more than its small
    /// programs take to run. With [`Launch::Ahead`] the waves run here and the first error of
    /// any is returned, after the rest ran (as within a unit).
    pub(crate) fn launch_each(
        &self,
        stream: &Stream,
        jobs: impl Iterator<Item = Result<Job>>,
        side_by_side: bool,
        launch: Launch,
        one_unit: bool,
        launched: &mut usize,
    ) -> Result<()> {
        let side = match side_by_side {
            true => self.backend.side_by_side(),
            false => None,
        };
        let mut wave = Wave::default();
        let mut unit = one_unit.then(Unit::default);
        let mut r = Ok(());
        let mut ran = Ok(());
        for job in jobs {
            let job = match job {
                Ok(job) => job,
                Err(e) => {
                    // The steps before this one run; this and later ones are failed.
                    r = Err(e);
                    break;
                }
            };
            if side.is_none() || !wave.admits(&job) {
                let w = self.launch_wave(stream, &mut wave, &side, launch, unit.as_mut(), launched);
                ran = ran.and(w);
            }
            wave.push(job);
        }
        let w = self.launch_wave(stream, &mut wave, &side, launch, unit.as_mut(), launched);
        ran = ran.and(w);
        if let Some(unit) = unit {
            ran = ran.and(self.launch_unit(stream, unit, launch));
        }
        ran.and(r)
    }

    /// Resolves a step's buffers, gets its program from `program` (the program cache, or a
    /// strict op's cached plan) and allocates its outputs.
    fn prepare(
        &self,
        step: Step,
        buffers: &impl BufferLookup,
        mode: Mode,
        stream: u64,
        program: impl FnOnce(&Step) -> Result<Arc<dyn Program>>,
    ) -> Result<Job> {
        let bufs: Vec<Arc<Buffer>> = step
            .binding
            .operands
            .iter()
            .map(|t| {
                buffers.find(t.buffer).cloned().ok_or_else(|| {
                    Error::Internal(format!("buffer b{} of a step is not tracked", t.buffer))
                })
            })
            .collect::<Result<_>>()?;
        if mode == Mode::Debug {
            check_bounds(&step, &bufs)?;
        }
        let program = program(&step)?;
        self.ready_job(
            program,
            (&step.region, &step.key),
            Arc::new(step.binding),
            bufs,
            mode,
            stream,
        )
    }

    /// A job of `program` on `bufs` (the binding's operands, resolved), allocating the
    /// storage of the buffers nothing has written yet. A captured graph's launch makes its
    /// jobs here too, from the steps it planned once.
    pub(crate) fn ready_job(
        &self,
        program: Arc<dyn Program>,
        region: (&Arc<Region>, &KeyMemo),
        binding: Arc<Binding>,
        bufs: Vec<Arc<Buffer>>,
        mode: Mode,
        stream: u64,
    ) -> Result<Job> {
        for (j, b) in bufs.iter().enumerate() {
            if !b.is_allocated() {
                // A first writer that covers every byte needs no zero-fill.
                let t = &binding.operands[j];
                let covers = j >= binding.n_inputs
                    && t.layout.is_contiguous()
                    && t.layout.offset == 0
                    && t.layout.numel() * t.dtype.size() == b.len;
                if covers {
                    b.storage_for_overwrite()?;
                } else {
                    b.storage()?;
                }
                self.counters
                    .bytes_allocated
                    .fetch_add(b.len as u64, Ordering::Relaxed);
            }
        }
        let trace = self
            .timeline
            .timing()
            .then(|| self.run_trace(region, &binding, stream));
        Ok(Job {
            program,
            binding,
            bufs,
            poison: mode != Mode::Debug,
            trace,
        })
    }

    /// What a timed run of a region records (and the region, noted once per trace).
    fn run_trace(
        &self,
        (region, key): (&Arc<Region>, &KeyMemo),
        binding: &Binding,
        stream: u64,
    ) -> Box<RunTrace> {
        // Set by `program`, which ran first.
        let fingerprint = key.get_or_init(|| fingerprint(region, self.backend.identity()).0);
        // A profiler's clock alone needs only the run's time, not its description.
        let (label, shapes, bytes) = if self.timeline.describes() {
            self.timeline.note_region(fingerprint, region);
            let (shapes, bytes) = binding_args(binding);
            (region_label(region), shapes, bytes)
        } else {
            (String::new(), String::new(), 0)
        };
        Box::new(RunTrace {
            timeline: self.timeline.clone(),
            stream,
            label,
            fingerprint,
            shapes,
            bytes,
            threads: self.threads,
            tag: Timeline::tag(),
        })
    }

    /// Launches the wave's jobs (if any) as one unit of stream work, or adds them to `unit`;
    /// the error is a [`Launch::Ahead`] run's.
    fn launch_wave(
        &self,
        stream: &Stream,
        wave: &mut Wave,
        side: &Option<Arc<dyn SideBySide>>,
        launch: Launch,
        unit: Option<&mut Unit>,
        launched: &mut usize,
    ) -> Result<()> {
        if wave.jobs.is_empty() {
            return Ok(());
        }
        if launch != Launch::Ahead {
            // Before the work can start: a later flush that runs ahead checks against it.
            let newest = wave.jobs.iter().flat_map(|j| &j.bufs).map(|b| b.id).max();
            if let Some(id) = newest {
                stream.note_queued_buffer(id);
            }
        }
        let outputs: Vec<Arc<Buffer>> = wave
            .jobs
            .iter()
            .flat_map(|j| j.outputs().iter().cloned())
            .collect();
        for b in &outputs {
            b.mark_launched();
        }
        let n = wave.jobs.len();
        let side = wave.sharing(side);
        if side.is_some() {
            self.counters
                .programs_side_by_side
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        let work = wave.take_work(side, stream.id);
        self.counters
            .programs_run
            .fetch_add(n as u64, Ordering::Relaxed);
        *launched += n;
        match unit {
            Some(u) => {
                u.works.push(work);
                u.outputs.extend(outputs);
                Ok(())
            }
            None => self.launch_unit(
                stream,
                Unit {
                    works: vec![work],
                    outputs,
                },
                launch,
            ),
        }
    }

    /// Hands `unit` to the stream (its waves run in order; the first error is the unit's)
    /// and records the stream as its outputs' writer; the error is a [`Launch::Ahead`]
    /// run's.
    fn launch_unit(&self, stream: &Stream, unit: Unit, launch: Launch) -> Result<()> {
        let Unit { mut works, outputs } = unit;
        let work = match works.len() {
            0 => return Ok(()),
            1 => works.pop().expect("one work"),
            _ => Box::new(move || {
                let mut first = Ok(());
                for w in works {
                    let r = w();
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            }),
        };
        let (seq, r) = match launch {
            Launch::Queue => (stream.launch(work), Ok(())),
            Launch::RunIfIdle => (stream.launch_or_run(work), Ok(())),
            // Job 0 of the stream: a wait for it is over at once (the work has run).
            Launch::Ahead => (0, crate::stream::run_caught(work)),
        };
        for b in &outputs {
            b.set_writer(Writer {
                stream: stream.id,
                done: Some((stream.progress.clone(), seq)),
            });
        }
        r
    }

    /// The step's program from the cache, or compiled (a compile is a span on `stream`'s
    /// host track while tracing).
    pub(crate) fn program(
        &self,
        step: &Step,
        stream: u64,
    ) -> Result<Arc<dyn crate::backend::Program>> {
        let key = Fingerprint(
            step.key
                .get_or_init(|| fingerprint(&step.region, self.backend.identity()).0),
        );
        let backend = &self.backend;
        let dump = self.dump_dir.clone();
        self.cache
            .get_or_compile(key, || {
                let t0 = self.timeline.on().then(|| self.timeline.now());
                let p = backend.compile(&step.region)?;
                if let Some(t0) = t0 {
                    let ms = (self.timeline.now() - t0) as f64 / 1e6;
                    let args = vec![
                        ("fingerprint", Arg::S(key.to_string())),
                        ("ms", Arg::F(ms)),
                        ("backend", Arg::S(backend.name().into())),
                    ];
                    let name = format!("compile {}", region_label(&step.region));
                    self.timeline
                        .span(Track::StreamHost(stream), "compile", name, t0, args);
                }
                if let Some(dir) = dump {
                    crate::dump::write_region(&dir, key, &step.region, &p.listing());
                }
                Ok::<_, Error>(p)
            })
            // The compiler's message as before; the key is in the dump and the timeline.
            .map_err(|e| Error::Backend(e.reason))
    }
}

/// Waves gathered to be handed to a stream as one unit of work, and the buffers they write.
#[derive(Default)]
struct Unit {
    works: Vec<crate::stream::Work>,
    outputs: Vec<Arc<Buffer>>,
}

/// Debug-mode check: every operand's view lies inside its buffer.
fn check_bounds(step: &Step, bufs: &[Arc<Buffer>]) -> Result<()> {
    for (t, b) in step.binding.operands.iter().zip(bufs) {
        let need = t.layout.extent() * t.dtype.size();
        if need > b.len {
            return Err(Error::Internal(format!(
                "debug check: a view of buffer b{} needs {need} bytes but the buffer has {}",
                t.buffer, b.len
            )));
        }
    }
    Ok(())
}

/// Marks every output of `steps` failed with `e` (they were never launched).
fn fail_outputs(steps: &[Step], buffers: &impl BufferLookup, e: &Error) {
    for id in steps.iter().flat_map(outputs_of) {
        if let Some(buf) = buffers.find(id) {
            buf.fail(e);
        }
    }
}

/// The buffers `step` writes: its binding's operands after the inputs.
fn outputs_of(step: &Step) -> impl Iterator<Item = BufferId> + '_ {
    let b = &step.binding;
    b.operands[b.n_inputs..].iter().map(|t| t.buffer)
}
