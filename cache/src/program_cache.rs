//! The tier-1 program cache: in memory, concurrent, compile-once, bounded with LRU eviction.
//!
//! Threads that miss on the same key share one compile: the first inserts a cell and compiles,
//! the others wait on the cell. Entries carry a last-use tick; when the cache is over its bound
//! the least recently used entry is dropped (its program stays alive while a caller holds it).

use crate::fingerprint::Fingerprint;
use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

struct Entry<P> {
    cell: Arc<OnceLock<Result<P, CompileError>>>,
    last_use: AtomicU64,
}

/// A failed compile, as every caller that waited on it sees it: the program's key and what the
/// compiler said (kept as text: one failure goes to many waiters, and the compiler's own error
/// type need not be cloneable).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("compiling program {key}: {reason}")]
pub struct CompileError {
    /// The program that failed to compile.
    pub key: Fingerprint,
    /// The compiler's error, as text.
    pub reason: String,
}

/// Counters a stats call reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found the program compiled.
    pub hits: u64,
    /// Lookups that found it not compiled yet (they compile it, or wait for the thread that
    /// does).
    pub misses: u64,
    /// Programs dropped to stay within the capacity (least recently used first).
    pub evictions: u64,
    /// Programs compiled (a failed compile counts too).
    pub compiles: u64,
    /// Nanoseconds spent compiling.
    pub compile_ns: u64,
    /// Programs held now.
    pub entries: u64,
}

/// Maps fingerprints to compiled programs of type `P` (cheap to clone, e.g. an `Arc`).
pub struct ProgramCache<P> {
    map: DashMap<Fingerprint, Entry<P>, ahash::RandomState>,
    capacity: usize,
    tick: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    compiles: AtomicU64,
    compile_ns: AtomicU64,
}

impl<P: Clone> ProgramCache<P> {
    /// A cache holding at most `capacity` programs (at least 1).
    pub fn new(capacity: usize) -> Self {
        ProgramCache {
            map: DashMap::with_hasher(ahash::RandomState::new()),
            capacity: capacity.max(1),
            tick: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            compile_ns: AtomicU64::new(0),
        }
    }

    /// The program for `key`, compiling it with `compile` on a miss. Concurrent misses on one
    /// key run `compile` once. A failed compile is returned to every waiter and not kept.
    pub fn get_or_compile<E: std::fmt::Display>(
        &self,
        key: Fingerprint,
        compile: impl FnOnce() -> Result<P, E>,
    ) -> Result<P, CompileError> {
        let now = self.tick.fetch_add(1, Ordering::Relaxed);
        let (cell, hit) = {
            let entry = self.map.entry(key).or_insert_with(|| Entry {
                cell: Arc::new(OnceLock::new()),
                last_use: AtomicU64::new(now),
            });
            entry.last_use.store(now, Ordering::Relaxed);
            (entry.cell.clone(), entry.cell.get().is_some())
        };
        if hit {
            self.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        let result = cell
            .get_or_init(|| {
                let t = Instant::now();
                let r = compile().map_err(|e| CompileError {
                    key,
                    reason: e.to_string(),
                });
                self.compiles.fetch_add(1, Ordering::Relaxed);
                self.compile_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                r
            })
            .clone();
        if result.is_err() {
            self.map.remove_if(&key, |_, e| Arc::ptr_eq(&e.cell, &cell));
        }
        self.evict_over_capacity();
        result
    }

    /// Counts `n` hits a caller answered from programs it kept from earlier lookups (a
    /// strict op's cached plan), so `hits` still counts every compiled program found. The
    /// programs' last use is not refreshed: the caller holds them, and an evicted one stays
    /// alive there.
    pub fn count_hits(&self, n: u64) {
        self.hits.fetch_add(n, Ordering::Relaxed);
    }

    fn evict_over_capacity(&self) {
        while self.map.len() > self.capacity {
            let oldest = self
                .map
                .iter()
                .filter(|e| e.cell.get().is_some())
                .min_by_key(|e| e.last_use.load(Ordering::Relaxed))
                .map(|e| *e.key());
            match oldest {
                Some(k) => {
                    if self.map.remove(&k).is_some() {
                        self.evictions.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => break,
            }
        }
    }

    /// Programs held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no program is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Most programs held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Drops every cached program.
    pub fn clear(&self) {
        self.map.clear();
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            compiles: self.compiles.load(Ordering::Relaxed),
            compile_ns: self.compile_ns.load(Ordering::Relaxed),
            entries: self.map.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn second_lookup_is_a_hit() {
        let c = ProgramCache::new(4);
        let k = Fingerprint(1);
        assert_eq!(c.get_or_compile(k, || Ok::<_, String>(7)), Ok(7));
        assert_eq!(c.get_or_compile(k, || Ok::<_, String>(8)), Ok(7));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.compiles), (1, 1, 1));
    }

    #[test]
    fn least_recently_used_is_evicted() {
        let c = ProgramCache::new(2);
        let ok = |v: i32| move || Ok::<_, String>(v);
        c.get_or_compile(Fingerprint(1), ok(1)).unwrap();
        c.get_or_compile(Fingerprint(2), ok(2)).unwrap();
        c.get_or_compile(Fingerprint(1), ok(1)).unwrap();
        c.get_or_compile(Fingerprint(3), ok(3)).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.stats().evictions, 1);
        // 2 was the least recently used, so it compiles again.
        assert_eq!(c.get_or_compile(Fingerprint(2), ok(20)), Ok(20));
    }

    #[test]
    fn concurrent_misses_compile_once() {
        let c = Arc::new(ProgramCache::new(8));
        let calls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                let calls = calls.clone();
                std::thread::spawn(move || {
                    c.get_or_compile(Fingerprint(42), || {
                        calls.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok::<_, String>(1)
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(1));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn failed_compile_is_not_cached() {
        let c: ProgramCache<i32> = ProgramCache::new(2);
        assert!(c.get_or_compile(Fingerprint(5), || Err("boom")).is_err());
        assert_eq!(
            c.get_or_compile(Fingerprint(5), || Ok::<_, String>(1)),
            Ok(1)
        );
    }

    #[test]
    fn a_failed_compile_names_the_program_and_the_compiler_error() {
        let c: ProgramCache<i32> = ProgramCache::new(2);
        let e = c
            .get_or_compile(Fingerprint(5), || Err("boom"))
            .unwrap_err();
        assert_eq!(e.key, Fingerprint(5));
        assert_eq!(e.reason, "boom");
        assert_eq!(
            e.to_string(),
            format!("compiling program {}: boom", Fingerprint(5))
        );
    }
}
