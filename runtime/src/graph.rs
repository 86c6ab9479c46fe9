//! Captured graphs: a deferred trace recorded once, planned once, and launched again on new
//! input tensors with no per-op recording, key building or planning.
//!
//! A compiled model's graph issues the same ops on every call, only on new inputs. Recording
//! them op by op costs microseconds each (the host backend's dispatch, the op's checks, the
//! trace key), which for a graph of a thousand small ops is far more than its programs take.
//! So a host backend records the graph once between [`Runtime::graph_capture_begin`] and
//! [`Runtime::graph_capture_end`]: the captured trace's buffers become the graph's buffers
//! (the inputs named at the end become its input slots; the buffers its ops made become
//! fresh buffers of each launch; any other buffer it touches, the graph holds), and its plan
//! and programs are made there, once. [`Runtime::graph_launch`] then binds new input tensors,
//! makes fresh buffers for the rest, and launches the planned steps through the same executor
//! as a flush, so every backend runs it and it keeps stream order with eager work.
//!
//! A capture is refused ([`Error::NotCapturable`]) when replaying it would not give what
//! recording the ops again gives: a sync point or a host read inside it (a value read on the
//! host is baked into what follows), an op issued in strict or debug mode or on another
//! stream, or a random op (its seed and offset are scalars of the trace, and a replay would
//! draw the same numbers again). The captured ops are then left pending as ordinary deferred
//! ops, so nothing is lost.

use crate::backend::Program;
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::handle::Handle;
use crate::mode::Mode;
use crate::runtime::{Runtime, Tensor};
use crate::stats::SyncReason;
use crate::stream::{Pending, Stream};
use deferfuse_fusion::ir::kernel::KernelOp;
use deferfuse_fusion::ir::{DType, Layout, Op};
use deferfuse_fusion::region::KeyMemo;
use deferfuse_fusion::{Binding, BufferId, Region};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A stream's capture in progress (kept in its [`Pending`]).
pub struct Capture {
    /// Buffers with this id or a later one were made while capturing (ids only grow).
    first_buffer: BufferId,
    /// Why the capture cannot be replayed, once something made it so.
    broken: Option<String>,
}

impl Capture {
    /// Marks the capture as not replayable; the first reason is the one reported.
    pub(crate) fn break_with(&mut self, why: String) {
        self.broken.get_or_insert(why);
    }
}

/// What one of a graph's buffers is at a launch.
enum Slot {
    /// The buffer of the launch's input tensors (the first input slot naming it).
    Input,
    /// Made by the captured ops: a new buffer of this many bytes at every launch.
    Fresh(usize),
    /// A buffer the captured ops read or wrote that is neither (a tensor made before the
    /// capture and not passed as an input): every launch uses it, as eager ops would.
    Held(Arc<Buffer>),
}

/// What an input slot takes: a view of exactly this layout and dtype.
struct InputSpec {
    /// Index into [`Graph::slots`].
    buffer: usize,
    layout: Layout,
    dtype: DType,
}

/// A planned step, with its program found once.
struct GraphStep {
    program: Arc<dyn Program>,
    region: Arc<Region>,
    key: KeyMemo,
    binding: Arc<Binding>,
    /// Each binding operand's buffer, as an index into [`Graph::slots`].
    operands: Vec<usize>,
}

/// An output: a view of one of the graph's buffers.
struct OutputSpec {
    buffer: usize,
    layout: Layout,
    dtype: DType,
}

/// A captured graph (see the module doc).
pub struct Graph {
    slots: Vec<Slot>,
    /// Per slot: the bytes its steps' views reach (an input buffer must be this large).
    needs: Vec<usize>,
    inputs: Vec<InputSpec>,
    steps: Vec<GraphStep>,
    outputs: Vec<OutputSpec>,
    /// Elements all the steps' operands hold together (see [`GRAPH_INLINE_MAX_ELEMS`]).
    elems: usize,
}

/// The slots of a capture: each buffer's index, in order of first appearance.
#[derive(Default)]
struct SlotMap {
    slots: Vec<Slot>,
    index: HashMap<BufferId, usize>,
}

impl SlotMap {
    fn add(&mut self, id: BufferId, slot: impl FnOnce() -> Slot) -> usize {
        let n = self.slots.len();
        *self.index.entry(id).or_insert_with(|| {
            self.slots.push(slot());
            n
        })
    }
}

/// The first random op of the trace, if any (a replay would repeat its numbers).
fn random_op(p: &Pending) -> Option<String> {
    p.trace
        .nodes()
        .iter()
        .find(|n| matches!(n.op, Op::Kernel(KernelOp::Random { .. })))
        .map(|n| n.to_string())
}

impl Graph {
    /// Plans the capture's trace (`p`, still pending) as a graph taking `inputs` and giving
    /// `outputs`. Programs come from `exec`'s cache (compiled here when missing).
    fn build(
        p: &Pending,
        first_buffer: BufferId,
        inputs: &[Tensor],
        outputs: &[Tensor],
        exec: &Executor,
        stream: &Stream,
    ) -> Result<Graph> {
        if let Some(op) = random_op(p) {
            return Err(Error::NotCapturable(format!(
                "the random op `{op}` would draw the same numbers at every launch"
            )));
        }
        let mut map = SlotMap::default();
        let specs: Vec<InputSpec> = inputs
            .iter()
            .map(|t| InputSpec {
                buffer: map.add(t.buffer.id, || Slot::Input),
                layout: t.layout.clone(),
                dtype: t.dtype,
            })
            .collect();
        let classify = |b: &Arc<Buffer>| {
            // Made while capturing and not yet written: only the captured ops fill it. One
            // made then with contents (a copy from the host) is a constant of the graph.
            if b.id >= first_buffer && !b.is_allocated() {
                Slot::Fresh(b.len)
            } else {
                Slot::Held(b.clone())
            }
        };
        for b in p.buffers.all() {
            map.add(b.id, || classify(b));
        }
        let outs: Vec<OutputSpec> = outputs
            .iter()
            .map(|t| OutputSpec {
                buffer: map.add(t.buffer.id, || Slot::Held(t.buffer.clone())),
                layout: t.layout.clone(),
                dtype: t.dtype,
            })
            .collect();
        // What a launch's caller can see: its inputs, its outputs, and the buffers the graph
        // holds. The rest is the graph's own, free to fuse away.
        let seen: HashSet<BufferId> = outputs.iter().map(|t| t.buffer.id).collect();
        let live = |id: BufferId| match map.index.get(&id) {
            Some(&k) => !matches!(map.slots[k], Slot::Fresh(_)) || seen.contains(&id),
            None => true,
        };
        let plan = deferfuse_fusion::plan::plan(p.trace.nodes(), &live, &exec.plan_options());
        let mut needs = vec![0; map.slots.len()];
        let mut steps = Vec::with_capacity(plan.steps.len());
        for step in plan.steps {
            let operands = step
                .binding
                .operands
                .iter()
                .map(|t| {
                    let k = *map.index.get(&t.buffer).ok_or_else(|| {
                        Error::Internal(format!(
                            "buffer b{} of a graph step is not tracked",
                            t.buffer
                        ))
                    })?;
                    needs[k] = needs[k].max(t.layout.extent() * t.dtype.size());
                    Ok(k)
                })
                .collect::<Result<Vec<_>>>()?;
            steps.push(GraphStep {
                program: exec.program(&step, stream.id)?,
                region: step.region,
                key: step.key,
                binding: Arc::new(step.binding),
                operands,
            });
        }
        let elems = steps
            .iter()
            .flat_map(|st| &st.binding.operands)
            .map(|t| t.layout.numel())
            .sum();
        let mut g = Graph {
            slots: map.slots,
            needs,
            inputs: specs,
            steps,
            outputs: outs,
            elems,
        };
        g.drop_unused_slots();
        Ok(g)
    }

    /// Drops the slots no step, input or output names: the buffers fused away (most of a
    /// long elementwise chain's), which a launch would otherwise make and drop every time.
    fn drop_unused_slots(&mut self) {
        let mut used = vec![false; self.slots.len()];
        let named = self.inputs.iter().map(|i| i.buffer);
        let named = named.chain(self.outputs.iter().map(|o| o.buffer));
        for k in named.chain(self.steps.iter().flat_map(|s| s.operands.iter().copied())) {
            used[k] = true;
        }
        let mut new_index = vec![usize::MAX; self.slots.len()];
        let mut n = 0;
        for (k, u) in used.iter().enumerate() {
            if *u {
                new_index[k] = n;
                n += 1;
            }
        }
        fn keep<T>(v: &mut Vec<T>, used: &[bool]) {
            let mut k = 0;
            v.retain(|_| {
                k += 1;
                used[k - 1]
            });
        }
        keep(&mut self.slots, &used);
        keep(&mut self.needs, &used);
        let renumber = |k: &mut usize| *k = new_index[*k];
        self.inputs.iter_mut().for_each(|i| renumber(&mut i.buffer));
        self.outputs
            .iter_mut()
            .for_each(|o| renumber(&mut o.buffer));
        for st in &mut self.steps {
            st.operands.iter_mut().for_each(renumber);
        }
    }

    /// The buffers of one launch, by slot: `inputs` checked against the capture, fresh
    /// buffers from `fresh`. Errors name the graph (`name`), the input slot, what the capture
    /// expects and what was given.
    fn bind(
        &self,
        name: &str,
        inputs: Vec<Tensor>,
        fresh: impl Fn(usize) -> Arc<Buffer>,
    ) -> Result<Vec<Arc<Buffer>>> {
        let bad = |m: String| Error::InvalidArgument(format!("graph_launch: {name}: {m}"));
        let mut bound: Vec<Option<Arc<Buffer>>> = vec![None; self.slots.len()];
        // Buffers already bound to a slot: two slots on one buffer would let a step's writes
        // reach another's reads, which the plan did not order.
        let mut taken: HashSet<BufferId> = self
            .slots
            .iter()
            .filter_map(|s| match s {
                Slot::Held(b) => Some(b.id),
                _ => None,
            })
            .collect();
        for (i, (t, spec)) in inputs.into_iter().zip(&self.inputs).enumerate() {
            if t.dtype != spec.dtype || t.layout != spec.layout {
                return Err(bad(format!(
                    "input {i}: expected {} {} (the capture's), given {} {}; capture the graph \
                     again for inputs of another shape, layout or dtype",
                    spec.dtype, spec.layout, t.dtype, t.layout
                )));
            }
            t.buffer.failure()?;
            let need = self.needs[spec.buffer];
            if t.buffer.len < need {
                return Err(bad(format!(
                    "input {i}: expected a buffer of at least {need} bytes (the graph's views \
                     reach that far), given one of {}",
                    t.buffer.len
                )));
            }
            match &bound[spec.buffer] {
                Some(b) if Arc::ptr_eq(b, &t.buffer) => {}
                Some(_) => {
                    return Err(bad(format!(
                        "input {i}: expected a view of the same buffer as an earlier input (as \
                         at capture), given a view of another buffer"
                    )))
                }
                None => {
                    if !taken.insert(t.buffer.id) {
                        return Err(bad(format!(
                            "input {i}: expected a buffer no other input or held tensor of \
                             the graph uses (as at capture), given one that another does"
                        )));
                    }
                    bound[spec.buffer] = Some(t.buffer);
                }
            }
        }
        Ok(bound
            .into_iter()
            .zip(&self.slots)
            .map(|(b, slot)| match (b, slot) {
                (Some(b), _) => b,
                (None, Slot::Held(b)) => b.clone(),
                (None, Slot::Fresh(len)) => fresh(*len),
                // An input slot is bound above: inputs and specs have the same length.
                (None, Slot::Input) => unreachable!("every input slot is bound"),
            })
            .collect())
    }

    /// The buffers a launch reads that eager work may still be writing: inputs and held ones.
    fn external<'a>(&'a self, bufs: &'a [Arc<Buffer>]) -> impl Iterator<Item = &'a Arc<Buffer>> {
        bufs.iter()
            .zip(&self.slots)
            .filter(|(_, s)| !matches!(s, Slot::Fresh(_)))
            .map(|(b, _)| b)
    }
}

/// The most elements (over all its steps' operands) a graph may touch and still run on the
/// launching thread when its stream is idle, as a small strict op does
/// (`STRICT_INLINE_MAX_ELEMS` in `exec.rs`, which is 4096 times smaller): a compiled graph's
/// caller issues little between launches (the next call's Python wrappers), so the overlap
/// the stream's worker would give is worth less than the thread wake-up each hand-off costs.
/// Measured with `bench_compile.py` (the README's torch.compile section): the small MLP's
/// compiled step (its graphs touch about 0.3M to 2M elements) ran 8% faster with its launches
/// inline than handed off; the large MLP's (up to about 13M) did not change. Past this bound a
/// graph's programs run long enough that the caller's next work should overlap them.
const GRAPH_INLINE_MAX_ELEMS: usize = 1 << 22;

impl Executor {
    /// Launches a graph's steps on `bufs` (by slot) in order, as a flush launches its plan;
    /// a failure before launching a step fails the outputs of it and every later one.
    fn launch_graph(
        &self,
        stream: &Stream,
        g: &Graph,
        bufs: &[Arc<Buffer>],
        mode: Mode,
    ) -> Result<()> {
        let jobs = g.steps.iter().map(|st| {
            let operands = st.operands.iter().map(|&k| bufs[k].clone()).collect();
            let region = (&st.region, &st.key);
            self.ready_job(
                st.program.clone(),
                region,
                st.binding.clone(),
                operands,
                mode,
                stream.id,
            )
        });
        let mut launched = 0;
        let debug = mode == Mode::Debug;
        let side_by_side = !debug && g.steps.len() > 1;
        let inline = debug || g.elems <= GRAPH_INLINE_MAX_ELEMS;
        let launch = crate::exec::Launch::waited_for(inline);
        let r = self.launch_each(stream, jobs, side_by_side, launch, true, &mut launched);
        if let (Err(e), false) = (&r, debug) {
            for st in &g.steps[launched..] {
                for &k in &st.operands[st.binding.n_inputs..] {
                    bufs[k].fail(e);
                }
            }
        }
        r
    }
}

impl Runtime {
    /// Starts capturing the ops recorded on `stream` as a graph. What is pending on the
    /// stream runs first, so the capture holds only the graph's ops. Record them in defer
    /// mode, then call [`Runtime::graph_capture_end`] (or [`Runtime::graph_capture_abort`]).
    pub fn graph_capture_begin(&self, stream: Handle) -> Result<()> {
        let s = self.stream(stream)?;
        self.flush(&s, SyncReason::ModeSwitch)?;
        let mut p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.capture.is_some() {
            return Err(Error::InvalidArgument(format!(
                "graph_capture_begin: stream {stream:#x} is already capturing a graph; end or \
                 abort that capture first"
            )));
        }
        if !p.trace.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "graph_capture_begin: another thread recorded ops on stream {stream:#x} while \
                 the capture began; capture on a stream only this thread uses"
            )));
        }
        p.capture = Some(Capture {
            first_buffer: self.next_buffer.load(Ordering::Relaxed),
            broken: None,
        });
        self.captures_active.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Ends the capture on `stream` and returns the new graph's handle: `inputs` (tensor
    /// handles) are its input slots, `outputs` what each launch returns views of. The
    /// captured ops stay pending and run at the next sync point, as deferred ops do; the
    /// graph neither holds nor needs the captured inputs and outputs. A capture that cannot
    /// be replayed is [`Error::NotCapturable`] (see the module doc).
    pub fn graph_capture_end(
        &self,
        stream: Handle,
        inputs: &[Handle],
        outputs: &[Handle],
    ) -> Result<Handle> {
        let s = self.stream(stream)?;
        let cap = self.take_capture(&s, stream)?;
        let named = |what: &str, hs: &[Handle]| -> Result<Vec<Tensor>> {
            hs.iter()
                .enumerate()
                .map(|(i, &h)| {
                    self.tensor(h).map_err(|e| match e {
                        Error::InvalidHandle(m) => {
                            Error::InvalidHandle(format!("graph_capture_end: {what} {i}: {m}"))
                        }
                        e => e,
                    })
                })
                .collect()
        };
        let (inputs, outputs) = (named("input", inputs)?, named("output", outputs)?);
        if let Some(why) = cap.broken {
            return Err(Error::NotCapturable(format!(
                "graph_capture_end: {why} while capturing; the captured ops run as deferred ops"
            )));
        }
        let p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
        let g = Graph::build(&p, cap.first_buffer, &inputs, &outputs, &self.exec, &s)?;
        drop(p);
        self.graphs.insert(Arc::new(g))
    }

    /// Ends the capture on `stream` without making a graph (the captured ops stay pending,
    /// as deferred ops): for a caller whose graph failed halfway.
    pub fn graph_capture_abort(&self, stream: Handle) -> Result<()> {
        let s = self.stream(stream)?;
        self.take_capture(&s, stream).map(drop)
    }

    fn take_capture(&self, s: &Stream, stream: Handle) -> Result<Capture> {
        let mut p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
        let cap = p.capture.take().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "graph capture: stream {stream:#x} has no capture begun; call \
                 graph_capture_begin first"
            ))
        })?;
        self.captures_active.fetch_sub(1, Ordering::Relaxed);
        Ok(cap)
    }

    /// Runs graph `graph` on `stream` with `inputs` (tensor handles, one per input slot, each
    /// of the layout and dtype it had at capture); returns new handles to its outputs. Work
    /// pending on the stream runs first and work recorded later runs after, as for an op;
    /// nothing is recorded.
    pub fn graph_launch(
        &self,
        stream: Handle,
        graph: Handle,
        inputs: &[Handle],
    ) -> Result<Vec<Handle>> {
        let name = format!("graph {graph:#x}");
        let g = self.graphs.get(graph).map_err(|e| match e {
            Error::InvalidHandle(m) => Error::InvalidHandle(format!("graph_launch: {m}")),
            e => e,
        })?;
        if inputs.len() != g.inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "graph_launch: {name}: expected {} inputs (its input slots at capture), given {}",
                g.inputs.len(),
                inputs.len()
            )));
        }
        let tensors = inputs
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                self.tensor(h).map_err(|e| match e {
                    Error::InvalidHandle(m) => {
                        Error::InvalidHandle(format!("graph_launch: {name}: input {i}: {m}"))
                    }
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let s = self.stream(stream)?;
        let bufs = g.bind(&name, tensors, |len| self.new_buffer_bytes(len))?;
        self.break_captures("a graph launch");
        // Eager work pending here may write the inputs: it runs first, in stream order.
        self.flush(&s, SyncReason::ModeSwitch)?;
        self.order_after_other_streams(&s, g.external(&bufs))?;
        let mode = self.mode();
        self.exec.launch_graph(&s, &g, &bufs, mode)?;
        if mode == Mode::Debug {
            s.synchronize()?;
        }
        g.outputs
            .iter()
            .map(|o| {
                self.tensors.insert(Tensor {
                    buffer: bufs[o.buffer].clone(),
                    layout: o.layout.clone(),
                    dtype: o.dtype,
                })
            })
            .collect()
    }

    /// How many input slots and outputs graph `graph` has.
    pub fn graph_arity(&self, graph: Handle) -> Result<(usize, usize)> {
        let g = self.graphs.get(graph)?;
        Ok((g.inputs.len(), g.outputs.len()))
    }

    /// Forgets graph `graph`; launches in flight keep what they use.
    pub fn graph_destroy(&self, graph: Handle) -> Result<()> {
        self.graphs.release(graph).map_err(|e| match e {
            Error::InvalidHandle(m) => Error::InvalidHandle(format!("graph_destroy: {m}")),
            e => e,
        })
    }

    /// An op recorded while some stream captures: one in strict or debug mode, or on a
    /// stream that is not capturing, is not in any capture, so every capture is broken.
    pub(crate) fn note_op_while_capturing(&self, s: &Stream, mode: Mode) {
        if mode != Mode::Defer {
            self.break_captures(&format!("an op ran in {mode:?} mode"));
            return;
        }
        let capturing = s
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capture
            .is_some();
        if !capturing {
            self.break_captures("an op was recorded on another stream");
        }
    }

    /// Marks every capture in progress as not replayable because of `why`.
    pub(crate) fn break_captures(&self, why: &str) {
        if self.captures_active.load(Ordering::Relaxed) == 0 {
            return;
        }
        for s in self.streams.values() {
            let mut p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = &mut p.capture {
                c.break_with(why.to_string());
            }
        }
    }
}
