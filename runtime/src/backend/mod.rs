//! Backends: they differ in what they fuse, not in how they are driven. A backend compiles a
//! [`Region`] into a [`Program`]; the executor runs programs on resolved buffers.

pub mod cpu;
pub mod pjrt;

use crate::config::{resolve_backend, resolve_pjrt_plugin, BackendKind, Config};
use crate::error::Result;
use deferfuse_fusion::{Binding, Region};
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

/// What a backend counts itself (see `Stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    /// Executables compiled for concrete (bucketed) shapes.
    pub shape_compiles: u64,
    /// Executables loaded from the disk cache instead of compiled.
    pub disk_cache_hits: u64,
    /// Damaged disk-cache entries found, removed and recompiled.
    pub disk_cache_corrupt: u64,
}

/// A compiled region, runnable many times with different bindings.
pub trait Program: Send + Sync {
    /// Runs on `bases`: each binding operand's buffer start, in binding order.
    ///
    /// # Safety
    /// Every base must point to a live buffer large enough for its operand's layout, and no
    /// other thread may write those buffers meanwhile (streams guarantee both).
    unsafe fn run(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()>;

    /// Human-readable code for dumps (e.g. Cranelift IR); empty if the backend has none.
    fn listing(&self) -> String {
        String::new()
    }
}

/// Compiles regions for one kind of device.
pub trait Backend: Send + Sync {
    /// Short name used in logs, stats and config (`cpu`).
    fn name(&self) -> &'static str;
    /// Identity that goes into program fingerprints: name plus target features.
    fn identity(&self) -> &str;
    fn compile(&self, region: &Region) -> Result<Arc<dyn Program>>;

    /// Counters beyond the program cache's. Backends whose programs serve every shape and
    /// that keep no disk cache (the CPU JIT) report zeros.
    fn counters(&self) -> BackendCounters {
        BackendCounters::default()
    }
}
