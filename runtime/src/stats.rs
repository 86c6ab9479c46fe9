//! Counters the stats call reports: what was recorded, compiled and run, and why work ran.

use crate::backend::BackendCounters;
pub use deferfuse_fusion::plan::CutReason;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why pending work was flushed or waited for.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncReason {
    /// A host read (copy to host, item).
    HostRead = 0,
    /// An explicit stream or device synchronize.
    Synchronize = 1,
    /// An event was recorded on the stream.
    Event = 2,
    /// The trace reached the configured maximum of pending ops.
    MaxPending = 3,
    /// Another stream read a value this stream had not produced yet.
    CrossStream = 4,
    /// A non-deferred op was issued while deferred ops were pending.
    ModeSwitch = 5,
    /// Deferred ops created more bytes of buffers than `Config::max_pending_bytes`.
    MemoryBound = 6,
    /// A host read whose values decide the size of an op's output (nonzero, boolean-mask
    /// indexing, unique): [`crate::Runtime::to_host_for_size`]. Counted apart from `HostRead`
    /// so a model's unavoidable data-dependent syncs can be told from its `.item()` calls.
    DataDependentSize = 7,
}

impl SyncReason {
    /// How many reasons there are: the length of [`Stats::sync_points`].
    pub const COUNT: usize = 8;

    /// The snake_case name reports use.
    pub fn name(self) -> &'static str {
        match self {
            SyncReason::HostRead => "host_read",
            SyncReason::Synchronize => "synchronize",
            SyncReason::Event => "event",
            SyncReason::MaxPending => "max_pending",
            SyncReason::CrossStream => "cross_stream",
            SyncReason::ModeSwitch => "mode_switch",
            SyncReason::MemoryBound => "memory_bound",
            SyncReason::DataDependentSize => "data_dependent_size",
        }
    }
}

/// A snapshot of the runtime's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Op calls recorded, in every mode.
    pub ops_recorded: u64,
    /// Programs compiled (on a backend that compiles at first run, its real compiles).
    pub programs_compiled: u64,
    /// Programs run.
    pub programs_run: u64,
    /// Programs that ran side by side with others: independent steps of one flush (an
    /// optimizer's per-parameter updates) launched together on the backend's threads.
    pub programs_side_by_side: u64,
    /// Program cache lookups that found a compiled program.
    pub cache_hits: u64,
    /// Program cache lookups that had to compile.
    pub cache_misses: u64,
    /// Programs dropped from the bounded program cache.
    pub cache_evictions: u64,
    /// Time spent compiling, in nanoseconds (counted like `programs_compiled`).
    pub compile_ns: u64,
    /// Flushes of a non-empty trace, plus every host read, indexed by `SyncReason as usize`
    /// (a synchronize or event with nothing deferred is not counted).
    pub sync_points: [u64; SyncReason::COUNT],
    /// Bytes of buffer storage allocated since the runtime was made.
    pub bytes_allocated: u64,
    /// Loop regions cut by the planner, indexed by `CutReason as usize`.
    pub cuts: [u64; CutReason::COUNT],
    /// Deferred ops dropped because nothing could observe their result.
    pub dead_nodes: u64,
    /// Deferred values computed in registers and never written to memory.
    pub unmaterialized: u64,
    /// Flushes whose plan was reused from an earlier trace of the same structure.
    pub plans_reused: u64,
    /// Ops run alone (strict, debug) whose lowered steps and programs were reused from an
    /// earlier op of the same structure on their stream.
    pub strict_plans_reused: u64,
    /// Host allocations served from the cache of freed blocks.
    pub host_cache_hits: u64,
    /// Host allocations that went to the system allocator.
    pub host_cache_misses: u64,
    /// Bytes of freed host blocks held for reuse.
    pub host_cached_bytes: u64,
    /// Defer-mode traces handed to the stream's worker without waiting, once they held
    /// `pipeline_ops` ops (see [`crate::Runtime::set_pipeline_ops`]); not sync points.
    pub pipelined_flushes: u64,
    /// What the backend counts itself (PJRT: shape compiles, the disk cache, device copies);
    /// zeros on the CPU backend.
    pub backend: BackendCounters,
}

/// The live counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub ops_recorded: AtomicU64,
    pub programs_run: AtomicU64,
    pub programs_side_by_side: AtomicU64,
    pub sync_points: [AtomicU64; SyncReason::COUNT],
    pub bytes_allocated: AtomicU64,
    pub cuts: [AtomicU64; CutReason::COUNT],
    pub dead_nodes: AtomicU64,
    pub unmaterialized: AtomicU64,
    pub plans_reused: AtomicU64,
    pub strict_plans_reused: AtomicU64,
    pub pipelined_flushes: AtomicU64,
}

impl Counters {
    /// Counts one sync point for reason `r`.
    pub fn sync(&self, r: SyncReason) {
        self.sync_points[r as usize].fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field names in (part of) a struct's `Debug` print: the words ending with ':'.
    fn field_names(s: &str) -> Vec<&str> {
        s.split_whitespace()
            .filter_map(|t| t.strip_suffix(':'))
            .collect()
    }

    #[test]
    fn every_counter_is_documented_in_the_readmes_counters_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
        let readme = std::fs::read_to_string(path).unwrap();
        let table = readme
            .split("**The counters.**")
            .nth(1)
            .and_then(|t| t.split("\n## ").next())
            .expect("README has a counters table");
        let text = format!("{:?}", Stats::default());
        let (own, backend) = text
            .split_once("backend: BackendCounters {")
            .expect("Stats prints its backend counters");
        let mut names: Vec<String> = field_names(own)
            .into_iter()
            .map(|n| match n {
                "cuts" | "sync_points" => format!("`{n}[reason]`"),
                _ => format!("`{n}`"),
            })
            .collect();
        names.extend(
            field_names(backend)
                .iter()
                .map(|n| format!("`backend.{n}`")),
        );
        assert!(names.len() > 20, "{names:?}");
        let missing: Vec<&String> = names.iter().filter(|n| !table.contains(*n)).collect();
        assert!(
            missing.is_empty(),
            "README's counters table does not name {missing:?}"
        );
    }
}
