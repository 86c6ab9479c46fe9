//! Running a whole-program region: one XLA executable per graph and exact signature (the
//! sizes, strides and offsets of every part's views and the sizes of the buffers that cross the
//! boundary), so a training loop that records the same step every iteration compiles it once
//! and then launches it once per flush. Once a second signature of the graph says which of its
//! numbers are the batch (`batch`), every other batch size runs the module of its bucket
//! (`graph_bucket`): a loop whose batch changes compiles at most one more module per bucket.
//!
//! Buffers cross the boundary as flat arrays (`stage::flat_padded`), kept on the device between
//! flushes (`resident::input_arg`): a step's parameters and optimizer state are uploaded once,
//! donated to the program that updates them (see `graph`), and the results become the buffers'
//! device copies. f16, bf16, u8 and bool buffers go through the host, as in one-region programs.

use super::batch::{self, Kind, Template};
use super::client::Executable;
use super::graph::{self, Layout, ScalarKind};
use super::graph_bucket;
use super::launch_checks::LaunchChecks;
use super::resident::{self, DeviceArray};
use super::{compile, stage, Arg, Shared};
use crate::backend::Program;
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use deferfuse_cache::Fingerprint;
use deferfuse_fusion::region::{GraphRegion, Region};
use deferfuse_fusion::Binding;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Signatures kept per graph: a loop alternating between a few shapes (a last, smaller batch)
/// keeps them all; past this the map starts over (the process memo and disk cache still hold
/// the executables).
const MAX_SIGNATURES: usize = 16;

/// Leads a bucketed module's cache key (an exact signature starts with a byte length).
const BUCKET_KEY: u64 = u64::MAX;

/// An executable and what it takes and gives.
struct Compiled {
    exe: Arc<Executable>,
    layout: Layout,
    /// It serves a bucket of batch sizes: it takes the launch's batch, and its arrays are
    /// padded (`Layout::lens`).
    bucketed: bool,
}

/// What the graph knows of its batch (see `batch`).
enum Batch {
    /// No signature seen yet.
    Unknown,
    /// The latest signature: the next different one says which numbers are the batch.
    Seen(Vec<(Kind, i64)>),
    Known(Template),
}

/// A graph's executables and what it learned of its batch.
struct State {
    /// Executables by exact signature, with the batch a bucketed one runs that signature at.
    compiled: HashMap<Vec<u64>, (Arc<Compiled>, usize)>,
    /// Bucketed executables by bucket; `None` where the graph cannot be bucketed.
    buckets: HashMap<usize, Option<Arc<Compiled>>>,
    batch: Batch,
}

/// A graph region's program: compiled per exact signature on first use, and per bucket of
/// batch sizes once two signatures say which numbers are the batch (`graph_bucket`).
pub struct GraphProgram {
    region: Region,
    fingerprint: Fingerprint,
    shared: Arc<Shared>,
    state: Mutex<State>,
}

impl GraphProgram {
    pub fn new(g: GraphRegion, fingerprint: Fingerprint, shared: Arc<Shared>) -> GraphProgram {
        GraphProgram {
            region: Region::Graph(g),
            fingerprint,
            shared,
            state: Mutex::new(State {
                compiled: HashMap::new(),
                buckets: HashMap::new(),
                batch: Batch::Unknown,
            }),
        }
    }

    fn graph(&self) -> &GraphRegion {
        match &self.region {
            Region::Graph(g) => g,
            _ => unreachable!("a GraphProgram holds a graph"),
        }
    }

    /// The executable for binding `b` on `bufs`, and the batch to launch it at (0 for an
    /// exact-size one).
    fn compiled(&self, b: &Binding, bufs: &[Arc<Buffer>]) -> Result<(Arc<Compiled>, usize)> {
        let lens: Vec<usize> = bufs.iter().map(|x| x.len).collect();
        // Everything the module depends on besides the region: each boundary buffer's
        // length, every part's views and iteration space, and whether each matmul reads its
        // old output.
        let numbers = batch::numbers(self.graph(), b, &lens);
        let key: Vec<u64> = numbers.iter().map(|x| x.1 as u64).collect();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = state.compiled.get(&key) {
            return Ok(c.clone());
        }
        let found = match self.bucketed(&mut state, b, &lens, &numbers)? {
            Some(found) => found,
            None => (self.exact(b, &lens, &key)?, 0),
        };
        if state.compiled.len() >= MAX_SIGNATURES {
            state.compiled.clear();
        }
        state.compiled.insert(key, found.clone());
        Ok(found)
    }

    /// The module for `b`'s exact sizes.
    fn exact(&self, b: &Binding, lens: &[usize], key: &[u64]) -> Result<Arc<Compiled>> {
        let elems: Vec<usize> = lens
            .iter()
            .zip(&b.operands)
            .map(|(&l, t)| l / t.dtype.size())
            .collect();
        let (mlir, layout) =
            graph::module(self.graph(), b, &elems, None).map_err(Error::Internal)?;
        let exe = compile::executable(
            &self.shared,
            self.fingerprint,
            key,
            &|| self.region.to_string(),
            || mlir,
        )?;
        Ok(Arc::new(Compiled {
            exe,
            layout,
            bucketed: false,
        }))
    }

    /// The bucketed module serving signature `numbers`, and its batch; `None` (logged with
    /// why) when it runs at its exact sizes: the first signature of the graph, a batch of one,
    /// or a graph or signature the buckets cannot serve.
    fn bucketed(
        &self,
        state: &mut State,
        b: &Binding,
        lens: &[usize],
        numbers: &[(Kind, i64)],
    ) -> Result<Option<(Arc<Compiled>, usize)>> {
        let g = self.graph();
        let t = match &state.batch {
            Batch::Known(t) => t.clone(),
            Batch::Unknown => {
                state.batch = Batch::Seen(numbers.to_vec());
                return Ok(None);
            }
            Batch::Seen(first) => match Template::infer(first, numbers) {
                Ok(t) => {
                    state.batch = Batch::Known(t.clone());
                    t
                }
                Err(why) => {
                    tracing::info!(
                        graph = %self.fingerprint,
                        "whole-flush module compiled for exact sizes: no batch dim found ({why})"
                    );
                    state.batch = Batch::Seen(numbers.to_vec());
                    return Ok(None);
                }
            },
        };
        let Some(n) = t.batch_of(numbers) else {
            tracing::info!(
                graph = %self.fingerprint,
                "whole-flush module compiled for exact sizes: its sizes are not the graph's \
                 batch template's at any batch"
            );
            return Ok(None);
        };
        if n < 2 {
            // A batch of one is its own bucket: the exact module is the bucket's.
            return Ok(None);
        }
        let size = stage::bucket(n);
        if let Some(c) = state.buckets.get(&size) {
            return Ok(c.clone().map(|c| (c, n)));
        }
        let c = match graph_bucket::module(g, &t, b, lens, size) {
            Ok((mlir, layout)) => {
                let mut key = vec![BUCKET_KEY, size as u64];
                key.extend(t.key());
                let exe = compile::executable(
                    &self.shared,
                    self.fingerprint,
                    &key,
                    &|| self.region.to_string(),
                    || mlir,
                )?;
                tracing::debug!(graph = %self.fingerprint, size, "whole-flush module for a bucket");
                Some(Arc::new(Compiled {
                    exe,
                    layout,
                    bucketed: true,
                }))
            }
            Err(why) => {
                tracing::info!(
                    graph = %self.fingerprint,
                    bucket = size,
                    "whole-flush module compiled for exact sizes: it cannot be bucketed ({why})"
                );
                None
            }
        };
        state.buckets.insert(size, c.clone());
        Ok(c.map(|c| (c, n)))
    }

    /// The packed scalar arrays of one launch (see `graph::Layout::scalars`).
    fn scalar_args(&self, c: &Compiled, b: &Binding, batch: usize) -> Result<Vec<Arg>> {
        c.layout
            .scalars
            .iter()
            .map(|(e, srcs)| {
                let mut bytes = Vec::with_capacity(srcs.len() * e.size());
                for s in srcs {
                    if let ScalarKind::Batch = s.kind {
                        bytes.extend((batch as i64).to_ne_bytes());
                        continue;
                    }
                    let bits = b.parts[s.part].scalars[s.slot];
                    bytes.extend(match s.kind {
                        ScalarKind::Param(d) => stage::scalar_bytes(bits, d),
                        ScalarKind::Gemm(d) => stage::gemm_scalar_bytes(bits, d),
                        ScalarKind::F64 | ScalarKind::Batch => bits.to_ne_bytes().to_vec(),
                    });
                }
                let ty = stage::pjrt_type(*e);
                let up = self
                    .shared
                    .client
                    .upload(&bytes, ty, &[srcs.len() as i64])?;
                Ok(Arg::Owned(up))
            })
            .collect()
    }
}

impl Program for GraphProgram {
    unsafe fn run(&self, binding: &Binding, bufs: &[Arc<Buffer>]) -> Result<()> {
        let (c, batch) = self.compiled(binding, bufs)?;
        let mut args = self.scalar_args(&c, binding, batch)?;
        // A bucketed module's arrays are padded: zero past the buffer's elements.
        let flat = |j: usize| {
            let n = bufs[j].len / binding.operands[j].dtype.size();
            stage::flat_padded(n, c.layout.lens[j])
        };
        for &j in &c.layout.inputs {
            let d = binding.operands[j].dtype;
            args.push(resident::input_arg(
                &self.shared,
                &flat(j),
                0,
                d,
                0,
                &bufs[j],
            )?);
        }
        let refs: Vec<_> = args.iter().map(Arg::buf).collect();
        let mut outs = c.exe.execute(&refs)?;
        drop(refs);
        // Donated inputs are consumed: their device copies are replaced just below.
        drop(args);
        let has_checks = !c.layout.checks.is_empty();
        if outs.len() != c.layout.outputs.len() + has_checks as usize {
            return Err(Error::Internal(format!(
                "a whole program returned {} results for {} outputs and {} bounds checks",
                outs.len(),
                c.layout.outputs.len(),
                c.layout.checks.len()
            )));
        }
        // The checks stay on the device until a sync point reads them (`launch_checks`); each
        // output carries those its values flow from, so every later use of a value computed
        // from a bad index reports the check's error, and the other outputs keep theirs.
        let counters = &self.shared.counters;
        let launch = match has_checks {
            true => {
                let flags = outs.pop().expect("the checks are the last result");
                let mut checks = c.layout.checks.clone();
                if c.bucketed {
                    for check in &mut checks {
                        check.size = check.size_at(batch);
                    }
                }
                let launch = Arc::new(LaunchChecks::new(checks, flags, counters.clone()));
                self.shared.unread_checks.add(&launch);
                Some(launch)
            }
            false => None,
        };
        for (k, (out, &j)) in outs.into_iter().zip(&c.layout.outputs).enumerate() {
            let b = &bufs[j];
            if let Some(launch) = &launch {
                let carried: Vec<_> = c.layout.output_checks[k]
                    .iter()
                    .map(|&x| launch.check(x))
                    .collect();
                b.carry_checks(&carried);
            }
            let d = binding.operands[j].dtype;
            let staging = flat(j);
            match stage::dense_key(&staging, 0, d, 0, b.len) {
                Some(k) => {
                    b.set_device_copy(Arc::new(DeviceArray::new(out, k, counters.clone())), true)
                }
                None => {
                    // Widened dtypes (f16, bf16, u8, bool) are stored on the host.
                    let mut host = vec![0u8; stage::staged_len(&staging, 0, d)];
                    out.download(&mut host)?;
                    counters
                        .downloads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    b.host_coherent()?;
                    stage::scatter(&staging, 0, d, b.storage()?.ptr(), 0, &host);
                    b.host_written();
                }
            }
        }
        Ok(())
    }

    fn listing(&self) -> String {
        format!(
            "a whole-program StableHLO module is written per signature as {}-<signature>.mlir",
            self.fingerprint
        )
    }
}
