//! The tier-2 program cache: serialized executables in a directory, shared by processes.
//!
//! Each entry is one file `<key>.dfx`: a header (magic, key, payload length, xxh3-64 of the
//! payload) and the payload. Writers write a private temp file and rename it into place, so a
//! reader sees a whole entry or none, and concurrent writers of one key just replace each
//! other's identical bytes. A reader that finds a bad header, a short file or a checksum
//! mismatch removes the entry, logs a warning and reports a miss, so the caller recompiles.
//! The directory is bounded: after a write, the least recently used entries (by modification
//! time, refreshed on every hit) are removed until the total fits.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 8] = b"DFXCACH1";
const HEADER: usize = 8 + 16 + 8 + 8;
const SUFFIX: &str = "dfx";
/// A temp file this old was left by a process that died mid-write.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Counters of one process's use of the directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Lookups that found a readable entry (a compile saved).
    pub hits: u64,
    /// Lookups that found none (the caller compiles and stores).
    pub misses: u64,
    /// Entries found damaged (and removed).
    pub corrupt: u64,
    /// Entries written.
    pub writes: u64,
    /// Entries removed to keep the directory within its byte bound.
    pub evictions: u64,
}

/// A directory of serialized programs keyed by 128-bit keys.
pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    writes: AtomicU64,
    evictions: AtomicU64,
    temp_serial: AtomicU64,
}

impl DiskCache {
    /// Opens (creating it if needed) the cache in `dir`, holding at most `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<DiskCache> {
        fs::create_dir_all(dir)?;
        Ok(DiskCache {
            dir: dir.to_path_buf(),
            max_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            temp_serial: AtomicU64::new(0),
        })
    }

    /// The directory the entries live in (for messages and tests).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of `key`.
    pub fn path(&self, key: u128) -> PathBuf {
        self.dir.join(format!("{key:032x}.{SUFFIX}"))
    }

    /// The payload stored under `key`, or `None` (a damaged entry is removed with a warning).
    pub fn get(&self, key: u128) -> Option<Vec<u8>> {
        let path = self.path(key);
        let Ok(bytes) = fs::read(&path) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        match check(&bytes, key) {
            Ok(()) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                // Refresh its age so eviction drops entries nobody uses first.
                if let Ok(f) = fs::File::options().append(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(bytes[HEADER..].to_vec())
            }
            Err(why) => {
                tracing::warn!(
                    path = %path.display(),
                    "disk cache entry is damaged ({why}); removing it and recompiling"
                );
                let _ = fs::remove_file(&path);
                self.corrupt.fetch_add(1, Ordering::Relaxed);
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Stores `payload` under `key` atomically, then keeps the directory within its bound.
    pub fn put(&self, key: u128, payload: &[u8]) -> std::io::Result<()> {
        let serial = self.temp_serial.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".tmp-{key:032x}-{}-{serial}", std::process::id()));
        let mut data = Vec::with_capacity(HEADER + payload.len());
        data.extend_from_slice(MAGIC);
        data.extend_from_slice(&key.to_le_bytes());
        data.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        data.extend_from_slice(&xxh3_64(payload).to_le_bytes());
        data.extend_from_slice(payload);
        let r = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&data)?;
            f.sync_data()?;
            fs::rename(&tmp, self.path(key))
        })();
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.evict();
        Ok(())
    }

    /// Removes least recently used entries until the directory fits `max_bytes`, and temp
    /// files abandoned by dead writers. Races with other processes are harmless: a file
    /// already gone is skipped.
    pub fn evict(&self) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for e in rd.flatten() {
            let path = e.path();
            let Ok(meta) = e.metadata() else { continue };
            let mtime = meta.modified().unwrap_or(now);
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".tmp-") {
                if now.duration_since(mtime).unwrap_or_default() > STALE_TEMP {
                    let _ = fs::remove_file(&path);
                }
                continue;
            }
            if path.extension().is_some_and(|x| x == SUFFIX) {
                entries.push((mtime, meta.len(), path));
            }
        }
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
            total = total.saturating_sub(len);
        }
    }

    /// This process's counters so far.
    pub fn stats(&self) -> DiskStats {
        DiskStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// Why `bytes` is not a whole entry for `key`.
fn check(bytes: &[u8], key: u128) -> Result<(), &'static str> {
    if bytes.len() < HEADER {
        return Err("shorter than its header");
    }
    if &bytes[..8] != MAGIC {
        return Err("bad magic");
    }
    let word = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    if u128::from_le_bytes(bytes[8..24].try_into().expect("16 bytes")) != key {
        return Err("stored under another key");
    }
    if word(24) != (bytes.len() - HEADER) as u64 {
        return Err("truncated or padded payload");
    }
    if word(32) != xxh3_64(&bytes[HEADER..]) {
        return Err("checksum mismatch");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory, removed with its entries when the test ends.
    fn temp_dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("deferfuse-disk-{name}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn a_stored_entry_reads_back() {
        let dir = temp_dir("roundtrip");
        let c = DiskCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(c.get(7), None);
        c.put(7, b"program bytes").unwrap();
        assert_eq!(c.get(7).as_deref(), Some(&b"program bytes"[..]));
        assert_eq!((c.stats().hits, c.stats().misses), (1, 1));
    }

    #[test]
    fn a_truncated_entry_is_removed_and_missed() {
        let dir = temp_dir("truncated");
        let c = DiskCache::open(dir.path(), 1 << 20).unwrap();
        c.put(9, &[5u8; 100]).unwrap();
        let p = c.path(9);
        let bytes = fs::read(&p).unwrap();
        fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
        assert_eq!(c.get(9), None);
        assert!(!p.exists(), "the damaged entry is removed");
        assert_eq!(c.stats().corrupt, 1);
    }

    #[test]
    fn a_flipped_payload_byte_fails_the_checksum() {
        let dir = temp_dir("flipped");
        let c = DiskCache::open(dir.path(), 1 << 20).unwrap();
        c.put(3, &[1u8; 64]).unwrap();
        let p = c.path(3);
        let mut bytes = fs::read(&p).unwrap();
        bytes[HEADER + 5] ^= 0xff;
        fs::write(&p, &bytes).unwrap();
        assert_eq!(c.get(3), None);
        assert_eq!(c.stats().corrupt, 1);
    }

    #[test]
    fn the_directory_stays_within_its_bound_dropping_the_oldest() {
        let dir = temp_dir("bound");
        let c = DiskCache::open(dir.path(), 3 * (HEADER as u64 + 1000)).unwrap();
        for k in 0..5u128 {
            c.put(k, &[k as u8; 1000]).unwrap();
            // Distinct modification times order the entries.
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + k as u64);
            fs::File::options()
                .append(true)
                .open(c.path(k))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        c.evict();
        let present: Vec<u128> = (0..5).filter(|&k| c.path(k).exists()).collect();
        assert_eq!(present, vec![2, 3, 4]);
    }

    #[test]
    fn concurrent_writers_of_one_key_leave_one_whole_entry() {
        let dir = temp_dir("concurrent");
        let c = std::sync::Arc::new(DiskCache::open(dir.path(), 1 << 24).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        c.put(42, &[7u8; 4096]).unwrap();
                        if let Some(v) = c.get(42) {
                            assert_eq!(v, vec![7u8; 4096]);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.get(42), Some(vec![7u8; 4096]));
        assert_eq!(c.stats().corrupt, 0);
        let temps = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .count();
        assert_eq!(temps, 0, "no temp file is left behind");
    }
}
