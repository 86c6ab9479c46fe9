//! Runtime configuration: the config struct, and the environment variables read once at
//! runtime creation.

use crate::error::Result;
use crate::mode::{mode_from_env, Mode};

/// How a runtime is set up. `Default` reads the mode from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// The default eager mode; `None` reads `TORCH_TPU_DEFER_AND_FUSE` and
    /// `TORCH_TPU_LAUNCH_BLOCKING`.
    pub mode: Option<Mode>,
    /// Deferred ops a stream may hold before it flushes by itself (bounds trace memory).
    pub max_pending_ops: usize,
    /// Bytes of new buffers deferred ops may create before the stream flushes by itself
    /// (bounds memory held by deferred values).
    pub max_pending_bytes: usize,
    /// Most ops the planner puts in one loop region.
    pub max_ops_per_region: usize,
    /// Compiled programs kept in memory (least recently used are dropped beyond this).
    pub cache_capacity: usize,
    /// Bytes of freed host blocks kept for reuse (0 disables the cache).
    pub host_cache_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: None,
            max_pending_ops: 4096,
            max_pending_bytes: 1 << 30,
            max_ops_per_region: 64,
            cache_capacity: 1024,
            host_cache_bytes: 1 << 30,
        }
    }
}

/// The mode to start in, and whether both env flags were on (worth a warning).
pub fn resolve_mode(config: &Config) -> Result<(Mode, bool)> {
    match config.mode {
        Some(m) => Ok((m, false)),
        None => {
            let d = std::env::var("TORCH_TPU_DEFER_AND_FUSE").ok();
            let b = std::env::var("TORCH_TPU_LAUNCH_BLOCKING").ok();
            mode_from_env(d.as_deref(), b.as_deref())
        }
    }
}
