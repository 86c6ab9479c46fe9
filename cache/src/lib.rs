//! deferfuse-cache: region fingerprints that are stable across processes, and the tiered
//! program cache (tier 1: memory, bounded LRU, compile-once under concurrency).

pub mod fingerprint;
pub mod program_cache;

pub use fingerprint::{fingerprint, Fingerprint};
pub use program_cache::{CacheStats, ProgramCache};
