//! Where XLA compiles happen, and their accounting: an executable for a program at a signature
//! comes from this process's memo (`process`), else the disk cache (`DEFERFUSE_CACHE_DIR`),
//! else an executable this process compiled from the same module text, else XLA. The backend's
//! counters (`compiles`, `compile_ns`, `disk_hits`) are bumped here, at the real compile or
//! load, so the runtime's `programs_compiled` and `compile_ns` report what XLA cost rather than
//! the lazy program objects `Backend::compile` makes.

use super::client::Executable;
use super::Shared;
use crate::error::{Error, Result};
use deferfuse_cache::Fingerprint;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The disk cache's key of an executable: the program, its signature and the plugin (`salt`).
fn disk_key(fingerprint: Fingerprint, key: &[u64], salt: &str) -> u128 {
    // v2: modules take the valid sizes and zero their results' padding.
    let mut b = b"deferfuse-pjrt-executable-v2\0".to_vec();
    b.extend_from_slice(&fingerprint.0.to_le_bytes());
    b.extend(key.iter().flat_map(|k| k.to_le_bytes()));
    b.extend_from_slice(salt.as_bytes());
    xxhash_rust::xxh3::xxh3_128(&b)
}

/// The executable of program `fingerprint` at signature `key`, compiling `mlir()` when neither
/// this process nor the disk cache has it. `what` names the program in a compile error.
pub fn executable(
    shared: &Shared,
    fingerprint: Fingerprint,
    key: &[u64],
    what: &dyn Fn() -> String,
    mlir: impl FnOnce() -> String,
) -> Result<Arc<Executable>> {
    if let Some(e) = shared.device.executable(fingerprint.0, key) {
        return Ok(e);
    }
    let counters = &shared.counters;
    let started = Instant::now();
    let spent = || started.elapsed().as_nanos() as u64;
    let disk = shared
        .disk
        .as_ref()
        .map(|d| (d, disk_key(fingerprint, key, &d.salt)));
    if let Some((d, k)) = &disk {
        if let Some(bytes) = d.cache.get(*k) {
            match shared.client.deserialize(&bytes) {
                Ok(exe) => {
                    counters.disk_hits.fetch_add(1, Ordering::Relaxed);
                    counters.compile_ns.fetch_add(spent(), Ordering::Relaxed);
                    let exe = Arc::new(exe);
                    shared
                        .device
                        .keep_executable(fingerprint.0, key.to_vec(), exe.clone());
                    return Ok(exe);
                }
                Err(e) => {
                    tracing::warn!(
                        path = %d.cache.path(*k).display(),
                        "disk cache entry does not load ({e}); removing it and recompiling"
                    );
                    let _ = std::fs::remove_file(d.cache.path(*k));
                    counters.disk_corrupt.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    let mlir = mlir();
    if let Some(dir) = &shared.dump_dir {
        let bytes: Vec<u8> = key.iter().flat_map(|k| k.to_le_bytes()).collect();
        let sig_hash = xxhash_rust::xxh3::xxh3_64(&bytes);
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(
            dir.join(format!("{fingerprint}-{sig_hash:016x}.mlir")),
            &mlir,
        );
    }
    // Another region may have emitted this very module (one whose views the staging erased):
    // its executable is this one's, so XLA is not asked again.
    let text = xxhash_rust::xxh3::xxh3_128(mlir.as_bytes());
    let exe = match shared.device.executable_by_text(text) {
        Some(exe) => {
            tracing::debug!(region = %what(), "module text already compiled in this process");
            exe
        }
        None => {
            let exe = shared.client.compile(&mlir).map_err(|e| {
                Error::Backend(format!("{e}\nwhile compiling region {}\n{mlir}", what()))
            });
            counters.compiles.fetch_add(1, Ordering::Relaxed);
            counters.compile_ns.fetch_add(spent(), Ordering::Relaxed);
            let exe = Arc::new(exe?);
            shared.device.keep_by_text(text, exe.clone());
            exe
        }
    };
    // Written under this program's key even when the text was compiled for another region: a
    // later process looks it up by this key before it has any module text.
    if let Some((d, k)) = &disk {
        // A cache that cannot be written only costs a recompile next time.
        match exe.serialize() {
            Ok(bytes) => {
                if let Err(e) = d.cache.put(*k, &bytes) {
                    tracing::warn!(dir = %d.cache.dir().display(), "disk cache write failed: {e}");
                }
            }
            Err(e) => tracing::warn!("PJRT executable cannot be serialized: {e}"),
        }
    }
    shared
        .device
        .keep_executable(fingerprint.0, key.to_vec(), exe.clone());
    Ok(exe)
}
