//! Region fingerprints: a stable 128-bit key for "the same program".
//!
//! A region is already canonical (operands by position, values numbered in order, shapes reduced
//! to stride kinds, scalars as parameter slots), so hashing it is enough. The hash is xxh3-128,
//! whose output is specified and identical in every process and on every platform, so a disk
//! cache can key on it. The key also covers the library version and the backend's identity
//! (name plus target features), because a program for another CPU is not the same program.

use deferfuse_fusion::Region;
use std::fmt;
use std::hash::{Hash, Hasher};
use xxhash_rust::xxh3::Xxh3;

/// The 128-bit identity of a compiled program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub u128);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Feeds `std::hash::Hash` into xxh3. Integers are written little-endian at fixed widths so the
/// byte stream does not depend on the platform.
struct StableHasher(Xxh3);

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        self.0.digest()
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn write_usize(&mut self, i: usize) {
        self.0.update(&(i as u64).to_le_bytes());
    }
    fn write_isize(&mut self, i: isize) {
        self.0.update(&(i as i64).to_le_bytes());
    }
}

/// The library version baked into every key: a new release never reuses an old program.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Fingerprints `region` for a backend identified by `backend` (e.g. "cpu-cranelift:avx2,fma").
pub fn fingerprint(region: &Region, backend: &str) -> Fingerprint {
    let mut h = StableHasher(Xxh3::new());
    h.write(b"deferfuse-region\0");
    h.write(VERSION.as_bytes());
    h.write(&[0]);
    h.write(backend.as_bytes());
    h.write(&[0]);
    region.hash(&mut h);
    Fingerprint(h.0.digest128())
}
