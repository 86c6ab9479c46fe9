//! Running a whole-program region: one XLA executable per graph and exact signature (the
//! sizes, strides and offsets of every part's views and the sizes of the buffers that cross the
//! boundary), so a training loop that records the same step every iteration compiles it once
//! and then launches it once per flush.
//!
//! Buffers cross the boundary as flat arrays (`stage::flat`), kept on the device between
//! flushes (`resident::input_arg`): a step's parameters and optimizer state are uploaded once,
//! donated to the program that updates them (see `graph`), and the results become the buffers'
//! device copies. f16, bf16, u8 and bool buffers go through the host, as in one-region programs.

use super::client::Executable;
use super::graph::{self, Layout, ScalarKind};
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

/// An executable and what it takes and gives.
struct Compiled {
    exe: Arc<Executable>,
    layout: Layout,
}

/// A graph region's program: compiled per exact signature on first use.
pub struct GraphProgram {
    region: Region,
    fingerprint: Fingerprint,
    shared: Arc<Shared>,
    /// This graph's executables by exact signature (`signature`).
    compiled: Mutex<HashMap<Vec<u64>, Arc<Compiled>>>,
}

impl GraphProgram {
    pub fn new(g: GraphRegion, fingerprint: Fingerprint, shared: Arc<Shared>) -> GraphProgram {
        GraphProgram {
            region: Region::Graph(g),
            fingerprint,
            shared,
            compiled: Mutex::new(HashMap::new()),
        }
    }

    fn graph(&self) -> &GraphRegion {
        match &self.region {
            Region::Graph(g) => g,
            _ => unreachable!("a GraphProgram holds a graph"),
        }
    }

    /// Everything the module depends on besides the region: each boundary buffer's length,
    /// every part's views and iteration space, and whether each matmul reads its old output.
    fn signature(&self, b: &Binding, bufs: &[Arc<Buffer>]) -> Vec<u64> {
        let mut k: Vec<u64> = bufs.iter().map(|x| x.len as u64).collect();
        for (part, pb) in self.graph().parts.iter().zip(&b.parts) {
            for t in &pb.operands {
                let l = &t.layout;
                k.push(l.offset as u64);
                k.push(l.rank() as u64);
                k.extend(l.sizes.iter().map(|&s| s as u64));
                k.extend(l.strides.iter().map(|&s| s as u64));
            }
            if let Some(it) = &pb.iter {
                k.push(it.rank() as u64 | (it.reduced as u64) << 32);
                k.extend(it.sizes.iter().map(|&s| s as u64));
                for st in &it.strides {
                    k.extend(st.iter().map(|&s| s as u64));
                }
            }
            if matches!(*part.region, Region::Matmul { .. }) {
                k.push((f64::from_bits(pb.scalars[1]) == 0.0) as u64);
            }
        }
        k
    }

    fn compiled(&self, b: &Binding, bufs: &[Arc<Buffer>]) -> Result<Arc<Compiled>> {
        let key = self.signature(b, bufs);
        let mut map = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let lens: Vec<usize> = bufs
            .iter()
            .zip(&b.operands)
            .map(|(x, t)| x.len / t.dtype.size())
            .collect();
        let (mlir, layout) = graph::module(self.graph(), b, &lens);
        let exe = compile::executable(
            &self.shared,
            self.fingerprint,
            &key,
            &|| self.region.to_string(),
            || mlir,
        )?;
        if map.len() >= MAX_SIGNATURES {
            map.clear();
        }
        let c = Arc::new(Compiled { exe, layout });
        map.insert(key, c.clone());
        Ok(c)
    }

    /// The packed scalar arrays of one launch (see `graph::Layout::scalars`).
    fn scalar_args(&self, c: &Compiled, b: &Binding) -> Result<Vec<Arg>> {
        c.layout
            .scalars
            .iter()
            .map(|(e, srcs)| {
                let mut bytes = Vec::with_capacity(srcs.len() * e.size());
                for s in srcs {
                    let bits = b.parts[s.part].scalars[s.slot];
                    bytes.extend(match s.kind {
                        ScalarKind::Param(d) => stage::scalar_bytes(bits, d),
                        ScalarKind::Gemm(d) => stage::gemm_scalar_bytes(bits, d),
                        ScalarKind::F64 => bits.to_ne_bytes().to_vec(),
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
        let c = self.compiled(binding, bufs)?;
        let mut args = self.scalar_args(&c, binding)?;
        let flat = |j: usize| stage::flat(bufs[j].len / binding.operands[j].dtype.size());
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
                let checks = c.layout.checks.clone();
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
