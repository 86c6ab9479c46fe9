//! deferfuse-cache: region fingerprints that are stable across processes, and the tiered
//! program cache (tier 1, [`program_cache`]: memory, bounded LRU, compile-once under
//! concurrency; tier 2, [`disk_cache`]: serialized programs on disk, shared by processes).
//!
//! The other caches of the project live with what they cache: the plan cache
//! (`deferfuse_fusion::plan_cache`, plans by trace structure) and the host block cache
//! (`deferfuse_runtime::alloc`, freed host memory blocks).

#![warn(missing_docs)]

pub mod disk_cache;
pub mod fingerprint;
pub mod program_cache;

pub use disk_cache::{DiskCache, DiskStats};
pub use fingerprint::{fingerprint, Fingerprint};
pub use program_cache::{CacheStats, CompileError, ProgramCache};
