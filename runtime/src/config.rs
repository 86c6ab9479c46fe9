//! Runtime configuration: the config struct, and the environment variables read once at
//! runtime creation.

use crate::error::{Error, Result};
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
    /// Threads one program may split its loops over; 0 reads `DEFERFUSE_NUM_THREADS`, and
    /// without it uses every core.
    pub num_threads: usize,
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
            num_threads: 0,
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

/// The threads programs use: the config's count, else `DEFERFUSE_NUM_THREADS`, else every core.
pub fn resolve_threads(config: &Config) -> Result<usize> {
    if config.num_threads > 0 {
        return Ok(config.num_threads);
    }
    let cores = || std::thread::available_parallelism().map_or(1, |n| n.get());
    match std::env::var("DEFERFUSE_NUM_THREADS") {
        Err(_) => Ok(cores()),
        Ok(v) => parse_threads(&v),
    }
}

/// Parses a `DEFERFUSE_NUM_THREADS` value: a positive integer.
fn parse_threads(v: &str) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::Config(format!(
            "DEFERFUSE_NUM_THREADS = {v:?}: expected a positive integer (the threads one \
             program may use); unset it to use every core"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_parse_as_positive_integers() {
        assert_eq!(parse_threads("3").unwrap(), 3);
        assert_eq!(parse_threads(" 1 ").unwrap(), 1);
    }

    #[test]
    fn zero_or_garbage_thread_counts_are_config_errors() {
        for v in ["0", "-2", "all", ""] {
            let e = parse_threads(v).unwrap_err().to_string();
            assert!(e.contains("DEFERFUSE_NUM_THREADS"), "{e}");
        }
    }

    #[test]
    fn a_configured_thread_count_wins_over_the_environment() {
        let c = Config {
            num_threads: 5,
            ..Config::default()
        };
        assert_eq!(resolve_threads(&c).unwrap(), 5);
    }
}
