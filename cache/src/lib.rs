//! deferfuse-cache: region fingerprints that are stable across processes, and the tiered
//! program cache (tier 1: memory, bounded LRU, compile-once under concurrency; tier 2: serialized
//! programs on disk, shared by processes).

pub mod disk;
pub mod fingerprint;
pub mod program_cache;

pub use disk::{DiskCache, DiskStats};
pub use fingerprint::{fingerprint, Fingerprint};
pub use program_cache::{CacheStats, ProgramCache};
