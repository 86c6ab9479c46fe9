//! Backends: they differ in what they fuse, not in how they are driven. A backend compiles a
//! [`Region`] into a [`Program`]; the executor runs programs on resolved buffers.

pub mod cpu;
pub mod host_kernels;
pub mod pjrt;

use crate::buffer::Buffer;
use crate::config::{resolve_backend, resolve_pjrt_plugin, BackendKind, Config};
use crate::error::Result;
use deferfuse_fusion::plan::Capabilities;
use deferfuse_fusion::{Binding, Region};
use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;

/// Creates the backend `config` (or the environment) selects; `dump_dir` is
/// `DEFERFUSE_DUMP_DIR`; `threads` is how many threads a CPU program may use.
pub fn create(
    config: &Config,
    dump_dir: Option<PathBuf>,
    threads: usize,
) -> Result<Box<dyn Backend>> {
    Ok(match resolve_backend(config)? {
        BackendKind::Cpu => Box::new(cpu::CpuBackend::new(dump_dir.is_some(), threads)?),
        BackendKind::Pjrt => {
            let plugin = resolve_pjrt_plugin(config)?;
            Box::new(pjrt::PjrtBackend::new(&plugin, dump_dir)?)
        }
    })
}

/// What a backend counts itself (`Stats::backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    /// Executables compiled for concrete (bucketed) shapes: the PJRT backend compiles one per
    /// region and shape bucket, one per whole program and signature, and one per relayout; 0
    /// on the CPU backend, whose programs serve every shape.
    pub shape_compiles: u64,
    /// Nanoseconds those compiles took, plus loading executables from the disk cache.
    pub shape_compile_ns: u64,
    /// PJRT executables loaded from the disk cache (`DEFERFUSE_CACHE_DIR`) instead of compiled.
    pub disk_cache_hits: u64,
    /// Damaged disk-cache entries found, removed and recompiled (each also logs a warning).
    pub disk_cache_corrupt: u64,
    /// Operand arrays copied from host to device. Values a program produced, and inputs
    /// uploaded once, stay on the device for later programs.
    pub device_uploads: u64,
    /// Arrays copied from device to host: a host read of a value that lives on the device, or
    /// a result written through a partial view.
    pub device_downloads: u64,
    /// Operands a program took from the device copy of their buffer instead of an upload.
    pub device_resident_hits: u64,
    /// Bytes of device memory holding buffers' values now (padded arrays); a buffer's device
    /// copy is freed with the buffer.
    pub device_resident_bytes: u64,
}

/// A buffer's value kept in a backend's device memory (see `buffer`'s module doc): opaque to
/// the runtime, which only asks it to write itself back into the host bytes.
pub trait DeviceValue: Send + Sync {
    /// For the backend that made it, to recognize its own type.
    fn as_any(&self) -> &dyn Any;
    /// Copies the value into `host`: the buffer's whole storage (every byte of it).
    fn copy_to_host(&self, host: &mut [u8]) -> Result<()>;
}

/// A compiled region, runnable many times with different bindings.
pub trait Program: Send + Sync {
    /// Runs on `bufs`: each binding operand's buffer, in binding order. The one way the
    /// executor runs a program: a program that runs on host bytes gets this from
    /// [`HostProgram`]; a backend that keeps values on a device implements it itself, with its
    /// own coherence rules.
    ///
    /// # Safety
    /// Every buffer is allocated and large enough for its operand's layout, and no other
    /// thread writes them meanwhile (streams guarantee both).
    unsafe fn run(&self, binding: &Binding, bufs: &[Arc<Buffer>]) -> Result<()>;

    /// Human-readable code for dumps (e.g. Cranelift IR); empty if the backend has none.
    fn listing(&self) -> String {
        String::new()
    }
}

/// A program that runs on host bytes (the CPU JIT's programs, the host kernels): it sees each
/// operand's buffer start. Every such type is a [`Program`] through the impl below, the one
/// place the host side of buffer coherence lives.
pub trait HostProgram: Send + Sync {
    /// Runs on `bases`: each binding operand's buffer start, in binding order.
    ///
    /// # Safety
    /// Every base must point to a live buffer large enough for its operand's layout, and no
    /// other thread may write those buffers meanwhile (streams guarantee both).
    unsafe fn run_host(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()>;

    /// Human-readable code for dumps (e.g. Cranelift IR); empty if there is none.
    fn listing(&self) -> String {
        String::new()
    }
}

impl<T: HostProgram> Program for T {
    /// Reads the device checks the inputs depend on (`checks`), writes back any newer device
    /// copy of every operand first and drops the device copies of the outputs (the host now
    /// holds their value); this costs nothing when no buffer has a device copy.
    unsafe fn run(&self, binding: &Binding, bufs: &[Arc<Buffer>]) -> Result<()> {
        // A routine on host bytes may raise on values computed from a bad index (an index
        // gathered through it); the bad index's own error comes first, as at its launch.
        for b in &bufs[..binding.n_inputs] {
            b.resolve_checks()?;
        }
        for b in bufs {
            b.host_coherent()?;
        }
        for b in &bufs[binding.n_inputs..] {
            b.host_written();
        }
        let mut bases = smallvec::SmallVec::<[*mut u8; 8]>::with_capacity(bufs.len());
        for b in bufs {
            bases.push(b.storage()?.ptr());
        }
        self.run_host(binding, &bases)
    }

    fn listing(&self) -> String {
        HostProgram::listing(self)
    }
}

/// Runs independent jobs side by side on a backend's threads: the executor hands it a flush's
/// consecutive steps that share no written buffer (an optimizer's per-parameter updates), each
/// too small to be worth splitting on its own.
pub trait SideBySide: Send + Sync {
    /// Runs `job(k)` for every k in `0..n`, several at a time, and returns once all ran; the
    /// first error wins.
    fn run_all(&self, n: usize, job: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()>;

    /// Whether jobs touching `elems` elements in all (operands counted once per job) are worth
    /// handing to other threads: waking one costs more than a few small programs take on the
    /// caller's thread, and a woken thread keeps its core busy a while after.
    fn worth_sharing(&self, elems: usize) -> bool;

    /// How many jobs can run at once (the caller's thread included): a kernel that splits one
    /// op into parts each paying a fixed share (a copy of a small operand) makes this many.
    fn threads(&self) -> usize;
}

/// Compiles regions for one kind of device.
pub trait Backend: Send + Sync {
    /// Short name used in logs, stats and config (`cpu`).
    fn name(&self) -> &'static str;
    /// Identity that goes into program fingerprints: name plus target features.
    fn identity(&self) -> &str;
    /// Turns a planned region into a runnable program; the program cache calls it once per
    /// fingerprint and keeps the result.
    fn compile(&self, region: &Region) -> Result<Arc<dyn Program>>;

    /// What one region may hold: the planner cuts each flush by it. The default is loop
    /// regions (the planner's own fusion rules).
    fn capabilities(&self) -> Capabilities {
        Capabilities::LOOPS
    }

    /// True when [`Backend::compile`] only wraps a region and the real compiles happen when a
    /// program first runs at a shape (PJRT): the stats then report those
    /// ([`BackendCounters::shape_compiles`]) as `programs_compiled` and `compile_ns`.
    fn compiles_on_first_run(&self) -> bool {
        false
    }

    /// Reads the device checks of every program that ran (`crate::checks`), at a stream
    /// synchronize: an op recorded afterwards on a value computed from a bad index is then
    /// refused at record time. Backends whose programs raise at launch have none.
    fn read_device_checks(&self) -> Result<()> {
        Ok(())
    }

    /// Counters beyond the program cache's. Backends whose programs serve every shape and
    /// that keep no disk cache (the CPU JIT) report zeros.
    fn counters(&self) -> BackendCounters {
        BackendCounters::default()
    }

    /// How to run independent programs concurrently, if this backend can; `None` runs them
    /// one after another.
    fn side_by_side(&self) -> Option<Arc<dyn SideBySide>> {
        None
    }
}
