//! Runtime configuration: the config struct, and the environment variables read once at
//! runtime creation.

use crate::error::{Error, Result};
use crate::mode::{mode_from_env, Mode};
use crate::stream::Pacing;
use std::path::PathBuf;

/// Which backend compiles and runs programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Cranelift JIT on the host CPU (the default).
    Cpu,
    /// StableHLO compiled by a PJRT plugin (`pjrt_plugin`).
    Pjrt,
}

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
    /// Deferred ops after which a stream hands its trace to its worker without waiting, at the
    /// next matmul or kernel op (defer mode's pipelining: the programs run while the host
    /// records the next ops; see `crate::pipeline`);
    /// `Some(0)` turns it off, `None` reads `DEFERFUSE_PIPELINE_OPS`, else
    /// [`DEFAULT_PIPELINE_OPS`]. See [`crate::Runtime::set_pipeline_ops`].
    pub pipeline_ops: Option<usize>,
    /// Compiled programs kept in memory (least recently used are dropped beyond this).
    pub cache_capacity: usize,
    /// Bytes of freed host blocks kept for reuse (0 disables the cache).
    pub host_cache_bytes: usize,
    /// The backend; `None` reads `DEFERFUSE_BACKEND` (`cpu` or `pjrt`; unset means cpu).
    pub backend: Option<BackendKind>,
    /// The PJRT plugin (.so) the pjrt backend loads; `None` reads `DEFERFUSE_PJRT_PLUGIN`.
    pub pjrt_plugin: Option<PathBuf>,
    /// Threads one program may split its loops over; 0 reads `DEFERFUSE_NUM_THREADS`, and
    /// without it uses every core.
    pub num_threads: usize,
    /// Bytes of buffers that may be in use at once (an allocation past it is an out-of-memory
    /// error); 0 reads `DEFERFUSE_MEMORY_LIMIT`, and without it there is no cap.
    pub memory_limit_bytes: usize,
    /// A Chrome trace / Perfetto JSON file to record the timeline into from creation until
    /// the runtime is dropped; `None` reads `DEFERFUSE_TRACE` (unset: no trace).
    pub trace: Option<PathBuf>,
    /// Events the timeline keeps (a ring buffer: the oldest are dropped beyond it); 0 reads
    /// `DEFERFUSE_TRACE_EVENTS`, else 262144.
    pub trace_events: usize,
    /// A directory each newly compiled region is written into (readable text, Graphviz and
    /// the backend's code); `None` reads `DEFERFUSE_DUMP_DIR` (unset: no dumps).
    pub dump_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: None,
            max_pending_ops: 4096,
            max_pending_bytes: 1 << 30,
            max_ops_per_region: 64,
            pipeline_ops: None,
            cache_capacity: 1024,
            host_cache_bytes: 1 << 30,
            backend: None,
            pjrt_plugin: None,
            num_threads: 0,
            memory_limit_bytes: 0,
            trace: None,
            trace_events: 0,
            dump_dir: None,
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

/// The backend to create, from the config or `DEFERFUSE_BACKEND`.
pub fn resolve_backend(config: &Config) -> Result<BackendKind> {
    if let Some(b) = config.backend {
        return Ok(b);
    }
    parse_backend(std::env::var("DEFERFUSE_BACKEND").ok().as_deref())
}

/// The backend a `DEFERFUSE_BACKEND` value names (unset or empty means cpu).
pub fn parse_backend(v: Option<&str>) -> Result<BackendKind> {
    match v {
        None | Some("") | Some("cpu") => Ok(BackendKind::Cpu),
        Some("pjrt") => Ok(BackendKind::Pjrt),
        Some(other) => Err(Error::Config(format!(
            "DEFERFUSE_BACKEND={other:?}: expected cpu or pjrt"
        ))),
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
        Ok(v) => Ok(parse_threads(&v)?.unwrap_or_else(cores)),
    }
}

/// How each stream's host and worker share the CPUs (see `stream::Pacing`): kept apart when
/// the CPU backend's `threads` leave the host a CPU of its own. A PJRT plugin runs its own
/// threads, which may take every CPU, so its streams share them.
pub fn resolve_pacing(config: &Config, threads: usize) -> Result<Pacing> {
    Ok(match resolve_backend(config)? {
        BackendKind::Cpu => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Pacing::for_threads(threads, cores)
        }
        BackendKind::Pjrt => Pacing::SHARED,
    })
}

/// Parses a `DEFERFUSE_NUM_THREADS` value: a non-negative integer, where 0 means every core
/// (`None`), as `Config::num_threads` does.
fn parse_threads(v: &str) -> Result<Option<usize>> {
    match v.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        _ => Err(Error::Config(format!(
            "DEFERFUSE_NUM_THREADS = {v:?}: expected a non-negative integer (the threads one \
             program may use; 0 or unset uses every core)"
        ))),
    }
}

/// Deferred ops after which a stream hands them to its worker at the next matmul or kernel op
/// (see `crate::pipeline`), unless the config or `DEFERFUSE_PIPELINE_OPS` says otherwise.
/// Measured on the model zoo's training steps (1 thread, side by side, against 32 and 64):
/// within noise on the transformers; on the MLPs 48 cut inside their backward, where 64 found
/// no matmul before the optimizer (the small MLP's step has 144 ops).
pub const DEFAULT_PIPELINE_OPS: usize = 48;

/// Ops per pipelined flush: the config's, else `DEFERFUSE_PIPELINE_OPS`, else
/// [`DEFAULT_PIPELINE_OPS`]; 0 means no pipelined flushes.
pub fn resolve_pipeline_ops(config: &Config) -> Result<usize> {
    if let Some(n) = config.pipeline_ops {
        return Ok(n);
    }
    match std::env::var("DEFERFUSE_PIPELINE_OPS") {
        Err(_) => Ok(DEFAULT_PIPELINE_OPS),
        Ok(v) => parse_pipeline_ops(&v),
    }
}

/// Parses a `DEFERFUSE_PIPELINE_OPS` value: a non-negative integer.
fn parse_pipeline_ops(v: &str) -> Result<usize> {
    v.trim().parse::<usize>().map_err(|_| {
        Error::Config(format!(
            "DEFERFUSE_PIPELINE_OPS = {v:?}: expected a non-negative integer (deferred ops \
             after which a stream starts running them while the host records; 0 turns this \
             off, unset means {DEFAULT_PIPELINE_OPS})"
        ))
    })
}

/// The cap on buffer bytes in use: the config's, else `DEFERFUSE_MEMORY_LIMIT`, else none (0).
pub fn resolve_memory_limit(config: &Config) -> Result<usize> {
    if config.memory_limit_bytes > 0 {
        return Ok(config.memory_limit_bytes);
    }
    match std::env::var("DEFERFUSE_MEMORY_LIMIT") {
        Err(_) => Ok(0),
        Ok(v) => parse_bytes(&v).ok_or_else(|| {
            Error::Config(format!(
                "DEFERFUSE_MEMORY_LIMIT = {v:?}: expected bytes as an integer with an optional \
                 K, M or G suffix (powers of 1024), e.g. 8G; 0 or unset means no limit"
            ))
        }),
    }
}

/// Bytes written as an integer with an optional K/M/G suffix (powers of 1024).
fn parse_bytes(v: &str) -> Option<usize> {
    let v = v.trim();
    let (digits, shift) = match v.as_bytes().last()? {
        b'K' | b'k' => (&v[..v.len() - 1], 10),
        b'M' | b'm' => (&v[..v.len() - 1], 20),
        b'G' | b'g' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// The PJRT plugin path, from the config or `DEFERFUSE_PJRT_PLUGIN`.
pub fn resolve_pjrt_plugin(config: &Config) -> Result<PathBuf> {
    if let Some(p) = &config.pjrt_plugin {
        return Ok(p.clone());
    }
    match std::env::var_os("DEFERFUSE_PJRT_PLUGIN") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(Error::Config(
            "the pjrt backend needs a plugin: set DEFERFUSE_PJRT_PLUGIN (or Config::pjrt_plugin) \
             to a PJRT plugin .so, e.g. site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so \
             from `pip install --no-deps xla-cpu-pjrt`"
                .into(),
        )),
    }
}

/// The trace to record from creation, if any: the config's, else `DEFERFUSE_TRACE`.
pub fn resolve_trace(config: &Config) -> Option<PathBuf> {
    config.trace.clone().or_else(|| {
        std::env::var_os("DEFERFUSE_TRACE")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    })
}

/// The dump directory: the config's, else `DEFERFUSE_DUMP_DIR` (unset or empty: none).
pub fn resolve_dump_dir(config: &Config) -> Option<PathBuf> {
    config.dump_dir.clone().or_else(|| {
        std::env::var_os("DEFERFUSE_DUMP_DIR")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    })
}

/// The events a trace keeps: the config's count, else `DEFERFUSE_TRACE_EVENTS`, else the
/// default.
pub fn resolve_trace_events(config: &Config) -> Result<usize> {
    if config.trace_events > 0 {
        return Ok(config.trace_events);
    }
    match std::env::var("DEFERFUSE_TRACE_EVENTS") {
        Err(_) => Ok(crate::timeline::DEFAULT_EVENTS),
        Ok(v) => parse_trace_events(&v),
    }
}

/// Parses a `DEFERFUSE_TRACE_EVENTS` value: a positive integer.
fn parse_trace_events(v: &str) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::Config(format!(
            "DEFERFUSE_TRACE_EVENTS = {v:?}: expected a positive integer (the events a \
             DEFERFUSE_TRACE timeline keeps; unset keeps {})",
            crate::timeline::DEFAULT_EVENTS
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_limit_is_bytes_with_an_optional_binary_suffix() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes(" 8G "), Some(8 << 30));
        assert_eq!(parse_bytes("512m"), Some(512 << 20));
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-1K"), None);
    }

    #[test]
    fn backend_names_parse_and_cpu_is_the_default() {
        assert_eq!(parse_backend(None), Ok(BackendKind::Cpu));
        assert_eq!(parse_backend(Some("cpu")), Ok(BackendKind::Cpu));
        assert_eq!(parse_backend(Some("pjrt")), Ok(BackendKind::Pjrt));
    }

    #[test]
    fn an_unknown_backend_name_is_a_configuration_error() {
        let e = parse_backend(Some("tpu")).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(e.to_string().contains("expected cpu or pjrt"), "{e}");
    }

    #[test]
    fn pipeline_ops_parse_as_non_negative_integers() {
        assert_eq!(parse_pipeline_ops("0").unwrap(), 0);
        assert_eq!(parse_pipeline_ops(" 128 ").unwrap(), 128);
    }

    #[test]
    fn a_bad_pipeline_ops_value_is_a_configuration_error_naming_the_variable() {
        for v in ["-1", "many", ""] {
            let e = parse_pipeline_ops(v).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e}");
            assert!(e.to_string().contains("DEFERFUSE_PIPELINE_OPS"), "{e}");
            assert!(e.to_string().contains("non-negative integer"), "{e}");
        }
    }

    #[test]
    fn thread_counts_parse_as_positive_integers() {
        assert_eq!(parse_threads("3").unwrap(), Some(3));
        assert_eq!(parse_threads(" 1 ").unwrap(), Some(1));
    }

    #[test]
    fn a_zero_thread_count_means_every_core() {
        assert_eq!(parse_threads("0").unwrap(), None);
    }

    #[test]
    fn negative_or_garbage_thread_counts_are_config_errors() {
        for v in ["-2", "all", ""] {
            let e = parse_threads(v).unwrap_err().to_string();
            assert!(e.contains("DEFERFUSE_NUM_THREADS"), "{e}");
        }
    }

    #[test]
    fn trace_event_counts_are_positive_integers() {
        assert_eq!(parse_trace_events("1000").unwrap(), 1000);
        for v in ["0", "-1", "many", ""] {
            let e = parse_trace_events(v).unwrap_err().to_string();
            assert!(
                e.contains("DEFERFUSE_TRACE_EVENTS") && e.contains("positive"),
                "{e}"
            );
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
