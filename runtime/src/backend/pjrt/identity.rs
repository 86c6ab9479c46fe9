//! What a serialized executable is only valid for: the plugin build and the host CPU.
//!
//! An executable from another plugin build can load and compute wrong numbers, and one built
//! for other CPU features can fail to load (shared/notes/pjrt.md), so the disk-cache key covers
//! the plugin file's bytes, its API and platform versions, and the host's CPU features (and, in
//! `open_disk`, the compile options: see `options`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use xxhash_rust::xxh3::xxh3_128;

/// xxh3-128 of the file at `path`, computed once per process (plugins are hundreds of MB).
pub fn file_hash(path: &Path) -> std::io::Result<u128> {
    static MEMO: OnceLock<Mutex<HashMap<PathBuf, u128>>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Some(h) = memo.lock().unwrap_or_else(|p| p.into_inner()).get(path) {
        return Ok(*h);
    }
    let h = xxh3_128(&std::fs::read(path)?);
    memo.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(path.to_path_buf(), h);
    Ok(h)
}

/// The host CPU's architecture and the SIMD features compiled code may use.
pub fn cpu_features() -> String {
    let mut f: Vec<&str> = vec![std::env::consts::ARCH];
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! feat {
            ($($name:tt),*) => {
                $(if std::arch::is_x86_feature_detected!($name) { f.push($name); })*
            };
        }
        feat!(
            "sse4.1",
            "sse4.2",
            "popcnt",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "bmi1",
            "bmi2",
            "lzcnt",
            "avx512f",
            "avx512bw",
            "avx512cd",
            "avx512dq",
            "avx512vl",
            "avx512vnni",
            "avx512bf16"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! feat {
            ($($name:tt),*) => {
                $(if std::arch::is_aarch64_feature_detected!($name) { f.push($name); })*
            };
        }
        feat!("neon", "fp16", "dotprod", "sve", "sve2", "bf16", "i8mm");
    }
    f.join(",")
}
